"""A sweep on a SLURM cluster: each cell one task of a job array, then one comparison job after them all.

A two-stage sweep (``--confirm-seeds``) runs this twice: the grid's array and a comparison job that chooses the
rates (the selection), which then submits, from inside its job, the confirmation cells at the chosen rates and
the final comparison after them (so ``sbatch`` must work from a compute node, as on most clusters).

The jobs are plain ``sbatch`` scripts written here (``--dry-run`` prints them), each running the sweep
command again for its own part (``--in-job cell:INDEX`` or ``--in-job compare``, ``gpt.sweep.cell_job``):
the same layout of cells, the same trainer and evaluator as a local sweep, so the same bits. Every cell
task asks for ``USR1`` a while before its time limit (``--signal=B:USR1@SECONDS``); the trainer then
finishes its step, checkpoints, and the job requeues itself to resume. The comparison job depends on
every cell with ``afterany``: it runs when the last cell ends, however it ended, and names those without
a result.

Bookkeeping, beside the runs in ``<runs_dir>/<config stem>-slurm/``:

    jobs.json       the job id of every cell's latest submission and of the comparison job's
    cells.sbatch    the cell array's script (the latest submitted)   compare.sbatch   the comparison's
    logs/           every job's output (%x-%A_%a.out)
    events/<cell>.jsonl   what each of the cell's jobs did: started (requeue count), requeued, ended

Submitting again is safe: finished cells are skipped, pending or running ones left alone, the rest
(cancelled, failed, timed out, never submitted) resubmitted, and a pending comparison is made to wait for
them too.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from gpt.common.errors import UserError, clipped
from gpt.common.files import read_json, write_atomically, write_json
from gpt.run.directory import COMPLETED, DIVERGED, read_eval_result
from gpt.sweep import controller
from gpt.sweep.cells import Cell, check_confirmation_kept
from gpt.sweep.spec import SweepSpec

# What the sweep writes into every cell job itself: a --slurm-opt may not set these.
OWN_OPTIONS = ("array", "output", "error", "dependency", "signal", "requeue", "chdir", "open-mode", "parsable")


@dataclass
class SlurmOptions:
    """What every cell job asks SLURM for (``sweep.py --launcher slurm``'s options; each field's help is
    its ``--`` option's)."""

    nodes: int = field(default=1, metadata={"help": "nodes per cell (torchrun on each, rendezvous on the first)"})
    gpus_per_node: int = field(default=0, metadata={"help": "GPUs per node (0: none asked for, a CPU job)"})
    partition: str | None = field(default=None, metadata={"help": "SLURM partition"})
    time: str | None = field(default=None, metadata={"help": "time limit per job (e.g. 04:00:00); requeued at it"})
    account: str | None = field(default=None, metadata={"help": "account to charge"})
    qos: str | None = field(default=None, metadata={"help": "quality of service"})
    constraint: str | None = field(default=None, metadata={"help": "node features (e.g. h100)"})
    signal_seconds: int = field(
        default=120,
        metadata={"help": "seconds before the time limit at which a cell checkpoints and requeues itself"},
    )
    slurm_opt: list[str] = field(
        default_factory=list,
        metadata={"help": "any other sbatch option, KEY=VALUE or KEY (repeatable), e.g. mem-per-cpu=4G"},
    )

    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group("with --launcher slurm")
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.name == "slurm_opt":
                group.add_argument(flag, action="append", default=[], metavar="KEY=VALUE", help=f.metadata["help"])
            else:
                kind = int if f.type == "int" else str
                group.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])

    @classmethod
    def from_args(cls, args) -> SlurmOptions:
        options = cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
        options.check()
        return options

    def argv(self) -> list[str]:
        """These options as the sweep command's words (a two-stage sweep's comparison job submits the
        confirmation cells with the same options)."""
        words = []
        for f in fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if f.name == "slurm_opt":
                words += [a for opt in value for a in (flag, opt)]
            elif value is not None and value != f.default:
                words += [flag, str(value)]
        return words

    def check(self) -> None:
        for name in ("nodes", "signal_seconds"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.gpus_per_node < 0:
            raise UserError(f"--gpus-per-node {self.gpus_per_node} must be >= 0")
        for opt in self.slurm_opt:
            key = opt.partition("=")[0].strip().lstrip("-")
            if not key or " " in key:
                raise UserError(f"--slurm-opt {opt!r}: expected KEY=VALUE or KEY, e.g. mem-per-cpu=4G or exclusive")
            if key in OWN_OPTIONS:
                raise UserError(f"--slurm-opt {opt}: the sweep sets --{key} itself (allowed: any other sbatch option)")

    def directives(self, *, cells: bool) -> list[str]:
        """The ``#SBATCH`` lines of a cell job (``cells``) or of the comparison job (one task, no GPU)."""
        lines = [f"--nodes={self.nodes}" if cells else "--nodes=1", "--ntasks-per-node=1"]
        if cells and self.gpus_per_node:
            lines.append(f"--gpus-per-node={self.gpus_per_node}")
        for name in ("partition", "time", "account", "qos", "constraint"):
            if getattr(self, name) is not None and (cells or name != "constraint"):
                lines.append(f"--{name}={getattr(self, name)}")
        if cells:
            lines += [f"--signal=B:USR1@{self.signal_seconds}", "--requeue"]
            lines += [f"--{o.strip().lstrip('-')}" for o in self.slurm_opt]
        return [f"#SBATCH {line}" for line in lines]


@dataclass(frozen=True)
class SweepFolder:
    """The sweep's bookkeeping on SLURM (the module docstring lists its files)."""

    path: Path

    @classmethod
    def of(cls, config: Path, runs_dir: Path) -> SweepFolder:
        return cls(Path(runs_dir).absolute() / f"{Path(config).stem}-slurm")

    @property
    def jobs_file(self) -> Path:
        return self.path / "jobs.json"

    def script(self, kind: str) -> Path:
        return self.path / f"{kind}.sbatch"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def events_file(self, cell: str) -> Path:
        return self.path / "events" / f"{cell}.jsonl"

    def jobs(self) -> dict:
        if not self.jobs_file.is_file():
            return {"cells": {}, "compare": None}
        fix = "delete it to resubmit every unfinished cell (finished ones are still skipped)"
        jobs = read_json(self.jobs_file, "record of the sweep's jobs", fix=fix)
        cells = jobs.get("cells") if isinstance(jobs, dict) else None
        if (
            not isinstance(cells, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in cells.items())
            or not isinstance(jobs.get("compare"), (str, type(None)))
        ):
            raise UserError(
                f'{self.jobs_file}: not a record of the sweep\'s jobs (expected {{"cells": {{cell: job id}}, '
                f'"compare": job id or null}}); {fix}'
            )
        return jobs

    def record(self, event: dict, cell: str) -> None:
        """Append one event of a cell's job (a line: a kill mid-write costs at most that line)."""
        path = self.events_file(cell)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"time": round(time.time(), 3), **event}) + "\n")

    def events(self, cell: str) -> list[dict]:
        path = self.events_file(cell)
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        return out


