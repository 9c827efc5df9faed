"""A sweep's definition, as its command line gives it: the grid, where its runs go, how they are compared.

One object, so that a SLURM job can run the very sweep it belongs to (``argv`` writes the command line
back) and lay out the same cells (``cells``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpt.analysis.selection import LR_KEY
from gpt.sweep.cells import MIN_LR_KEY, Cell, comparison_folder, lay_out, min_lr_fixed


@dataclass
class SweepSpec:
    config: Path  # the sweep's config: every cell is it with the cell's norm type, seeds, name and folder
    norm_types: list[str]
    seeds: list[int]  # train.seed values (with init_seeds and data_seeds: not used)
    init_seeds: list[int] | None = None  # with data_seeds: model.init_seed values, crossed with them
    data_seeds: list[int] | None = None
    runs_dir: Path = Path("runs")
    overrides: list[str] = field(default_factory=list)  # --set KEY=VALUE of every cell
    nproc: int = 1  # processes per run (per node)
    out: Path | None = None  # the comparison's folder (default <runs_dir>/<config stem>-comparison)
    baseline: str | None = None
    equivalence_margin: float | None = None
    allow_differ: list[str] = field(default_factory=list)
    push_to_hub: str | None = None  # then publish the sweep under this Hub namespace (on SLURM: the comparison job)
    hub_prefix: str | None = None
    lrs: list[float] | None = None  # optim.lr values crossed with the grid; the comparison then selects on val

    @classmethod
    def from_args(cls, args, nproc: int) -> SweepSpec:
        names = [f for f in cls.__dataclass_fields__ if f != "nproc"]
        return cls(**{name: getattr(args, name) for name in names}, nproc=nproc)

    def cells(self) -> list[Cell]:
        return lay_out(
            self.config, self.norm_types, self.seeds, self.runs_dir, self.overrides,
            init_seeds=self.init_seeds, data_seeds=self.data_seeds, lrs=self.lrs,
        )  # fmt: skip

    @property
    def comparison(self) -> Path:
        return comparison_folder(self.config, self.runs_dir, self.out)

    def compare_options(self) -> dict:
        """How the sweep's cells are compared (``gpt.analysis.table.compare``'s options); with ``lrs``, the rate is
        an axis chosen on validation, and optim.min_lr (where it follows the rate) may differ with it."""
        options = {"baseline": self.baseline, "equivalence_margin": self.equivalence_margin,
                   "allow_differ": list(self.allow_differ)}  # fmt: skip
        if self.lrs:
            options.update(vary=[LR_KEY], select_on="val")
            if not min_lr_fixed(self.overrides) and MIN_LR_KEY not in self.allow_differ:
                options["allow_differ"].append(MIN_LR_KEY)
        return options

    def argv(self) -> list[str]:
        """The sweep command (``python -m gpt.commands.sweep``) that defines this sweep."""
        words = [sys.executable, "-m", "gpt.commands.sweep", str(self.config), "--norm-types", *self.norm_types]
        words += ["--seeds", *map(str, self.seeds)]
        for flag, values in (("--init-seeds", self.init_seeds), ("--data-seeds", self.data_seeds)):
            words += [flag, *map(str, values)] if values else []
        words += ["--lrs", *map(repr, map(float, self.lrs))] if self.lrs else []
        words += ["--nproc", str(self.nproc), "--runs-dir", str(self.runs_dir)]
        words += [a for o in self.overrides for a in ("--set", o)]
        named = (("--out", self.out), ("--baseline", self.baseline), ("--push-to-hub", self.push_to_hub))
        for flag, value in (*named, ("--hub-prefix", self.hub_prefix)):
            words += [flag, str(value)] if value is not None else []
        if self.equivalence_margin is not None:
            words += ["--equivalence-margin", repr(self.equivalence_margin)]
        return words + [a for key in self.allow_differ for a in ("--allow-differ", key)]
