"""Typed run configuration: dataclasses loaded from YAML, validated once, at start.

A config file is YAML with one mapping per section (``model``, ``data``, ``optim``,
``train``, ``run``, ``log``, ``hub``). ``extends: base.yaml`` (a path relative to the
file) inherits another file, deep-merged; ``--set section.key=value`` overrides on the
command line (values parsed as YAML scalars). Every field is declared once, below, with
``opt(default, doc, constraints...)``: adding a field is adding one line.

Every mistake a user can make stops here with a one-line ``ConfigError`` that names the
file (or ``--set``), the key and what is allowed, before any model is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpt.errors import UserError
from gpt.norms import NORM_TYPES
from gpt.schedule import SCHEDULES


class ConfigError(UserError):
    """A mistake in a config file or override."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # default of a field the user must set


def opt(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None,
        choices: tuple[str, ...] | None = None) -> Any:
    """Declare a config field: default, one-line doc, and the allowed values."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- sections

@dataclass
class ModelConfig:
    """The network. Defaults are GPT-2 small as the write-up trained it."""

    vocab_size: int = opt(50257, "tokens in the vocabulary (GPT-2 BPE: 50257)", ge=1)
    context_length: int = opt(1024, "longest sequence; size of the learned position table", ge=1)
    d_model: int = opt(768, "width of the residual stream", ge=1)
    n_layers: int = opt(12, "transformer blocks", ge=1)
    n_heads: int = opt(12, "attention heads per block; must divide d_model", ge=1)
    dropout: float = opt(0.0, "dropout on embeddings, attention and residual branches", ge=0, lt=1)
    qkv_bias: bool = opt(False, "bias on the Q/K/V projection (OpenAI GPT-2: true; write-up: false)")
    tie_weights: bool = opt(False, "share the token embedding with the output head (GPT-2: true)")
    norm_type: str = opt("handrolled_layernorm", "normalisation layer built by make_norm",
                         choices=NORM_TYPES)
    norm_eps: float = opt(1e-5, "eps of every norm that has one (hand-rolled and PyTorch alike)", gt=0)
    dyt_alpha_init: float = opt(0.5, "initial alpha of the dyt norm", gt=0)
    init: str = opt("pytorch", "pytorch: PyTorch's default init (the write-up); "
                    "gpt2: normal(0, 0.02), residual projections / sqrt(2 * n_layers)",
                    choices=("pytorch", "gpt2"))
    init_seed: int | None = opt(None, "seed of the initial weights; null: use train.seed", ge=0)

    def validate(self, fail) -> None:
        if self.d_model % self.n_heads:
            fail("n_heads", f"{self.n_heads} does not divide model.d_model={self.d_model}; "
                            "choose n_heads that divides d_model")


@dataclass
class DataConfig:
    """Where the tokens come from, and which token ranges serve as validation and test."""

    path: str | None = opt(None, "folder of a prepared token set (scripts/prepare_data.py) or of "
                           "the author's <split>.safetensors files")
    hub_repo: str | None = opt(None, "Hub data set of pre-tokenised splits, fetched into the local cache "
                               "(instead of data.path)")
    hub_revision: str | None = opt(None, "branch, tag or commit of data.hub_repo; null: main")
    train_split: str = opt("train", "split trained on")
    val_split: str = opt("val", "split of the validation loss measured during training "
                         "(the author's sets: validation)")
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
            fail("train_split", f"{self.train_split!r} is also the validation or test split; "
                                "held-out tokens must not be trained on")
        if self.val_split == self.test_split:
            test_end = math.inf if self.test_tokens is None else self.test_offset + self.test_tokens
            if self.val_offset < test_end and self.test_offset < self.val_offset + self.val_tokens:
                fail("test_offset", f"the test range [{self.test_offset:,}, {test_end:,}) of split "
                     f"{self.test_split!r} overlaps the validation range [{self.val_offset:,}, "
                     f"{self.val_offset + self.val_tokens:,}); move one of them")


@dataclass
class OptimConfig:
    """AdamW and the learning rate. Defaults: the write-up's run."""

    lr: float = opt(1.4e-3, "peak learning rate, reached at the end of warmup", gt=0)
    min_lr: float = opt(1.4e-4, "floor of the cosine decay", ge=0)
    warmup_frac: float = opt(0.05, "fraction of the steps spent in linear warmup from 0", ge=0, le=1)
    schedule: str = opt("cosine", "after warmup: cosine to min_lr, constant, or wsd (stable, then linear "
                        "decay to min_lr over the last decay_frac)", choices=SCHEDULES)
    decay_frac: float = opt(0.2, "wsd only: fraction of the steps spent in the final decay", ge=0, le=1)
    weight_decay: float = opt(0.1, "AdamW weight decay", ge=0)
    decay_norms_and_biases: bool = opt(True, "also decay norm weights and biases "
                                       "(the write-up's harness decayed every parameter)")
    beta1: float = opt(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = opt(0.999, "AdamW beta2 (PyTorch's default)", ge=0, lt=1)
    eps: float = opt(1e-8, "AdamW eps", gt=0)
    grad_clip: float | None = opt(None, "clip the global gradient norm to this; null: no clipping", gt=0)

    def validate(self, fail) -> None:
        if self.min_lr > self.lr:
            fail("min_lr", f"{self.min_lr} is above optim.lr={self.lr}; the floor must be <= the peak")


@dataclass
class TrainConfig:
    """How long and how big. Batches are in sequences of model.context_length tokens."""

    seed: int = opt(0, "seed of every random draw (initial weights unless model.init_seed, data order)", ge=0)
    micro_batch_size: int = opt(12, "sequences per rank per forward pass", ge=1)
    global_batch_size: int = opt(96, "sequences per optimizer step over all ranks "
                                 "(the write-up: 8 GPUs x 12)", ge=1)
    tokens: int | None = opt(None, "train for this many tokens (set one of tokens / steps / tokens_per_param)", ge=1)
    steps: int | None = opt(None, "train for this many optimizer steps", ge=1)
    tokens_per_param: float | None = opt(None, "train for this many tokens per parameter "
                                         "(20: Chinchilla-optimal)", gt=0)
    precision: str = opt("fp32", "fp32, bf16 (autocast) or fp16 (autocast + grad scaling, the write-up)",
                         choices=("fp32", "bf16", "fp16"))
    compile: bool = opt(False, "wrap the model in torch.compile")
    eval_every: int = opt(500, "measure the validation loss every this many steps (and at the end)", ge=1)
    checkpoint_every: int = opt(617, "write a checkpoint every this many steps (and at the end)", ge=1)
    keep_last: int = opt(2, "checkpoints kept besides the best one", ge=1)
    max_nonfinite_steps: int = opt(25, "stop as diverged after this many consecutive steps with a "
                                   "non-finite loss or gradient (each one's update is skipped)", ge=1)
    loss_ceiling: float | None = opt(None, "stop as diverged when the train loss exceeds this after warmup; "
                                     "null: no ceiling", gt=0)

    def validate(self, fail) -> None:
        if self.global_batch_size % self.micro_batch_size:
            fail("global_batch_size", f"{self.global_batch_size} is not a multiple of "
                 f"train.micro_batch_size={self.micro_batch_size}")
        lengths = [k for k in ("tokens", "steps", "tokens_per_param") if getattr(self, k) is not None]
        if not lengths:
            fail("steps", "missing required value: set one of train.tokens, train.steps, "
                          "train.tokens_per_param")
        if len(lengths) > 1:
            fail(tuple(lengths), f"set only one of train.tokens, train.steps, train.tokens_per_param "
                                 f"(got {', '.join('train.' + k for k in lengths)}; set the others to null)")


@dataclass
class RunConfig:
    """Identity and location of the run."""

    name: str = opt(REQUIRED, "name of the run; its directory is runs/<name> unless run.dir is set")
    dir: str | None = opt(None, "run directory; null: runs/<run.name>")
    device: str = opt("auto", "auto (cuda when available), cuda or cpu", choices=("auto", "cuda", "cpu"))


@dataclass
class LogConfig:
    """Where metrics go."""

    log_every: int = opt(10, "log metrics every this many steps (the only steps that wait for the GPU)", ge=1)
    progress: bool = opt(True, "show a progress bar on rank 0")
    wandb: bool = opt(False, "also log to Weights & Biases")
    wandb_project: str = opt("gpt2-norms", "W&B project")
    wandb_entity: str | None = opt(None, "W&B entity (user or team); null: your default")
    tags: list[str] = opt([], "extra W&B tags (the norm type and seed are always added)")


@dataclass
class HubConfig:
    """Hugging Face Hub upload."""

    repo_id: str | None = opt(None, "Hub repository to upload to, as user/name")
    private: bool = opt(True, "create the repository as private")


@dataclass
class Config:
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

    def total_steps(self, n_params: int) -> int:
        """Optimizer steps of the run: train.steps, or enough steps for train.tokens or
        train.tokens_per_param x n_params tokens (rounded up)."""
        t = self.train
        if t.steps is not None:
            return t.steps
        tokens = t.tokens if t.tokens is not None else t.tokens_per_param * n_params
        return math.ceil(tokens / self.tokens_per_step)


# ---------------------------------------------------------------------------- reading

OVERRIDE = "--set"  # the "file" named for keys that came from the command line


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of sections, got {type(data).__name__}")
    return data


def _leaves(data: dict, prefix: str = ""):
    """Dotted keys of every leaf (non-mapping value, or empty mapping) of ``data``."""
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _leaves(v, key + ".")
        else:
            yield key


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``top`` replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """The merged mapping of ``path`` and its ``extends`` chain, and which file set each key."""
    real = path.resolve()
    if real in seen:
        chain = " -> ".join(str(p) for p in (*seen, real))
        raise ConfigError(f"{path}: extends: circular inheritance ({chain})")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    raw: dict = {}
    sources: dict[str, str] = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a relative path (str), got {parent!r}")
        parent_path = path.parent / parent
        if not parent_path.is_file():
            raise ConfigError(f"{path}: extends: {parent}: no such file (looked at {parent_path})")
        raw, sources = _load_raw(parent_path, (*seen, real))
    for key in _leaves(data):
        _set_source(sources, key, str(path))
    return _merge(raw, data), sources


def _set_source(sources: dict[str, str], key: str, source: str) -> None:
    """Record who set ``key``; the dict's order stays the order in which keys were last set."""
    sources.pop(key, None)
    sources[key] = source


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.norm_type=pytorch_rmsnorm"`` -> (["model", "norm_type"], "pytorch_rmsnorm")."""
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(f"{OVERRIDE}: expected SECTION.KEY=VALUE (e.g. model.norm_type=pytorch_rmsnorm), got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"{OVERRIDE}: {key}: {value!r} is not a YAML scalar") from None
    return parts, parsed


def _apply_override(raw: dict, parts: list[str], value: Any) -> None:
    node = raw
    for i, p in enumerate(parts[:-1]):
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{OVERRIDE}: {'.'.join(parts)}: {'.'.join(parts[:i + 1])} is not a section")
        node = child
    node[parts[-1]] = value


# ------------------------------------------------------------------------- validation

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


_NO = object()  # "does not fit this type"


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp``, or ``_NO``. Ints are accepted as floats, and so are
    strings like ``1e-5`` (PyYAML reads an exponent without a dot as a string)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            out = _coerce(arg, value)
            if out is not _NO:
                return out
        return _NO
    if origin is list:
        if not isinstance(value, list):
            return _NO
        items = [_coerce(typing.get_args(tp)[0], v) for v in value]
        return _NO if any(i is _NO for i in items) else items
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                return _NO
            return out if math.isfinite(out) else _NO
        return _NO
    if tp is str:
        return value if isinstance(value, str) else _NO
    raise TypeError(f"config field type {tp!r} is not supported")


def _check_range(value: Any, meta: dict) -> str | None:
    """What is wrong with ``value`` given the field's constraints, or None."""
    if value is None:
        return None
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"{value!r} is not one of: {', '.join(meta['choices'])}"
    for op, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                         ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        bound = meta[op]
        if bound is not None and not ok(value, bound):
            return f"{value!r} is out of range; allowed: {word} {bound:g}"
    return None


def _build(cls: type, data: Any, prefix: str, sources: dict[str, str], root: str) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, checking keys, types and ranges."""
    where = prefix.rstrip(".") or "top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{sources.get(prefix.rstrip('.'), root)}: {where}: expected a mapping of keys, "
                          f"got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            dotted = f"{prefix}{key}"
            src = sources.get(dotted) or next((s for k, s in sources.items() if k.startswith(dotted + ".")), root)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean '{prefix}{close[0]}'? " if close else ""
            raise ConfigError(f"{src}: {dotted}: unknown key; {hint}valid keys in {where}: {', '.join(names)}")

    def fail(name: str | tuple[str, ...], message: str):
        """Stop at key ``name``; of several keys, the one set last (where the clash was made)."""
        if isinstance(name, tuple):
            order = list(sources)
            name = max(name, key=lambda n: order.index(prefix + n) if prefix + n in order else -1)
        raise ConfigError(f"{sources.get(prefix + name, root)}: {prefix}{name}: {message}")

    values = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            values[f.name] = _build(tp, data.get(f.name, {}), f"{prefix}{f.name}.", sources, root)
            continue
        if f.name not in data:
            if f.default is REQUIRED:
                fail(f.name, f"missing required value ({f.metadata['doc']})")
            continue
        value = _coerce(tp, data[f.name])
        if value is _NO:
            fail(f.name, f"expected {_type_name(tp)}, got {data[f.name]!r}")
        problem = _check_range(value, f.metadata)
        if problem:
            fail(f.name, problem)
        values[f.name] = value
    obj = cls(**values)
    if hasattr(obj, "validate"):
        obj.validate(fail)
    return obj


# ------------------------------------------------------------------------- public API

def config_from_dict(data: dict, source: str = "<dict>") -> Config:
    """Validate a plain mapping (as read from YAML) into a ``Config``."""
    return _build(Config, data, "", {k: source for k in _leaves(data)}, source)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (following ``extends``), apply ``--set`` overrides, validate."""
    path = Path(path)
    raw, sources = _load_raw(path)
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(raw, parts, value)
        _set_source(sources, ".".join(parts), OVERRIDE)
    return _build(Config, raw, "", sources, str(path))


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config) -> str:
    """The fully resolved config as YAML; ``load_config`` of it gives an equal Config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def describe_fields() -> str:
    """Every config key with its type, default and doc (``train.py --help-config``)."""
    lines = []
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        lines.append(f"{section.name}:  # {cls.__doc__.strip()}")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            extra = f" (one of: {', '.join(f.metadata['choices'])})" if f.metadata["choices"] else ""
            lines.append(f"  {f.name}: {default!r}  # {_type_name(hints[f.name])}{extra}; {f.metadata['doc']}")
    return "\n".join(lines)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The arguments every entry point shares: CONFIG and repeated --set KEY=VALUE."""
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set model.norm_type=pytorch_rmsnorm "
                             "(repeatable; values are YAML scalars)")


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.config, args.overrides)
