"""Learning rate as a pure function of the step, so a resumed run needs no scheduler state.

- ``cosine``: linear warmup over the first ``W = round(warmup_frac * total_steps)`` steps,
  step ``s`` (0-based) taking ``lr * (s + 1) / W``: the first update uses ``lr / W``, never 0
  (an update at lr 0 would be a wasted step), and step ``W - 1`` the peak; then cosine decay
  from ``lr`` at step ``W`` to ``min_lr`` at the last step (the write-up: 5%, 1.4e-3 -> 1.4e-4).
- ``constant``: the same warmup, then ``lr``.
- ``wsd`` (warmup-stable-decay): the same warmup, ``lr`` until the last ``decay_frac``
  of the steps, then linear decay to ``min_lr``.
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "constant", "wsd")


def warmup_steps(total_steps: int, warmup_frac: float) -> int:
    return round(warmup_frac * total_steps)


def lr_at(step: int, total_steps: int, *, lr: float, min_lr: float, warmup_frac: float,
          schedule: str = "cosine", decay_frac: float = 0.2) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``."""
    warmup = warmup_steps(total_steps, warmup_frac)
    if step < warmup:
        return lr * (step + 1) / warmup  # reaches lr at the last warmup step, never 0
    if schedule == "constant":
        return lr
    last = max(total_steps - 1, 1)
    if schedule == "cosine":
        progress = min((step - warmup) / max(last - warmup, 1), 1.0)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_start = total_steps - round(decay_frac * total_steps)
        if step < decay_start:
            return lr
        progress = min((step - decay_start + 1) / max(total_steps - decay_start, 1), 1.0)
        return lr + (min_lr - lr) * progress
    raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
