"""The token-level loss and the autocast choice: one definition for training, validation and test.

The model's forward pass, the trainer and the evaluator all score tokens with
``cross_entropy`` (always in float32, whatever autocast computed the logits in) under the
context ``autocast_for(precision, device)`` gives, so a loss means the same thing
everywhere it is reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

PRECISIONS = ("fp32", "bf16", "fp16")  # what autocast_for knows; gpt.config.PRECISIONS names the same


def autocast_for(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A context-manager factory: autocast to bf16 / fp16, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy of logits (B, T, V) against targets (B, T), computed in float32.

    ``reduction``: ``mean`` over all B * T tokens (the training loss), or ``none`` for one
    loss per token, flattened to (B * T,) (the evaluator sums those in float64).
    """
    # float32 for the softmax even under autocast: the loss is what we compare
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)
