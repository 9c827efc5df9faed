"""The config schema: every field a run can set, declared once, with its doc and bounds.

A config is a mapping of sections (``model``, ``data``, ``optim``, ``train``, ``run``,
``log``, ``hub``), each a dataclass below. Every field is declared with
``opt(default, doc, constraints...)``: adding a field is adding one line, and
``train.py --help-config`` lists them all. Cross-field rules live in each section's
``validate``. Reading YAML into these classes (``extends``, ``--set``, coercion, the
one-line errors) is ``gpt.config.loader``'s job.
"""

from __future__ import annotations

import argparse
import ast
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

import gpt.config.architecture as architecture
from gpt.common.errors import quoted
from gpt.config.sizes import SIZES, sized

# The choices a config may name. This package imports no torch (a config is checked before anything heavy
# loads), so the implementations keep their own registries, read here from their source without running it:
# the norm types from the norm registry (gpt.model.norms, shipped alone to the Hub), the schedules from
# gpt.training.schedule's SHAPES. The model's other options are the spec's (gpt.config.architecture); a test holds
# PRECISIONS equal to gpt.model.loss's (tests/behaviour/test_architecture.py).
NORM_REGISTRY = Path(__file__).parents[1] / "model" / "norms.py"
SCHEDULE_REGISTRY = Path(__file__).parents[1] / "training" / "schedule.py"


def declared_norm_types(source: Path = NORM_REGISTRY) -> tuple[str, ...]:
    """The norm types the registry declares, in its order: the name of each ``NormType("name", ...)`` in its
    source (a parse, not an import: no torch). tests/model/test_norms.py holds them equal to the registry."""
    calls = [
        node
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), str(source)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "NormType"
    ]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    return tuple(c.args[0].value for c in calls if c.args and isinstance(c.args[0], ast.Constant))


def declared_norm_params(source: Path = NORM_REGISTRY) -> dict[str, tuple[str, ...]]:
    """The config keys of each declared norm type's parameters (``NormType("name", build, doc, (PARAM, ...))`` with
    ``PARAM = NormParam("key", ...)``), by a parse of the registry's source, as ``declared_norm_types``."""
    tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    keys = {
        node.targets[0].id: node.value.args[0].value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "NormParam" and isinstance(node.targets[0], ast.Name)
    }  # fmt: skip
    out = {}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "NormType"):
        params = (
            call.args[3] if len(call.args) > 3 else next((k.value for k in call.keywords if k.arg == "params"), None)
        )
        names = [e.id for e in getattr(params, "elts", []) if isinstance(e, ast.Name)]
        out[call.args[0].value] = tuple(keys[n] for n in names if n in keys)
    return out


def declared_keys(source: Path, name: str) -> tuple[str, ...]:
    """The literal keys of the dict ``name = {"key": ..., ...}`` in ``source``, in order (a parse, not an import)."""
    for node in ast.parse(source.read_text(encoding="utf-8"), str(source)).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise ValueError(f"{source}: no dict {name} = {{...}}")


NORM_TYPES = declared_norm_types()
NORM_PARAMS = declared_norm_params()  # norm type -> the config keys of its parameters (model.norm_eps, ...)
DEFAULT_BASELINE = "handrolled_layernorm"  # the write-up's baseline: a comparison's and a token ladder's default
NORM_PLACEMENTS = architecture.choices("norm_placement")  # where a block's norms sit
QK_NORMS = architecture.choices("qk_norm")  # what QK-norm normalises over
SCHEDULES = declared_keys(SCHEDULE_REGISTRY, "SHAPES")  # the learning-rate schedules
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "muon")  # optim.name: gpt.training.optimizer builds each
MUON_KEYS = ("muon_lr", "muon_momentum", "muon_adjust_lr")  # optim's keys that only Muon reads


