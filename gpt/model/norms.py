"""Normalisation layers, their registry, and the one factory every norm of the model comes from: ``make_norm(cfg)``.

Each norm type is declared once, as a ``NormType`` in the registry at the end of this file (its
name, builder, module types, own parameters with defaults and docs); ``NORM_TYPES``,
``NORM_MODULES``, ``NORM_PARAMS`` and ``make_norm`` derive from it, and so do the config's choices
(read from this file's source). A norm parameter is also an option of the architecture spec
(``gpt.config.architecture``: the config key and the Hub export; a test holds the two equal). This
file is shipped verbatim to the Hub beside the weights (``gpt.publish.layouts``), so it imports torch
and the standard library only.

All layers here map ``(..., D) -> (..., D)`` and act on the last dimension only.
Their parameters are called ``weight`` (scale) and ``bias`` (shift), as in
``nn.LayerNorm`` / ``nn.RMSNorm``, so a hand-rolled and a PyTorch norm of the same
family have interchangeable state dicts: only the implementation differs.

No layer here draws random numbers at construction (ones / zeros / a constant), and
the model re-initialises every non-norm parameter from its own seeded generator
anyway (see ``gpt.model.gpt``), so the choice of norm cannot shift any other weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class NormParam:
    """A hyper-parameter of a norm type: the config key ``model.<name>``, read by ``make_norm``."""

    name: str  # the config key (gpt.config.schema.ModelConfig has a field of this name)
    default: float
    doc: str  # one line, the config field's doc
    arg: str  # the builder's keyword argument it is passed as


# The parameters of the types registered below (several types share one, as eps).
EPS = NormParam("norm_eps", 1e-5, "eps of every norm that has one (hand-rolled and PyTorch alike)", "eps")
DYT_ALPHA = NormParam("dyt_alpha_init", 0.5, "initial alpha of the dyt norm", "alpha_init")
DERF_ALPHA = NormParam("derf_alpha_init", 0.5, "initial alpha of the derf norm (the Derf paper's: 0.5)", "alpha_init")
DERF_SHIFT = NormParam("derf_shift_init", 0.0, "initial shift s of the derf norm (the Derf paper's: 0)", "shift_init")

# A squashing norm (DyT, Derf) is "saturated" where its function is within 3.6% of its asymptote: tanh past
# |u| > 2 (tanh(2) = 0.964), erf past the u where erf reaches the same height (the statistics probe reads these).
FLAT = math.tanh(2.0)


# --------------------------------------------------------------------------- layers


class LayerNorm(nn.Module):
    """The textbook LayerNorm (as in Raschka's book, used by the write-up).

    mean and biased variance (correction=0, like GPT-2 and ``nn.LayerNorm``), then
    ``weight * (x - mean) / sqrt(var + eps) + bias``. The mean is computed twice
    (once here, once inside ``var``): that is the point of this baseline.
    """

    def __init__(self, dim: int, eps: float = EPS.default):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, correction=0)
        return self.weight * ((x - mean) / torch.sqrt(var + self.eps)) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class FastLayerNorm(LayerNorm):
    """Hand-rolled LayerNorm that reuses the re-centred vector for the variance.

    Same function as ``LayerNorm``; it saves the second mean and subtraction
    (the write-up's footnote 6).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        var = (centred * centred).mean(dim=-1, keepdim=True)
        return self.weight * (centred / torch.sqrt(var + self.eps)) + self.bias


class RMSNorm(nn.Module):
    """Hand-rolled RMSNorm: ``x / sqrt(mean(x**2) + eps) * weight``, no shift.

    eps sits inside the square root, as in ``nn.RMSNorm``, so both compute the same
    function.
    """

    def __init__(self, dim: int, eps: float = EPS.default):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt((x * x).mean(dim=-1, keepdim=True) + self.eps)
        return (x / rms) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class DyT(nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun, Liu, CVPR 2025): ``weight * tanh(alpha * x) + bias``.

    alpha is one learnable scalar shared by all features; it starts at ``alpha_init``.
    A normalisation-free replacement: no statistics over the vector are taken.
    """

    flat_beyond = 2.0  # tanh(u) is within 3.6% of +-1 past |u| > 2 (FLAT)

    def __init__(self, dim: int, alpha_init: float = DYT_ALPHA.default):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """What the squashing function reads (the statistics probe's saturation)."""
        return self.alpha * x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha.item():g}"


class Derf(nn.Module):
    """Dynamic erf (Chen, Lu, Zhu, Sun, Liu, arXiv 2512.10938): ``weight * erf(alpha * x + shift) + bias``.

    alpha and shift (the paper's s) are learnable scalars shared by all features, starting at the paper's 0.5
    and 0 (``alpha_init``, ``shift_init``); weight and bias are per feature, as DyT's. Like DyT it takes no
    statistics over the vector: a point-wise function, bounded by the erf's +-1.
    """

    flat_beyond = float(torch.special.erfinv(torch.tensor(FLAT, dtype=torch.float64)))  # erf(1.48) = tanh(2)

    def __init__(self, dim: int, alpha_init: float = DERF_ALPHA.default, shift_init: float = DERF_SHIFT.default):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.shift = nn.Parameter(torch.tensor(float(shift_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha.item():g}, shift_init={self.shift.item():g}"


def rmsnorm_noweight(dim: int, eps: float = EPS.default) -> nn.RMSNorm:
    """Parameter-free RMSNorm: ``x / sqrt(mean(x**2) + eps)``, nn.RMSNorm without its weight (marin's
    experiment; the nanoGPT speedrun's QK-norm)."""
    return nn.RMSNorm(dim, eps=eps, elementwise_affine=False)


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a config object (attribute) or a plain dict (item)."""
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class NormType:
    """One norm type, declared once: everything else (``NORM_TYPES``, ``NORM_MODULES``, the Hub
    export's config keys, the config schema's choices) derives from the registry of these."""

    name: str  # the value of model.norm_type
    build: Callable[..., nn.Module]  # build(dim, **{param.arg: value}) -> the layer
    doc: str  # one line: what it computes
    params: tuple[NormParam, ...] = ()
    modules: tuple[type[nn.Module], ...] = ()  # what build returns; () means build itself (a class)

    def __post_init__(self) -> None:
        if not self.modules:
            if not isinstance(self.build, type):
                raise ValueError(f"norm type {self.name!r}: name the module types its builder returns (modules=)")
            object.__setattr__(self, "modules", (self.build,))


NORMS: dict[str, NormType] = {}  # the registry: norm_type -> its declaration
NORM_TYPES: tuple[str, ...] = ()  # the registry's names, in order
NORM_MODULES: tuple[type[nn.Module], ...] = ()  # every module type make_norm can return
NORM_PARAMS: dict[str, NormParam] = {}  # every norm parameter by config key, as first declared


def register_norm(norm: NormType) -> NormType:
    """Add a norm type to the registry (a test may add one at run time; ``unregister_norm`` removes it)."""
    if norm.name in NORMS:
        raise ValueError(f"norm type {norm.name!r} is registered already")
    for p in norm.params:
        known = NORM_PARAMS.get(p.name)
        if known is not None and known != p:
            raise ValueError(f"norm parameter {p.name!r} of {norm.name!r} differs from the one declared as {known}")
    NORMS[norm.name] = norm
    _derive()
    return norm


def unregister_norm(name: str) -> None:
    del NORMS[name]
    _derive()


def _derive() -> None:
    """Rebuild what derives from the registry (module globals, read at call time by is_norm and make_norm)."""
    global NORM_TYPES, NORM_MODULES, NORM_PARAMS
    NORM_TYPES = tuple(NORMS)
    NORM_MODULES = tuple(dict.fromkeys(m for n in NORMS.values() for m in n.modules))
    NORM_PARAMS = {p.name: p for n in NORMS.values() for p in n.params}


# The norm types, in the write-up's order (a comparison's default baseline is the first one its runs hold).
for _norm in (
    NormType("handrolled_layernorm", LayerNorm, "the textbook LayerNorm, hand-rolled (the write-up's)", (EPS,)),
    NormType("pytorch_layernorm", nn.LayerNorm, "nn.LayerNorm (fused kernel)", (EPS,)),
    NormType("handrolled_rmsnorm", RMSNorm, "RMSNorm, hand-rolled: x / sqrt(mean(x^2) + eps) * weight", (EPS,)),
    NormType("pytorch_rmsnorm", nn.RMSNorm, "nn.RMSNorm", (EPS,)),
    NormType("no_norm", nn.Identity, "no normalisation: the identity, no parameters"),
    NormType("dyt", DyT, "Dynamic Tanh: weight * tanh(alpha * x) + bias, alpha learnable", (DYT_ALPHA,)),
    NormType("handrolled_layernorm_fast", FastLayerNorm, "hand-rolled LayerNorm re-using x - mean", (EPS,)),
    NormType(
        "derf",
        Derf,
        "Dynamic erf: weight * erf(alpha * x + shift) + bias, alpha and shift learnable",
        (DERF_ALPHA, DERF_SHIFT),
    ),
    NormType(
        "rmsnorm_noweight",
        rmsnorm_noweight,
        "parameter-free RMSNorm: x / sqrt(mean(x^2) + eps), no weight",
        (EPS,),
        modules=(nn.RMSNorm,),
    ),
):
    register_norm(_norm)


# --------------------------------------------------------------------------- using it


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a norm layer (of any registered type, those registered later included)."""
    return isinstance(module, NORM_MODULES)


def _param(cfg: Any, p: NormParam) -> Any:
    value = _cfg_get(cfg, p.name)
    return p.default if value is None else type(p.default)(value)


def make_norm(cfg: Any, dim: int | None = None, norm_type: str | None = None) -> nn.Module:
    """Build the norm layer named by ``cfg.norm_type`` (or ``cfg["norm_type"]``), or by ``norm_type`` where
    given (QK-norm's own type, ``model.qk_norm_type``).

    The width is ``dim`` where given (a head-wise QK-norm's is one head's, d_model / n_heads), else
    ``d_model`` (``emb_dim`` is accepted for the write-up's dict configs); each of the type's
    parameters is read by its config key (``norm_eps``, ``dyt_alpha_init``), its default where
    the config has none.
    """
    norm_type = norm_type or _cfg_get(cfg, "norm_type")
    if norm_type not in NORMS:
        raise ValueError(f"unknown norm_type {norm_type!r}; valid types: {', '.join(NORM_TYPES)}")
    dim = dim or _cfg_get(cfg, "d_model", None) or _cfg_get(cfg, "emb_dim")
    if dim is None:
        raise ValueError("make_norm needs the width as cfg d_model (or emb_dim)")
    norm = NORMS[norm_type]
    return norm.build(int(dim), **{p.arg: _param(cfg, p) for p in norm.params})
