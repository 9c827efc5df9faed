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
  copy at ``COPY_GB_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt.config import Config
from gpt.run.checkpoints import checkpoint_interval, stored_tensors
from gpt.speed.mfu import PEAK_BF16_TFLOPS
from gpt.training.inside import STATS_SEQUENCES

GPU = "h100"  # the peak assumed: H100 SXM's dense bf16 (the write-up's GPUs)
MFU = 0.40  # model FLOPs utilisation assumed for training, validation and the stats pass
WRITE_GIB_S = 0.5  # a checkpoint's write to a GPU host's disk (1.82 GiB in 2-5 s measured by the review)
LAUNCH_S = 10e-6  # host time per eager op of the stats step (python, dispatch, launch)
COPY_GB_S = 1000.0  # a device-to-device copy's rate (HBM, read + write, well under H100's 3.35 TB/s)
GIB = 2**30


@dataclass(frozen=True)
class StatsCost:
    """One stats step's work on rank 0 besides its training step (``scripts/stats_cost.py`` measures it)."""

    ops: int  # eager ops launched
    host_reads: int  # device-to-host reads (each a wait)
    bytes_copied: int  # bytes of weight copies


def checkpoint_bytes(model) -> tuple[int, int]:
    """(a whole checkpoint's bytes, its weights' bytes): the stored tensors once, and AdamW's two moments of
    every trainable parameter (state.pt's counters and RNG states are kilobytes)."""
    state = model.state_dict()
    weights = sum(state[min(names)].numel() * state[min(names)].element_size() for names, _ in stored_tensors(model))
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + moments, weights


def count_steps(total: int, every: int) -> int:
    """Steps of 1..total that are a multiple of ``every`` or the last (the loop's rule for validation and
    checkpoints)."""
    return total // every + (total % every != 0)


def overhead_lines(cfg: Config, model, gpus: int, stats: StatsCost | None = None) -> list[str]:
    """The dry run's account of a run's overheads on ``gpus`` GPUs, one line each."""
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
    one_s = pass_s + stats.ops * LAUNCH_S + stats.bytes_copied / (COPY_GB_S * 1e9)
    return [
        *lines,
        f"  stats steps: {n_stats:,} (every {every:,} steps) x ({stats.ops:,} ops, {stats.host_reads} host read"
        f"{'s' * (stats.host_reads != 1)}, {stats.bytes_copied / GIB:.2f} GiB copied on rank 0; ~{1e3 * one_s:.0f} ms "
        f"while the other ranks wait): {share(n_stats * one_s)}",
    ]