def norm_label_arg(value: str) -> str:
    """A ``--norm-types`` value (argparse's type): a registered norm type, or one with sites of their own
    (``architecture.norm_label``: ``pytorch_rmsnorm+mlp:handrolled_layernorm``)."""
    try:
        names = architecture.label_keys(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    choices = _NormTypeChoices()
    unknown = [name for name in names.values() if name not in choices]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not a norm type; choose from: {', '.join(choices)}")
    return value


def norm_order(label: str) -> tuple[int, str]:
    """Where a norm label (``architecture.norm_label``) sorts: by its norm type in the registry's order (the
    write-up's first), a label with sites of their own after its norm type's plain one; unknown names last."""
    names = _NormTypeChoices()
    first = label.split("+")[0]
    return (list(names).index(first) if first in names else len(names), label)


# What a resumed run may change (prefixes of dotted keys): how the run is named, stored, logged,
# fetched and executed, never what it computes. Any other difference from the checkpoint's
# config is refused (gpt.run.checkpoints.check_same_experiment). data.path and friends name where
# the tokens are, and train.tf32 / compile / prefetch how they are computed: the fingerprint
# check (gpt.run.fingerprint.check_resume) refuses other tokens, another resolved precision or
# TF32, another device type.
RESUMABLE = (
    "run.",
    "log.",
    "hub.",
    "data.path",
    "data.hub_repo",
    "data.hub_revision",
    "train.eval_every",
    "train.checkpoint_every",
    "train.keep_last",
    "train.compile",
    "train.tf32",
    "train.prefetch",
)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # default of a field the user must set


def opt(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Sequence[str] | None = None,
) -> Any:
    """Declare a config field: default, one-line doc, and the allowed values."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


class _NormTypeChoices(Sequence[str]):
    """model.norm_type's choices: the norm registry's names once ``gpt.model.norms`` is loaded (so a norm
    type registered at run time, as by a test, is one), else ``NORM_TYPES``, the names its source declares. Looked
    up, never imported: loading the config must not load torch."""

    def _names(self) -> tuple[str, ...]:
        registry = sys.modules.get("gpt.model.norms")
        return NORM_TYPES if registry is None else registry.NORM_TYPES

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())


# --------------------------------------------------------------------------- sections


class ModelRules:
    """What a model config is besides its fields (``gpt.config.architecture.OPTIONS``, one each): the head's rows,
    the rules between fields, the reading of older configs."""

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the output head (and of a tied embedding): vocab_size rounded up to vocab_pad_multiple."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    def validate(self, fail) -> None:
        if self.d_model % self.n_heads:
            fail(
                "n_heads",
                f"{self.n_heads} does not divide model.d_model={self.d_model}; choose n_heads that divides d_model",
            )
        # settings that cannot change the model are refused: a sweep would train one model under several names
        if self.qk_norm != "none" and self.qk_norm_type == "no_norm":
            fail(("qk_norm", "qk_norm_type"), "qk_norm_type no_norm builds no QK-norm; set model.qk_norm: none")
        if self.block == "modern" and self.qkv_bias:
            fail(("block", "qkv_bias"), "the modern block has no biases; set model.qkv_bias false (or block gpt2)")
        self._validate_sites(fail)
        self._validate_placement(fail)

    def _validate_sites(self, fail) -> None:
        sites = [f"{site}_norm_type" for site in architecture.SITES if site != "final" or self.final_norm]
        if all(getattr(self, key) is not None for key in sites):
            fail(
                ("norm_type", *sites),
                f"{self.norm_type} is not built anywhere ({', '.join(f'model.{k}' for k in sites)} are all set); set "
                "model.norm_type to one of them and drop that key",
            )
        if not self.final_norm and self.final_norm_type is not None:
            fail("final_norm_type", "final_norm false builds no final norm; drop model.final_norm_type")
        if not self.final_norm and architecture.site_norm_type(self, "final") == "no_norm":
            fail(
                ("norm_type", "final_norm"), "final_norm false with a no_norm final norm builds the same model: drop it"
            )

    def _validate_placement(self, fail) -> None:
        placement = self.norm_placement
        unnormed = {architecture.site_norm_type(self, s) for s in ("attn", "mlp")} == {"no_norm"}
        if unnormed and placement != "pre":
            fail(
                ("norm_type", "norm_placement"),
                f"norm_placement {placement} with norm_type no_norm in every block builds the pre-norm no_norm model "
                "(no norm to place); train no_norm with norm_placement: pre (a sweep of its own)",
            )
        if placement != "mix" and self.mix_post_layers is not None:
            fail("mix_post_layers", f"applies to norm_placement mix only (this is {placement}); drop it")
        if placement == "mix" and self.mix_post_layers is not None:
            k, n = self.mix_post_layers, self.n_layers
            same = {0: "pre", n: "post"}.get(k) if k <= n else None
            if k > n:
                fail("mix_post_layers", f"{k} is more than model.n_layers={n}; choose 1 to {n - 1} (null: {n // 4})")
            if same is not None:
                fail(
                    ("norm_placement", "mix_post_layers"),
                    f"{k} of {n} post-norm blocks builds the {same}-norm model; set norm_placement: {same}, or "
                    "model.mix_post_layers from 1 to n_layers - 1 (a model of 2 layers or more)",
                )
        if self.norm_depth_scaling != "none":
            why = (
                f"norm_placement {placement}'s norms write the residual stream itself: LayerNorm Scaling scales a "
                "sublayer's input or output; use pre, peri or reordered"
                if placement in ("post", "mix")
                else "no block has a norm to scale"
                if unnormed
                else "a model of one layer scales by 1 / sqrt(1): the same model as none"
                if self.n_layers == 1
                else None
            )
            if why is not None:
                fail(("norm_placement", "norm_depth_scaling"), f"{self.norm_depth_scaling}: {why}")

    @classmethod
    def upgrade(cls, data: dict) -> dict:
        """A model section in today's words (``architecture.upgrade``: the one reading of older keys), with
        ``size`` (a rung of ``gpt.config.sizes``) applied: its n_layers, d_model and n_heads."""
        return _unread_norm_params(architecture.upgrade(sized(data)))


def _unread_norm_params(data: dict) -> dict:
    """A norm parameter no built norm reads (model.derf_alpha_init in a LayerNorm model) reads as its default: it
    cannot change the model, so a sweep that sets it for every norm type trains each other type once, not under two
    configs. The parameters are the registry's (one registered at run time included) or, before it loads, its
    source's."""
    registry = sys.modules.get("gpt.model.norms")
    params = (
        {name: tuple(p.name for p in norm.params) for name, norm in registry.NORMS.items()}
        if registry is not None
        else NORM_PARAMS
    )
    norm_type = data.get("norm_type", architecture.BY_KEY["norm_type"].default)
    built = {data.get(f"{site}_norm_type") or norm_type for site in architecture.SITES}
    if data.get("qk_norm", "none") != "none":
        built.add(data.get("qk_norm_type", architecture.BY_KEY["qk_norm_type"].default))
    read = {key for name in built if isinstance(name, str) for key in params.get(name, ())}
    return {k: v for k, v in data.items() if k in read or not any(k in keys for keys in params.values())}


_CHOICES = {architecture.NORM_TYPES: _NormTypeChoices(), architecture.SIZES: tuple(SIZES)}

# The network, one field per option of the architecture spec. Defaults are GPT-2 small as the write-up trained it.
ModelConfig = make_dataclass(
    "ModelConfig",
    [
        (o.key, o.type, opt(o.default, o.doc, choices=_CHOICES.get(o.choices, o.choices), **o.bounds))
        for o in architecture.OPTIONS
    ],
    bases=(ModelRules,),
)
ModelConfig.__module__ = __name__  # where pickle and reprs find it
ModelConfig.__doc__ = "The network: one field per option of ``gpt.config.architecture``. Defaults: GPT-2 small."


@dataclass
class DataConfig:
    """Where the tokens come from, and which token ranges serve as validation and test."""

    path: str | None = opt(
        None, "folder of a prepared token set (scripts/prepare_data.py) or of the author's <split>.safetensors files"
    )
    hub_repo: str | None = opt(
        None, "Hub data set of pre-tokenised splits, fetched into the local cache (instead of data.path)"
    )
    hub_revision: str | None = opt(None, "branch, tag or commit of data.hub_repo; null: main")
    train_split: str = opt("train", "split trained on")
    val_split: str = opt("val", "split of the validation loss measured during training (the author's sets: validation)")
    val_offset: int = opt(0, "first token of the validation range", ge=0)
    val_tokens: int = opt(4_194_304, "tokens in the validation range: the same tokens at every evaluation", ge=1)
    test_split: str = opt("test", "split of the held-out test loss (the author's evaluator: validation)")
    test_offset: int = opt(0, "first token of the test range (the author's evaluator: 50,000,000)", ge=0)
    test_tokens: int | None = opt(None, "tokens in the test range; null: to the end of the split", ge=1)
    shuffle: bool = opt(True, "read training sequences in an order shuffled by train.seed")

    def validate(self, fail) -> None:
        if self.path is not None and self.hub_repo is not None:
            fail("hub_repo", "set data.path or data.hub_repo, not both")
        if self.train_split in (self.val_split, self.test_split):
            fail(
                "train_split",
                f"{quoted(self.train_split)} is also the validation or test split; held-out tokens must not be "
                "trained on",
            )
        if self.val_split == self.test_split:
            test_end = math.inf if self.test_tokens is None else self.test_offset + self.test_tokens
            if self.val_offset < test_end and self.test_offset < self.val_offset + self.val_tokens:
                fail(
                    "test_offset",
                    f"the test range [{self.test_offset:,}, {test_end:,}) of split "
                    f"{quoted(self.test_split)} overlaps the validation range [{self.val_offset:,}, "
                    f"{self.val_offset + self.val_tokens:,}); move one of them",
                )


@dataclass
class OptimConfig:
    """The optimizer and the learning rate. Defaults: the write-up's run (AdamW)."""

    name: str = opt(
        "adamw",
        "adamw: AdamW on every parameter (the write-up); muon: torch.optim.Muon on the blocks' 2-D weight matrices "
        "(attention and MLP projections), AdamW on the rest (embeddings, head, norms, biases), as the Muon papers "
        "and the nanoGPT speedrun",
        choices=OPTIMIZERS,
    )
    lr: float = opt(1.4e-3, "peak learning rate, reached at the end of warmup (AdamW's, under muon too)", gt=0)
    min_lr: float = opt(1.4e-4, "floor of the cosine decay", ge=0)
    warmup_frac: float = opt(
        0.05,
        "fraction of the steps in linear warmup: step s < W = round(warmup_frac x "
        "steps) takes lr x (s + 1) / W, so the first step uses lr / W and step W - 1 the peak",
        ge=0,
        le=1,
    )
    schedule: str = opt(
        "cosine",
        "after warmup: cosine to min_lr, constant, or wsd (stable, then linear "
        "decay to min_lr over the last decay_frac)",
        choices=SCHEDULES,
    )
    decay_frac: float = opt(0.2, "wsd only: fraction of the steps spent in the final decay", ge=0, le=1)
    weight_decay: float = opt(0.1, "AdamW weight decay", ge=0)
    decay_norms_and_biases: bool = opt(
        True, "also decay norm weights and biases (the write-up's harness decayed every parameter)"
    )
    beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = opt(0.999, "AdamW beta2 (PyTorch's default)", ge=0, lt=1)
    eps: float = opt(1e-8, "AdamW eps", gt=0)
    grad_clip: float | None = opt(None, "clip the global gradient norm to this; null: no clipping", gt=0)
    muon_lr: float = opt(
        0.02,
        "optim.name muon: Muon's peak learning rate (Keller Jordan's Muon: 0.02); it follows the same schedule, "
        "x optim.min_lr / optim.lr at the floor",
        gt=0,
    )
    muon_momentum: float = opt(
        0.95, "optim.name muon: Muon's momentum (Nesterov), torch.optim.Muon's default", ge=0, lt=1
    )
    muon_adjust_lr: str = opt(
        "original",
        "optim.name muon: how Muon scales each matrix's rate: original: x sqrt(max(1, rows / cols)) (Keller "
        "Jordan's); match_rms_adamw: x 0.2 sqrt(max(rows, cols)) (Moonshot's, for AdamW's rates)",
        choices=("original", "match_rms_adamw"),
    )

    @classmethod
    def upgrade(cls, data: dict) -> dict:
        """Muon's keys under AdamW read as their defaults: they cannot change the run, so a sweep that sets them for
        every cell (``--lrs`` moves optim.muon_lr with the rate) trains each AdamW cell under one config."""
        if data.get("name", "adamw") == "adamw":
            return {k: v for k, v in data.items() if k not in MUON_KEYS}
        return data

    def validate(self, fail) -> None:
        if self.min_lr > self.lr:
            fail("min_lr", f"{self.min_lr} is above optim.lr={self.lr}; the floor must be <= the peak")
        if self.warmup_frac >= 1:
            fail(
                "warmup_frac",
                f"{self.warmup_frac:g} leaves no steps after warmup, so the learning rate never "
                "decays; choose a fraction below 1 (the write-up: 0.05)",
            )
        if self.schedule == "wsd" and self.warmup_frac + self.decay_frac > 1:
            fail(
                ("warmup_frac", "decay_frac"),
                f"warmup_frac {self.warmup_frac:g} + decay_frac {self.decay_frac:g} "
                "is more than the whole run: the decay would start inside the warmup and the learning rate jump; "
                "keep their sum <= 1",
            )


STOP_ON = ("resid_rms", "attn_logit_max", "nonfinite")  # train.stop_on's choices (gpt.training.inside)


@dataclass
class TrainConfig:
    """How long and how big. Batches are in sequences of model.context_length tokens."""

    seed: int = opt(
        0, "seed of every random draw (initial weights unless model.init_seed, data order)", ge=0,
        le=architecture.SEED_MAX,
    )  # fmt: skip
    micro_batch_size: int = opt(12, "sequences per rank per forward pass", ge=1)
    global_batch_size: int = opt(96, "sequences per optimizer step over all ranks (the write-up: 8 GPUs x 12)", ge=1)
    tokens: int | None = opt(None, "train for this many tokens (set one of tokens / steps / tokens_per_param)", ge=1)
    steps: int | None = opt(None, "train for this many optimizer steps", ge=1)
    tokens_per_param: float | None = opt(
        None,
        "train for this many tokens per parameter outside the norm "
        "layers (20: Chinchilla-optimal); the same length for every norm type",
        gt=0,
    )
    precision: str = opt(
        "auto",
        "fp32, bf16 (autocast), fp16 (autocast + grad scaling, the write-up), or "
        "auto: bf16 on a GPU that has it, else fp32",
        choices=("auto",) + PRECISIONS,
    )
    compile: bool | None = opt(None, "wrap the model in torch.compile; null: on a CUDA GPU, off on the CPU")
    tf32: bool = opt(True, "CUDA: fp32 matmuls in TF32 (the parts autocast leaves in fp32); no effect on the CPU")
    prefetch: bool = opt(
        True, "read the next step's batches in a background thread while this step runs (into pinned memory on CUDA)"
    )
    eval_every: int = opt(500, "measure the validation loss every this many steps (and at the end)", ge=1)
    checkpoint_every: int | None = opt(
        None,
        "write a checkpoint every this many steps (and at the end); null: sized to the run, about 10 at "
        "multiples of eval_every; a new best between checkpoints keeps its weights only",
        ge=1,
    )
    keep_last: int = opt(2, "checkpoints kept besides the best one", ge=1)
    max_nonfinite_steps: int = opt(
        25,
        "stop as diverged after this many consecutive steps with a "
        "non-finite loss or gradient (each one's update is skipped)",
        ge=1,
    )
    loss_ceiling: float | None = opt(
        None, "stop as diverged when the train loss exceeds this after warmup; null: no ceiling", gt=0
    )
    stop_on: list[str] = opt(
        [],
        "stop as diverged on the early warning of these statistics (log.stats_every): resid_rms, "
        "attn_logit_max, nonfinite (any statistic not finite); []: warnings are only said",
    )

    def split_problem(self, processes: int, what: str = "processes") -> str | None:
        """Why global_batch_size does not split into micro-batches over ``processes`` ranks, or None."""
        if self.global_batch_size % (self.micro_batch_size * processes) == 0:
            return None
        fits = [n for n in range(1, self.global_batch_size // self.micro_batch_size + 1)
                if self.global_batch_size % (self.micro_batch_size * n) == 0]  # fmt: skip
        return (
            f"train.global_batch_size {self.global_batch_size} is not a multiple of train.micro_batch_size "
            f"{self.micro_batch_size} x {processes} {what}; choose a global batch divisible by "
            f"{self.micro_batch_size * processes}, or {what} that split it: {' '.join(map(str, fits))}"
        )

    def validate(self, fail) -> None:
        for name in self.stop_on:
            if name not in STOP_ON:
                fail("stop_on", f"{name!r} is not a statistic it can stop on (allowed: {', '.join(STOP_ON)})")
        if self.global_batch_size % self.micro_batch_size:
            fail(
                "global_batch_size",
                f"{self.global_batch_size} is not a multiple of train.micro_batch_size={self.micro_batch_size}",
            )
        lengths = [k for k in ("tokens", "steps", "tokens_per_param") if getattr(self, k) is not None]
        if not lengths:
            fail("steps", "missing required value: set one of train.tokens, train.steps, train.tokens_per_param")
        if len(lengths) > 1:
            fail(
                tuple(lengths),
                f"set only one of train.tokens, train.steps, train.tokens_per_param "
                f"(got {', '.join('train.' + k for k in lengths)}; set the others to null)",
            )


@dataclass
class RunConfig:
    """Identity and location of the run."""

    name: str = opt(REQUIRED, "name of the run; its directory is runs/<name> unless run.dir is set")
    dir: str | None = opt(None, "run directory; null: runs/<run.name>")
    device: str = opt("auto", "auto (cuda when available), cuda or cpu", choices=("auto", "cuda", "cpu"))

    def validate(self, fail) -> None:
        if self.name in ("", ".", "..") or any(c in self.name for c in "/\\\0"):
            fail(
                "name",
                f"{quoted(self.name)} is not a run name: one non-empty folder name without / (the run's "
                "folder is runs/<name>; set run.dir for another place)",
            )
        if self.dir is not None and not self.dir.strip():
            fail("dir", "empty: give a folder, or null for runs/<run.name>")


@dataclass
class LogConfig:
    """Where metrics go."""

    log_every: int = opt(10, "log metrics every this many steps (the only steps that wait for the GPU)", ge=1)
    progress: bool = opt(True, "show a progress bar on rank 0")
    wandb: bool = opt(False, "also log to Weights & Biases")
    wandb_project: str = opt("gpt2-norms", "W&B project")
    wandb_entity: str | None = opt(None, "W&B entity (user or team); null: your default")
    tags: list[str] = opt([], "extra W&B tags (the norm type and seed are always added)")
    stats_every: int = opt(
        100,
        "every this many steps, what each norm does inside the model into stats.jsonl (residual RMS, norm "
        "outputs, attention logits, per-block gradients and update ratios; docs/training.md); 0: off",
        ge=0,
    )
    stats_warn_growth: float = opt(
        10.0,
        "early warning when a block's residual RMS or attention-logit max grows past this many times its "
        "smallest value over the last log.stats_warn_window stats steps (train.stop_on makes it stop the run)",
        gt=1,
    )
    stats_warn_window: int = opt(
        5, "stats steps the early warning looks back over, from the first one (warmup included)", ge=1
    )


@dataclass
class HubConfig:
    """Hugging Face Hub upload."""

    repo_id: str | None = opt(
        None,
        "Hub repository to publish to, as user/name: a completed run's final model "
        "goes to its main branch with the model card; null: no upload",
    )
    private: bool = opt(True, "create the repository as private")
    push_every_checkpoint: bool = opt(
        False,
        "also upload every checkpoint, each to a branch named after it "
        "(step-00001000), from a background thread training never waits for",
    )
    wait_on_exit_s: float = opt(
        60.0,
        "after a stop signal, wait at most this long for queued uploads (a "
        "cluster's grace period before SIGKILL is often 30-120 s); what is left is "
        "recorded and uploaded first by the resumed run",
        ge=0,
    )

    def validate(self, fail) -> None:
        if self.repo_id is not None and (self.repo_id.count("/") != 1 or not all(self.repo_id.split("/"))):
            fail("repo_id", f"{quoted(self.repo_id)} is not a Hub repository name: user/name (or organisation/name)")
        if self.push_every_checkpoint and self.repo_id is None:
            fail("push_every_checkpoint", "true, but hub.repo_id is null: name the repository to upload to")


@dataclass
class Config:
    """A whole run: one field per section. Built by ``gpt.config.load_config``, validated once."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    log: LogConfig = field(default_factory=LogConfig)
    hub: HubConfig = field(default_factory=HubConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir if self.run.dir is not None else f"runs/{self.run.name}")

    @property
    def init_seed(self) -> int:
        return self.model.init_seed if self.model.init_seed is not None else self.train.seed

    @property
    def tokens_per_step(self) -> int:
        return self.train.global_batch_size * self.model.context_length

    def validate(self, fail) -> None:
        if self.optim.name == "muon" and self.train.precision == "fp16":
            fail(
                ("optim.name", "train.precision"),
                "muon with fp16: the grad scaler steps torch optimizers only; use train.precision bf16, fp32 or "
                "auto with Muon, or optim.name adamw with fp16",
            )
        stop_on, every = self.train.stop_on, self.log.stats_every
        if stop_on and every == 0:
            fail(
                ("train.stop_on", "log.stats_every"),
                "train.stop_on acts on the statistics log.stats_every measures, and log.stats_every is 0 (off): "
                "set log.stats_every (e.g. 10) or drop train.stop_on",
            )
        steps = self.train.steps
        if self.train.tokens is not None:
            steps = math.ceil(self.train.tokens / self.tokens_per_step)
        unmeasured = self.stop_on_problem(steps) if steps is not None else None
        if unmeasured:
            fail(("train.stop_on", "log.stats_every"), unmeasured)

    def stop_on_problem(self, steps: int) -> str | None:
        """Why train.stop_on would never fire in a run of ``steps`` steps (no statistics measured in it), or None.
        With train.tokens_per_param the steps are known once the model is built: the trainer asks then."""
        every = self.log.stats_every
        if not self.train.stop_on or every <= steps:
            return None
        return (
            f"log.stats_every {every} is more than the run's {steps} steps: nothing is measured, so "
            f"train.stop_on never fires; set log.stats_every <= {steps} or drop train.stop_on"
        )

    def total_steps(self, n_params: int) -> int:
        """Optimizer steps of the run: train.steps, or enough steps for train.tokens or
        train.tokens_per_param x n_params tokens (rounded up). ``n_params`` is the model's count
        outside its norm layers (``GPT.num_params(norms=False)``), so that every norm type of
        one config trains the same steps on the same tokens."""
        t = self.train
        if t.steps is not None:
            return t.steps
        tokens = t.tokens if t.tokens is not None else t.tokens_per_param * n_params
        return math.ceil(tokens / self.tokens_per_step)
