"""The training run: one process or DDP under torchrun, resumable to the bit.

Follow a batch: ``TrainBatches.next_step()`` reads this rank's micro-batches of the
global step from the token file; ``StepEngine.step`` (``gpt.training.step``) runs the
optimizer step on them. Every ``log_every`` steps, and only then, the loop reads numbers
back from the device: losses, the norm, divergence counters. Validation, checkpoints and
the stop-signal check follow. A checkpoint (weights, optimizer, reader: 1.8 GiB at GPT-2 small) is
written every ``train.checkpoint_every`` steps (null: about ten a run, ``checkpoint_interval``), at
the end and on a stop; a new best validation between them only copies the weights into host memory,
written (weights alone, ``best-<step>/``) before the next checkpoint, so every checkpoint's best is
on the disk and a run writes at most twice as many folders as it has checkpoints.

A ``Trainer`` is used in three stages: ``preflight`` checks everything a user can get
wrong before anything heavy is built, ``build`` makes the model, optimizer, grad scaler
and reader (and loads the checkpoint it resumes from), ``train`` runs the loop and
returns the summary. ``state_dict`` / ``load_state_dict`` are the one place that says
what a checkpoint carries besides the weights.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from gpt.common.errors import UserError
from gpt.common.stops import LostPeer, StopNow
from gpt.config import Config
from gpt.data.batches import TrainBatches
from gpt.data.folders import check_vocabulary, open_split, resolve_data_dir
from gpt.data.tokens import DataError, TokenRange
from gpt.evaluation.token_loss import evaluate_loss
from gpt.run.checkpoints import (
    CheckpointError,
    HeldBest,
    checkpoint_interval,
    load_state,
    load_weights,
    save_checkpoint,
)
from gpt.run.directory import COMPLETED, DIVERGED, INTERRUPTED, RunDir
from gpt.run.distributed import Dist, device_name, peak_memory, setup
from gpt.run.fastpath import resolve
from gpt.run.ledger import RunLedger
from gpt.run.nodes import check_nodes
from gpt.run.random_state import rng_state, set_rng_state
from gpt.training.hooks import RunHooks
from gpt.training.inside import EarlyWarning, StatsProbe
from gpt.training.metrics import Metrics
from gpt.training.monitors import Divergence, LossWindow, StopFlag, Throughput
from gpt.training.optimizer import set_lr, split_record
from gpt.training.schedule import lr_at, warmup_steps
from gpt.training.step import StepEngine, train_reader


class Ending(NamedTuple):
    """How the loop ended: the run's status, and why it stopped short (None: completed)."""

    status: str
    reason: str | None


@dataclass
class Progress:
    """What a checkpoint must carry besides weights, optimizer and reader to continue exactly."""

    step: int = 0  # optimizer steps done
    tokens: int = 0  # training tokens consumed
    elapsed: float = 0.0  # wall seconds of training before this process started
    best_val: float = math.inf  # lowest validation loss so far
    best_step: int | None = None  # the step that measured it (None: no validation yet)
    nonfinite_total: int = 0  # skipped (non-finite) steps, as counted at the last log step
    nonfinite_run: int = 0  # of those, consecutive up to the last log step
    last_val: float | None = None  # the latest validation loss
    total_steps: int | None = None  # the run's planned length: a resume must keep it
    window: list[float] | None = None  # the train-loss window since the last log, summed over ranks (LossWindow)
    last_train_loss: float | None = None  # the last log step's mean train loss: the summary's, after a resume too

    @property
    def best_val_loss(self) -> float | None:
        return self.best_val if self.best_step is not None else None