def has_result(cell: Cell) -> bool:
    """A cell with nothing left to do: diverged, or completed and evaluated."""
    status = cell.run.status()
    if status == DIVERGED:
        return True
    return status == COMPLETED and read_eval_result(cell.run.checkpoint("final"), cell.cfg.data.test_split, "fp32")


def job_script(
    kind: str, options: SlurmOptions, job_name: str, folder: SweepFolder, command: list[str], array: str = ""
) -> str:
    """The sbatch script of the cell array (``kind`` "cells", tasks ``array``; ``command`` ends ``--in-job``,
    ``cell:<task index>`` appended) or of the comparison ("compare")."""
    index = ' "cell:$SLURM_ARRAY_TASK_ID"' if kind == "cells" else ""
    what = "one cell of the sweep per array task" if kind == "cells" else "the sweep's comparison"
    directives = [
        f"#SBATCH --job-name={job_name}",
        *([f"#SBATCH --array={array}"] if array else []),
        *options.directives(cells=kind == "cells"),
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={folder.logs}/" + ("%x-%A_%a.out" if kind == "cells" else "%x-%j.out"),
        f"#SBATCH --chdir={Path.cwd()}",
    ]
    for line in directives:  # one line each: a line break would end sbatch's directives and run the rest
        if any(c in line for c in "\n\r\x00") or not line.isprintable():
            raise UserError(
                f"{clipped(repr(line.removeprefix('#SBATCH ')))}: a SLURM option or path with a line break or "
                "control character cannot go into a job script; give it on one line"
            )
    return "\n".join(
        [
            "#!/bin/bash",
            f"# {what}; written by gpt.sweep.slurm: rerun the sweep command rather than sbatch this by hand",
            *directives,
            "set -u",
            f"exec {shlex.join(command)}{index}",
            "",
        ]
    )


