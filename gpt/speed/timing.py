"""Timing real training steps, single norm layers, and generation: the rows ``bench.py`` prints.

A step row times ``StepEngine.step``, the step the trainer runs (reading the batch,
forward and backward under the configured autocast, gradient norm, fused AdamW), on
this process's share of the configured world size, after ``warmup`` steps. Step times
come from CUDA events (no waiting for the GPU between steps) or, on the CPU, the clock.
``data``: ``config`` reads the config's token set, ``synthetic`` a random one made for
the run, ``ready`` one step's batches read once and handed back at every step (the
difference to ``config`` is what reading costs).

A norm row times one norm layer's forward and backward on a (B, T, D) activation in
fp32 under the configured autocast: what the norm sees in a training step, where the
residual stream stays fp32. Each of its steps is a window of back-to-back passes (~20 ms)
timed whole and divided by their number: one pass alone would time its launch.

A generate row times greedy generation (``GPT.generate``) by CONFIG's model with fresh
weights, once without the key-value cache and once with it: tokens/s, the speed-up, and
whether both gave the same tokens.

Rows are handed to ``emit`` the moment each is measured, so a benchmark stopped part-way
(a time limit, a kill) keeps every finished row. A row that raises (out of memory, a
compile failure) becomes an error row naming the exception, and the next row runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from gpt.common.errors import first_line
from gpt.config import Config
from gpt.data.folders import resolve_data_dir
from gpt.data.tokens import write_random_set
from gpt.model.gpt import GPT
from gpt.model.loss import autocast_for
from gpt.model.norms import make_norm
from gpt.run.distributed import Dist, device_name, peak_memory
from gpt.run.fastpath import auto_precision
from gpt.speed.mfu import mfu, peak_tflops, step_stats
from gpt.speed.micro_batch import free_memory, stepping_config
from gpt.training.step import RepeatedBatches, ready_engine, train_reader

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


def data_for(cfg: Config, dist: Dist, mode: str, steps: int) -> Path:
    """The token set a benchmark reads: the config's, or (rank 0 writes it) a random one of ``steps`` steps."""
    if mode != "synthetic":
        return dist.on_main(lambda: resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision))
    n_tokens = (steps + 1) * cfg.tokens_per_step + 1
    return dist.on_main(
        lambda: write_random_set(Path(tempfile.mkdtemp(prefix="gpt-bench-")), n_tokens, cfg.model.vocab_size)
    )


def time_steps(cfg: Config, dist: Dist, data_dir: Path, ready: bool, steps: int, warmup: int) -> dict:
    """Build what the trainer builds for ``cfg`` and time ``warmup + steps`` training steps."""
    if dist.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dist.device)
    engine, reader = None, None
    try:
        engine = ready_engine(cfg, dist)
        reader = train_reader(cfg, dist, engine.fast, data_dir)
        if ready:  # the first step's micro-batches again and again: no reading in the steps
            batches = list(reader.next_step())
            reader.close()
            reader = RepeatedBatches(batches)
        timer = StepTimer(dist.device)
        for _ in range(warmup + steps):
            engine.step(reader.next_step(), reader.accum)
            timer.mark()
        seconds = timer.seconds()
        return {
            "first_step_s": seconds[0],
            **step_stats(seconds[warmup:]),
            "tokens_per_s": steps * cfg.tokens_per_step / sum(seconds[warmup:]),
            "flops_per_token": engine.model.flops_per_token(),
            "params_outside_norms": engine.model.num_params(norms=False),  # for the run's length
            "precision": engine.fast.precision,
            **peak_memory(dist.device),
        }
    finally:
        if reader is not None:
            reader.close()
        del engine
        free_memory(dist.device)


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


