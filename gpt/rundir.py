"""A run directory: the one module that knows its files and reads a run's status.

    runs/<name>/
        config.yaml       the resolved config, written when the run starts
        metrics.jsonl     one JSON record per logged step (rank 0)
        summary.json      written when the run ends: status, stop reason, steps, speed, ...
        loss.png lr.png grad_norm.png      charts of metrics.jsonl (gpt.plots)
        wandb_id.txt      the W&B run id, so that a resumed run continues it
        checkpoints/      step-NNNNNNNN/ folders and the latest / best pointers (gpt.checkpoint)
            step-NNNNNNNN/eval-<split>-<precision>.json    a loss of that checkpoint (gpt.evaluation)

Training, evaluation, comparison and the sweep reach these files only through here.
A run's status is its ``summary.json``'s: ``completed``, ``diverged`` or ``interrupted``;
with no summary it is ``unfinished`` (still running, or killed before it could write one).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpt.checkpoint import (MODEL_FILE, CheckpointError, is_checkpoint, read_pointer,
                            remove_stale_temporaries)
from gpt.errors import UserError

COMPLETED, DIVERGED, INTERRUPTED = "completed", "diverged", "interrupted"
UNFINISHED = "unfinished"  # no summary.json: running, or killed before it ended
FINISHED = (COMPLETED, DIVERGED)  # results: a sweep does not run them again
EXIT_CODES = {COMPLETED: 0, DIVERGED: 3, INTERRUPTED: 4}  # train.py's exit status for each (2: a user error)
EVAL_PREFIX = "eval-"
CHECKPOINTS_DIR = "checkpoints"


@dataclass(frozen=True)
class RunDir:
    """The run directory at ``path`` (which may not exist yet)."""

    path: Path

    @classmethod
    def of_checkpoint(cls, ckpt: Path) -> RunDir:
        """The run a checkpoint folder belongs to (for a loose checkpoint: its parent folder)."""
        return cls(ckpt.parent.parent if ckpt.parent.name == CHECKPOINTS_DIR else ckpt.parent)

    # ------------------------------------------------------------------ files

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def wandb_id_file(self) -> Path:
        return self.path / "wandb_id.txt"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    def looks_like_run(self) -> bool:
        """Whether training ever started here (a config or a checkpoints folder)."""
        return self.config_file.is_file() or self.checkpoints.is_dir()

    # ---------------------------------------------------------------- reading

    def summary(self) -> dict | None:
        return json.loads(self.summary_file.read_text()) if self.summary_file.is_file() else None

    def status(self) -> str:
        summary = self.summary()
        return summary["status"] if summary else UNFINISHED

    def read_config(self) -> dict:
        """The resolved config as the plain mapping it was written as."""
        return yaml.safe_load(self.config_file.read_text())

    def metrics(self) -> list[dict]:
        if not self.metrics_file.is_file():
            return []
        return [json.loads(line) for line in self.metrics_file.read_text().splitlines() if line.strip()]

    def latest_checkpoint(self) -> Path | None:
        return find_checkpoint(self.path) if read_pointer(self.checkpoints, "latest") is not None else None

    def checkpoint(self, which: str) -> Path:
        """Checkpoint ``which``: ``best``, ``latest``, or ``final`` (the latest of a completed run)."""
        if which == "final":
            status = self.status()
            if status != COMPLETED:
                raise UserError(f"{self.path}: the run has no final checkpoint (status: {status}); "
                                "use --which latest or --which best")
            which = "latest"
        return find_checkpoint(self.path, which)

    def holds_run(self) -> bool:
        """Whether a run has trained here: it logged metrics or wrote a checkpoint."""
        return self.metrics_file.is_file() or read_pointer(self.checkpoints, "latest") is not None

    def owns(self, ckpt: Path | None) -> bool:
        """Whether ``ckpt`` is one of this run's own checkpoints."""
        return ckpt is not None and self.path.resolve() in Path(ckpt).resolve().parents

    # ---------------------------------------------------------------- writing

    def claim(self, resume: str | None, overwrite: bool) -> Path | None:
        """The checkpoint to resume from (or None), after refusing anything that would lose a run.

        ``resume``: ``auto`` (this run's latest checkpoint, if any), a path to a run or
        checkpoint, or None (a fresh start, refused over an existing run unless ``overwrite``).
        """
        latest = self.latest_checkpoint()
        if resume == "auto":
            return latest
        source = find_checkpoint(resume) if resume is not None else None
        if self.owns(source):
            return source  # an earlier checkpoint of this very run
        if self.holds_run() and not overwrite:
            what = f"checkpoints up to {latest.name}" if latest else "metrics of an earlier run"
            raise UserError(f"{self.path} already holds a run ({what}); pass --resume auto to continue it, "
                            f"--overwrite to start over (the old run is moved aside), or set run.name / run.dir")
        return source

    def start(self, config_yaml: str, step: int, move_aside: bool, keep_config: bool) -> Path | None:
        """Set the folder up for a run continuing after ``step`` (rank 0 only); returns where an
        earlier run was moved to, if ``move_aside`` and there was one. ``keep_config``: the run
        continues, and its config.yaml, if it has one, stays as the run began."""
        aside = None
        if move_aside and self.path.exists():
            aside = self.path.with_name(f"{self.path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            self.path.rename(aside)
        self.path.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.checkpoints)
        if not (keep_config and self.config_file.is_file()):
            self.config_file.write_text(config_yaml)
        self.truncate_metrics(step)  # steps past the checkpoint are logged again
        return aside

    def truncate_metrics(self, after_step: int) -> None:
        """Drop records past ``after_step`` (a resumed run logs those steps again), atomically."""
        if not self.metrics_file.is_file():
            return
        kept = [r for r in self.metrics() if r["step"] <= after_step]
        tmp = self.metrics_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.metrics_file)

    def write_summary(self, summary: dict) -> None:
        self.summary_file.write_text(json.dumps(summary, indent=2) + "\n")


