"""The runs a comparison reads, as ``Run``s: run directories (their config, metrics, summary with its
fingerprints, and the evaluations of the chosen checkpoint, read through ``gpt.run.directory``), or the rows of a
results table (``gpt.analysis.results``); and ``Group``, the runs of one norm type (and --vary values) over seeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpt.analysis import results as results_table
from gpt.common.errors import UserError
from gpt.config import flatten
from gpt.config.architecture import SITES, norm_label
from gpt.evaluation.tasks import compared_tasks
from gpt.run.directory import COMPLETED, DIVERGED, RunDir, read_eval_result
from gpt.run.fingerprint import EVALUATION_INFORMATIONAL, computation

AXIS = "model.norm_type"  # what a comparison compares
SEED_KEYS = ("train.seed", "model.init_seed")  # the repeats within a group


@dataclass
class Run:
    """One run directory (or one row of a results table), as the comparison sees it."""

    path: Path  # the run directory (a results table's row: "FILE.csv:LINE")
    config: dict  # its resolved config, flattened: "model.norm_type" -> value
    status: str  # completed, diverged, interrupted or unfinished (gpt.run.directory)
    summary: dict  # its summary.json ({} while it has none)
    metrics: list[dict]  # its metrics.jsonl records
    evaluation: dict | None  # the evaluation result of the chosen checkpoint; None: not evaluated
    view: dict = field(default_factory=dict)  # what decides its numbers: config, fingerprints (gpt.run.fingerprint)
    tasks: dict = field(default_factory=dict)  # other tasks' results of the chosen checkpoint: {"hellaswag": ...}

    @property
    def data_seed(self) -> int:
        return self.config["train.seed"]

    @property
    def init_seed(self) -> int:
        init = self.config.get("model.init_seed")
        return self.data_seed if init is None else init

    @property
    def cell(self) -> tuple[int, int]:
        """(initialisation seed, data-order seed): where the run sits in its group's design."""
        return self.init_seed, self.data_seed

    @property
    def seed(self) -> str:
        """``"3"`` when the initial weights and the data order share seed 3, else ``"init/data"``."""
        return seed_label(self.cell)

    @property
    def usable(self) -> bool:
        """Whether its test loss enters the statistics: completed and evaluated."""
        return self.status == COMPLETED and self.evaluation is not None

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite gradient (the summary's count; 0 when it has none)."""
        return self.summary.get("nonfinite_steps") or 0

    @property
    def planned_tokens(self) -> int | None:
        """The tokens its run planned to train: its total steps x the tokens of a step (None: no summary yet)."""
        steps = self.summary.get("total_steps")
        return (
            None
            if steps is None
            else steps * self.config["train.global_batch_size"] * self.config["model.context_length"]
        )

    @property
    def fingerprinted(self) -> bool:
        return bool(self.summary.get("segments"))

    def left_out_because(self) -> str:
        if self.status == DIVERGED:
            step = self.summary.get("diverged_at_step")
            return "diverged" if step is None else f"diverged at step {step}"
        if self.status != COMPLETED:
            return self.status
        return "not evaluated"


def seed_label(cell: tuple[int, int]) -> str:
    init, data = cell
    return str(data) if init == data else f"{init}/{data}"


@dataclass
class Group:
    """Runs that compute the same thing but for their seeds: one norm type (and one value of each --vary key)."""

    label: str  # the norm type, then ", key=value" for each --vary key
    values: dict  # the values that define the group: model.norm_type and the --vary keys
    runs: list[Run] = field(default_factory=list)  # one per seed

    def losses_by_cell(self) -> dict[tuple[int, int], float]:
        """Test loss by (init seed, data seed), of the runs that enter the statistics."""
        return {r.cell: r.evaluation["loss"] for r in self.runs if r.usable}

    def task_runs(self, task: str) -> list[Run]:
        """The completed runs that have a result of ``task``."""
        return [r for r in self.runs if r.status == COMPLETED and task in r.tasks]


def load_run(
    path: Path,
    which: str = "final",
    split: str = "test",
    precision: str = "fp32",
    tokens: int | None = None,
    offset: int | None = None,
) -> Run:
    """A run directory and the evaluation of its checkpoint ``which`` on ``split`` in ``precision``: over the
    run's configured test range, or, given ``tokens``, over [offset, offset + tokens) (``offset`` defaulting to
    the run's data.test_offset), as ``evaluate.py --tokens / --offset`` kept it."""
    path = Path(path)
    run = RunDir(path)
    if not run.config_file.is_file() or not run.metrics_file.is_file():
        raise UserError(f"{path}: not a run directory (needs {run.config_file.name} and {run.metrics_file.name})")
    try:
        ckpt = run.checkpoint(which)  # only a completed run has a final one
    except UserError:
        ckpt = None
    config, summary = axis_view(flatten(run.read_config())), run.summary() or {}
    start = config.get("data.test_offset", 0) if offset is None else offset
    span = None if tokens is None else (start, start + tokens)
    evaluation = read_eval_result(ckpt, split, precision, span) if ckpt is not None else None
    tasks = {t.name: t.result(ckpt, precision) for t in compared_tasks()} if ckpt is not None else {}
    tasks = {k: v for k, v in tasks.items() if v}
    view = {**computation(config, summary.get("segments")), **evaluation_view(evaluation, tasks)}
    return Run(path, config, run.status(), summary, run.metrics(), evaluation, view, tasks)


def axis_view(config: dict) -> dict:
    """A run's flat config with its norms at every site as the one compared value (``architecture.norm_label``):
    ``model.norm_type`` holds the label, and the sites' own keys are part of it, not keys of their own."""
    model = {k.removeprefix("model."): v for k, v in config.items() if k.startswith("model.")}
    sites = {f"model.{site}_norm_type" for site in SITES}
    return {**{k: v for k, v in config.items() if k not in sites}, AXIS: norm_label(model)}


def evaluation_view(evaluation: dict | None, tasks: dict) -> dict:
    """The compared keys of a run's evaluations, flat: the test loss's fingerprint under ``evaluation.``, each
    task's under ``<task>.evaluation.`` (``hellaswag.evaluation.code.source``). What cannot change a number
    (``gpt.run.fingerprint.EVALUATION_INFORMATIONAL``) is left out; the test tokens are checked on their own
    (``check_comparable``)."""
    out = {}
    for prefix, result in (("evaluation", evaluation), *((f"{t}.evaluation", r) for t, r in sorted(tasks.items()))):
        if result is None:
            continue
        recorded = flatten(result.get("fingerprint") or {})
        if "batch_size" not in recorded and result.get("batch_size") is not None:  # a result from before
            recorded["batch_size"] = result["batch_size"]
        out.update({f"{prefix}.{k}": v for k, v in recorded.items() if not k.startswith(EVALUATION_INFORMATIONAL)})
    return out


def runs_from_results(path: Path) -> list[Run]:
    """A results table's rows as runs (``gpt.analysis.results.read_results``): each row a completed run of its
    group at its seeds, its test loss its evaluation, its other metrics tasks."""
    runs = []
    for row in results_table.read_results(path):
        tasks = {task: {"metrics": dict.fromkeys(values), **values} for task, values in row["tasks"].items()}
        runs.append(
            Run(
                Path(f"{Path(path).name}:{row['line']}"),
                {AXIS: row["group"], "train.seed": row["data_seed"], "model.init_seed": row["init_seed"]},
                row["status"],
                {},
                [],
                None if row["test_loss"] is None else {"loss": row["test_loss"]},
                tasks=tasks,
            )
        )
    return runs


def load_runs(paths: list[Path], results: Path | None, vary: list[str], allow_differ: list[str], **load) -> list[Run]:
    """The runs to compare: the rows of a results table, or the run directories ``paths`` (``load``: ``load_run``'s
    keywords)."""
    if results is not None:
        if paths:
            raise UserError("give run directories or --results FILE.csv, not both")
        if vary or allow_differ:
            raise UserError("--vary and --allow-differ read run directories; a results table has groups already")
        runs = runs_from_results(results)
    else:
        runs = [load_run(p, **load) for p in paths]
    if not runs:
        raise UserError("no runs to compare")
    return runs
