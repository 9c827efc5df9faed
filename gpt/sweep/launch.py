"""Running a sweep (the cells of ``gpt.sweep.cells``): train, evaluate, compare; safe to rerun.

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
from pathlib import Path

from gpt.analysis.across_sizes import compare_sizes
from gpt.analysis.table import compare
from gpt.common.errors import UserError
from gpt.data.batches import TrainBatches
from gpt.data.folders import open_split
from gpt.evaluation.held_out import EvalOptions, evaluate_checkpoint
from gpt.model.gpt import GPT
from gpt.publish.release import outcome_problems, publish_sweep
from gpt.run.directory import COMPLETED, FINISHED, INTERRUPTED, read_eval_result
from gpt.run.distributed import setup
from gpt.sweep.cells import (
    Cell,
    check_confirmation_kept,
    check_fractions,
    check_rates,
    check_size_axis,
    comparison_folder,
    ladder_cells,
    ladder_norm,
    lay_out,
    parse_factors,
    selection_folder,
)
from gpt.sweep.spec import SweepSpec
from gpt.training.loop import train


def launcher(nproc: int) -> list[str]:
    """The start of a command that runs a module (the next word) on ``nproc`` processes."""
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
    return [sys.executable, "-m"]


def train_command(config: Path, cell: Cell, nproc: int, start: list[str] | None = None) -> list[str]:
    """The command that trains (or resumes) ``cell``; ``start``: how to launch the module, if not ``launcher``."""
    sets = [a for o in cell.overrides for a in ("--set", o)]
    return [*(start or launcher(nproc)), "gpt.commands.train", str(config), *sets, "--resume", "auto"]


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


def compare_grid(paths: list[Path], out: Path, failed: dict[str, str] | None = None, **options) -> dict:
    """The comparison of a sweep's runs: across sizes (``options["across_sizes"]``, ``compare_sizes``), else of
    one size (``compare``); ``options``: the sweep's (``SweepSpec.compare_options``)."""
    if options.pop("across_sizes", False):
        return compare_sizes(paths, out, failed=failed, **options)
    options.pop("predict_at", None)
    return compare(paths, out, failed=failed, **options)


def compare_command(cells: list[Cell], out: Path, options: dict) -> list[str]:
    """The comparison command of a sweep's ``cells`` into ``out`` with ``options`` (``compare``'s keywords)."""
    margin = options.get("equivalence_margin")
    words = [sys.executable, "-m", "gpt.commands.compare", *[str(c.run.path) for c in cells], "--out", str(out)]
    words += ["--baseline", options["baseline"]] if options.get("baseline") else []
    words += ["--equivalence-margin", f"{margin:g}"] if margin is not None else []
    words += [a for key in options.get("vary") or () for a in ("--vary", key)]
    words += [a for key in options.get("by") or () for a in ("--by", key)]
    words += [a for key in options.get("allow_differ") or () for a in ("--allow-differ", key)]
    words += ["--across-sizes"] if options.get("across_sizes") else []
    words += ["--predict-at", repr(options["predict_at"])] if options.get("predict_at") is not None else []
    words += ["--ladder", *map(str, options["ladder"])] if options.get("ladder") else []
    words += ["--throughput", str(options["throughput"])] if options.get("throughput") else []
    return words + (["--select-on", options["select_on"]] if options.get("select_on") else [])


