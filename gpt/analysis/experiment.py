"""A grid of runs (norm types x seeds): train, evaluate, compare; safe to rerun.

Each cell has a predictable run directory, ``<runs_dir>/<config stem>-<norm-type>-s<seed>``
(one seed for the initial weights and the data order), or, where the two are crossed to
split the noise between them, ``<config stem>-<norm-type>-i<init seed>-s<data seed>``.
A rerun skips cells that completed (or diverged: that is a result too), resumes cells
that were interrupted or killed (``--resume auto``), evaluates cells that have no
evaluation yet, and ends with the comparison of every cell.

With one process per run, cells train and evaluate in this process; with more, each
runs under torchrun as ``python -m gpt.commands.train`` / ``python -m gpt.commands.evaluate``, so nothing
depends on where the package is installed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt.analysis.table import compare
from gpt.common.errors import UserError
from gpt.config import Config, load_config
from gpt.evaluation.test_loss import EvalOptions, evaluate_checkpoint
from gpt.run.directory import COMPLETED, FINISHED, INTERRUPTED, RunDir, read_eval_result
from gpt.run.distributed import setup
from gpt.training.loop import train


@dataclass
class Cell:
    """One run of the grid."""

    norm_type: str  # the norm type it trains
    seed: int  # its train.seed (the data order; its cfg's model.init_seed, when set, the initial weights)
    name: str  # its run.name, also its folder's name
    cfg: Config  # its resolved config
    overrides: list[str]  # the --set overrides that make the sweep's config this cell's

    @property
    def run(self) -> RunDir:
        return RunDir(self.cfg.run_dir)


def cell_name(config: Path, norm_type: str, seed: int, init_seed: int | None = None) -> str:
    init = "" if init_seed is None else f"-i{init_seed}"
    return f"{Path(config).stem}-{norm_type.replace('_', '-')}{init}-s{seed}"


def seed_pairs(
    seeds: list[int], init_seeds: list[int] | None = None, data_seeds: list[int] | None = None
) -> list[tuple[int | None, int]]:
    """(init seed, data seed) of each cell of one norm type: ``seeds`` as (None, seed), or, with both
    ``init_seeds`` and ``data_seeds``, every pair of them crossed."""
    if (init_seeds is None) != (data_seeds is None):
        raise UserError(
            "--init-seeds and --data-seeds go together: every initialisation seed is trained with every data-order seed"
        )
    if init_seeds is None:
        return [(None, s) for s in seeds]
    for flag, values in (("--init-seeds", init_seeds), ("--data-seeds", data_seeds)):
        if len(set(values)) < 2:
            raise UserError(
                f"{flag} needs at least two different seeds to split the noise (got {' '.join(map(str, values))})"
            )
    return [(i, dist) for i in init_seeds for dist in data_seeds]


def plan(
    config: Path,
    norm_types: list[str],
    seeds: list[int],
    runs_dir: Path,
    overrides: list[str] = (),
    seeds_for: dict[str, list[int]] | None = None,
    init_seeds: list[int] | None = None,
    data_seeds: list[int] | None = None,
) -> list[Cell]:
    """Every cell's resolved config, validated before anything runs. ``seeds_for`` gives some norm
    types other seeds than ``seeds``; ``init_seeds`` with ``data_seeds`` cross the two instead."""
    cells = []
    for norm_type in norm_types:
        for init, seed in seed_pairs((seeds_for or {}).get(norm_type, seeds), init_seeds, data_seeds):
            name = cell_name(config, norm_type, seed, init)
            cell_overrides = [
                *overrides,
                f"model.norm_type={norm_type}",
                f"train.seed={seed}",
                *([f"model.init_seed={init}"] if init is not None else []),
                f"run.name={name}",
                f"run.dir={Path(runs_dir) / name}",
            ]
            cells.append(Cell(norm_type, seed, name, load_config(config, cell_overrides), cell_overrides))
    return cells


def comparison_folder(config: Path, runs_dir: Path, out: Path | None = None) -> Path:
    """Where the sweep's comparison goes: ``out``, or ``<runs_dir>/<config stem>-comparison``."""
    return Path(out) if out is not None else Path(runs_dir) / f"{Path(config).stem}-comparison"


def launcher(nproc: int) -> list[str]:
    """The start of a command that runs a module (the next word) on ``nproc`` processes."""
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
    return [sys.executable, "-m"]


