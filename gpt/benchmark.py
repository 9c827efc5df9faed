"""Timing real training steps, and single norm layers: the rows ``bench.py`` prints.

A step row times ``Trainer.train_step``, the step the trainer runs (reading the batch,
forward and backward under the configured autocast, gradient norm, fused AdamW), on
this process's share of the configured world size, after ``warmup`` steps. Step times
come from CUDA events (no waiting for the GPU between steps) or, on the CPU, the clock.
``data``: ``config`` reads the config's token set, ``synthetic`` a random one made for
the run, ``ready`` one step's batches read once and handed back at every step (the
difference to ``config`` is what reading costs).

A norm row times one norm layer's forward and backward on a (B, T, D) activation in
fp32 under the configured autocast: what the norm sees in a training step, where the
residual stream stays fp32.

Rows are handed to ``emit`` the moment each is measured, so a benchmark stopped part-way
(a time limit, a kill) keeps every finished row. A row that raises (out of memory, a
compile failure) becomes an error row naming the exception, and the next row runs.
"""

from __future__ import annotations

import copy
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpt.config import Config
from gpt.data import resolve_data_dir, write_random_set
from gpt.distributed import Dist, device_name, peak_memory_bytes
from gpt.errors import UserError, first_line
from gpt.fastpath import auto_precision, resolve
from gpt.loss import autocast_for
from gpt.norms import make_norm
from gpt.speed import mfu, peak_tflops, step_stats
from gpt.trainer import Trainer

BASELINE = "handrolled_layernorm"  # every row's time is also given as a ratio to this norm's row


class StepTimer:
    """Wall time of each step, without waiting for the device between steps."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.mark()

    def mark(self) -> None:
        """The end of a step (and the start of the next)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Each step's seconds (waits for the device once)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class FixedBatches:
    """A training reader's stand-in that hands back the same micro-batches at every step:
    one step of the real reader (``--data ready``), or random ids (the memory probe)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self.batches, self.accum = batches, len(batches)

    def next_step(self):
        return self.batches

    def check_capacity(self, steps: int) -> None:
        pass

    def close(self) -> None:
        pass


def bench_config(cfg: Config, norm_type: str, compile_: bool, steps: int) -> Config:
    """``cfg`` with one norm type and compile setting, ``steps`` steps long (its own length aside)."""
    c = copy.deepcopy(cfg)
    c.model.norm_type, c.train.compile = norm_type, compile_
    c.train.steps, c.train.tokens, c.train.tokens_per_param = steps, None, None
    return c


def data_for(cfg: Config, d: Dist, mode: str, steps: int) -> Path:
    """The token set a benchmark reads: the config's, or (rank 0 writes it) a random one of ``steps`` steps."""
    if mode != "synthetic":
        return d.on_main(lambda: resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision))
    n_tokens = (steps + 1) * cfg.tokens_per_step + 1
    return d.on_main(lambda: write_random_set(Path(tempfile.mkdtemp(prefix="gpt-bench-")), n_tokens,
                                              cfg.model.vocab_size))


def time_steps(cfg: Config, d: Dist, data_dir: Path, ready: bool, steps: int, warmup: int) -> dict:
    """Build what the trainer builds for ``cfg`` and time ``warmup + steps`` training steps."""
    if d.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(d.device)
    trainer = Trainer(cfg, d)
    try:
        trainer.open_reader(data_dir)
        if ready:
            trainer.reader.close()
            trainer.reader = FixedBatches(trainer.reader.next_step())
        trainer.build()
        trainer.prepare_step()
        timer = StepTimer(d.device)
        for _ in range(warmup + steps):
            trainer.train_step()
            timer.mark()
        seconds = timer.seconds()
        return {"first_step_s": seconds[0], **step_stats(seconds[warmup:]),
                "tokens_per_s": steps * cfg.tokens_per_step / sum(seconds[warmup:]),
                "flops_per_token": trainer.model.flops_per_token(), "precision": trainer.fast.precision,
                "peak_memory_bytes": peak_memory_bytes(d.device)}
    finally:
        trainer.release()
        del trainer
        free_memory(d.device)


