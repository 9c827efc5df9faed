"""A run's bookkeeping, kept beside the training step: what rank 0 claims, checks and writes in the run folder.

The trainer makes one ``RunLedger`` and calls it at each point of a run: ``claim`` (lock the folder, tidy it,
choose the checkpoint to continue and check it is the same experiment), ``fingerprint`` (the segments of the
run, refusing a resume that would compute something else), ``check_length`` (a resume keeps its planned
length), ``open`` (move an old run aside, write config.yaml and the "running" summary), ``write_summary`` and
``say_end`` (summary.json and the one line on how the run ended), ``mark_interrupted`` (after a third stop
signal) and ``lost_peers`` (what a rank says when a peer's process ended). Every rank holds the outcome of
the claim and the segments (rank 0 works them out, the others receive them); only rank 0 writes.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from gpt.common.errors import UserError, clipped, first_line, os_reason
from gpt.config import Config, dump_config, load_config
from gpt.data.batches import TrainBatches
from gpt.data.tokens import TokenRange, tokenizer_name
from gpt.run.checkpoints import (
    CheckpointError,
    check_same_experiment,
    checkpoint_config,
    read_info,
    read_pointer,
    tidy,
)
from gpt.run.directory import COMPLETED, INTERRUPTED, RUNNING, RunDir
from gpt.run.distributed import PEER_FAILURE, Dist
from gpt.run.fastpath import FastPath
from gpt.run.fingerprint import check_resume, take
from gpt.run.lock import RunLock


class RunLedger:
    """The bookkeeping of run ``cfg`` on this rank (see the module's docstring)."""

    def __init__(self, cfg: Config, dist: Dist):
        self.cfg, self.dist = cfg, dist
        self.run = RunDir(cfg.run_dir)
        self.config_yaml = dump_config(cfg)  # written beside the run and into every checkpoint
        self.lock: RunLock | None = None  # rank 0's hold on the run directory, from the claim to the end
        # the claim (every rank)
        self.resume_from: Path | None = None  # the checkpoint to continue from
        self.move_aside = False  # --overwrite of a run this one does not continue: move the old one aside
        self.continues = False  # a run continues in the folder (from a checkpoint, or killed before one)
        self.segments: list[dict] = []  # the fingerprint of every segment of the run, this one last

    # ------------------------------------------------------------ before the run

    def claim(self, resume: str | None, overwrite: bool) -> None:
        """Lock the run directory, tidy it, choose the checkpoint to resume from and check that it is the same
        experiment (rank 0; every rank learns the outcome)."""
        self.resume_from, self.move_aside, self.continues = self.dist.on_main(lambda: self._claim(resume, overwrite))

    def _claim(self, resume: str | None, overwrite: bool) -> tuple[Path | None, bool, bool]:
        self.lock = self.run.lock()
        for note in tidy(self.run.checkpoints):
            print(note, file=sys.stderr)
        resume_from = self.run.claim(resume, overwrite, report=lambda note: print(note, file=sys.stderr))
        holds_run = self.run.holds_run()
        move_aside = overwrite and not self.run.owns(resume_from) and holds_run  # else nothing to keep
        continues = resume_from is not None or (holds_run and not move_aside)
        if resume_from is not None:  # the experiment continues only as it began
            check_same_experiment(checkpoint_config(resume_from), self.cfg, resume_from)
        elif continues and self.run.config_file.is_file():  # restarting a run killed before a checkpoint
            check_same_experiment(load_config(self.run.config_file), self.cfg, self.run.config_file)
        return resume_from, move_aside, continues

    def fingerprint(self, fast: FastPath, data_dir: Path, reader: TrainBatches, val: TokenRange) -> None:
        """The segments of the run so far (the resumed checkpoint's) and this one's fingerprint, after refusing
        a resume that would compute something else than the checkpoint did (rank 0; every rank gets them)."""
        self.segments = self.dist.on_main(lambda: self._segments(fast, data_dir, reader, val))

    def _segments(self, fast: FastPath, data_dir: Path, reader: TrainBatches, val: TokenRange) -> list[dict]:
        saved = read_info(self.resume_from) if self.resume_from is not None else {}
        current = take(
            fast,
            self.dist,
            data_dir=data_dir,
            tokenizer=tokenizer_name(data_dir),
            micro_batch_size=self.cfg.train.micro_batch_size,
            grad_accum=reader.accum,
            train=reader.tokens,
            train_range=reader.token_range(),
            val=val.tokens,
            val_range=(val.offset, val.offset + val.n_tokens),
            from_step=saved.get("step", 0),
        )
        check_resume(saved.get("segments", []), current, self.resume_from)
        return [*saved.get("segments", []), current]

    def check_length(self, planned: int | None, step: int, total_steps: int) -> None:
        """Refuse to continue a checkpoint (at ``step``, of a run ``planned`` to take that many steps) under
        another plan than the one it was trained for."""
        if planned is not None and planned != total_steps:
            raise CheckpointError(
                f"{self.resume_from} belongs to a run of {planned:,} steps, but this config now "
                f"gives {total_steps:,}; the schedule would change mid-run: start a new run"
            )
        if step > total_steps:
            raise CheckpointError(
                f"{self.resume_from} is at step {step:,}, past this config's {total_steps:,} steps: start a new run"
            )

    def open(self, step: int, total_steps: int, token_ranges: dict) -> list[str]:
        """Rank 0: set the run directory up and mark the run as running (an evaluator then knows that its
        summary is not final); returns what it did worth saying."""
        notes = []
        if self.move_aside:
            notes.append(f"moved the earlier run to {self.run.move_aside()}")
            self.lock.release()  # its lock file went with it: hold the new folder's
            self.lock = self.run.lock()
        notes += self.run.start(self.config_yaml, step, keep_config=self.continues)
        cfg = self.cfg
        try:
            self.run.write_summary(
                {
                    "status": RUNNING,
                    "pid": os.getpid(),
                    "steps": step,
                    "total_steps": total_steps,
                    "norm_type": cfg.model.norm_type,
                    "seed": cfg.train.seed,
                    **token_ranges,
                    "segments": self.segments,
                }
            )
        except OSError as e:
            raise UserError(
                f"cannot write {self.run.summary_file}: {os_reason(e)}; free space or make the run "
                "directory writable, then rerun"
            ) from None
        return notes

    # ------------------------------------------------------------------ the end

    def write_summary(self, summary: dict) -> str | None:
        """Rank 0: write summary.json; what went wrong if it could not (the disk that stopped a checkpoint)."""
        try:
            self.run.write_summary(summary)
        except OSError as e:
            return f"{self.run.summary_file.name} not written: {os_reason(e)}"
        return None

    @staticmethod
    def say_end(status: str, reason: str | None, step: int, problems: list[str | None]) -> None:
        """Rank 0: one line on stderr for a run that did not complete, or for what went wrong at the end."""
        said = "; ".join(x for x in problems if x)
        if status != COMPLETED:
            print(f"{status} at step {step}: {reason}" + (f" ({said})" if said else ""), file=sys.stderr)
        elif said:
            print(f"warning: {said}", file=sys.stderr)

    def mark_interrupted(self, why: str) -> None:
        """Rank 0, after a third stop signal: mark a run that had started as interrupted (its newest
        checkpoint stands); a folder it cannot write is left as it is."""
        if not self.dist.is_main:
            return
        try:
            summary = self.run.summary()
            if summary is not None and summary.get("status") == RUNNING:
                self.run.write_summary({**summary, "status": INTERRUPTED, "stop_reason": why})
        except (OSError, UserError):
            pass

    def lost_peers(self, lost: list[int], exc: RuntimeError, resume: str | None, step: int) -> str:
        """What a rank says when ``lost`` (``Dist.lost_ranks``: ranks on its machine whose process ended, else
        those of the machine the error names, else none) broke a collective at ``step``: who, when, and which
        checkpoint a restart or a rerun continues from."""
        dist, here = self.dist, socket.gethostname()
        ranks = ", ".join(map(str, lost))
        if not lost:
            who = f"lost a rank on another machine ({clipped(first_line(exc), 160)})"
        elif dist.peers[lost[0]].host == here:
            pids = ", ".join(str(dist.peers[r].pid) for r in lost)
            who = f"lost rank {ranks} (PID {pids} on {here} ended: killed, or out of memory?)"
        else:
            peer = dist.peers[lost[0]]
            reason = PEER_FAILURE.search(str(exc)).group(0)
            who = (
                f"lost node {peer.host} (rank {ranks}; {reason} from {', '.join(peer.addresses)}: "
                "its node down, its network cut, or its process killed?)"
            )
        try:
            latest = read_pointer(self.run.checkpoints, "latest")
        except CheckpointError:
            latest = None
        where = f"checkpoint {latest.name}" if latest is not None else "the start (no checkpoint yet)"
        left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) - int(
            os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)
        )
        if resume != "auto":
            then = f"rerun with --resume auto to continue from {where} (a restart without it refuses the run it finds)"
        elif left > 0:
            then = f"torchrun restarts the group ({left} restart(s) left) and --resume auto continues from {where}"
        else:
            then = f"rerun with --resume auto to continue from {where} (torchrun --max-restarts=N does it by itself)"
        return f"{who} at step {step}; rank {dist.rank} stops too: {then}"

    def release(self) -> None:
        """Let the run directory go (a killed process lets go too: the kernel drops its lock)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