def step_rows(
    cfg: Config,
    dist: Dist,
    norm_types: list[str],
    compiles: list[bool],
    *,
    steps: int,
    warmup: int,
    data: str,
    peak: float | None = None,
    emit=None,
) -> list[dict]:
    """One row per (compile setting, norm type), in that order: speed, MFU and memory of the training step;
    each handed to ``emit`` as soon as it is measured."""
    data_dir = data_for(cfg, dist, data, warmup + steps)
    device = device_name(dist.device)
    peak = peak if peak is not None else peak_tflops(device)
    rows = []
    try:
        for compile_ in compiles:
            for norm_type in norm_types:
                c = stepping_config(cfg, norm_type, compile_, warmup + steps)
                row = {
                    "mode": "step",
                    "config": cfg.run.name,
                    "norm_type": norm_type,
                    "compile": compile_,
                    "device": device,
                    "world_size": dist.world_size,
                    "micro_batch": c.train.micro_batch_size,
                    "global_batch": c.train.global_batch_size,
                    "tokens_per_step": c.tokens_per_step,
                    "steps": steps,
                    "warmup": warmup,
                    "data": data,
                    "peak_tflops": peak,
                }
                # the run this row times a few steps of, at its full length
                run_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm_type=norm_type))
                measure = functools.partial(step_numbers, c, run_cfg, dist, data_dir, data, steps, warmup, peak)
                rows.append(measured(row, measure, dist.device, emit))
    finally:
        if data == "synthetic":
            dist.barrier()
            if dist.is_main:
                shutil.rmtree(data_dir, ignore_errors=True)
    return with_ratios(rows)


def step_numbers(
    cfg: Config, run_cfg: Config, dist: Dist, data_dir: Path, data: str, steps: int, warmup: int, peak: float | None
) -> dict:
    """A step row's measurements: ``time_steps`` and what follows from it (compile time, MFU, and the hours
    a whole run of ``run_cfg`` takes at this speed: the measurement that replaces an estimate)."""
    r = time_steps(cfg, dist, data_dir, data == "ready", steps, warmup)
    run_tokens = run_cfg.total_steps(r.pop("params_outside_norms")) * run_cfg.tokens_per_step
    return {
        **r,
        "compile_s": r["first_step_s"] - r["ms_per_step"] / 1e3 if cfg.train.compile else None,
        "mfu": mfu(r["flops_per_token"], r["tokens_per_s"], peak, dist.world_size),
        "run_tokens": run_tokens,
        "run_hours": run_tokens / r["tokens_per_s"] / 3600,
    }


def with_ratios(rows: list[dict]) -> list[dict]:
    """Add each row's step time relative to the hand-rolled LayerNorm row of the same compile setting
    (None where that row is missing or failed): below 1, faster."""
    base = {r["compile"]: r["ms_per_step"] for r in rows if r["norm_type"] == BASELINE and "error" not in r}
    for r in rows:
        b = base.get(r["compile"])
        r[f"time_vs_{BASELINE}"] = r["ms_per_step"] / b if b and "error" not in r else None
    return rows


def time_norm(
    norm_type: str,
    shape: tuple[int, int, int],
    device: torch.device,
    precision: str,
    compile_: bool,
    steps: int,
    warmup: int,
) -> list[float]:
    """Seconds of one forward + backward pass of one norm layer, in each of ``steps`` timed windows (after
    ``warmup`` passes, the first compiling). A window is as many back-to-back passes as fill ``WINDOW_S``,
    timed whole (CUDA events, or the CPU's clock) and divided by their number: one pass takes 0.1-0.5 ms on a
    GPU, so two events around it would time the launch, not the kernels."""
    norm = make_norm({"norm_type": norm_type, "d_model": shape[-1]}).to(device)
    fn = torch.compile(norm) if compile_ else norm
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    autocast = autocast_for(precision, device)

    def passes(n: int) -> None:
        for _ in range(n):
            with autocast():
                y = fn(x)
            y.backward(grad)
            x.grad = None

    passes(warmup)
    calls = passes_per_window(passes, device)
    timer = StepTimer(device)
    for _ in range(steps):
        passes(calls)
        timer.mark()
    return [seconds / calls for seconds in timer.seconds()]


WINDOW_S = 0.02  # a norm row's timed window: long enough that its two clock reads are noise beside it
MOST_PASSES = 100_000


def passes_per_window(passes, device: torch.device, window_s: float = WINDOW_S) -> int:
    """How many ``passes(n)`` fill ``window_s``: n doubled from 1 until n passes take a quarter of it, then
    scaled to the whole (one pass already as long: 1)."""
    n = 1
    while True:
        timer = StepTimer(device)
        passes(n)
        timer.mark()
        seconds = timer.seconds()[0]
        if seconds >= window_s / 4 or n >= MOST_PASSES:
            return max(1, min(MOST_PASSES, math.ceil(n * window_s / max(seconds, 1e-9))))
        n *= 2


