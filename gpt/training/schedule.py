"""Learning rate as a pure function of the step, so a resumed run needs no scheduler state.

Every schedule shares the warmup: linear over the first ``W = round(warmup_frac * total_steps)``
steps, step ``s`` (0-based) taking ``lr * (s + 1) / W``: the first update uses ``lr / W``, never 0
(an update at lr 0 would be a wasted step), and step ``W - 1`` the peak. After it, the shape:

- ``cosine``: cosine decay from ``lr`` at step ``W`` to ``min_lr`` at the last step (the
  write-up: 5%, 1.4e-3 -> 1.4e-4).
- ``constant``: ``lr``.
- ``wsd`` (warmup-stable-decay): ``lr`` until the last ``decay_frac`` of the steps, then linear
  decay to ``min_lr``.

A new schedule is one function and its entry in ``SHAPES`` (its name a literal: ``gpt.config.SCHEDULES``,
which checks configs without importing this, reads the keys from this file's source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """What every shape needs to know: the run's length, its warmup, and the two rates."""

    total_steps: int
    warmup: int
    lr: float
    min_lr: float
    decay_frac: float


def cosine(step: int, p: Plan) -> float:
    last = max(p.total_steps - 1, 1)
    progress = min((step - p.warmup) / max(last - p.warmup, 1), 1.0)
    return p.min_lr + 0.5 * (p.lr - p.min_lr) * (1 + math.cos(math.pi * progress))


def constant(step: int, p: Plan) -> float:
    return p.lr


def wsd(step: int, p: Plan) -> float:
    decay_start = p.total_steps - round(p.decay_frac * p.total_steps)
    if step < decay_start:
        return p.lr
    progress = min((step - decay_start + 1) / max(p.total_steps - decay_start, 1), 1.0)
    return p.lr + (p.min_lr - p.lr) * progress


# schedule name -> the learning rate of a step past the warmup. The keys are the valid schedules.
SHAPES = {"cosine": cosine, "constant": constant, "wsd": wsd}
SCHEDULES = tuple(SHAPES)


def warmup_steps(total_steps: int, warmup_frac: float) -> int:
    return round(warmup_frac * total_steps)


def lr_at(
    step: int,
    total_steps: int,
    *,
    lr: float,
    min_lr: float,
    warmup_frac: float,
    schedule: str = "cosine",
    decay_frac: float = 0.2,
) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``."""
    if schedule not in SHAPES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    warmup = warmup_steps(total_steps, warmup_frac)
    if step < warmup:
        return lr * (step + 1) / warmup  # reaches lr at the last warmup step, never 0
    return SHAPES[schedule](step, Plan(total_steps, warmup, lr, min_lr, decay_frac))