def run_sweep(
    config: Path,
    norm_types: list[str],
    seeds: list[int],
    runs_dir: Path = Path("runs"),
    *,
    seeds_for: dict[str, list[int]] | None = None,
    init_seeds: list[int] | None = None,
    data_seeds: list[int] | None = None,
    lrs: list[float] | None = None,
    confirm_seeds: list[int] | None = None,
    nproc: int = 1,
    overrides: list[str] = (),
    out: Path | None = None,
    sizes: list[str] | None = None,
    token_fractions: list[float] | None = None,
    factors: list[str] | None = None,
    dry_run: bool = False,
    log=print,
    hooks_for=None,
    **compare_options,
) -> dict | None:
    """Run the grid of ``config`` x ``norm_types`` x ``seeds`` (``seeds_for`` a norm type: its own; or ``init_seeds``
    x ``data_seeds`` crossed; x ``lrs``; x ``sizes``, compared across sizes; x ``factors``, ``--vary KEY=A,B``) in
    ``runs_dir``, ``nproc`` processes per run, and compare the cells into ``out`` (``compare_options``:
    ``compare_grid``'s); returns the comparison (None for a dry run: it logs the commands). ``hooks_for(cfg)``: a
    cell's hooks (``standard_hooks``); ``token_fractions``: the baseline's token ladder too (``lay_out_ladder``).

    ``confirm_seeds`` (with ``lrs``): two stages. The grid is the selection: compared into ``<out>-selection``,
    where each norm type's rate is chosen on validation; then each chosen rate is trained on the fresh
    ``confirm_seeds`` alone, and those runs are compared into ``out`` (95% intervals, free of the choice)."""
    check_rates(confirm_seeds, lrs, seeds, init_seeds)
    check_size_axis(sizes, confirm_seeds, compare_options.get("predict_at"))
    check_fractions(token_fractions, sizes, lrs, init_seeds, confirm_seeds)
    grid = (seeds_for, init_seeds, data_seeds, lrs, sizes, parse_factors(factors, overrides))
    cells = lay_out(config, norm_types, seeds, runs_dir, overrides, *grid)
    ladder = lay_out_ladder(config, norm_types, seeds_for, seeds, runs_dir, overrides, token_fractions, compare_options)
    check_confirmation_kept(out := comparison_folder(config, runs_dir, out), confirm_seeds)
    compare_options["across_sizes"] = compare_options.get("across_sizes") or bool(sizes)
    grid_out = selection_folder(out) if confirm_seeds else out
    if sizes and not dry_run:
        check_capacity(cells)
    run_cells(config, cells + ladder, nproc, dry_run, log, hooks_for)
    if dry_run:
        log(shlex.join(compare_command(cells, grid_out, compare_options)))
        if confirm_seeds:
            log(f"# then each norm type's rate chosen there, on seeds {' '.join(map(str, confirm_seeds))}: trained, "
                f"evaluated and compared into {out} (rerun without --dry-run once the selection has run)")  # fmt: skip
        return None
    result = compare_grid([c.run.path for c in cells], grid_out, **compare_options)
    if not confirm_seeds:
        return result
    shared = {k: compare_options[k] for k in ("baseline", "equivalence_margin", "allow_differ") if k in compare_options}
    spec = SweepSpec(config, list(norm_types), list(seeds), runs_dir=runs_dir, overrides=list(overrides), out=out,
                     lrs=lrs, confirm_seeds=confirm_seeds, factors=factors, **shared)  # fmt: skip
    confirmation = spec.confirmation_cells(spec.chosen_rates(result["selection"]))
    log(f"confirmation: {len(confirmation)} cell(s) at the chosen rates, seeds {' '.join(map(str, confirm_seeds))}")
    run_cells(config, confirmation, nproc, False, log, hooks_for)
    return compare([c.run.path for c in confirmation], out, **spec.confirmation_options(result["selection"]))


def lay_out_ladder(config, norm_types, seeds_for, seeds, runs_dir, overrides, fractions, options) -> list[Cell]:
    """The baseline's token ladder (``fractions`` of the token budget; [] without), its runs' folders handed to the
    comparison (``options["ladder"]``), the curve each norm type's effective speedup is read from."""
    if not fractions:
        return []
    norm = ladder_norm(list(norm_types), options.get("baseline"))
    cells = ladder_cells(config, norm, (seeds_for or {}).get(norm, seeds), runs_dir, overrides, fractions)
    options["ladder"] = [c.run.path for c in cells]
    return cells


def check_capacity(cells: list[Cell]) -> None:
    """Refuse, before any cell trains, a cell that asks more training tokens than its data has. Across sizes on
    train.tokens_per_param the largest size trains longest, and the trainer would say so only when its turn
    came, after the smaller sizes. Each distinct model is built once, on the CPU, to count its parameters."""
    seen = set()
    for cell in cells:
        cfg = cell.cfg
        key = (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.data.path, cfg.data.train_split)
        if key in seen or cell.run.status() in FINISHED or not Path(cfg.data.path).is_dir():
            continue  # data not here yet (a Hub set, say): the trainer checks it
        seen.add(key)
        t, steps = cfg.train, cfg.total_steps(GPT(cfg.model).num_params(norms=False))
        tokens = open_split(Path(cfg.data.path), cfg.data.train_split)
        reader = TrainBatches(tokens, cfg.model.context_length, t.global_batch_size, t.global_batch_size)
        try:
            reader.check_capacity(steps)
        except UserError as e:
            raise UserError(f"{cell.name} (and the cells of its size): {e}") from None
        finally:
            reader.close()


def run_cells(config: Path, cells: list[Cell], nproc: int, dry_run: bool, log, hooks_for) -> None:
    """Train (or resume) and evaluate each of ``cells`` that has no result yet; a dry run logs the commands."""
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


def publish_grid(
    config: Path, runs_dir: Path, out: Path | None, namespace: str, prefix: str | None, dry_run: bool
) -> None:
    """Publish a sweep's runs and comparison under ``namespace`` (``gpt.publish.release.publish_sweep``); a dry
    run prints the command that would, as it prints the others (nothing is trained yet)."""
    comparison = comparison_folder(config, runs_dir, out)
    if dry_run:
        publish = ["scripts/publish_sweep.py", str(runs_dir), "--namespace", namespace]
        publish += ["--comparison", str(comparison), *(["--prefix", prefix] if prefix else [])]
        print(shlex.join([sys.executable, *publish]))
    else:
        outcome_problems(publish_sweep(runs_dir, namespace, prefix=prefix, comparison=comparison))