def submit_sweep(spec: SweepSpec, folder: SweepFolder, options: SlurmOptions, dry_run: bool = False, log=print) -> dict:
    """Submit every cell of ``spec`` that needs a job and the comparison after them; returns ``jobs.json``'s
    record (with ``dry_run``, what would be submitted)."""
    check_confirmation_kept(spec.comparison, spec.confirm_seeds)
    cells, job_command = spec.cells(), [*spec.argv(), *options.argv()]
    if not dry_run:
        controller.require("sbatch", "scontrol")
    jobs = folder.jobs()
    todo, waiting = [], []
    for i, cell in enumerate(cells):
        job = jobs["cells"].get(cell.name)
        state = controller.state(job) if job and not has_result(cell) else None
        if has_result(cell):
            log(f"{cell.name}: {cell.run.status()}, skipped")
        elif state in controller.ACTIVE:
            log(f"{cell.name}: job {job} {state.lower()}, left alone")
            waiting.append(job)
        else:
            todo.append(i)
            verb = ("would be " if dry_run else "") + ("resubmitted" if job else "submitted")
            log(f"{cell.name}: {verb}" + (f" (job {job} {state.lower()})" if state else ""))
    stem, indices = Path(spec.config).stem, ",".join(map(str, todo))
    cell_script = job_script("cells", options, f"{stem}-cell", folder, [*job_command, "--in-job"], indices)
    compare_script = job_script("compare", options, f"{stem}-compare", folder, [*job_command, "--in-job", "compare"])
    if dry_run:
        report = dry_run_report(cells, todo, waiting, cell_script, compare_script, indices, log)
        if spec.confirm_seeds and not spec.chosen_rates():
            log(
                f"then: the comparison job chooses each norm type's rate and submits its cells on seeds "
                f"{' '.join(map(str, spec.confirm_seeds))} and the final comparison after them"
            )
        return report
    for part in ("events", "logs"):
        (folder.path / part).mkdir(parents=True, exist_ok=True)
    if todo:
        write_atomically(folder.script("cells"), cell_script)
        array = controller.submit(folder.script("cells"))
        for i in todo:
            jobs["cells"][cells[i].name] = f"{array}_{i}"
        waiting.append(array)
        write_json(folder.jobs_file, jobs)  # recorded before the comparison's submission can fail
        log(f"submitted job array {array} ({len(todo)} cell(s), tasks {indices})")
    jobs["compare"] = submit_comparison(folder, compare_script, jobs.get("compare"), waiting, bool(todo), log)
    write_json(folder.jobs_file, jobs)
    return jobs


def submit_comparison(folder: SweepFolder, script: str, previous: str | None, waiting: list[str], new: bool, log):
    """The comparison job's id: the pending one, now waiting for ``waiting`` too, or a new one when cells were
    submitted (after a running one, which compares without them) or no comparison ran to its end."""
    dependency = "afterany:" + ":".join(waiting) if waiting else None
    if previous is not None and previous == controller.this_job().get("job_id"):
        previous = None  # a two-stage sweep's selection job submitting the confirmation: it ends, a new one follows
    state = controller.state(previous)
    if state == "PENDING":
        if new:
            controller.set_dependency(previous, dependency or "")
            log(f"comparison job {previous} now waits for {', '.join(waiting)}")
        return previous
    if not new and state in (*controller.ACTIVE, "COMPLETED"):
        log(f"comparison job {previous}: {state.lower()}, left alone")
        return previous
    if state in controller.ACTIVE:  # running without the new cells: a new one follows it and them
        waiting = [*waiting, previous]
        dependency = "afterany:" + ":".join(waiting)
    write_atomically(folder.script("compare"), script)
    job = controller.submit(folder.script("compare"), dependency)
    log(f"submitted comparison job {job}" + (f" after {', '.join(waiting)}" if waiting else ""))
    return job