def find_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """A checkpoint folder from a run directory, its checkpoints folder, or the folder itself."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    for root in (RunDir(path).checkpoints, path):
        target = read_pointer(root, which)
        if target is not None:
            if not is_checkpoint(target):
                raise CheckpointError(f"{root / which} names {target.name}, which is missing or incomplete")
            return target
    if not path.exists():
        raise CheckpointError(f"{path}: no such run or checkpoint")
    raise CheckpointError(f"{path}: not a run directory or checkpoint (no {CHECKPOINTS_DIR}/{which}, no {MODEL_FILE})")


def resolve_which(run_or_ckpt: str | Path, which: str) -> Path:
    """The checkpoint ``which`` (best | latest | final) of a run, or the checkpoint itself."""
    path = Path(run_or_ckpt)
    if is_checkpoint(path):
        return path
    run = RunDir(path)
    if not run.looks_like_run():
        raise UserError(f"{path}: not a run directory or checkpoint (no {run.config_file.name}, "
                        f"no {run.checkpoints.name}/, no {MODEL_FILE})")
    return run.checkpoint(which)


# ------------------------------------------------------------ evaluation results

def eval_result_file(ckpt: Path, split: str, precision: str) -> Path:
    """Where the loss of checkpoint ``ckpt`` on ``split`` in ``precision`` is kept."""
    return Path(ckpt) / f"{EVAL_PREFIX}{split}-{precision}.json"


def read_eval_result(ckpt: Path, split: str, precision: str) -> dict | None:
    path = eval_result_file(ckpt, split, precision)
    return json.loads(path.read_text()) if path.is_file() else None


def write_eval_result(ckpt: Path, result: dict) -> None:
    """Keep ``result`` (a dict with its ``split`` and ``precision``) beside the checkpoint."""
    eval_result_file(ckpt, result["split"], result["precision"]).write_text(json.dumps(result, indent=2) + "\n")
