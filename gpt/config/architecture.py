"""The model's options, each declared once: the architecture spec.

Every field of ``model:`` in a config (``ModelConfig``) is one ``Option`` in ``OPTIONS``: its key, type,
choices and bounds, default and doc line (the schema builds ``ModelConfig`` from these), how a published
``config.json`` carries it (its key there, or why it is not exported), the value a config written before it
existed reads as, which values a native GPT-2 export accepts, and its words in the model card and the run's
summary. Everything that used to keep a list of its own reads it from here: the schema and
docs/configuration.md, the Hub export and the published model's loader (``to_hub`` / ``from_hub``), the
GPT-2 conversion's guard (``gpt2_mismatch``), the card and the dry run's summary (``phrases``, ``words``).

This file is shipped to the Hub beside the model's own files (the published wrapper reads ``config.json``
through ``from_hub``), so it imports the standard library only. Choices declared elsewhere are named, not
copied: ``NORM_TYPES`` (the norm registry, ``gpt.model.norms``) and ``SIZES`` (``gpt.config.sizes``); the
schema resolves the names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SEED_MAX = 2**32 - 1  # a seed numpy's and Python's generators both take

NORM_TYPES = "norm types"  # choices: the norm registry's names (gpt.model.norms)
SIZES = "sizes"  # choices: the size ladder's names (gpt.config.sizes)


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()  # Option.before: a config written before the option existed reads as its default


@dataclass(frozen=True)
class Option:
    """One model option. ``words`` and ``phrase`` take the value and the whole model config."""

    key: str  # model.<key>, and the attribute the model reads
    type: Any  # the field's type: int, float, bool, str, or with | None
    default: Any
    doc: str  # one line: docs/configuration.md and train.py --help-config
    choices: tuple[str, ...] | str | None = None  # allowed values, or the name of a list declared elsewhere
    bounds: Mapping[str, float] = field(default_factory=dict)  # ge, gt, le, lt
    hub: str | None = None  # its key in a published config.json; None: not exported (``why_not``)
    why_not: str = ""  # why a published model does not need it (an exported option has none)
    before: Any = DEFAULT  # what a saved or published config without the key reads as: the model it built
    gpt2: tuple | None = None  # the values transformers' GPT2LMHeadModel computes; None: any
    words: Callable[[Any, Any], str | None] | None = None  # its clause in the card's Model section
    phrase: Callable[[Any, Any], str | None] | None = None  # short, where not GPT-2's: card title, run summary

    def __post_init__(self) -> None:
        if (self.hub is None) == (not self.why_not):
            raise ValueError(f"option {self.key}: give its config.json key (hub=) or why it is not exported")


# what a placement and QK-norm are, in the card's words
_PLACED = {
    "pre": "pre-norm (each block: x + f(norm(x)), as GPT-2)",
    "post": "post-norm (each block: norm(x + f(x)), as the original Transformer)",
    "peri": "peri-norm (each block: x + norm(f(norm(x))), a norm before and after each sublayer)",
    "reordered": "reordered norm (each block: x + norm(f(x)), OLMo 2's: a norm on each sublayer's output only)",
    "mix": "Mix-LN (post-norm, norm(x + f(x)), in the first {}; pre-norm, x + f(norm(x)), in the rest)",
}
SITES = ("attn", "mlp", "final")  # where a norm type of its own may sit: model.<site>_norm_type
MIX_POST_FRACTION = 0.25  # Mix-LN's share of post-norm blocks (arXiv 2412.13795), rounded down


def site_norm_type(m: Any, site: str) -> str:
    """The norm type at ``site`` (attn, mlp, final) of model config ``m``: its own where set, else model.norm_type
    (gpt.model.gpt has the model's copy of this rule: the shipped model imports no config)."""
    return getattr(m, f"{site}_norm_type", None) or m.norm_type


def norm_label(m: Any) -> str:
    """What a comparison compares for model config ``m`` (an object, or a mapping by our keys): its norm type, then
    ``+site:type`` for each site with a norm type of its own (``pytorch_rmsnorm+mlp:handrolled_layernorm``), so a
    model's norms at every site are one value of one axis."""
    own = [(site, _get(m, f"{site}_norm_type", None)) for site in SITES]
    return "+".join([_get(m, "norm_type", None), *(f"{site}:{t}" for site, t in own if t is not None)])


def label_keys(label: str) -> dict[str, str]:
    """The model keys a ``norm_label`` stands for: ``{"norm_type": ..., "<site>_norm_type": ...}``; ValueError for
    a label not of that form (the names themselves are the registry's to check)."""
    first, *sites = label.split("+")
    keys = {"norm_type": first}
    for part in sites:
        site, _, name = part.partition(":")
        if site not in SITES or not name or f"{site}_norm_type" in keys:
            raise ValueError(f"{label!r}: after the norm type, each +SITE:NORM_TYPE names one of {', '.join(SITES)}")
        keys[f"{site}_norm_type"] = name
    return keys


def mix_post_default(n_layers: int) -> int:
    """Mix-LN's post-norm blocks of a model ``n_layers`` deep: floor(0.25 x n_layers), the paper's."""
    return int(MIX_POST_FRACTION * n_layers)


def _sited(site: str) -> str:
    return {"attn": "at attention (ln_1, and peri's ln_1_out)", "mlp": "at the MLP (ln_2, and peri's ln_2_out)",
            "final": "before the head (ln_f)"}[site]  # fmt: skip


def _site_option(site: str) -> Option:
    return Option(
        f"{site}_norm_type",
        str | None,
        None,
        f"the norm type {_sited(site)}; null: model.norm_type. One that equals model.norm_type reads as null",
        choices=NORM_TYPES,
        hub=f"{site}_norm_type",
        before=None,
        gpt2=(None, "pytorch_layernorm", "handrolled_layernorm", "handrolled_layernorm_fast"),
        words=lambda v, m: None if v is None else f"`{v}` {_sited(site)}",
        phrase=lambda v, m: None if v is None else f"{site} {v}",
    )


_QK = {
    "none": "no QK-norm",
    "head": "QK-norm: `{}` over each head's queries and keys, one weight shared by the heads",
    "full": "QK-norm: `{}` over the whole query and key projections, before the split into heads",
}
_NO_TRAINING = "a published model is for inference: it trains no more"
_WEIGHTS = "how the initial weights were drawn: the published weights are the trained ones"

OPTIONS: tuple[Option, ...] = (
    Option("vocab_size", int, 50257, "tokens in the vocabulary (GPT-2 BPE: 50257)", bounds={"ge": 1},
           hub="vocab_size"),
    Option("context_length", int, 1024, "longest sequence; size of the learned position table", bounds={"ge": 1},
           hub="n_positions"),
    Option("d_model", int, 768, "width of the residual stream", bounds={"ge": 1}, hub="n_embd"),
    Option("n_layers", int, 12, "transformer blocks", bounds={"ge": 1}, hub="n_layer"),
    Option("n_heads", int, 12, "attention heads per block; must divide d_model", bounds={"ge": 1}, hub="n_head"),
    Option(
        "size", str | None, None,
        "a named size of the ladder (gpt.config.sizes: 1x64 ... 12x768 on the GPU, 1x16 ... 4x64 on the CPU): sets "
        "n_layers, d_model and n_heads to its own; null: the three as given",
        choices=SIZES, why_not="a name for n_layers, d_model and n_heads, which are exported",
    ),
    Option("dropout", float, 0.0, "dropout on embeddings, attention and residual branches",
           bounds={"ge": 0, "lt": 1}, why_not=_NO_TRAINING + " (no dropout)"),
    Option(
        "block", str, "gpt2",
        "the block's family, the norms aside: gpt2: learned positions, a GELU MLP 4 x d_model wide, biases (GPT-2); "
        "modern: rotary positions (RoPE, base 10,000) on the queries and keys, a SwiGLU MLP 8 x d_model / 3 wide "
        "(the same matrix weights), no bias in any linear layer (Llama's)",
        choices=("gpt2", "modern"), hub="block", before="gpt2", gpt2=("gpt2",),
        words=lambda v, m: "a Llama-style block: rotary positions, a SwiGLU MLP, no biases" if v == "modern" else None,
        phrase=lambda v, m: "modern block" if v == "modern" else None,
    ),
    Option("qkv_bias", bool, False, "bias on the Q/K/V projection (OpenAI GPT-2: true; write-up: false)",
           hub="qkv_bias", before=False),
    Option("tie_weights", bool, False, "share the token embedding with the output head (GPT-2: true)",
           hub="tie_word_embeddings"),
    Option("norm_type", str, "handrolled_layernorm", "normalisation layer built by make_norm", choices=NORM_TYPES,
           hub="norm_type",
           gpt2=("pytorch_layernorm", "handrolled_layernorm", "handrolled_layernorm_fast")),
    # the norm types' own parameters (gpt.model.norms.NormParam: the same name, default and doc)
    Option("norm_eps", float, 1e-5, "eps of every norm that has one (hand-rolled and PyTorch alike)",
           bounds={"gt": 0}, hub="norm_eps"),
    Option("dyt_alpha_init", float, 0.5, "initial alpha of the dyt norm", bounds={"gt": 0}, hub="dyt_alpha_init"),
    Option("derf_alpha_init", float, 0.5, "initial alpha of the derf norm (the Derf paper's: 0.5)", bounds={"gt": 0},
           hub="derf_alpha_init"),
    Option("derf_shift_init", float, 0.0, "initial shift s of the derf norm (the Derf paper's: 0)",
           hub="derf_shift_init"),
    *(_site_option(site) for site in SITES),
    Option(
        "norm_placement", str, "pre",
        "where each block's norms sit: pre: x + f(ln(x)) (GPT-2); post: ln(x + f(x)) (the original Transformer); "
        "peri: x + ln_out(f(ln(x))) (Peri-LN: a norm before and after each sublayer, ln_1_out / ln_2_out); "
        "reordered: x + ln(f(x)) (OLMo 2: the norm on each sublayer's output, none on its input); mix: post in the "
        "first model.mix_post_layers blocks, pre in the rest (Mix-LN)",
        choices=("pre", "post", "peri", "reordered", "mix"), hub="norm_placement", before="pre", gpt2=("pre",),
        words=lambda v, m: _PLACED[v].format(f"{m.mix_post_layers} block{'' if m.mix_post_layers == 1 else 's'}"),
        phrase=lambda v, m: None
        if v == "pre"
        else f"mix-norm ({m.mix_post_layers} post)"
        if v == "mix"
        else f"{v}-norm",
    ),
    Option(
        "mix_post_layers", int | None, None,
        "norm_placement mix only: the first this many blocks are post-norm, the rest pre-norm; null: floor(0.25 x "
        "n_layers), the Mix-LN paper's share (a config stores the number it reads as)",
        bounds={"ge": 0}, hub="mix_post_layers", before=None,
    ),
    Option(
        "norm_depth_scaling", str, "none",
        "inverse_sqrt: each block norm's output times 1 / sqrt(l), l the block's depth from 1 (LayerNorm Scaling, "
        "arXiv 2502.05795), under pre, peri or reordered; a constant of the architecture, in no state dict; none",
        choices=("none", "inverse_sqrt"), hub="norm_depth_scaling", before="none", gpt2=("none",),
        words=lambda v, m: "each block's norms scaled by 1 / sqrt(depth) (LayerNorm Scaling)"
        if v == "inverse_sqrt" else None,
        phrase=lambda v, m: "LayerNorm Scaling" if v == "inverse_sqrt" else None,
    ),
    Option(
        "final_norm", bool, True,
        "the norm ln_f before the output head (GPT-2's; false: the head reads the last block's output, as in the "
        "original post-LN Transformer)",
        hub="final_norm", before=True, gpt2=(True,),
        words=lambda v, m: "a norm before the head" if v else "none before the head",
        phrase=lambda v, m: None if v else "no final norm",
    ),
    Option(
        "qk_norm", str, "none",
        "QK-norm, a norm of model.qk_norm_type over the queries and keys before their dot product (keys cached "
        "normalised): head: over each head's d_model / n_heads features, one weight shared by the heads (Qwen3, "
        "Gemma 3); full: over the whole d_model-wide projection before the split into heads (OLMo 2); none. "
        "true in a config written before, reads as head with qk_norm_type = model.norm_type (what it built)",
        choices=("none", "head", "full"), hub="qk_norm", before="none", gpt2=("none",),
        words=lambda v, m: _QK[v].format(m.qk_norm_type),
        phrase=lambda v, m: None if v == "none" else f"QK-norm ({v}, {m.qk_norm_type})",
    ),
    Option(
        "qk_norm_type", str, "pytorch_rmsnorm",
        "the norm type of QK-norm (the literature's: RMSNorm), any registered norm type but no_norm",
        choices=NORM_TYPES, hub="qk_norm_type", before="pytorch_rmsnorm",
    ),
    Option(
        "norm_compute_dtype", str, "float32",
        "the dtype a norm computes in under autocast: float32: every norm computes in fp32 and returns its input's "
        "dtype, so hand-rolled and PyTorch norms (which autocast runs in fp32) see the same input; input: its "
        "input's (bf16 for peri's and reordered's output norms and QK-norm, where hand-rolled norms then take their "
        "statistics in bf16). Pre, post and mix without QK-norm read the fp32 residual stream: there the two are the "
        "same model",
        choices=("input", "float32"), hub="norm_compute_dtype", before="input",
        words=lambda v, m: "every norm computes in its input's dtype (bf16 where a matmul wrote it)"
        if v == "input" else None,
        phrase=lambda v, m: "norms in their input dtype" if v == "input" else None,
    ),
    Option(
        "init", str, "pytorch",
        "pytorch: PyTorch's default init (the write-up); "
        "gpt2: normal(0, 0.02), residual projections / sqrt(2 * n_layers)",
        choices=("pytorch", "gpt2"), why_not=_WEIGHTS,
    ),
    Option("init_seed", int | None, None, "seed of the initial weights; null: use train.seed",
           bounds={"ge": 0, "le": SEED_MAX},
           why_not=_WEIGHTS),
    Option(
        "vocab_pad_multiple", int, 1,
        "pad the output head to a multiple of this many rows (64: faster "
        "matmuls; padded logits are dropped before the loss, never predicted); 1: none",
        bounds={"ge": 1}, why_not="the export leaves the padding rows behind (the model's vocab_size rows only)",
    ),
)  # fmt: skip

BY_KEY: dict[str, Option] = {o.key: o for o in OPTIONS}
NOT_EXPORTED: dict[str, str] = {o.key: o.why_not for o in OPTIONS if o.hub is None}  # key -> why


def choices(key: str) -> tuple[str, ...]:
    """The choices of an option that lists its own."""
    listed = BY_KEY[key].choices
    if not isinstance(listed, tuple):
        raise ValueError(f"model.{key}'s choices are declared elsewhere ({listed})")
    return listed


# --------------------------------------------------------------------------- old configs


def upgrade(data: Mapping) -> dict:
    """A model section (or a published config.json's keys, by our names) as written before its keys changed, in
    today's words with the same meaning; the one place old formats are read:

    - ``qk_norm: true`` was a head-wise QK-norm of model.norm_type, ``false`` none;
    - ``norm_compute_dtype: input`` (the default before float32) where every norm reads the fp32 residual stream
      (pre or post, no QK-norm) is float32: the same bits, so such runs stay comparable with today's."""
    data = dict(data)
    if isinstance(data.get("qk_norm"), bool):
        if data.pop("qk_norm"):
            data["qk_norm"] = "head"
            data.setdefault("qk_norm_type", data.get("norm_type", BY_KEY["norm_type"].default))
        else:
            data["qk_norm"] = "none"
    moot = data.get("norm_placement", "pre") in ("pre", "post", "mix") and data.get("qk_norm", "none") == "none"
    if moot and data.get("norm_compute_dtype") == "input":
        data["norm_compute_dtype"] = "float32"
    return canonical(data)


def canonical(data: dict) -> dict:
    """One spelling per model, so that no two labels build one (a sweep would train it twice): a site's norm type
    equal to model.norm_type reads as null, QK-norm's type without a QK-norm as the default, and Mix-LN's null count
    as the number it stands for."""
    if data.get("qk_norm", "none") == "none" and "qk_norm_type" in data:
        data["qk_norm_type"] = BY_KEY["qk_norm_type"].default
    norm_type = data.get("norm_type", BY_KEY["norm_type"].default)
    for site in SITES:
        if data.get(f"{site}_norm_type") == norm_type:
            data[f"{site}_norm_type"] = None
    layers = data.get("n_layers", BY_KEY["n_layers"].default)
    if data.get("norm_placement") == "mix" and data.get("mix_post_layers") is None and isinstance(layers, int):
        data["mix_post_layers"] = mix_post_default(layers)
    return data


def as_built(data: Mapping) -> tuple[dict, list[str]]:
    """A model section (in today's words, ``upgrade``) of a model already trained, with the settings that cannot
    change what it builds read as what it built, and a line for each. New configs refuse these settings (a sweep
    would train one model under two names: ``ModelConfig.validate``), but a run folder or a published model
    written before the refusal must still load: no_norm has no norm to place, finalise or put in QK-norm."""
    data, notes = upgrade(data), []

    def read(key: str, value: Any, why: str) -> None:
        was = str(data[key]).lower() if isinstance(data[key], bool) else data[key]
        now = str(value).lower() if isinstance(value, bool) else value
        notes.append(f"model.{key} {was} {why}: read as {key} {now}, the model it built")
        data[key] = value

    if data.get("qk_norm", "none") != "none" and data.get("qk_norm_type") == "no_norm":
        read("qk_norm", "none", "with qk_norm_type no_norm builds no QK-norm")
    if data.get("norm_type") == "no_norm":
        if data.get("norm_placement", "pre") != "pre":
            read("norm_placement", "pre", "with norm_type no_norm builds the pre-norm no_norm model (no norm to place)")
        if data.get("final_norm", True) is False:
            read("final_norm", True, "with norm_type no_norm builds the same model (no final norm either way)")
    return data, notes


# --------------------------------------------------------------------------- a published config.json


def _get(config: Any, key: str, absent: Any) -> Any:
    return config.get(key, absent) if isinstance(config, Mapping) else getattr(config, key, absent)


def to_hub(m: Any) -> dict:
    """The exported options of model config ``m`` under their config.json keys."""
    return {o.hub: getattr(m, o.key) for o in OPTIONS if o.hub is not None}


def from_hub(config: Any) -> dict:
    """Every exported option by our key, from a published config.json (a mapping, or an object with its keys as
    attributes: a transformers config); a key a model was published without reads as ``before``, the model it
    built. The options not exported take their defaults, except what a published model always is: no vocabulary
    padding, no dropout."""
    missing = object()
    given = {o.key: _get(config, o.hub, missing) for o in OPTIONS if o.hub is not None}
    given = upgrade({k: v for k, v in given.items() if v is not missing})  # in today's words, before any is filled
    absent = {o.key: o.default if o.before is DEFAULT or o.hub is None else o.before for o in OPTIONS}
    return as_built({**absent, **given, "vocab_pad_multiple": 1, "dropout": 0.0})[0]


# --------------------------------------------------------------------------- GPT-2, the card


def gpt2_mismatch(m: Any) -> str | None:
    """What of model config ``m`` transformers' GPT2LMHeadModel cannot compute, in one line (each option and
    the values GPT-2 has); None where it computes this model."""
    wrong = [
        f"model.{o.key} {_said(getattr(m, o.key))} (GPT-2: {' or '.join(_said(v) for v in o.gpt2)})"
        for o in OPTIONS
        if o.gpt2 is not None and getattr(m, o.key) not in o.gpt2
    ]
    return f"GPT2LMHeadModel cannot compute this model: {', '.join(wrong)}" if wrong else None


def _said(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def phrases(m: Any) -> list[str]:
    """The short words of every option of ``m`` that is not GPT-2's own (the card's title, the run's summary)."""
    return [w for o in OPTIONS if o.phrase is not None for w in [o.phrase(getattr(m, o.key), m)] if w]


def words(m: Any) -> list[str]:
    """The clause of every option of ``m`` that has one (the card's Model section)."""
    return [w for o in OPTIONS if o.words is not None for w in [o.words(getattr(m, o.key), m)] if w]
