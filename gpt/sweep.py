"""A grid of runs (norm types x seeds): train, evaluate, compare; safe to rerun.

Each cell has a predictable run directory, ``<runs_dir>/<config stem>-<norm-type>-s<seed>``.
A rerun skips cells that completed (or diverged: that is a result too), resumes cells
that were interrupted or killed (``--resume auto``), evaluates cells that have no
evaluation yet, and ends with the comparison of every cell.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt.config import Config, load_config
from gpt.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cell:
    norm_type: str
    seed: int
    name: str
    cfg: Config
    overrides: list[str]

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    def status(self) -> str | None:
        path = self.run_dir / "summary.json"
        return json.loads(path.read_text())["status"] if path.is_file() else None


def cell_name(config: Path, norm_type: str, seed: int) -> str:
    return f"{Path(config).stem}-{norm_type.replace('_', '-')}-s{seed}"


def plan(config: Path, norm_types: list[str], seeds: list[int], runs_dir: Path,
         overrides: list[str] = ()) -> list[Cell]:
    """Every cell's resolved config, validated before anything runs."""
    cells = []
    for norm_type in norm_types:
        for seed in seeds:
            name = cell_name(config, norm_type, seed)
            cell_overrides = [*overrides, f"model.norm_type={norm_type}", f"train.seed={seed}",
                              f"run.name={name}", f"run.dir={Path(runs_dir) / name}"]
            cells.append(Cell(norm_type, seed, name, load_config(config, cell_overrides), cell_overrides))
    return cells


def train_command(config: Path, cell: Cell, nproc: int) -> list[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                if nproc > 1 else [sys.executable])
    sets = [a for o in cell.overrides for a in ("--set", o)]
    return [*launcher, str(ROOT / "train.py"), str(config), *sets, "--resume", "auto"]


def run_sweep(config: Path, norm_types: list[str], seeds: list[int], runs_dir: Path = Path("runs"),
              nproc: int = 1, overrides: list[str] = (), out: Path | None = None, baseline: str | None = None,
              dry_run: bool = False, log=print) -> dict | None:
    """Run the grid; returns the comparison (None for a dry run)."""
    from gpt.compare import compare
    from gpt.distributed import setup
    from gpt.evaluation import eval_file_name, evaluate_checkpoint, resolve_which
    from gpt.training import train

    cells = plan(config, norm_types, seeds, runs_dir, overrides)
    out = Path(out) if out is not None else Path(runs_dir) / f"{Path(config).stem}-comparison"
    for i, cell in enumerate(cells, 1):
        status = cell.status()
        where = f"[{i}/{len(cells)}] {cell.name}"
        command = train_command(config, cell, nproc)
        if dry_run:
            if status not in ("completed", "diverged"):
                log(shlex.join(command))
            log(shlex.join([sys.executable, str(ROOT / "evaluate.py"), str(cell.run_dir)]))
            continue
        if status in ("completed", "diverged"):
            log(f"{where}: {status}, skipped")
        else:
            log(f"{where}: {'resuming' if status == 'interrupted' or cell.run_dir.exists() else 'training'}")
            if nproc > 1:
                result = subprocess.run(command)
                if result.returncode not in (0, 3):  # 3: diverged, a result like any other
                    raise UserError(f"{cell.name}: training exited with status {result.returncode}; "
                                    "rerun the sweep to resume it")
            else:
                summary = train(cell.cfg, resume="auto")
                if summary["status"] == "interrupted":
                    raise UserError(f"{cell.name}: interrupted at step {summary['steps']}; rerun the sweep to resume")
            status = cell.status()
        if status == "completed":
            ckpt = resolve_which(cell.run_dir, "final")
            if not (ckpt / eval_file_name(cell.cfg.data.test_split, "fp32")).is_file():
                if nproc > 1:
                    subprocess.run([*command[:command.index(str(ROOT / "train.py"))], str(ROOT / "evaluate.py"),
                                    str(cell.run_dir), "--quiet"], check=True)
                else:
                    result = evaluate_checkpoint(ckpt, setup(cell.cfg.run.device), show_progress=False)
                    log(f"{where}: test loss {result['loss']:.6f} on {result['tokens']:,} tokens")
    if dry_run:
        log(shlex.join([sys.executable, str(ROOT / "scripts" / "compare.py"), *[str(c.run_dir) for c in cells],
                        "--out", str(out)]))
        return None
    return compare([c.run_dir for c in cells], out, baseline)
