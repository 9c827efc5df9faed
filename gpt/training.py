"""The training loop: one process or DDP under torchrun, resumable to the bit.

Follow a batch: ``TrainBatches.next_step()`` reads this rank's micro-batches of the
global step from the token file; each runs forward under autocast and backward
(``no_sync`` until the last, so DDP all-reduces gradients once per step); the pre-clip
gradient norm is measured; fused AdamW applies the update unless the norm is not
finite (then the update is skipped and counted, on the device, without waiting for
it). Every ``log_every`` steps, and only then, the loop reads numbers back from the
device: losses, the norm, divergence counters. Validation, checkpoints and the
stop-signal check follow.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from gpt import checkpoint as ckpt_io
from gpt.config import Config, dump_config
from gpt.data import DataError, TrainBatches, open_split, resolve_data_dir
from gpt.distributed import Dist, setup
from gpt.errors import UserError
from gpt.evaluation import autocast_for, eval_sequences, evaluate_loss
from gpt.metrics import Metrics, read_metrics, truncate_metrics
from gpt.model import GPT
from gpt.norms import NORM_MODULES
from gpt.plots import plot_run
from gpt.schedule import lr_at, warmup_steps

SUMMARY_FILE = "summary.json"
STEADY_SKIP = 0.1  # tokens/s in summary.json leaves out the first 10% of the steps (start-up, compile)


@dataclass
class Progress:
    """What a checkpoint must carry besides weights and optimizer to continue exactly."""

    step: int = 0  # optimizer steps done
    tokens: int = 0
    elapsed: float = 0.0  # training seconds before this process started
    best_val: float = math.inf
    best_step: int | None = None
    nonfinite_total: int = 0
    nonfinite_run: int = 0  # consecutive, up to now
    last_val: float | None = None


def make_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.AdamW:
    """Fused AdamW: it can skip an update on a device-side flag (``found_inf``), no sync needed.

    ``optim.decay_norms_and_biases: true`` (the write-up) decays every parameter; false
    exempts norm parameters and biases, the common modern choice.
    """
    o = cfg.optim
    if o.decay_norms_and_biases:
        groups = [{"params": [p for p in model.parameters()], "weight_decay": o.weight_decay}]
    else:
        norm_ids = {id(p) for m in model.modules() if isinstance(m, NORM_MODULES) for p in m.parameters()}
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (no_decay if id(p) in norm_ids or name.endswith("bias") else decay).append(p)
        groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True)


class StopFlag:
    """SIGTERM / SIGINT ask the loop to finish its step, checkpoint and exit."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _belongs_to(ckpt: Path | None, run_dir: Path) -> bool:
    return ckpt is not None and run_dir.resolve() in ckpt.resolve().parents


def prepare_run_dir(cfg: Config, resume: str | None, overwrite: bool) -> Path | None:
    """The checkpoint to resume from (or None), after refusing anything that would lose a run."""
    run_dir = cfg.run_dir
    latest = ckpt_io.latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if resume == "auto":
        return latest
    source = ckpt_io.find_checkpoint(resume) if resume is not None else None
    if _belongs_to(source, run_dir):
        return source  # an earlier checkpoint of this very run
    holds_run = latest is not None or (run_dir / "metrics.jsonl").is_file()
    if holds_run and not overwrite:
        what = f"checkpoints up to {latest.name}" if latest else "metrics of an earlier run"
        raise UserError(f"{run_dir} already holds a run ({what}); pass --resume auto to continue it, "
                        f"--overwrite to start over (the old run is moved aside), or set run.name / run.dir")
    return source