def dry_run_report(cells, todo, waiting, cell_script, compare_script, indices, log) -> dict:
    """Print the scripts and the dependency graph; submit nothing."""
    if todo:
        log("# cells.sbatch (would be submitted as one job array, tasks " + indices + ")")
        log(cell_script)
    log("# compare.sbatch")
    log(compare_script)
    log("# dependency graph (nothing submitted)")
    for i in todo:
        log(f"cell task {i}: {cells[i].name}")
    after = [*waiting, *(["the cell array"] if todo else [])]
    log(f"comparison: after {' and '.join(after) if after else 'nothing'} (afterany: however each ends)")
    return {"cells": {cells[i].name: None for i in todo}, "compare": None}


def status_rows(cells: list[Cell], folder: SweepFolder) -> list[dict]:
    """Each cell's job, state, progress, last loss and requeue count, then the comparison job's state; a runs
    folder that holds nothing of this sweep is refused (a plausible table of "not submitted" would mislead)."""
    runs_dir = folder.path.parent
    if not runs_dir.is_dir():
        what = "not a folder" if runs_dir.exists() else "no such folder"
        raise UserError(f"--runs-dir {runs_dir}: {what}; give the sweep's --runs-dir (default: runs)")
    if not folder.path.is_dir() and not any(c.run.path.exists() for c in cells):
        raise UserError(
            f"{runs_dir}: no cell of this sweep has started there and it has no SLURM record ({folder.path.name}); "
            "check the config, the grid and --runs-dir against the sweep's command"
        )
    jobs = folder.jobs()
    rows = []
    for cell in cells:
        job = jobs["cells"].get(cell.name)
        info = controller.job_info(job) if job else {}
        summary = cell.run.summary() or {}
        metrics = cell.run.metrics() if cell.run.metrics_file.is_file() else []
        events = folder.events(cell.name)
        losses = [m["train_loss"] for m in metrics if "train_loss" in m]
        ended = [e for e in events if e["event"] == "end"]
        rows.append(
            {
                "cell": cell.name,
                "job": job or "-",
                "state": info.get("JobState") or (ended[-1]["outcome"] if ended else "not submitted"),
                "run": cell.run.status(),
                "step": metrics[-1]["step"] if metrics else 0,
                "total": summary.get("total_steps"),
                "last_loss": losses[-1] if losses else None,
                "requeued": max([int(info.get("Restarts", 0))] + [e.get("restarts", 0) for e in events]),
                "error": ended[-1].get("error") if ended and ended[-1]["outcome"] == "failed" else None,
            }
        )
    compare_job = jobs.get("compare")
    rows.append({"cell": "comparison", "job": compare_job or "-", "state": controller.state(compare_job) or "-"})
    return rows


def status_table(rows: list[dict]) -> str:
    head = f"{'cell':<40} {'job':<12} {'state':<14} {'run':<12} {'step / total':>15} {'last loss':>10} {'requeued':>8}"
    lines = [head]
    for r in rows:
        if r["cell"] == "comparison":
            lines.append(f"{'comparison':<40} {r['job']:<12} {r['state']:<14}")
            continue
        steps = f"{r['step']:,} / {r['total']:,}" if r["total"] else f"{r['step']:,} / ?"
        loss = f"{r['last_loss']:.4f}" if r["last_loss"] is not None else "-"
        lines.append(
            f"{r['cell']:<40} {r['job']:<12} {r['state']:<14} {r['run']:<12} {steps:>15} {loss:>10} {r['requeued']:>8}"
        )
        if r["error"]:
            lines.append(f"    {r['error']}")
    return "\n".join(lines)
