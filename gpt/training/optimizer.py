"""The optimizer (``optim.name``): AdamW with its weight-decay groups, or Muon on the blocks' matrices with AdamW on
the rest; and the update that is skipped when a gradient is not finite.

Fused AdamW is chosen because it can skip a whole update on a flag that stays on the
device, so the training loop never waits for the GPU to learn whether a step was bad.

Muon is PyTorch's own ``torch.optim.Muon`` (momentum, then Newton-Schulz orthogonalisation of each matrix's update),
applied where the Muon papers and the nanoGPT speedrun apply it: the 2-D weight matrices inside the blocks
(attention's and the MLP's projections). Everything else, the embeddings, the output head, every norm parameter and
every bias, is AdamW's (``muon_split``). Under DDP every rank orthogonalises every matrix on the same all-reduced
gradient: the same update everywhere, computed redundantly (a sharded Muon would split that work; at GPT-2 small's
85M matrix weights it is a few per cent of a step).
"""

from __future__ import annotations

import torch

from gpt.config import OptimConfig


def decay_groups(params: list[torch.nn.Parameter], weight_decay: float, decay_norms_and_biases: bool) -> list[dict]:
    """AdamW parameter groups. Decaying everything is the write-up's choice; otherwise the common
    convention: parameters with fewer than two dimensions (norm scales and shifts, biases, DyT's
    scalar alpha) are not decayed, matrices (linear layers, embeddings) are."""
    if decay_norms_and_biases:
        return [{"params": params, "weight_decay": weight_decay}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def muon_split(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The names of the parameters Muon updates (the blocks' 2-D weight matrices that are not a norm's) and of
    those AdamW updates (the rest: embeddings, head, norms, biases), each in the model's order, a tied weight once."""
    norms = model.norm_parameter_names()
    muon, adamw = [], []
    for name, p in model.named_parameters():
        matrix = p.dim() == 2 and name.startswith("blocks.") and name not in norms
        (muon if matrix else adamw).append(name)
    return muon, adamw


class MuonWithAdamW:
    """``torch.optim.Muon`` on ``muon``'s parameters, fused AdamW on ``adamw``'s, stepped, zeroed, saved and loaded
    as one optimizer. Muon's groups carry ``lr_ratio`` (optim.muon_lr / optim.lr): ``set_lr`` moves both along one
    schedule."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def make_optimizer(model: torch.nn.Module, o: OptimConfig) -> torch.optim.AdamW | MuonWithAdamW:
    """The optimizer ``optim`` configures over ``model``'s parameters: fused AdamW over all of them, or (optim.name
    muon) ``MuonWithAdamW`` over ``muon_split``'s two sets."""
    named = dict(model.named_parameters())
    if o.name == "adamw":
        groups = decay_groups(list(named.values()), o.weight_decay, o.decay_norms_and_biases)
        return _adamw(groups, o)
    muon_names, adamw_names = muon_split(model)
    muon = torch.optim.Muon(
        [named[n] for n in muon_names],
        lr=o.muon_lr,
        weight_decay=o.weight_decay,
        momentum=o.muon_momentum,
        nesterov=True,
        adjust_lr_fn=o.muon_adjust_lr,
    )
    for group in muon.param_groups:
        group["lr_ratio"] = o.muon_lr / o.lr
    adamw = _adamw(decay_groups([named[n] for n in adamw_names], o.weight_decay, o.decay_norms_and_biases), o)
    return MuonWithAdamW(muon, adamw)


def _adamw(groups: list[dict], o: OptimConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True)


def split_record(model: torch.nn.Module, o: OptimConfig) -> dict:
    """What each optimizer updates, for the run's summary and its account: names and weights per optimizer."""
    if o.name == "adamw":
        return {"name": "adamw"}
    named = dict(model.named_parameters())
    muon, adamw = muon_split(model)
    return {
        "name": "muon",
        "muon": {"tensors": len(muon), "weights": sum(named[n].numel() for n in muon), "names": muon},
        "adamw": {"tensors": len(adamw), "weights": sum(named[n].numel() for n in adamw), "names": adamw},
    }


def set_lr(optimizer, lr: float) -> None:
    """The schedule's rate ``lr`` on every group; a Muon group takes it times its ``lr_ratio``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_ratio", 1.0)


def step_unless_nonfinite(optimizer, scaler: torch.amp.GradScaler, grad_norm: torch.Tensor) -> torch.Tensor:
    """Apply the update unless ``grad_norm`` is not finite; return that verdict as a device bool.

    Nothing here waits for the device under AdamW. With fp16 the GradScaler skips on its own
    ``found_inf``, which a non-finite norm implies. Otherwise fused AdamW's hook for
    GradScaler is used directly: ``step()`` reads the optimizer attributes ``found_inf``
    (skip the whole update when 1.0, checked on the device) and ``grad_scale`` (None:
    gradients are already unscaled). They are set for this one call and removed after it.
    Muon has no such hook: its half reads the verdict back (one wait per step) and steps only when finite.
    """
    bad = ~torch.isfinite(grad_norm)  # every rank agrees: the gradients are already all-reduced
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
        return bad
    adamw = optimizer.adamw if isinstance(optimizer, MuonWithAdamW) else optimizer
    if adamw is not optimizer and not bool(bad):
        optimizer.muon.step()
    adamw.found_inf = bad.float()
    adamw.grad_scale = None
    try:
        adamw.step()
    finally:
        del adamw.found_inf, adamw.grad_scale
    return bad


def optimizer_line(o: OptimConfig, model: torch.nn.Module) -> str:
    """The optimizer in one line of a run's account (train.py --dry-run), and under Muon what each half updates."""
    split = split_record(model, o)
    if split["name"] == "adamw":
        return f"optimizer: AdamW on every parameter, lr {o.lr:g}"
    m, a = split["muon"], split["adamw"]
    return (
        f"optimizer: Muon (lr {o.muon_lr:g}, momentum {o.muon_momentum:g}, {o.muon_adjust_lr}) on the blocks' "
        f"{m['tensors']} weight matrices ({m['weights']:,} weights); AdamW (lr {o.lr:g}) on the other "
        f"{a['tensors']} tensors ({a['weights']:,}: embeddings, head, norms, biases)"
    )