def free_memory(device: torch.device) -> None:
    """Let the next row start from an empty device (and fresh compile caches)."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measured(row: dict, measure, device: torch.device, emit) -> dict:
    """``row`` with what ``measure()`` returns, or, if it raises, with the error instead (the next row
    still runs); handed to ``emit`` at once."""
    try:
        row = {**row, **measure()}
    except Exception as e:  # out of memory, a compile failure: this row's result, not the benchmark's end
        free_memory(device)
        row = {**row, "error": f"{type(e).__name__}: {first_line(e)}"}
    if emit is not None:
        emit(row)
    return row


def step_rows(cfg: Config, d: Dist, norm_types: list[str], compiles: list[bool], *, steps: int, warmup: int,
              data: str, peak: float | None = None, emit=None) -> list[dict]:
    """One row per (compile setting, norm type), in that order: speed, MFU and memory of the training step;
    each handed to ``emit`` as soon as it is measured."""
    data_dir = data_for(cfg, d, data, warmup + steps)
    device = device_name(d.device)
    peak = peak if peak is not None else peak_tflops(device)
    rows = []
    try:
        for compile_ in compiles:
            for norm_type in norm_types:
                c = bench_config(cfg, norm_type, compile_, warmup + steps)
                row = {"mode": "step", "config": cfg.run.name, "norm_type": norm_type, "compile": compile_,
                       "device": device, "world_size": d.world_size, "micro_batch": c.train.micro_batch_size,
                       "global_batch": c.train.global_batch_size, "tokens_per_step": c.tokens_per_step,
                       "steps": steps, "warmup": warmup, "data": data, "peak_tflops": peak}
                rows.append(measured(row, lambda: step_numbers(c, d, data_dir, data, steps, warmup, peak), d.device,
                                     emit))
    finally:
        if data == "synthetic":
            d.barrier()
            if d.is_main:
                shutil.rmtree(data_dir, ignore_errors=True)
    return with_ratios(rows)


def step_numbers(cfg: Config, d: Dist, data_dir: Path, data: str, steps: int, warmup: int,
                 peak: float | None) -> dict:
    """A step row's measurements: ``time_steps`` and what follows from it (compile time, MFU)."""
    r = time_steps(cfg, d, data_dir, data == "ready", steps, warmup)
    return {**r, "compile_s": r["first_step_s"] - r["ms_per_step"] / 1e3 if cfg.train.compile else None,
            "mfu": mfu(r["flops_per_token"], r["tokens_per_s"], peak, d.world_size)}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Add each row's step time relative to the hand-rolled LayerNorm row of the same compile setting
    (None where that row is missing or failed): below 1, faster."""
    base = {r["compile"]: r["ms_per_step"] for r in rows if r["norm_type"] == BASELINE and "error" not in r}
    for r in rows:
        b = base.get(r["compile"])
        r[f"time_vs_{BASELINE}"] = r["ms_per_step"] / b if b and "error" not in r else None
    return rows


def time_norm(norm_type: str, shape: tuple[int, int, int], device: torch.device, precision: str, compile_: bool,
              steps: int, warmup: int) -> list[float]:
    """Seconds of each of ``steps`` forward + backward passes of one norm layer (after ``warmup``)."""
    norm = make_norm({"norm_type": norm_type, "d_model": shape[-1]}).to(device)
    fn = torch.compile(norm) if compile_ else norm
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    autocast = autocast_for(precision, device)
    timer = StepTimer(device)
    for _ in range(warmup + steps):
        with autocast():
            y = fn(x)
        y.backward(grad)
        x.grad = None
        timer.mark()
    return timer.seconds()[warmup:]


def norm_rows(norm_types: list[str], compiles: list[bool], *, shape: tuple[int, int, int], device: torch.device,
              precision: str, steps: int, warmup: int, emit=None) -> list[dict]:
    """One row per (compile setting, norm type): the norm layer alone; each handed to ``emit`` when measured."""
    rows = []
    for compile_ in compiles:
        for norm_type in norm_types:
            row = {"mode": "norm", "norm_type": norm_type, "compile": compile_, "shape": list(shape),
                   "precision": precision, "device": device_name(device), "steps": steps, "warmup": warmup}
            rows.append(measured(row, lambda: step_stats(time_norm(norm_type, shape, device, precision, compile_,
                                                                   steps, warmup)), device, emit))
            free_memory(device)
    eager_base = next((r["ms_per_step"] for r in rows if r["norm_type"] == BASELINE and not r["compile"]
                       and "error" not in r), None)
    for r in rows:  # against eager hand-rolled LayerNorm: hand-rolled vs PyTorch vs compiled at a glance
        r[f"time_vs_{BASELINE}"] = r["ms_per_step"] / eager_base if eager_base and "error" not in r else None
    return rows


def norms_precision(precision: str, device: torch.device) -> str:
    """The autocast of the norm benchmark: ``auto`` as a training run on ``device`` would have it."""
    return auto_precision(device) if precision == "auto" else precision


# ------------------------------------------------------------------ the largest micro-batch

def largest_fitting(fits, limit: int) -> int:
    """The largest m in 1..limit for which ``fits(m)``, fits being monotone (0: not even 1 fits).
    Doubles from 1 until a size fails, then bisects: about 2 log2(limit) probes."""
    good, m = 0, 1
    while m <= limit and fits(m):
        good, m = m, m * 2
    bad = min(m, limit + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def fits_in_memory(cfg: Config, d: Dist, micro_batch: int) -> bool:
    """Whether two training steps of ``cfg`` at ``micro_batch`` run without running out of GPU memory,
    beside a reserve as large as DDP's gradient buckets (fp32, one copy of the gradients)."""
    c = bench_config(cfg, cfg.model.norm_type, False, 2)
    c.train.micro_batch_size = c.train.global_batch_size = micro_batch
    trainer = Trainer(c, d)
    reserve = None
    try:
        ids = torch.randint(0, c.model.vocab_size, (micro_batch, c.model.context_length + 1))
        trainer.reader = FixedBatches([(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())])
        trainer.build()
        reserve = torch.empty(sum(p.numel() for p in trainer.params), dtype=torch.float32, device=d.device)
        trainer.prepare_step()
        for _ in range(2):  # the second step holds the optimizer state too
            trainer.train_step()
        d.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        del trainer, reserve
        free_memory(d.device)