def train(
    cfg: Config,
    resume: str | None = None,
    overwrite: bool = False,
    dist: Dist | None = None,
    hooks: list[RunHooks] = (),
) -> dict:
    """Run (or continue) the training run ``cfg`` describes; returns its summary.

    ``resume``: ``auto`` or a run / checkpoint path (see ``RunDir.claim``); ``overwrite``
    moves an existing run aside. ``dist``: an already set-up process group (default: join
    torchrun's, if any, and leave it at the end). ``hooks``: what rank 0 tells of the run's
    progress (charts, Hub uploads: ``gpt.commands.cli.standard_hooks``); none by default.
    """
    own_group = dist is None  # joined here: left here
    dist = dist or setup(cfg.run.device)
    trainer = Trainer(cfg, dist, hooks)
    try:
        trainer.preflight(resume, overwrite)
        trainer.build()
        return trainer.train()
    except StopNow as e:  # a third stop signal: say so in the summary, keep every checkpoint as it is
        trainer.ledger.mark_interrupted(str(e))
        raise
    except RuntimeError as e:  # a collective that failed: a peer rank's process ended?
        lost = dist.lost_ranks(e)
        if lost is None:
            raise
        message = trainer.ledger.lost_peers(lost, e, resume, trainer.progress.step)
        trainer.ledger.mark_interrupted(message)
        raise LostPeer(message, say=dist.speaks_for(lost)) from None
    finally:
        trainer.release()
        if own_group:
            dist.close()


@dataclass
class Watchers:
    """The loop's sinks and monitors, made when it starts (``Trainer.start``)."""

    metrics: Metrics | None  # rank 0: metrics.jsonl and wandb
    window: LossWindow  # the train losses since the last log
    divergence: Divergence  # non-finite steps and the loss ceiling, counted on the device
    bar: tqdm  # the progress bar
    throughput: Throughput  # tokens/s, steady and since the last log