def _move_aside(run_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
    run_dir.rename(aside)
    return aside


def train(cfg: Config, resume: str | None = None, overwrite: bool = False) -> dict:
    """Run (or continue) the training run ``cfg`` describes; returns its summary."""
    d = setup(cfg.run.device)
    try:
        return _train(cfg, d, resume, overwrite)
    finally:
        d.close()


def _train(cfg: Config, d: Dist, resume: str | None, overwrite: bool) -> dict:
    t = cfg.train
    # ---- everything a user can get wrong, before any model is built
    if t.global_batch_size % (t.micro_batch_size * d.world_size):
        raise UserError(f"train.global_batch_size {t.global_batch_size} is not a multiple of "
                        f"train.micro_batch_size {t.micro_batch_size} x {d.world_size} processes; "
                        f"choose a global batch divisible by {t.micro_batch_size * d.world_size}")
    resume_from = prepare_run_dir(cfg, resume, overwrite)
    if resume_from is not None:
        ckpt_io.check_same_model(ckpt_io.checkpoint_config(resume_from).model, cfg.model, resume_from)
    data_dir = resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision) if d.is_main else None
    data_dir = d.gather_objects(data_dir)[0]  # rank 0 fetched (if from the Hub); everyone reads it
    train_tokens = open_split(data_dir, cfg.data.train_split)
    val_tokens = open_split(data_dir, cfg.data.val_split)
    if cfg.data.val_offset + cfg.data.val_tokens > len(val_tokens):
        raise DataError(f"{val_tokens.path}: validation range [{cfg.data.val_offset:,}, "
                        f"{cfg.data.val_offset + cfg.data.val_tokens:,}) is past its {len(val_tokens):,} tokens; "
                        "lower data.val_tokens or data.val_offset")
    if eval_sequences(cfg.data.val_tokens, cfg.model.context_length) == 0:
        raise DataError(f"data.val_tokens {cfg.data.val_tokens} holds no sequence of "
                        f"model.context_length + 1 = {cfg.model.context_length + 1} tokens")
    reader = TrainBatches(train_tokens, cfg.model.context_length, t.micro_batch_size, t.global_batch_size,
                          rank=d.rank, world_size=d.world_size, seed=t.seed, shuffle=cfg.data.shuffle)

    # ---- build
    random.seed(t.seed + d.rank)
    np.random.seed(t.seed + d.rank)
    torch.manual_seed(t.seed + d.rank)  # dropout masks differ across ranks, as they should
    model = GPT(cfg.model, seed=cfg.init_seed)
    n_params = model.num_params()
    total_steps = cfg.total_steps(n_params)
    reader.check_capacity(total_steps)
    model.to(d.device)
    optimizer = make_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(d.device.type, enabled=t.precision == "fp16")
    progress = Progress()
    run_dir = cfg.run_dir
    config_yaml = dump_config(cfg)  # written beside the run and into every checkpoint
    if resume_from is not None:
        ckpt_io.load_weights(model, resume_from)
        state = ckpt_io.load_state(resume_from)
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        reader.load_state_dict(state["data"])
        progress = Progress(**state["progress"])
        rngs = state["rng"]
        ckpt_io.set_rng_state(rngs[d.rank] if d.rank < len(rngs) else rngs[0])
    if d.is_main:
        if overwrite and run_dir.exists() and not _belongs_to(resume_from, run_dir):
            aside = _move_aside(run_dir)
            print(f"moved the earlier run to {aside}", file=sys.stderr)
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt_io.remove_stale_temporaries(run_dir)
        (run_dir / "config.yaml").write_text(config_yaml)
        truncate_metrics(run_dir, progress.step)  # steps past the checkpoint are logged again
    d.barrier()

    net: torch.nn.Module = model
    if d.enabled:
        net = DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    if t.compile:
        net = torch.compile(net)
    autocast = autocast_for(t.precision, d.device)
    metrics = Metrics(run_dir, cfg) if d.is_main else None

    def save(is_best: bool) -> None:
        rngs = d.gather_objects(ckpt_io.rng_state())
        if d.is_main:
            elapsed = progress.elapsed + time.perf_counter() - start
            state = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                     "data": reader.state_dict(), "progress": {**vars(progress), "elapsed": elapsed}, "rng": rngs}
            info = {"step": progress.step, "tokens": progress.tokens, "val_loss": progress.last_val,
                    "best_val_loss": progress.best_val if progress.best_step is not None else None,
                    "elapsed_seconds": elapsed}
            ckpt_io.save_checkpoint(run_dir, progress.step, model, state, config_yaml, info,
                                    t.keep_last, is_best)
            plot_run(read_metrics(run_dir), run_dir, f"{cfg.run.name} ({cfg.model.norm_type})")
        d.barrier()

    # ---- the loop
    warmup = warmup_steps(total_steps, cfg.optim.warmup_frac)
    accum = reader.accum
    params = list(model.parameters())
    nonfinite_total = torch.tensor(progress.nonfinite_total, device=d.device)
    nonfinite_run = torch.tensor(progress.nonfinite_run, device=d.device)
    status, stop_reason = "completed", None
    start = time.perf_counter()
    start_step = progress.step
    # tokens/s counts training time only: evaluation and checkpoint time is kept in `paused`
    paused = 0.0
    rate_mark = (start, progress.step, paused)  # tokens/s since the last log
    steady_mark = None  # (time, step, paused) once the first STEADY_SKIP of the steps are done
    last_train_loss = None
    bar = tqdm(total=total_steps, initial=progress.step, unit="step", disable=not (d.is_main and cfg.log.progress),
               file=sys.stderr, dynamic_ncols=True)
    with StopFlag() as stop:
        while progress.step < total_steps:
            step = progress.step
            lr = lr_at(step, total_steps, lr=cfg.optim.lr, min_lr=cfg.optim.min_lr, warmup_frac=cfg.optim.warmup_frac,
                       schedule=cfg.optim.schedule, decay_frac=cfg.optim.decay_frac)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=d.device)
            for k, (x, y) in enumerate(reader.next_step()):
                if d.device.type == "cuda":  # pinned: the copy does not wait for the GPU to drain
                    x, y = x.pin_memory(), y.pin_memory()
                x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
                sync = contextlib.nullcontext() if (not d.enabled or k == accum - 1) else net.no_sync()
                with sync:
                    with autocast():
                        _, loss = net(x, y)
                    scaler.scale(loss / accum).backward()
                loss_sum += loss.detach()
            scaler.unscale_(optimizer)  # a no-op unless fp16
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            if cfg.optim.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(params, cfg.optim.grad_clip, grad_norm)
            bad = ~torch.isfinite(grad_norm)  # all ranks agree: gradients are already all-reduced
            if scaler.is_enabled():
                scaler.step(optimizer)  # skips on its own found_inf, which includes ours
                scaler.update()
            else:
                optimizer.found_inf = bad.float()  # fused AdamW skips the whole update when 1
                optimizer.grad_scale = None
                optimizer.step()
                del optimizer.found_inf, optimizer.grad_scale
            optimizer.zero_grad(set_to_none=True)
            nonfinite_total += bad
            nonfinite_run = (nonfinite_run + 1) * bad
            progress.step += 1
            progress.tokens += cfg.tokens_per_step
            bar.update(1)
            done = progress.step == total_steps
            if steady_mark is None and progress.step - start_step >= max(1, round(STEADY_SKIP * total_steps)):
                steady_mark = (time.perf_counter(), progress.step, paused)

            record = None
            if progress.step % cfg.log.log_every == 0 or done or progress.step == 1:
                # the one place the loop waits for the device
                mean_loss = (d.all_sum(loss_sum) / (accum * d.world_size)).item()
                now = time.perf_counter()
                seconds = now - rate_mark[0] - (paused - rate_mark[2])
                rate = (progress.step - rate_mark[1]) * cfg.tokens_per_step / max(seconds, 1e-9)
                rate_mark = (now, progress.step, paused)
                progress.nonfinite_total, progress.nonfinite_run = int(nonfinite_total), int(nonfinite_run)
                last_train_loss = mean_loss
                record = {"step": progress.step, "tokens": progress.tokens, "train_loss": mean_loss, "lr": lr,
                          "grad_norm": float(grad_norm), "tokens_per_s": rate,
                          "elapsed_s": progress.elapsed + now - start, "nonfinite_steps": progress.nonfinite_total}
                bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{rate:,.0f}", refresh=False)
                if progress.nonfinite_run >= t.max_nonfinite_steps:
                    status, stop_reason = "diverged", (f"{progress.nonfinite_run} consecutive steps with a "
                                                       f"non-finite loss or gradient")
                elif t.loss_ceiling is not None and progress.step > warmup and not mean_loss <= t.loss_ceiling:
                    status, stop_reason = "diverged", f"train loss {mean_loss:.4g} above train.loss_ceiling {t.loss_ceiling:g}"
            if status == "diverged":
                if metrics:
                    metrics.log(record)
                break  # keep the last good checkpoint: nothing is saved from a diverged run

            is_best = False
            pause_start = time.perf_counter()
            if progress.step % t.eval_every == 0 or done:
                # the unwrapped model: ranks may score different numbers of batches, DDP must not see it
                val_loss = evaluate_loss(model, val_tokens, cfg.data.val_offset, cfg.data.val_tokens,
                                         cfg.model.context_length, t.micro_batch_size, d, autocast)[0]
                progress.last_val = val_loss
                record = record or {"step": progress.step, "tokens": progress.tokens, "lr": lr}
                record["val_loss"] = val_loss
                if val_loss < progress.best_val:
                    progress.best_val, progress.best_step, is_best = val_loss, progress.step, True
            if record is not None and metrics:
                metrics.log(record)
            stopping = d.any_flag(stop.requested)
            if progress.step % t.checkpoint_every == 0 or done or is_best or stopping:
                save(is_best)
            paused += time.perf_counter() - pause_start
            if stopping:
                status, stop_reason = "interrupted", "stop signal (SIGTERM / SIGINT)"
                break
    bar.close()

    # ---- the end
    wall = progress.elapsed + time.perf_counter() - start
    steady = None
    if steady_mark is not None and progress.step > steady_mark[1]:
        seconds = time.perf_counter() - steady_mark[0] - (paused - steady_mark[2])
        steady = (progress.step - steady_mark[1]) * cfg.tokens_per_step / seconds
    summary = {
        "status": status, "stop_reason": stop_reason, "steps": progress.step, "total_steps": total_steps,
        "tokens": progress.tokens, "wall_seconds": wall, "tokens_per_s": steady,
        "final_train_loss": last_train_loss,
        "best_val_loss": progress.best_val if progress.best_step is not None else None,
        "best_val_step": progress.best_step, "nonfinite_steps": int(nonfinite_total),
        "diverged_at_step": progress.step if status == "diverged" else None,
        "n_params": n_params, "norm_type": cfg.model.norm_type, "seed": t.seed, "world_size": d.world_size,
        "device": torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else platform.processor() or "cpu",
        "peak_memory_bytes": (torch.cuda.max_memory_allocated(d.device) if d.device.type == "cuda"
                              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "train_token_range": [cfg.data.train_split, *reader.token_range()],
        "val_token_range": [cfg.data.val_split, cfg.data.val_offset, cfg.data.val_offset + cfg.data.val_tokens],
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
    }
    if d.is_main:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        plot_run(read_metrics(run_dir), run_dir, f"{cfg.run.name} ({cfg.model.norm_type})")
        metrics.close(summary)
        if status != "completed":
            print(f"{status} at step {progress.step}: {stop_reason}", file=sys.stderr)
    return summary

