"""The size axis: named model sizes, declared once, each a (n_layers, d_model, n_heads) of the ladder it belongs to.

A rung is named ``<n_layers>x<d_model>``. Both ladders keep a fixed aspect ratio, d_model / n_layers, and a fixed
head width, so that only the scale changes along them:

- the GPU ladder, GPT-2 small's own shape (768 / 12 = 64 wide per layer, 64 per head), from 1x64 up to 12x768,
  which *is* GPT-2 small;
- the CPU ladder (16 per layer, 16 per head), 1x16 up to 4x64, small enough that a laptop trains a whole
  study of it in minutes on a byte-level vocabulary (docs/studies.md).

``model.size: NAME`` in a config (or ``sweep.py --sizes NAME ...``) sets the three keys to its rung's. Every
other key stays the config's: the run's length follows from ``train.tokens_per_param`` x its parameters, so that
each size trains by the same rule. ``SIZE_KEYS`` are the keys runs of different sizes may differ in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    n_layers: int
    d_model: int
    n_heads: int

    @property
    def name(self) -> str:
        return f"{self.n_layers}x{self.d_model}"

    def settings(self) -> dict[str, int]:
        """The model keys the size sets (``model.<key>``)."""
        return {"n_layers": self.n_layers, "d_model": self.d_model, "n_heads": self.n_heads}


def ladder(width_per_layer: int, head_width: int, layers: tuple[int, ...]) -> list[Size]:
    """Rungs at one aspect ratio (d_model = width_per_layer x n_layers) and one head width."""
    return [Size(n, n * width_per_layer, n * width_per_layer // head_width) for n in layers]


LADDERS = {
    "gpu": ladder(64, 64, (1, 2, 3, 4, 6, 8, 10, 12)),  # 12x768: GPT-2 small
    "cpu": ladder(16, 16, (1, 2, 3, 4)),
}
SIZES = {s.name: s for rungs in LADDERS.values() for s in rungs}
SIZE_KEY = "model.size"
SIZE_KEYS = (SIZE_KEY, *(f"model.{k}" for k in Size(1, 1, 1).settings()))  # what only a size may change


def mixed_shapes(names: list[str]) -> str | None:
    """Why ``names`` (rungs) are not one ladder, or None: a fit across sizes of several aspect ratios mixes the
    shape's effect on the loss with the size's."""
    shapes: dict[int, list[str]] = {}
    for name in (n for n in names if n in SIZES):
        size = SIZES[name]
        shapes.setdefault(size.d_model // size.n_layers, []).append(name)
    if len(shapes) < 2:
        return None
    return (
        "the sizes mix aspect ratios ("
        + "; ".join(f"d_model/n_layers {ratio}: {' '.join(rungs)}" for ratio, rungs in shapes.items())
        + "): one curve across them mixes the shape's effect with the size's"
    )


def sized(model: dict) -> dict:
    """A model section with its ``size`` (if it names a rung) applied: n_layers, d_model and n_heads the rung's."""
    size = SIZES.get(model.get("size")) if isinstance(model.get("size"), str) else None
    return model if size is None else {**model, **size.settings()}