class Trainer:
    """One training run on this rank: ``preflight``, ``build``, then ``train``. The model, optimizer and
    the step itself are its ``engine``'s (``gpt.training.step.StepEngine``), which the benchmark and the memory
    probe use without a run.

    Every attribute is declared here; those that a stage sets are None until it has run. The run's
    bookkeeping (its folder, lock, fingerprint, summary) is the ledger's (``gpt.run.ledger``)."""

    def __init__(self, cfg: Config, dist: Dist, hooks: list[RunHooks] = ()):
        self.cfg, self.dist = cfg, dist
        self.hooks = list(hooks) if dist.is_main else []  # rank 0 tells; the other ranks only train
        self.ledger = RunLedger(cfg, dist)  # the run folder: claim, fingerprint, summary, the end
        self.fast = resolve(cfg.train, dist.device)  # precision, compile, TF32, prefetch as they apply here
        self.first_step_seconds: float | None = None  # this process's first step: compiling, warming up
        self.progress = Progress()
        self.diverged_at: int | None = None  # the step a divergence was first seen at (check_divergence)
        # preflight
        self.val: TokenRange | None = None  # the validation range (open_data)
        self.reader: TrainBatches | None = None  # this rank's training batches (open_reader)
        # build
        self.engine = StepEngine(cfg, dist, self.fast)  # the model, optimizer, grad scaler and the step itself
        self.total_steps: int | None = None  # the run's planned optimizer steps
        self.warmup: int | None = None  # of those, warmup steps
        self.checkpoint_every: int | None = None  # train.checkpoint_every, or sized to the run
        # start
        self.watch: Watchers | None = None  # the loop's sinks and monitors
        self.last_checkpoint: Path | None = None  # rank 0: the newest checkpoint written
        self.held = HeldBest()  # rank 0: a new best's weights between checkpoints, in host memory
        self.probe: StatsProbe | None = None  # rank 0, log.stats_every > 0: what each norm does inside the model
        self.warning: EarlyWarning | None = None  # rank 0: says when the probe's statistics run away

    # ------------------------------------------------------------ before the loop

    def preflight(self, resume: str | None, overwrite: bool) -> None:
        """Everything a user can get wrong, checked before any model is built."""
        cfg, dist, t = self.cfg, self.dist, self.cfg.train
        unsplit = t.split_problem(dist.world_size)
        if unsplit:
            raise UserError(unsplit)
        for note in check_nodes(dist, cfg, cfg.run_dir.parent):  # several machines: the same code, config, folder
            if dist.is_main:
                print(note, file=sys.stderr)
        self.ledger.claim(resume, overwrite)
        data_dir = dist.on_main(lambda: resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision))
        self.open_data(data_dir)
        self.ledger.fingerprint(self.fast, data_dir, self.reader, self.val)

    def open_data(self, data_dir: Path) -> None:
        """Open the validation range and the training reader; refuse ranges and token ids that do not fit."""
        cfg = self.cfg
        check_vocabulary(data_dir, cfg.model.vocab_size)
        self.val = TokenRange(open_split(data_dir, cfg.data.val_split), cfg.data.val_offset, cfg.data.val_tokens)
        if self.val.offset + self.val.n_tokens > len(self.val.tokens):
            raise DataError(
                f"{self.val.tokens.path}: validation range [{self.val.offset:,}, "
                f"{self.val.offset + self.val.n_tokens:,}) is past its {len(self.val.tokens):,} tokens; "
                "lower data.val_tokens or data.val_offset"
            )
        if self.val.n_sequences(cfg.model.context_length) == 0:
            raise DataError(
                f"data.val_tokens {cfg.data.val_tokens} holds no sequence of "
                f"model.context_length + 1 = {cfg.model.context_length + 1} tokens"
            )
        self.val.check_ids(cfg.model.vocab_size)  # the whole range, now, rather than at the first validation
        self.open_reader(data_dir)

    def open_reader(self, data_dir: Path) -> None:
        """The training reader of this rank, reading ahead where the fast path says so."""
        self.reader = train_reader(self.cfg, self.dist, self.fast, data_dir)

    def build(self) -> None:
        """Seed, build the model (``StepEngine``), refuse a length it cannot warm up in, then the optimizer and
        grad scaler; load the checkpoint resumed from."""
        cfg = self.cfg
        model = self.engine.build_model()
        self.total_steps = cfg.total_steps(model.num_params(norms=False))
        self.progress.total_steps = self.total_steps
        self.warmup = warmup_steps(self.total_steps, cfg.optim.warmup_frac)
        self.checkpoint_every = checkpoint_interval(self.total_steps, cfg.train.eval_every, cfg.train.checkpoint_every)
        if self.warmup >= self.total_steps > 1:
            raise UserError(
                f"optim.warmup_frac {cfg.optim.warmup_frac:g} of {self.total_steps:,} steps is "
                f"{self.warmup:,} warmup steps, the whole run: the learning rate would never decay; "
                "lower optim.warmup_frac or train for more steps"
            )
        unmeasured = cfg.stop_on_problem(self.total_steps)  # train.tokens_per_param: known only now
        if unmeasured:
            raise UserError(f"train.stop_on: {unmeasured}")
        self.reader.check_capacity(self.total_steps)
        self.engine.build_optimizer()
        if self.ledger.resume_from is not None:
            load_weights(model, self.ledger.resume_from)
            self.load_state_dict(load_state(self.ledger.resume_from))
            self.ledger.check_length(self.progress.total_steps, self.progress.step, self.total_steps)

    def state_dict(self) -> dict:
        """Everything besides the weights that continuing exactly needs. Every rank calls it:
        it gathers every rank's RNG states."""
        return {
            "optimizer": self.engine.optimizer.state_dict(),
            "scaler": self.engine.scaler.state_dict(),
            "data": self.reader.state_dict(),
            "progress": {
                **vars(self.progress),
                "elapsed": self.progress.elapsed + self.watch.throughput.seconds(),
                "window": self.watch.window.totals(self.dist.all_sum),
            },
            "rng": self.dist.gather_objects(rng_state()),
        }

    def load_state_dict(self, state: dict) -> None:
        self.engine.optimizer.load_state_dict(state["optimizer"])
        self.engine.scaler.load_state_dict(state["scaler"])
        self.reader.load_state_dict(state["data"])
        self.progress = Progress(**{"total_steps": None, **state["progress"]})  # older checkpoints: no plan
        rngs = state["rng"]  # a run resumed on more ranks than it had: the new ones take rank 0's
        set_rng_state(rngs[self.dist.rank] if self.dist.rank < len(rngs) else rngs[0])

    def start(self) -> None:
        """Set the run directory up (rank 0), prepare the step, open the sinks."""
        cfg, dist, p = self.cfg, self.dist, self.progress
        for note in dist.on_main(self.open_run):
            print(note, file=sys.stderr)
        self.engine.prepare()
        self.watch = Watchers(
            metrics=Metrics(self.run, cfg) if dist.is_main else None,
            window=LossWindow(dist.device, p.window if dist.is_main else None),  # all of a resumed window: rank 0
            divergence=Divergence(
                dist.device,
                step=p.step,
                total=p.nonfinite_total,
                consecutive=p.nonfinite_run,
                max_nonfinite=cfg.train.max_nonfinite_steps,
                loss_ceiling=cfg.train.loss_ceiling,
                warmup=self.warmup,
            ),
            bar=tqdm(
                total=self.total_steps,
                initial=p.step,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                disable=not (dist.is_main and cfg.log.progress),
            ),
            throughput=Throughput(p.step, self.total_steps, cfg.tokens_per_step),
        )
        if dist.is_main and cfg.log.stats_every:
            self.probe = StatsProbe(cfg.log.stats_every)
            self.warning = EarlyWarning(cfg.log.stats_warn_growth, cfg.log.stats_warn_window, cfg.train.stop_on)
            for record in self.run.stats():  # a resumed run: the recent values and what was said, as before
                self.warning.check(record)

    def open_run(self) -> list[str]:
        """Rank 0: set the run directory up, mark the run as running, tell the hooks."""
        notes = self.ledger.open(self.progress.step, self.total_steps, self.token_ranges())
        for hook in self.hooks:
            hook.started(self.run.path)
        return notes

    @property
    def run(self) -> RunDir:
        return self.ledger.run

    def release(self) -> None:
        """Close the reader and let the run directory go (a killed process lets go too: the kernel drops its lock)."""
        if self.reader is not None:
            self.reader.close()
        self.ledger.release()

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict:
        """Step until the run is done, has diverged or is asked to stop; returns the summary. Stop signals
        are counted from the start to the end (``StopFlag``): the first stops the run after its step and a
        checkpoint, the second hurries that stop (no wait for uploads), the third ends it at once."""
        with StopFlag() as stop:
            self.start()
            return self.finish(*self.loop(stop), stop)

    def loop(self, stop: StopFlag) -> Ending:
        """The training steps, each read top to bottom: the step, its statistics, the log, validation, a
        checkpoint. Only the log, validation and checkpoint steps wait for the device. Ends completed after the
        planned last step, or early: diverged (the counters, or an early warning that train.stop_on names),
        interrupted (a checkpoint that could not be written, a stop signal)."""
        p = self.progress
        while p.step < self.total_steps:
            lr, loss_sum, grad_norm = self.step()
            if self.should_measure(p.step) and self.dist.any_flag(self.read_stats()):  # rank 0's warning says where
                self.diverged_at = p.step
                return Ending(DIVERGED, self.warning.stop if self.warning else "early warning (train.stop_on)")
            stopping = self.dist.any_flag(stop.requested)  # every step: training time, not a pause
            evaluate, save = self.should_evaluate(p.step), self.should_checkpoint(p.step) or stopping
            record, counts = self.log_record(lr, loss_sum, grad_norm) if self.should_log(p.step) else (None, None)
            # wherever the loop waits for the device anyway, it also reads the divergence counters
            reason = self.check_divergence(record, counts) if record is not None or evaluate or save else None
            if reason:  # keep the last good checkpoint: nothing is saved from a diverged run
                self.log(record)
                return Ending(DIVERGED, reason)
            with self.watch.throughput.paused(self.dist.synchronize) if evaluate or save else contextlib.nullcontext():
                record = record or ({"step": p.step, "tokens": p.tokens, "lr": lr} if evaluate else None)
                is_best = evaluate and self.validate(record)
                self.log(record)
                failed = self.checkpoint(is_best, full=save) if save or is_best else None
            if failed:  # a full disk, say: stop, keeping the last good one
                return Ending(INTERRUPTED, failed)
            if stopping:
                return Ending(INTERRUPTED, "stop signal (SIGTERM / SIGINT)")
        return Ending(COMPLETED, None)

    def step(self) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One optimizer step at the schedule's learning rate, counted (progress, divergence, the loss window,
        the bar); its learning rate, and its loss sum and gradient norm as device tensors, nothing waited for."""
        p = self.progress
        lr = self.scheduled_lr(p.step)
        set_lr(self.engine.optimizer, lr)
        loss_sum, grad_norm, skipped = self.first_step() if self.first_step_seconds is None else self.train_step()
        self.watch.divergence.record(skipped)
        self.watch.window.add(loss_sum, self.reader.accum)
        p.step += 1
        p.tokens += self.cfg.tokens_per_step
        self.watch.bar.update(1)
        self.watch.throughput.step_done(p.step)
        return lr, loss_sum, grad_norm

    def scheduled_lr(self, step: int) -> float:
        o = self.cfg.optim
        return lr_at(
            step,
            self.total_steps,
            lr=o.lr,
            min_lr=o.min_lr,
            warmup_frac=o.warmup_frac,
            schedule=o.schedule,
            decay_frac=o.decay_frac,
        )

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimizer step on this rank's micro-batches of the next global step (``StepEngine.step``): device
        tensors, nothing waited for. On a stats step rank 0's probe measures inside it."""
        probe = self.probe if self.probe is not None and self.probe.due(self.progress.step + 1) else None
        return self.engine.step(self.reader.next_step(), self.reader.accum, probe)

    def first_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This process's first step, timed apart and left out of tokens/s: it compiles the model
        (train.compile) and warms up kernels and allocators."""
        self.dist.synchronize()
        began = time.perf_counter()
        out = self.train_step()
        self.dist.synchronize()
        self.first_step_seconds = time.perf_counter() - began
        self.watch.throughput.restart(self.progress.step + 1)
        if self.fast.compile and self.dist.is_main:
            self.watch.bar.write(
                f"torch.compile: the first step took {self.first_step_seconds:.1f} s (compiling); "
                "tokens/s leaves it out",
                file=sys.stderr,
            )
        return out

    def should_measure(self, step: int) -> bool:
        """A stats step (log.stats_every): rank 0's probe measured inside it; every rank hears its verdict."""
        return self.cfg.log.stats_every > 0 and step % self.cfg.log.stats_every == 0

    def should_log(self, step: int) -> bool:
        return step % self.cfg.log.log_every == 0 or step == self.total_steps or step == 1

    def should_evaluate(self, step: int) -> bool:
        return step % self.cfg.train.eval_every == 0 or step == self.total_steps

    def should_checkpoint(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step == self.total_steps

    def log_record(self, lr: float, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> tuple[dict, list[float]]:
        """The metrics of a log step, and the divergence counters read with them (``Divergence.on_device``):
        one all-reduce and one read back, a log step's only wait for the device (other steps never wait).

        ``train_loss`` is the mean over the steps since the last log, ``train_loss_last`` the
        log step's own."""
        p, dist, w = self.progress, self.dist, self.watch
        measured = {  # this rank's device numbers of the record: read back with the losses and counters
            "grad_norm": grad_norm,
        }
        summed = dist.all_sum(torch.cat([loss_sum.float().reshape(1), w.window.sums]))  # this step's, the window's
        local = [t.double().reshape(1) for t in measured.values()]
        read = torch.cat([summed.double(), *local, w.divergence.on_device().double()]).tolist()  # the one read
        (step_sum, *window), values, counts = read[:3], read[3 : 3 + len(local)], read[3 + len(local) :]
        last = step_sum / (self.reader.accum * dist.world_size)
        mean_loss = w.window.take(window)
        rate = self.watch.throughput.since_last_log(p.step)
        p.last_train_loss = mean_loss
        self.watch.bar.set_postfix(
            loss=f"{mean_loss:.4f}", tok_s="-" if rate is None else f"{rate:,.0f}", refresh=False
        )
        record = {
            "step": p.step,
            "tokens": p.tokens,
            "train_loss": mean_loss,
            "train_loss_last": last,
            "lr": lr,
            **dict(zip(measured, values, strict=True)),
            "tokens_per_s": rate,
            "elapsed_s": p.elapsed + self.watch.throughput.seconds(),
        }
        return record, counts

    def check_divergence(self, record: dict | None, counts: list[float] | None = None) -> str | None:
        """Read the divergence counters (``counts``: a log step read them already) into the progress (and
        ``record``); why the run diverged, or None."""
        p = self.progress
        p.nonfinite_total, p.nonfinite_run, crossed_at = self.watch.divergence.counts(counts)
        if record is not None:
            record["nonfinite_steps"] = p.nonfinite_total
        verdict = self.watch.divergence.reason(crossed_at, p.step, record["train_loss"] if record else None)
        if verdict is None:
            return None
        reason, self.diverged_at = verdict
        return reason

    def read_stats(self) -> bool:
        """Rank 0, a stats step: read the probe's numbers back (a wait, as at a log step), write them and say
        any early warning; True when one of them is to stop the run (``train.stop_on``). Any other step: False."""
        if self.probe is None or self.probe.pending is None:
            return False
        record = self.probe.take(self.progress.step, self.progress.tokens)
        self.watch.metrics.log_stats(record)
        for line in self.warning.check(record):
            self.watch.bar.write(line, file=sys.stderr)
        return self.warning.stop is not None

    def validate(self, record: dict) -> bool:
        """Measure the validation loss into ``record``; True if it is the best so far."""
        p = self.progress
        # the unwrapped model: ranks may score different numbers of batches, DDP must not see it
        p.last_val = evaluate_loss(
            self.engine.model,
            self.val,
            self.dist,
            seq_len=self.cfg.model.context_length,
            batch_size=self.cfg.train.micro_batch_size,
            autocast=self.engine.autocast,
            compiled=self.engine.scorer,
        )[0]
        record["val_loss"] = p.last_val
        if p.last_val < p.best_val:
            p.best_val, p.best_step = p.last_val, p.step
            return True
        return False

    def log(self, record: dict | None) -> None:
        if record is not None and self.watch.metrics is not None:
            self.watch.metrics.log(record)

    # ------------------------------------------------------- checkpoints, the end

    def checkpoint(self, is_best: bool, full: bool = True) -> str | None:
        """Save a checkpoint of this step (rank 0 writes, every rank takes part) and tell the hooks; why it could
        not be written (every rank hears it), or None. A new best between checkpoints (``full`` False): rank 0
        holds its weights in host memory (``HeldBest``), written before the next checkpoint, or as the run ends
        diverged; a checkpoint that is the best drops what is held."""
        if not full:
            if self.dist.is_main:
                self.held.hold(self.engine.model, self.info(self.progress.elapsed + self.watch.throughput.seconds()))
            return None
        state = self.state_dict()

        def save() -> None:
            if is_best:
                self.held.drop()
            self.write_held_best()
            self.last_checkpoint = save_checkpoint(
                self.run.checkpoints,
                self.progress.step,
                self.engine.model,
                state=state,
                config_yaml=self.ledger.config_yaml,
                info=self.info(state["progress"]["elapsed"]),
                keep_last=self.cfg.train.keep_last,
                is_best=is_best,
            )
            for hook in self.hooks:
                hook.checkpoint_saved(self.last_checkpoint)

        try:
            self.dist.on_main(save)
        except CheckpointError as e:  # a full disk, say: the last good checkpoint stands
            return str(e)
        return None

    def info(self, elapsed: float) -> dict:
        """A checkpoint's checkpoint.json at this step."""
        p = self.progress
        return {
            "step": p.step,
            "tokens": p.tokens,
            "val_loss": p.last_val,
            "best_val_loss": p.best_val_loss,
            "elapsed_seconds": elapsed,
            "segments": self.ledger.segments,
        }

    def write_held_best(self) -> None:
        """Rank 0: write the best weights held in host memory, if any."""
        self.held.write(
            self.run.checkpoints,
            config_yaml=self.ledger.config_yaml,
            keep_last=self.cfg.train.keep_last,
            synchronize=self.dist.synchronize,
        )

    def token_ranges(self) -> dict:
        """The tokens the run reads for training and validation, as the evaluator checks them."""
        data = self.cfg.data
        return {
            "train_token_range": [data.train_split, *self.reader.token_range()],
            "val_token_range": [data.val_split, self.val.offset, self.val.offset + self.val.n_tokens],
        }

    def summary(self, status: str, reason: str | None) -> dict:
        """What summary.json says of the run (see the README for every field)."""
        cfg, dist, p = self.cfg, self.dist, self.progress
        return {
            "status": status,
            "stop_reason": reason,
            "steps": p.step,
            "total_steps": self.total_steps,
            "tokens": p.tokens,
            "wall_seconds": p.elapsed + self.watch.throughput.seconds(),
            "tokens_per_s": self.watch.throughput.steady(p.step),
            "final_train_loss": p.last_train_loss,
            "best_val_loss": p.best_val_loss,
            "best_val_step": p.best_step,
            "nonfinite_steps": self.watch.divergence.counts()[0],
            "diverged_at_step": self.diverged_at if status == DIVERGED else None,
            "early_warnings": self.warning.lines if self.warning is not None else [],  # log.stats_every's
            "n_params": self.engine.model.num_params(),  # a tied weight once, vocabulary padding not at all
            "n_params_outside_norms": self.engine.model.num_params(norms=False),
            "flops_per_token": self.engine.model.flops_per_token(),  # training FLOPs: x tokens (scaling fits)
            "optimizer": split_record(self.engine.model, cfg.optim),  # what Muon and AdamW each update
            "norm_type": cfg.model.norm_type,
            "seed": cfg.train.seed,
            "precision": self.fast.precision,
            "compile": self.fast.compile,
            "first_step_seconds": self.first_step_seconds,
            "world_size": dist.world_size,
            "device": device_name(dist.device),
            **peak_memory(dist.device),
            **self.token_ranges(),
            "segments": self.ledger.segments,  # every process's fingerprint: versions, hardware, data, code
        }

    def finish(self, status: str, reason: str | None, stop: StopFlag | None = None) -> dict:
        """Close the progress bar and the sinks; rank 0 keeps the best weights a diverged run held, waits for the
        uploads (bounded once a stop signal came), writes summary.json and the final charts, and says in one
        line how the run ended."""
        if status == DIVERGED and self.dist.is_main:  # the best before it diverged is kept, as at any checkpoint
            try:
                self.write_held_best()
            except CheckpointError as e:
                self.watch.bar.write(f"warning: the best weights were not kept: {e}", file=sys.stderr)
        self.watch.bar.close()
        summary = self.summary(status, reason)
        self.dist.meet()  # the last collective: rank 0's wait for its uploads below holds no other rank
        if self.dist.is_main:
            final = self.last_checkpoint if status == COMPLETED else None
            problems = [hook.finished(status, final, summary, stop) for hook in self.hooks]
            if stop is not None and stop.hurry:
                problems.append("a second stop signal: nothing waited for after the checkpoint")
            problems.append(self.ledger.write_summary(summary))  # a disk that stopped the checkpoint: in the line
            self.watch.metrics.close(summary)
            self.ledger.say_end(status, reason, self.progress.step, problems)
        return summary