def norm_stats(*args) -> dict:
    """``time_norm(*args)``'s step statistics."""
    return step_stats(time_norm(*args))


def norm_rows(
    norm_types: list[str],
    compiles: list[bool],
    *,
    shape: tuple[int, int, int],
    device: torch.device,
    precision: str,
    steps: int,
    warmup: int,
    emit=None,
) -> list[dict]:
    """One row per (compile setting, norm type): the norm layer alone; each handed to ``emit`` when measured."""
    rows = []
    for compile_ in compiles:
        for norm_type in norm_types:
            row = {
                "mode": "norm",
                "norm_type": norm_type,
                "compile": compile_,
                "shape": list(shape),
                "precision": precision,
                "device": device_name(device),
                "steps": steps,
                "warmup": warmup,
            }
            rows.append(
                measured(
                    row,
                    functools.partial(norm_stats, norm_type, shape, device, precision, compile_, steps, warmup),
                    device,
                    emit,
                )
            )
            free_memory(device)
    eager_base = next(
        (r["ms_per_step"] for r in rows if r["norm_type"] == BASELINE and not r["compile"] and "error" not in r), None
    )
    for r in rows:  # against eager hand-rolled LayerNorm: hand-rolled vs PyTorch vs compiled at a glance
        r[f"time_vs_{BASELINE}"] = r["ms_per_step"] / eager_base if eager_base and "error" not in r else None
    return rows


def norms_precision(precision: str, device: torch.device) -> str:
    """The autocast of the norm benchmark: ``auto`` as a training run on ``device`` would have it."""
    return auto_precision(device) if precision == "auto" else precision


def time_generation(
    cfg: Config, norm_type: str, use_cache: bool, prompt_tokens: int, new_tokens: int, device, repeats: int
) -> dict:
    """Greedy generation of ``new_tokens`` after a random ``prompt_tokens``-token prompt, by the model of
    ``cfg`` with ``norm_type`` (fresh weights): the median of ``repeats`` timed runs after an untimed one."""
    model = GPT(dataclasses.replace(cfg.model, norm_type=norm_type), seed=cfg.train.seed).to(device).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.model.vocab_size, (1, prompt_tokens), generator=g).to(device)
    model.generate(prompt, 4, temperature=0, use_cache=use_cache)  # warm-up: allocations, kernels
    timer, out = StepTimer(device), None
    for _ in range(repeats):
        out = model.generate(prompt, new_tokens, temperature=0, use_cache=use_cache)
        timer.mark()
    seconds = sorted(timer.seconds())[len(timer.seconds()) // 2]
    return {"seconds": seconds, "tokens_per_s": new_tokens / seconds, "tokens": out[0, prompt_tokens:].tolist()}


def generation_rows(
    cfg: Config, norm_types: list[str], *, prompt_tokens: int, new_tokens: int, device, repeats: int, emit=None
) -> list[dict]:
    """Per norm type, greedy generation without and with the key-value cache: tokens/s, the speed-up, and
    whether both gave the same tokens."""
    rows = []
    for norm_type in norm_types:
        pair = []
        for use_cache in (False, True):
            row = {
                "mode": "generate",
                "norm_type": norm_type,
                "cache": use_cache,
                "compile": False,
                "prompt_tokens": prompt_tokens,
                "new_tokens": new_tokens,
                "device": device_name(device),
                "repeats": repeats,
            }
            measure = functools.partial(
                time_generation, cfg, norm_type, use_cache, prompt_tokens, new_tokens, device, repeats
            )
            pair.append(measured(row, measure, device, None))
        if all("error" not in r for r in pair):
            pair[1]["speedup"] = pair[1]["tokens_per_s"] / pair[0]["tokens_per_s"]
            pair[1]["same_tokens"] = pair[0]["tokens"] == pair[1]["tokens"]
        for r in pair:
            r.pop("tokens", None)
            if emit is not None:
                emit(r)
        rows += pair
    return rows
