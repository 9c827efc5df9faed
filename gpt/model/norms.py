"""Normalisation layers and the one factory every block calls: ``make_norm(cfg)``.

All layers here map ``(..., D) -> (..., D)`` and act on the last dimension only.
Their parameters are called ``weight`` (scale) and ``bias`` (shift), as in
``nn.LayerNorm`` / ``nn.RMSNorm``, so a hand-rolled and a PyTorch norm of the same
family have interchangeable state dicts: only the implementation differs.

No layer here draws random numbers at construction (ones / zeros / a constant), and
the model re-initialises every non-norm parameter from its own seeded generator
anyway (see ``gpt.model.gpt``), so the choice of norm cannot shift any other weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

DEFAULT_EPS = 1e-5
DEFAULT_DYT_ALPHA = 0.5


class LayerNorm(nn.Module):
    """The textbook LayerNorm (as in Raschka's book, used by the write-up).

    mean and biased variance (correction=0, like GPT-2 and ``nn.LayerNorm``), then
    ``weight * (x - mean) / sqrt(var + eps) + bias``. The mean is computed twice
    (once here, once inside ``var``): that is the point of this baseline.
    """

    def __init__(self, dim: int, eps: float = DEFAULT_EPS):
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

    def __init__(self, dim: int, eps: float = DEFAULT_EPS):
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

    def __init__(self, dim: int, alpha_init: float = DEFAULT_DYT_ALPHA):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha.item():g}"


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a config object (attribute) or a plain dict (item)."""
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


# norm_type -> builder(dim, cfg). The keys are the only valid norm types.
_BUILDERS: dict[str, Callable[[int, Any], nn.Module]] = {
    "handrolled_layernorm": lambda d, c: LayerNorm(d, eps=_eps(c)),
    "pytorch_layernorm": lambda d, c: nn.LayerNorm(d, eps=_eps(c)),
    "handrolled_rmsnorm": lambda d, c: RMSNorm(d, eps=_eps(c)),
    "pytorch_rmsnorm": lambda d, c: nn.RMSNorm(d, eps=_eps(c), elementwise_affine=True),
    "no_norm": lambda d, c: nn.Identity(),
    "dyt": lambda d, c: DyT(d, alpha_init=_cfg_get(c, "dyt_alpha_init", DEFAULT_DYT_ALPHA)),
    "handrolled_layernorm_fast": lambda d, c: FastLayerNorm(d, eps=_eps(c)),
}

NORM_TYPES: tuple[str, ...] = tuple(_BUILDERS)

# Every module type make_norm can return: how the model (and the optimizer's
# weight-decay grouping) recognises a norm layer.
NORM_MODULES: tuple[type[nn.Module], ...] = (
    LayerNorm,
    RMSNorm,
    DyT,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.Identity,
)


def _eps(cfg: Any) -> float:
    return float(_cfg_get(cfg, "norm_eps", DEFAULT_EPS))


def make_norm(cfg: Any) -> nn.Module:
    """Build the norm layer named by ``cfg.norm_type`` (or ``cfg["norm_type"]``).

    The width is ``d_model`` (``emb_dim`` is accepted for the write-up's dict
    configs); eps is ``norm_eps`` (default 1e-5) for every type that has one.
    """
    norm_type = _cfg_get(cfg, "norm_type")
    if norm_type not in _BUILDERS:
        raise ValueError(f"unknown norm_type {norm_type!r}; valid types: {', '.join(NORM_TYPES)}")
    dim = _cfg_get(cfg, "d_model", None) or _cfg_get(cfg, "emb_dim")
    if dim is None:
        raise ValueError("make_norm needs the width as cfg d_model (or emb_dim)")
    return _BUILDERS[norm_type](int(dim), cfg)
