"""What a sweep folder holds to publish (what ``scripts/sweep.py`` writes): its comparison folder and the runs
the comparison names, in table order, each with the checkpoint its model repo gets or why it gets none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpt.common.errors import UserError
from gpt.common.files import read_json
from gpt.run.directory import COMPARISON_FILE, COMPLETED, Evaluations, RunDir


@dataclass
class SweepRun:
    """One run of the sweep, in the comparison's table order."""

    name: str  # its folder's name, also its model repo's (after the prefix)
    run: RunDir
    group: str  # its comparison group (the norm type)
    seed: str
    status: str  # completed, diverged, interrupted, ...
    test_loss: float | None  # as the comparison has it
    ckpt: Path | None = None  # what its model repo holds; None: not published
    evaluations: Evaluations | None = None  # of its final checkpoint (completed) or of ckpt: read once, shared
    left_out: str | None = None  # why it is not published


@dataclass
class Sweep:
    folder: Path  # the sweep's folder (its runs and its comparison folder)
    comparison: Path  # the comparison folder
    result: dict  # comparison.json
    runs: list[SweepRun]

    @property
    def title_stem(self) -> str:
        return self.comparison.name.removesuffix("-comparison")

    @property
    def published(self) -> list[SweepRun]:
        return [r for r in self.runs if r.ckpt is not None]


def sweep_comparison_folder(folder: Path, comparison: Path | None) -> Path:
    """The sweep's comparison folder: ``comparison`` if given, else the one folder in ``folder`` holding one."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder; give the folder a sweep wrote (its runs and its comparison)")
    if comparison is not None:
        if not (comparison / COMPARISON_FILE).is_file():
            raise UserError(f"--comparison {comparison}: holds no {COMPARISON_FILE}; run scripts/compare.py first")
        return comparison
    found = sorted(d for d in folder.iterdir() if (d / COMPARISON_FILE).is_file())
    if len(found) != 1:
        what = f"{len(found)}: {', '.join(d.name for d in found)}" if found else "none"
        raise UserError(
            f"{folder}: a sweep folder holds one comparison folder ({COMPARISON_FILE}), found {what}; "
            "name one with --comparison DIR, or run scripts/sweep.py (or scripts/compare.py) first"
        )
    return found[0]


def choose_checkpoint(r: SweepRun, split: str, include_failed: bool) -> None:
    """Set ``r.ckpt`` to what its repo publishes, or ``r.left_out`` to why nothing is."""
    if r.status == COMPLETED:
        ckpt = r.run.checkpoint("final")
        r.evaluations = Evaluations(ckpt)
        if r.evaluations.result(split, "fp32") is None:
            r.left_out = f"completed, not evaluated (python evaluate.py {r.run.path})"
        else:
            r.ckpt = ckpt
        return
    if not include_failed:
        r.left_out = f"{r.status}: published only with --include-failed"
        return
    try:
        r.ckpt = r.run.checkpoint("latest")
    except UserError:
        r.left_out = f"{r.status}, and no checkpoint to publish"
    else:
        r.evaluations = Evaluations(r.ckpt)


def _shape_problem(result: dict) -> str | None:
    """What keeps ``result`` (a comparison.json) from naming its runs, or None: a one-size comparison's groups, each
    with its runs and their paths, or a comparison across sizes' sizes, each with its name."""
    if "groups" not in result:
        sizes = result.get("sizes")
        if not isinstance(sizes, list) or not sizes:
            return "no groups, and no sizes"
        if not all(isinstance(s, dict) and isinstance(s.get("size"), str) for s in sizes):
            return "a size without its name"
        return None
    groups = result["groups"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "group" in g for g in groups):
        return "groups is not a list of groups"
    for g in groups:
        entries = g.get("runs", [])
        if not isinstance(entries, list):
            return f"group {g['group']}: runs is not a list"
        for entry in entries:
            if not isinstance(entry, dict) or not all(k in entry for k in ("path", "seed", "status")):
                return f"group {g['group']}: a run without its path, seed or status"
    return None


def read_sweep(folder: Path, comparison: Path | None = None, include_failed: bool = False) -> Sweep:
    """The sweep in ``folder``: its comparison and its runs in table order, each with what it publishes."""
    folder = Path(folder)
    comparison = sweep_comparison_folder(folder, comparison)
    result = read_json(comparison / COMPARISON_FILE, "comparison")
    wrong = _shape_problem(result)
    if wrong:
        raise UserError(
            f"{comparison / COMPARISON_FILE}: not a comparison as compare.py writes it ({wrong}); run "
            "scripts/compare.py (or the sweep) again to rewrite it"
        )
    if "groups" not in result:  # a comparison across sizes
        raise UserError(
            f"{comparison}: a comparison across sizes, which names no runs itself; publish each size's: --comparison "
            f"{comparison / 'sizes' / result['sizes'][0]['size']} (and the other sizes in {comparison / 'sizes'})"
        )
    split = (result.get("test_range") or {}).get("split", "test")
    runs = []
    for group in result.get("groups", []):
        for entry in group.get("runs", []):
            name = Path(entry["path"]).name  # the path as compare was given it; the folder is in the sweep's
            run = RunDir(folder / name)
            if not run.looks_like_run():
                raise UserError(f"{folder / name}: the comparison names this run, and it is not in {folder}")
            r = SweepRun(name, run, group["group"], str(entry["seed"]), entry["status"], entry.get("test_loss"))
            choose_checkpoint(r, split, include_failed)
            runs.append(r)
    return Sweep(folder, comparison, result, runs)