def train_command(config: Path, cell: Cell, nproc: int) -> list[str]:
    sets = [a for o in cell.overrides for a in ("--set", o)]
    return [*launcher(nproc), "gpt.commands.train", str(config), *sets, "--resume", "auto"]


def evaluate_command(cell: Cell, nproc: int) -> list[str]:
    return [*launcher(nproc), "gpt.commands.evaluate", str(cell.run.path), "--quiet"]


def train_cell(config: Path, cell: Cell, nproc: int, hooks_for=None) -> None:
    """Train (or resume) one cell; raise a UserError if it stops short of a result. ``hooks_for(cfg)``: the
    hooks of a cell trained in this process (a cell on several processes runs the train command, which
    builds its own)."""
    if nproc > 1:
        result = subprocess.run(train_command(config, cell, nproc))
        status = cell.run.status()  # the run's own word: torchrun's exit status is 1 for a clean SIGTERM too
        if status not in FINISHED:
            raise UserError(
                f"{cell.name}: training stopped ({status}, exit status {result.returncode}); "
                "rerun the sweep to resume it"
            )
        return
    summary = train(cell.cfg, resume="auto", hooks=hooks_for(cell.cfg) if hooks_for is not None else ())
    if summary["status"] == INTERRUPTED:
        raise UserError(f"{cell.name}: interrupted at step {summary['steps']}; rerun the sweep to resume")


def evaluate_cell(cell: Cell, nproc: int, log, where: str) -> None:
    """Evaluate a completed cell's final checkpoint unless that was done before."""
    ckpt = cell.run.checkpoint("final")
    if read_eval_result(ckpt, cell.cfg.data.test_split, "fp32") is not None:
        return
    if nproc > 1:
        subprocess.run(evaluate_command(cell, nproc), check=True)
    else:
        result = evaluate_checkpoint(ckpt, setup(cell.cfg.run.device), EvalOptions(show_progress=False))
        log(f"{where}: test loss {result['loss']:.6f} on {result['targets_scored']:,} tokens scored")


def run_sweep(
    config: Path,
    norm_types: list[str],
    seeds: list[int],
    runs_dir: Path = Path("runs"),
    *,
    seeds_for: dict[str, list[int]] | None = None,
    init_seeds: list[int] | None = None,
    data_seeds: list[int] | None = None,
    nproc: int = 1,
    overrides: list[str] = (),
    out: Path | None = None,
    baseline: str | None = None,
    equivalence_margin: float | None = None,
    allow_differ: list[str] = (),
    dry_run: bool = False,
    log=print,
    hooks_for=None,
) -> dict | None:
    """Run the grid of ``config`` x ``norm_types`` x ``seeds`` (``seeds_for`` a norm type: its own; or
    ``init_seeds`` x ``data_seeds`` crossed) in ``runs_dir``, ``nproc`` processes per run, and compare the
    cells into ``out``; returns the comparison (None for a dry run, which only logs the commands).
    ``hooks_for(cfg)``: the hooks of a cell trained in this process (``gpt.commands.cli.standard_hooks``)."""
    cells = plan(config, norm_types, seeds, runs_dir, overrides, seeds_for, init_seeds, data_seeds)
    out = comparison_folder(config, runs_dir, out)
    for i, cell in enumerate(cells, 1):
        status = cell.run.status()
        if dry_run:
            if status not in FINISHED:
                log(shlex.join(train_command(config, cell, nproc)))
            log(shlex.join(evaluate_command(cell, nproc)))
            continue
        where = f"[{i}/{len(cells)}] {cell.name}"
        if status in FINISHED:
            log(f"{where}: {status}, skipped")
        else:
            log(f"{where}: {'resuming' if status == INTERRUPTED or cell.run.path.exists() else 'training'}")
            train_cell(config, cell, nproc, hooks_for)
        if cell.run.status() == COMPLETED:
            evaluate_cell(cell, nproc, log, where)
    if dry_run:
        log(
            shlex.join(
                [
                    sys.executable,
                    "-m",
                    "gpt.commands.compare",
                    *[str(c.run.path) for c in cells],
                    "--out",
                    str(out),
                    *(["--baseline", baseline] if baseline else []),
                    *(["--equivalence-margin", f"{equivalence_margin:g}"] if equivalence_margin is not None else []),
                    *[a for key in allow_differ for a in ("--allow-differ", key)],
                ]
            )
        )
        return None
    return compare(
        [c.run.path for c in cells], out, baseline, equivalence_margin=equivalence_margin, allow_differ=allow_differ
    )
