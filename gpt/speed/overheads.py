"""What a run spends besides its training steps, said before it starts (``train.py --dry-run``): validations,
checkpoint writes and stats steps, each counted from the config and the model and given its share of the run.

The counts and bytes are exact (the loop's own rules: ``checkpoint_interval``, ``should_evaluate``, a stats step
every ``log.stats_every``). The seconds are estimates under the assumptions named in the output, until a GPU
measures them (``bench.py``):

- the training steps at ``MFU`` of the GPU's dense bf16 peak (``gpt.speed.mfu``), on ``gpus`` GPUs;
- a validation scores ``data.val_tokens`` forward only, a third of a training token's FLOPs, at the same rate;
- a checkpoint (weights + AdamW's two moments) is written at ``WRITE_GIB_S``; every rank waits for it;
- a stats step (rank 0, the others waiting at the next all-reduce) runs the probe's extra forward pass
  (``STATS_SEQUENCES`` sequences) at the same rate, plus ``LAUNCH_S`` for each of its eager ops, plus its weight
  copy at ``COPY_GB_S``; its ops, reads and bytes are counted by running it on the meta device
  (``stats_step_cost``, a ``TorchDispatchMode`` counting what it dispatches).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from gpt.config import Config
from gpt.run.checkpoints import checkpoint_interval, stored_state
from gpt.speed.mfu import PEAK_BF16_TFLOPS
from gpt.training.inside import STATS_SEQUENCES, StatsProbe

GPU = "h100"  # the peak assumed: H100 SXM's dense bf16 (the write-up's GPUs)
MFU = 0.40  # model FLOPs utilisation assumed for training, validation and the stats pass
WRITE_GIB_S = 0.5  # a checkpoint's write to a GPU host's disk (1.82 GiB in 2-5 s measured by the review)
LAUNCH_S = 10e-6  # host time per eager op of the stats step (python, dispatch, launch)
COPY_GB_S = 1000.0  # a device-to-device copy's rate (HBM, read + write, well under H100's 3.35 TB/s)
GIB = 2**30


def checkpoint_bytes(model) -> tuple[int, int]:
    """(a whole checkpoint's bytes, its weights' bytes): the stored tensors once, and AdamW's two moments of
    every trainable parameter (state.pt's counters and RNG states are kilobytes)."""
    weights = sum(t.numel() * t.element_size() for t in stored_state(model).values())
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + moments, weights


def count_steps(total: int, every: int) -> int:
    """Steps of 1..total that are a multiple of ``every`` or the last (the loop's rule for validation and
    checkpoints)."""
    return total // every + (total % every != 0)


def overhead_lines(cfg: Config, model, gpus: int, stats: dict | None = None) -> list[str]:
    """The dry run's account of a run's overheads on ``gpus`` GPUs, one line each; ``stats``: a stats step's
    ``stats_step_cost`` (without it, the stats steps are only counted)."""
    t, steps = cfg.train, cfg.total_steps(model.num_params(norms=False))
    peak = dict(PEAK_BF16_TFLOPS)[GPU] * 1e12
    rate = MFU * peak * gpus / model.flops_per_token()  # training tokens a second
    train_s = steps * cfg.tokens_per_step / rate

    def share(seconds: float) -> str:
        return f"{seconds:,.1f} s, {100 * seconds / train_s:.1f}% of the training steps"

    n_val = count_steps(steps, t.eval_every)
    val_s = n_val * cfg.data.val_tokens / (3 * rate)
    every = checkpoint_interval(steps, t.eval_every, t.checkpoint_every)
    n_ckpt = count_steps(steps, every)
    whole, weights = checkpoint_bytes(model)
    lines = [
        f"overheads on {gpus} GPU{'s' * (gpus > 1)} (estimates: {GPU.upper()} bf16 peak {peak / 1e12:.0f} TFLOP/s at "
        f"{MFU:.0%} MFU, checkpoints written at {WRITE_GIB_S:g} GiB/s; bench.py measures the steps):",
        f"  training steps: {steps:,} in {train_s / 60:,.1f} min",
        f"  validation: {n_val:,} x {cfg.data.val_tokens:,} tokens (every {t.eval_every:,} steps and the end), "
        f"forward only: {share(val_s)}",
        f"  checkpoint writes: {n_ckpt:,} (every {every:,} steps"
        f"{'' if t.checkpoint_every else ', train.checkpoint_every null: sized to the run'}, and the end) x "
        f"{whole / GIB:.2f} GiB = {n_ckpt * whole / GIB:,.1f} GiB: {share(n_ckpt * whole / GIB / WRITE_GIB_S)}; "
        f"a new best between them keeps its weights ({weights / GIB:.2f} GiB), written before the next "
        f"checkpoint: at most {n_ckpt:,} more writes, {n_ckpt * weights / GIB:,.1f} GiB",
    ]
    every = cfg.log.stats_every
    if not every:
        return [*lines, "  stats steps: none (log.stats_every 0)"]
    n_stats = steps // every
    if stats is None:
        return [*lines, f"  stats steps: {n_stats:,} (every {every:,} steps)"]
    pass_s = STATS_SEQUENCES * cfg.model.context_length / (3 * MFU * peak / model.flops_per_token())
    launches = stats["kernel_ops"] + stats["forward_ops"]  # the probe's and its extra forward pass's, eager
    one_s = pass_s + launches * LAUNCH_S + stats["bytes_copied"] / (COPY_GB_S * 1e9)
    return [
        *lines,
        f"  stats steps: {n_stats:,} (every {every:,} steps) x ({launches:,} eager ops, {stats['host_reads']} host "
        f"read{'s' * (stats['host_reads'] != 1)}, {stats['bytes_copied'] / GIB:.2f} GiB of weights copied on rank 0; "
        f"~{1e3 * one_s:.0f} ms while the other ranks wait): {share(n_stats * one_s)}",
    ]


# ------------------------------------------------ a stats step's cost, counted

COST_KEYS = ("ops", "kernel_ops", "host_reads", "bytes_copied", "bytes_allocated")
_aten = torch.ops.aten
_COPIES = {_aten.clone.default, _aten.copy_.default, _aten._to_copy.default, _aten._foreach_copy_.default}
_ALLOCATIONS = {_aten.empty.memory_format, _aten.empty_like.default, _aten.empty_strided.default}  # no kernel


def _flat(x) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results (lists of them included)."""
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in _flat(item)] if isinstance(x, (list, tuple)) else []


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # the memory a tensor lives in: a view shares its base's (meta ones too)


def _zeros(shape) -> list | float:
    return [_zeros(shape[1:]) for _ in range(shape[0])] if shape else 0.0


class _Cost(TorchDispatchMode):
    """Counts the aten ops dispatched while it is on (``COST_KEYS``); ``weights``: the parameters' storages, whose
    copies bytes_copied counts. On the meta device nothing is computed: a read from it answers 0."""

    def __init__(self, weights: set[int]):
        super().__init__()
        self.weights, self.cost = weights, dict.fromkeys(COST_KEYS, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, cost = kwargs or {}, self.cost
        cost["ops"] += 1
        if func is _aten._local_scalar_dense.default:  # .item(), float(t), bool(t)
            cost["host_reads"] += 1
            if args[0].device.type == "meta":
                return 0.0 if args[0].is_floating_point() else 0
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        inputs = {_storage(t) for t in _flat(args) + _flat(list(kwargs.values()))}
        new = [t for t in _flat(out) if _storage(t) not in inputs]  # not a view (nor a reshape that is one)
        mutated = func._schema.is_mutable  # in place
        cost["kernel_ops"] += bool(new or mutated) and func not in _ALLOCATIONS
        cost["bytes_allocated"] += sum(t.numel() * t.element_size() for t in new)
        if func in _COPIES:
            pairs = zip(_flat(args[0]), _flat(args[1])) if mutated else [(out, args[0])]
            cost["bytes_copied"] += sum(d.numel() * d.element_size() for d, s in pairs if _storage(s) in self.weights)
        if func in (_aten._to_copy.default, _aten.copy_.default):  # to the CPU from a device: a read
            source, to = (args[0], out) if func is _aten._to_copy.default else (args[1], args[0])
            cost["host_reads"] += to.device.type == "cpu" and source.device.type not in ("cpu", "meta")
        return out

    @contextlib.contextmanager
    def on(self):
        """Count, ``.tolist()`` calls included (a read from the device each; on the meta device zeros)."""
        tolist = torch.Tensor.tolist

        def counted(t):
            self.cost["host_reads"] += 1
            if t.device.type == "meta":
                return _zeros(list(t.shape))
            with _disable_current_modes():  # its own copy to the CPU is this read
                return tolist(t)

        torch.Tensor.tolist = counted
        try:
            with self:
                yield self.cost
        finally:
            torch.Tensor.tolist = tolist


def stats_step_cost(model, probe_class=None) -> dict:
    """What one stats step of ``probe_class`` (``StatsProbe``, or an older one to compare) costs on ``model``, a
    ``GPT`` (on the CPU, or the meta device: shapes only, nothing computed) or a ``ModelConfig`` (built on the
    meta device: GPT-2 small in a second). Counted in aten ops, as dispatched (``COST_KEYS``):

    - ops: the probe's own (its hooks, reductions, copies and read-back; not the extra forward pass's model ops,
      ``forward_ops``), kernel_ops: those of them that launch device work (not views nor bare allocations);
    - host_reads: reads from the device (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``, copies to the CPU);
    - bytes_copied: bytes written by copies of the weights (clone, copy_, _foreach_copy_): those before the update;
    - bytes_allocated: bytes of the new tensors the probe's ops return, its temporaries included.

    ``tensors``: the parameter tensors. The model is changed: a zero gradient where it has none, its weights
    stepped (between ``measure`` and ``after_update``). A GPU launches a kernel or more per kernel op (a
    ``_foreach`` op one per ~100 tensors or ~20M numbers); under autocast, casts that float32 on the CPU does
    not need are not counted."""
    if not isinstance(model, torch.nn.Module):
        from gpt.model.gpt import GPT

        with torch.device("meta"):
            model = GPT(model, seed=None)
    probe = (probe_class or StatsProbe)(every=1)
    params = list(model.parameters())
    device, cfg = params[0].device, model.cfg
    x = torch.randint(0, cfg.vocab_size, (STATS_SEQUENCES, cfg.context_length), device=device)
    for p in params:
        p.grad = torch.zeros_like(p) if p.grad is None else p.grad
    weights = {_storage(p) for p in params}
    with torch.no_grad():
        was_training = model.training
        model.eval()
        with _Cost(weights).on() as forward:  # the extra forward pass's model ops, without the probe's hooks
            model(x)
        model.train(was_training)
        with _Cost(weights).on() as cost:
            probe.measure(model, x, contextlib.nullcontext, None)
        torch._foreach_add_(params, 1e-3)  # an update, not counted
        with _Cost(weights).on() as after:
            probe.after_update(model)
            probe.take(1, 0)
    out = {k: cost[k] - forward[k] + after[k] for k in COST_KEYS}
    return {**out, "forward_ops": forward["ops"], "tensors": len({id(p) for p in params})}