def micro_batch_plan(cfg: Config, largest: int, world_sizes=(1, 2, 4, 8)) -> list[str]:
    """For each world size that divides the global batch: the largest micro-batch that fits and
    divides the global batch per GPU, and the gradient accumulation it implies."""
    g = cfg.train.global_batch_size
    lines = []
    for w in world_sizes:
        if g % w:
            continue
        m = max((m for m in range(1, min(largest, g // w) + 1) if (g // w) % m == 0), default=0)
        if m:
            lines.append(f"  {w} GPU{'s' if w > 1 else ''}: train.micro_batch_size {m}, accumulation "
                         f"{g // (w * m)} (global batch {g} = {w} x {m} x {g // (w * m)})")
    return lines


def find_micro_batch(cfg: Config, d: Dist) -> str:
    """The largest micro-batch of ``cfg`` that fits in this GPU's memory, with the plan it implies."""
    if d.device.type != "cuda":
        raise UserError("--find-micro-batch measures GPU memory, and no CUDA GPU is visible here; run it on "
                        "the kind of machine you will train on")
    limit = cfg.train.global_batch_size

    def probe(m: int) -> bool:  # each probe said as it ends: a search stopped part-way still tells something
        fits = fits_in_memory(cfg, d, m)
        print(f"micro-batch {m}: {'fits' if fits else 'out of memory'}", file=sys.stderr, flush=True)
        return fits

    largest = largest_fitting(probe, limit)
    if largest == 0:
        raise UserError(f"not even a micro-batch of 1 x {cfg.model.context_length} tokens fits on "
                        f"{device_name(d.device)}; use a smaller model or context")
    total = torch.cuda.get_device_properties(d.device).total_memory
    head = (f"largest micro-batch that fits on {device_name(d.device)} ({total / 2**30:.0f} GiB), eager, "
            f"{resolve(cfg.train, d.device).precision}, beside DDP's gradient buckets: {largest} sequences of "
            f"{cfg.model.context_length} tokens" + (" (the search stops at train.global_batch_size)"
                                                    if largest == limit else ""))
    return "\n".join([head, f"with train.global_batch_size {limit}:", *micro_batch_plan(cfg, largest)])
