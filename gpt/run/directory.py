"""A run directory: the one module that knows its files, its lock, and a run's status.

    runs/<name>/
        config.yaml       the resolved config, written when the run starts
        metrics.jsonl     one JSON record per logged step (rank 0)
        stats.jsonl       with log.stats_every: per block activations, attention logits, gradients (rank 0)
        summary.json      "running" while a trainer works on it; at the end: status, stop reason, speed, ...
        loss.png lr.png grad_norm.png      charts of metrics.jsonl (CHARTS, drawn by gpt.analysis.charts)
        wandb_id.txt      the W&B run id, so that a resumed run continues it
        .lock             held (flock) by the one trainer working on the run; holds its PID
        hub.json          with hub.push_every_checkpoint: what was uploaded to the Hub (gpt.publish.uploads)
        .hub-staging/     checkpoints waiting for their upload (hard links), removed at the end
        checkpoints/      step-NNNNNNNN/ folders and the latest / best pointers (gpt.run.checkpoints)
            step-NNNNNNNN/eval-<split>-<precision>.json    a loss of that checkpoint (gpt.evaluation.held_out)

Training, evaluation, comparison and the sweep reach these files only through here.
A run's status is its ``summary.json``'s: ``running``, then ``completed``, ``diverged``
or ``interrupted``; with no summary it is ``unfinished``. A ``running`` run whose lock
nobody holds was killed: the next ``--resume auto`` continues it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpt.common.errors import UserError, first_line, os_reason
from gpt.common.files import WriteError, read_json, write_atomically, write_json
from gpt.config import ConfigError, parse_yaml
from gpt.run.checkpoints import (
    MODEL_FILE,
    CheckpointError,
    is_checkpoint,
    newest_loadable,
    problem,
    read_pointer,
    step_folders,
)
from gpt.run.lock import RunLock

COMPLETED, DIVERGED, INTERRUPTED, RUNNING = "completed", "diverged", "interrupted", "running"
UNFINISHED = "unfinished"  # no summary.json: killed before its first summary, or never started
FINISHED = (COMPLETED, DIVERGED)  # results: a sweep does not run them again
EXIT_CODES = {COMPLETED: 0, DIVERGED: 3, INTERRUPTED: 4}  # train.py's exit status for each (2: a user error)
EVAL_PREFIX = "eval-"
CHECKPOINTS_DIR = "checkpoints"
STATS_FILE = "stats.jsonl"  # what each norm does inside the model, every log.stats_every steps (gpt.training.inside)
COMPARISON_FILE = "comparison.json"  # compare's result, in a folder beside the runs it compares (the sweep's)


@dataclass(frozen=True)
class Chart:
    """A chart of metrics.jsonl against tokens, drawn under one file name for a run (its curves) and for a
    comparison (every run's, coloured by group): ``gpt.analysis.charts`` draws what is declared here."""

    file: str  # the PNG, in a run's folder and in a comparison's
    series: tuple[tuple[str, str], ...]  # (metrics.jsonl key, legend label): a line each, first solid, then dashed
    label: str  # the y axis
    log_scale: bool = False


# Every per-step chart, declared once: a new metric is a key the training loop logs and an entry here.
CHARTS = (
    Chart("loss.png", (("train_loss", "train"), ("val_loss", "validation")), "cross-entropy loss"),
    Chart("lr.png", (("lr", "learning rate"),), "learning rate"),
    Chart("grad_norm.png", (("grad_norm", "gradient norm (before clipping)"),), "gradient norm", log_scale=True),
)


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
    def stats_file(self) -> Path:
        return self.path / STATS_FILE

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def wandb_id_file(self) -> Path:
        return self.path / "wandb_id.txt"

    @property
    def loss_chart(self) -> Path:
        """The chart of the training and validation loss (``CHARTS``' first), which a published model shows."""
        return self.path / CHARTS[0].file

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def lock_file(self) -> Path:
        return self.path / ".lock"

    @property
    def hub_file(self) -> Path:
        return self.path / "hub.json"

    @property
    def hub_staging(self) -> Path:
        return self.path / ".hub-staging"

    def hub_record(self) -> dict:
        """What was uploaded to the Hub during training (``hub.json``): branch -> commit, branch -> failure."""
        record = read_json(self.hub_file, "Hub upload record") if self.hub_file.is_file() else {}
        return {"uploaded": {}, "failed": {}, **record}

    def write_hub_record(self, record: dict) -> None:
        try:
            write_json(self.hub_file, record)
        except WriteError as e:  # a full disk: the record is the summary's to report, never a reason to stop
            print(f"warning: {e}", file=sys.stderr)

    def looks_like_run(self) -> bool:
        """Whether training ever started here (a config or a checkpoints folder)."""
        return self.config_file.is_file() or self.checkpoints.is_dir()

    # ---------------------------------------------------------------- reading

    def summary(self) -> dict | None:
        return read_json(self.summary_file, "summary") if self.summary_file.is_file() else None

    def status(self) -> str:
        summary = self.summary()
        return summary.get("status", UNFINISHED) if summary else UNFINISHED

    def read_config(self) -> dict:
        """The resolved config as the plain mapping it was written as."""
        try:
            data = parse_yaml(self.config_file.read_text(), str(self.config_file))
        except (ConfigError, UnicodeDecodeError) as e:
            raise UserError(
                f"{self.config_file}: damaged config ({first_line(e).removeprefix(f'{self.config_file}: ')}); "
                f"restore it from a checkpoint's {self.config_file.name}"
            ) from None
        if not isinstance(data, dict):
            raise UserError(
                f"{self.config_file}: damaged config (not a mapping of sections); restore it from a "
                f"checkpoint's {self.config_file.name}"
            )
        return data

    def metrics(self, dropped: list[int] | None = None) -> list[dict]:
        """The metric records; lines that do not parse (a torn last line after a kill or a full disk)
        are left out, and their numbers (1-based) added to ``dropped``."""
        return _records(self.metrics_file, dropped)

    def stats(self, dropped: list[int] | None = None) -> list[dict]:
        """The stats records (``log.stats_every``), read as ``metrics`` reads its own."""
        return _records(self.stats_file, dropped)

    def checkpoint(self, which: str) -> Path:
        """Checkpoint ``which``: ``best``, ``latest``, or ``final`` (the latest of a completed run)."""
        if which == "final":
            status = self.status()
            if status != COMPLETED:
                raise UserError(
                    f"{self.path}: the run has no final checkpoint (status: {status}); "
                    "use --which latest or --which best"
                )
            which = "latest"
        return find_checkpoint(self.path, which)

    def holds_run(self) -> bool:
        """Whether a run has trained here: it logged metrics or wrote a checkpoint."""
        return (
            self.metrics_file.is_file()
            or bool(step_folders(self.checkpoints))
            or (self.checkpoints / "latest").is_file()
        )

    def owns(self, ckpt: Path | None) -> bool:
        """Whether ``ckpt`` is one of this run's own checkpoints."""
        return ckpt is not None and self.path.resolve() in Path(ckpt).resolve().parents

    # ---------------------------------------------------------------- writing

    def lock(self) -> RunLock:
        """Take the run's exclusive lock, or raise RunBusyError naming the trainer that holds it; a folder
        this process cannot write is a UserError naming it and the reason, before anything is built."""
        return RunLock(self.lock_file, self.path)

    def claim(self, resume: str | None, overwrite: bool, report: Callable[[str], None]) -> Path | None:
        """The checkpoint to resume from (or None), after refusing anything that would lose a run.

        ``resume``: ``auto`` (this run's newest checkpoint that loads, reporting any skipped),
        a path to a run or checkpoint (refused if damaged), or None (a fresh start, refused over
        an existing run unless ``overwrite``).
        """
        if resume == "auto":
            return newest_loadable(self.checkpoints, report)
        source = find_checkpoint(resume) if resume is not None else None
        damage = problem(source) if source is not None else None
        if damage is not None:
            raise CheckpointError(
                f"{source}: cannot resume from it: {damage}; choose another checkpoint "
                "(--resume auto takes the newest one that loads)"
            )
        if self.owns(source):
            return source  # an earlier checkpoint of this very run
        if self.holds_run() and not overwrite:
            steps = step_folders(self.checkpoints)
            what = f"checkpoints up to {steps[-1].name}" if steps else "metrics of an earlier run"
            raise UserError(
                f"{self.path} already holds a run ({what}); pass --resume auto to continue it, "
                f"--overwrite to start over (the old run is moved aside), or set run.name / run.dir"
            )
        return source

    def move_aside(self) -> Path:
        """Rename the run (for --overwrite: an earlier run is never deleted); returns its new place."""
        aside = self.path.with_name(f"{self.path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            self.path.rename(aside)
        except OSError as e:
            raise UserError(f"cannot move the earlier run {self.path} aside: {os_reason(e)}") from None
        return aside

    def start(self, config_yaml: str, step: int, keep_config: bool) -> list[str]:
        """Set the folder up for a run continuing after ``step`` (rank 0 only); returns what it did
        worth saying. ``keep_config``: the run continues, and its config.yaml, if it has one, stays
        as the run began."""
        notes = []
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not (keep_config and self.config_file.is_file()):
                write_atomically(self.config_file, config_yaml)
            dropped: list[int] = []
            self.truncate_metrics(step, dropped)  # steps past the checkpoint are logged again
            if dropped:
                notes.append(
                    f"{self.metrics_file}: dropped unparsable line(s) {', '.join(map(str, dropped))} "
                    "(a kill or a full disk cut them short)"
                )
        except OSError as e:
            raise UserError(
                f"cannot set up the run directory {self.path}: {os_reason(e)}; make it writable "
                "(or free space) and rerun"
            ) from None
        return notes

    def truncate_metrics(self, after_step: int, dropped: list[int] | None = None) -> None:
        """Drop records past ``after_step`` (a resumed run logs those steps again) from metrics.jsonl and
        stats.jsonl, and lines that do not parse, atomically."""
        for path in (self.metrics_file, self.stats_file):
            if path.is_file():
                kept = [
                    r for r in _records(path, dropped if path == self.metrics_file else None) if r["step"] <= after_step
                ]
                write_atomically(path, "".join(json.dumps(r) + "\n" for r in kept))

    def write_summary(self, summary: dict) -> None:
        write_json(self.summary_file, summary)


def _records(path: Path, dropped: list[int] | None = None) -> list[dict]:
    """The JSON records, one a line, of a run's metrics.jsonl or stats.jsonl; lines that do not parse are left
    out, their numbers (1-based) added to ``dropped``."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            record = "torn"
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        elif record is not None and dropped is not None:
            dropped.append(number)
    return records


def find_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """A checkpoint folder from a run directory, its checkpoints folder, or the folder itself."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    for root in (RunDir(path).checkpoints, path):
        target = read_pointer(root, which)
        if target is not None:
            if not is_checkpoint(target):
                there = ", ".join(p.name for p in step_folders(root)) or "none"
                raise CheckpointError(
                    f"{root / which} names {target.name}, which is missing or incomplete; "
                    f"give a checkpoint folder instead (checkpoints there: {there})"
                )
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
        raise UserError(
            f"{path}: not a run directory or checkpoint (no {run.config_file.name}, "
            f"no {run.checkpoints.name}/, no {MODEL_FILE})"
        )
    return run.checkpoint(which)


# ------------------------------------------------------------ evaluation results


def eval_result_file(ckpt: Path, split: str, precision: str, span: tuple[int, int] | None = None) -> Path:
    """Where the loss of checkpoint ``ckpt`` on ``split`` in ``precision`` is kept: over the run's configured
    test range (``span`` None), ``eval-<split>-<precision>.json``; over tokens [start, end) of the split given
    instead (evaluate.py's --offset / --tokens / --split / --data), ``eval-<split>-<start>-<end>-<precision>.json``.
    Results over different ranges live side by side; a repeat over one range replaces its own."""
    where = "" if span is None else f"-{span[0]}-{span[1]}"
    return Path(ckpt) / f"{EVAL_PREFIX}{split}{where}-{precision}.json"


def eval_result_files(ckpt: Path) -> list[Path]:
    """Every evaluation result kept beside checkpoint ``ckpt``."""
    return sorted(Path(ckpt).glob(f"{EVAL_PREFIX}*.json"))


class Evaluations:
    """The evaluation results kept beside one checkpoint, each read once (at its first use) and then handed to
    whoever needs it: a sweep's release chooses by it, the model card shows it, the dataset uploads its files."""

    def __init__(self, ckpt: Path):
        self.ckpt = Path(ckpt)
        self._read: dict[Path, dict | None] = {}

    @property
    def files(self) -> list[Path]:
        """Every result file beside the checkpoint."""
        return eval_result_files(self.ckpt)

    def result(self, split: str, precision: str = "fp32", span: tuple[int, int] | None = None) -> dict | None:
        """``read_eval_result``'s answer, read from the disk the first time only."""
        path = eval_result_file(self.ckpt, split, precision, span)
        if path not in self._read:
            self._read[path] = read_eval_result(self.ckpt, split, precision, span)
        return self._read[path]


def comparisons_beside(run: RunDir) -> list[Path]:
    """The comparison results in the folders beside ``run`` (a sweep writes one next to its runs)."""
    return sorted(run.path.parent.glob(f"*/{COMPARISON_FILE}"))


def read_eval_result(ckpt: Path, split: str, precision: str, span: tuple[int, int] | None = None) -> dict | None:
    path = eval_result_file(ckpt, split, precision, span)
    if not path.is_file():
        return None
    result = read_json(path, "evaluation result")
    if "tokens" in result and "targets_scored" not in result:  # written before the count was named for what it is
        result["targets_scored"] = result.pop("tokens")
    return result


def write_eval_result(ckpt: Path, result: dict) -> bool:
    """Keep ``result`` (a dict with its ``split``, ``precision``, ``range`` and whether that is the run's
    configured test range) beside the checkpoint; False, with a line on stderr, if it cannot be kept (a
    checkpoint a running trainer pruned, a read-only run)."""
    span = None if result.get("configured_range", True) else tuple(result["range"])
    path = eval_result_file(ckpt, result["split"], result["precision"], span)
    try:
        write_json(path, result)
    except WriteError as e:
        if not Path(ckpt).is_dir():  # a pruned checkpoint is never recreated
            print(
                f"warning: {ckpt} was removed while it was evaluated (pruned by its running trainer); the result "
                f"is printed but not kept: evaluate a checkpoint that stays, e.g. --which best",
                file=sys.stderr,
            )
        else:  # a read-only run, a full disk: the numbers are still worth having, and an earlier result stays
            print(
                f"warning: cannot keep the result in {path}: {e.reason}; it is printed, and --json FILE "
                "writes it where you choose",
                file=sys.stderr,
            )
        return False
    return True
