"""AdamW with its weight-decay groups, and the update that is skipped when a gradient is not finite.

Fused AdamW is chosen because it can skip a whole update on a flag that stays on the
device, so the training loop never waits for the GPU to learn whether a step was bad.
"""

from __future__ import annotations

import torch

from gpt.config import OptimConfig


def decay_groups(model: torch.nn.Module, weight_decay: float, decay_norms_and_biases: bool) -> list[dict]:
    """AdamW parameter groups. Decaying everything is the write-up's choice; otherwise the common
    convention: parameters with fewer than two dimensions (norm scales and shifts, biases, DyT's
    scalar alpha) are not decayed, matrices (linear layers, embeddings) are."""
    params = list(model.parameters())
    if decay_norms_and_biases:
        return [{"params": params, "weight_decay": weight_decay}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def make_optimizer(model: torch.nn.Module, o: OptimConfig) -> torch.optim.AdamW:
    """Fused AdamW over ``model``'s parameters, as ``optim`` configures it."""
    groups = decay_groups(model, o.weight_decay, o.decay_norms_and_biases)
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def step_unless_nonfinite(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, grad_norm: torch.Tensor
) -> torch.Tensor:
    """Apply the update unless ``grad_norm`` is not finite; return that verdict as a device bool.

    Nothing here waits for the device. With fp16 the GradScaler skips on its own
    ``found_inf``, which a non-finite norm implies. Otherwise fused AdamW's hook for
    GradScaler is used directly: ``step()`` reads the optimizer attributes ``found_inf``
    (skip the whole update when 1.0, checked on the device) and ``grad_scale`` (None:
    gradients are already unscaled). They are set for this one call and removed after it.
    """
    bad = ~torch.isfinite(grad_norm)  # every rank agrees: the gradients are already all-reduced
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
        return bad
    optimizer.found_inf = bad.float()
    optimizer.grad_scale = None
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf, optimizer.grad_scale
    return bad
