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
    Where a gradient is wanted, ``TokenLoss`` computes the same numbers without keeping a
    float32 copy of the logits for the backward pass.
    """
    logits, targets = logits.flatten(0, 1), targets.flatten()  # (N, V), (N,)
    if torch.is_grad_enabled() and logits.requires_grad:
        losses = TokenLoss.apply(logits, targets)
        return losses.mean() if reduction == "mean" else losses
    # float32 for the softmax even under autocast: the loss is what we compare
    return F.cross_entropy(logits.float(), targets, reduction=reduction)


CHUNK_ELEMENTS = 2**25  # logits converted to float32 at a time: 128 MiB, whatever the batch


class TokenLoss(torch.autograd.Function):
    """Per-token cross-entropy (N,) of logits (N, V) in float32, for the backward pass keeping only the
    logits as they came (bf16 under autocast: half the bytes) and one log-sum-exp per token.

    ``F.cross_entropy(logits.float())`` keeps its float32 log-softmax, (N, V), until backward: 2.3 GiB
    at 12 x 1024 tokens x 50,257 (and the float32 copy besides, while it runs). Here rows are taken a
    chunk at a time (``CHUNK_ELEMENTS``): forward, the same log-softmax as F.cross_entropy's;
    backward, (softmax - one_hot(target)) x the incoming gradient, the softmax recomputed from the
    kept logits. The losses are F.cross_entropy's; the gradients agree with its to float32 rounding.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        losses = logits.new_empty(n, dtype=torch.float32)
        lse = logits.new_empty(n, dtype=torch.float32)  # log-sum-exp of each row, for the backward pass
        for rows in _chunks(logits):
            x = logits[rows].float()  # (rows, V)
            losses[rows] = -torch.log_softmax(x, dim=-1).gather(1, targets[rows, None]).squeeze(1)
            lse[rows] = torch.logsumexp(x, dim=-1)
        ctx.save_for_backward(logits, targets, lse)
        return losses

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # grad (N,): d total / d loss of each token
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        for rows in _chunks(logits):
            p = torch.exp(logits[rows].float() - lse[rows, None])  # softmax (rows, V)
            p.scatter_add_(1, targets[rows, None], -torch.ones_like(p[:, :1]))  # - one_hot(target)
            out[rows] = p * grad[rows, None]
        return out, None


def _chunks(logits: torch.Tensor) -> list[slice]:
    """Row ranges of about ``CHUNK_ELEMENTS`` logits each; under torch.compile one: inductor fuses the float32
    upcast into its kernels and never makes the copy the chunks bound, while every chunk would be unrolled into
    the graph (19 at GPT-2 small's micro-batch of 12: a third more forward nodes)."""
    n, v = logits.shape
    if torch.compiler.is_compiling():
        return [slice(0, n)]
    step = max(1, CHUNK_ELEMENTS // max(v, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]
