"""A sweep's definition, as its command line gives it: the grid, where its runs go, how they are compared.

One object, so that a SLURM job can run the very sweep it belongs to (``argv`` writes the command line
back) and lay out the same cells (``cells``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpt.analysis.selection import LR_KEY
from gpt.common.errors import UserError
from gpt.common.files import read_json
from gpt.config import load_config
from gpt.config.loader import parse_override
from gpt.run.directory import COMPARISON_FILE
from gpt.sweep.cells import (
    Cell,
    check_fractions,
    check_rates,
    check_size_axis,
    comparison_folder,
    following,
    ladder_cells,
    ladder_norm,
    lay_out,
    levels,
    parse_factors,
    selection_folder,
    trains_muon,
)


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
    confirm_seeds: list[int] | None = None  # with lrs: fresh seeds trained at each norm type's chosen rate alone
    sizes: list[str] | None = None  # model sizes (gpt.config.sizes) crossed with the grid; compared across sizes
    predict_at: float | None = None  # with sizes: the parameter count the comparison predicts each norm's loss at
    token_fractions: list[float] | None = None  # the baseline's token ladder: fractions of the token budget
    throughput: Path | None = None  # bench.py's rows (JSON lines): the time-matched figure's tokens/s
    factors: list[str] | None = None  # --vary KEY=A,B: config keys crossed with the grid, compared --by them

    def __post_init__(self) -> None:
        check_rates(self.confirm_seeds, self.lrs, self.seeds, self.init_seeds)
        check_size_axis(self.sizes, self.confirm_seeds, self.predict_at)
        check_fractions(self.token_fractions, self.sizes, self.lrs, self.init_seeds, self.confirm_seeds)
        if parse_factors(self.factors, self.overrides) and (self.sizes or self.token_fractions):
            raise UserError("--vary with --sizes or --token-fractions: cross a factor within one size, on the budget")
        if self.throughput is not None and not self.token_fractions:
            raise UserError("--throughput times the norm types for the effective speedup: add --token-fractions")
        if self.sizes and self.push_to_hub:
            raise UserError(
                "--push-to-hub with --sizes: publish each size's comparison when the sweep has run: scripts/"
                "publish_sweep.py RUNS_DIR --namespace USER --comparison RUNS_DIR/<config>-comparison/sizes/SIZE"
            )

    @classmethod
    def from_args(cls, args, nproc: int) -> SweepSpec:
        names = [f for f in cls.__dataclass_fields__ if f != "nproc"]
        return cls(**{name: getattr(args, name) for name in names}, nproc=nproc)

    def grid_cells(self) -> list[Cell]:
        """The grid: norm types x seeds (x rates); with ``confirm_seeds``, the selection stage."""
        return lay_out(
            self.config, self.norm_types, self.seeds, self.runs_dir, self.overrides,
            init_seeds=self.init_seeds, data_seeds=self.data_seeds, lrs=self.lrs, sizes=self.sizes,
            factors=parse_factors(self.factors),
        )  # fmt: skip

    def ladder_cells(self) -> list[Cell]:
        """The baseline's token ladder (``token_fractions``; [] without): its runs at other token budgets."""
        if not self.token_fractions:
            return []
        norm = ladder_norm(self.norm_types, self.baseline)
        return ladder_cells(self.config, norm, self.seeds, self.runs_dir, self.overrides, self.token_fractions)

    def cells(self) -> list[Cell]:
        """Every cell known now: the grid, the token ladder, then (two-stage, once the selection has chosen) the
        confirmation cells. A SLURM task's index points into this list."""
        return self.grid_cells() + self.ladder_cells() + self.confirmation_cells()

    def chosen_rates(self, selection: dict | None = None) -> dict[str, float]:
        """Each norm type's rate chosen by the selection (its comparison's ``selection``; by default read from
        the selection folder's comparison.json): {} before it has run, or without ``confirm_seeds``."""
        if not self.confirm_seeds:
            return {}
        if selection is None:
            path = self.selection_comparison / COMPARISON_FILE
            if not path.is_file():
                return {}
            selection = read_json(path, "the sweep's selection", fix="delete it to choose the rates again")["selection"]
        return {f["family"]: f["chosen_value"] for f in selection["families"] if f["chosen_value"] is not None}

    def confirmation_cells(self, chosen: dict[str, float] | None = None) -> list[Cell]:
        """Each norm type's chosen rate x the confirmation seeds (``chosen``: the rates; by default the selection's
        on disk), in norm-type order; [] before the selection."""
        chosen = self.chosen_rates() if chosen is None else chosen
        by_parts = {frozenset(label.split(", ")): rate for label, rate in chosen.items()}
        factors = parse_factors(self.factors)
        cells = []
        for norm in self.norm_types:
            for combo in levels(factors):
                family = frozenset([norm, *(f"{key}={_value(f'{key}={v}')}" for key, v in combo)])
                if family in by_parts:
                    one = [(key, [v]) for key, v in combo]  # this level alone: its name, its overrides
                    cells += lay_out(self.config, [norm], self.confirm_seeds, self.runs_dir, self.overrides,
                                     lrs=[by_parts[family]], factors=one)  # fmt: skip
        return cells

    def following(self, allowed: list[str]) -> list[str]:
        """The keys that move with the rate axis (``gpt.sweep.cells.following``), where not ``allowed`` already:
        allowed to differ between the rates' runs."""
        muon = trains_muon(load_config(self.config, self.overrides).optim.name, parse_factors(self.factors))
        return [key for key in following(self.overrides, muon) if key not in allowed]

    @property
    def comparison(self) -> Path:
        return comparison_folder(self.config, self.runs_dir, self.out)

    @property
    def selection_comparison(self) -> Path:
        return selection_folder(self.comparison)

    def compare_options(self) -> dict:
        """How the grid's cells are compared (``gpt.analysis.table.compare``'s options); with ``lrs``, the rate is
        an axis chosen on validation, and optim.min_lr (where it follows the rate) may differ with it."""
        options = {"baseline": self.baseline, "equivalence_margin": self.equivalence_margin,
                   "allow_differ": list(self.allow_differ)}  # fmt: skip
        if self.sizes:
            options.update(across_sizes=True, predict_at=self.predict_at)
        if self.token_fractions:
            options["ladder"] = [c.run.path for c in self.ladder_cells()]
            options["throughput"] = self.throughput
        keys = [key for key, _ in parse_factors(self.factors)]
        if keys and not self.lrs:
            options["by"] = keys
        if self.lrs:
            options.update(vary=[LR_KEY, *keys], select_on="val")
            options["allow_differ"] += self.following(self.allow_differ)
        return options

    def run_options(self) -> dict:
        """``gpt.sweep.launch.run_sweep``'s arguments for this sweep, its comparison's options included."""
        keys = ("config", "norm_types", "seeds", "runs_dir", "init_seeds", "data_seeds", "lrs", "confirm_seeds")
        more = ("nproc", "overrides", "out", "sizes", "token_fractions", "factors")
        return {**{k: getattr(self, k) for k in (*keys, *more)}, **self.compare_options()}

    def confirmation_options(self, selection: dict) -> dict:
        """How the confirmation cells are compared: by norm type, each at its own rate (optim.lr, and min_lr where
        it follows, allowed to differ), with the record of where the rates came from."""
        options = {"baseline": self.baseline, "equivalence_margin": self.equivalence_margin,
                   "allow_differ": list(dict.fromkeys([*self.allow_differ, LR_KEY]))}  # fmt: skip
        options["allow_differ"] += self.following(options["allow_differ"])
        families = [
            {"family": f["family"], "chosen_value": f["chosen_value"], "edge": f.get("edge"),
             "grid": [rate["value"] for rate in f["rates"]]}
            for f in selection["families"]
        ]  # fmt: skip
        options["by"] = [key for key, _ in parse_factors(self.factors)]
        options["confirmation"] = {
            "key": LR_KEY, "selection": str(self.selection_comparison), "selection_seeds": list(self.seeds),
            "confirm_seeds": list(self.confirm_seeds), "families": families,
        }  # fmt: skip
        return options

    def argv(self) -> list[str]:
        """The sweep command (``python -m gpt.commands.sweep``) that defines this sweep."""
        words = [sys.executable, "-m", "gpt.commands.sweep", str(self.config), "--norm-types", *self.norm_types]
        words += ["--seeds", *map(str, self.seeds)]
        for flag, values in (("--init-seeds", self.init_seeds), ("--data-seeds", self.data_seeds)):
            words += [flag, *map(str, values)] if values else []
        words += ["--lrs", *map(repr, map(float, self.lrs))] if self.lrs else []
        words += ["--confirm-seeds", *map(str, self.confirm_seeds)] if self.confirm_seeds else []
        words += ["--sizes", *self.sizes] if self.sizes else []
        words += ["--predict-at", repr(float(self.predict_at))] if self.predict_at is not None else []
        words += ["--token-fractions", *map(repr, map(float, self.token_fractions))] if self.token_fractions else []
        words += ["--throughput", str(self.throughput)] if self.throughput is not None else []
        words += [a for factor in self.factors or () for a in ("--vary", factor)]
        words += ["--nproc", str(self.nproc), "--runs-dir", str(self.runs_dir)]
        words += [a for o in self.overrides for a in ("--set", o)]
        named = (("--out", self.out), ("--baseline", self.baseline), ("--push-to-hub", self.push_to_hub))
        for flag, value in (*named, ("--hub-prefix", self.hub_prefix)):
            words += [flag, str(value)] if value is not None else []
        if self.equivalence_margin is not None:
            words += ["--equivalence-margin", repr(self.equivalence_margin)]
        return words + [a for key in self.allow_differ for a in ("--allow-differ", key)]


def _value(override: str) -> str:
    """An override's value as a run's config reads it back (``0.020`` -> ``0.02``), as a family's label shows it."""
    return str(parse_override(override)[1])
