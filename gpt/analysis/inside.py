"""What each norm does inside the model, read back: a run's ``stats.jsonl`` (written every ``log.stats_every``
steps by ``gpt.training.inside``) as numpy arrays, and the numbers a comparison draws from several runs'.

From a notebook::

    from gpt.analysis.inside import load_stats
    s = load_stats("runs/dyt-s0")
    s.per_block("resid_rms")   # (steps, blocks + 1): the residual stream entering each block, then ln_f
    s.scalar("logits_max")     # (steps,)

Drawing is ``gpt.analysis.charts``' job (``plot_inside``, ``plot_inside_comparison``); nothing here imports
matplotlib.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpt.common.errors import UserError, os_reason, shortened
from gpt.run.directory import RunDir

EXTRA_ROW = "resid_rms"  # the one per-block key with a row more: the residual stream entering the final norm


def _number(value) -> float:
    """A recorded value as a float: "nan" / "inf" / "-inf" are how the writer spells what JSON lacks; null
    (loss_scale outside fp16) and anything unreadable are nan."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


@dataclass
class Stats:
    """A run's stats records, one per stats step in step order. Lists in a record are per block (index 0: the
    first block); a record that lacks a key (an older line) gives nan there."""

    path: Path  # the stats.jsonl read
    records: list[dict] = field(repr=False)
    dropped: list[int] = field(default_factory=list)  # line numbers (1-based) that did not parse: a torn last line

    @property
    def steps(self) -> np.ndarray:
        return np.array([r["step"] for r in self.records], dtype=np.int64)

    @property
    def tokens(self) -> np.ndarray:
        return np.array([r.get("tokens", -1) for r in self.records], dtype=np.int64)  # -1: not recorded

    @property
    def keys(self) -> list[str]:
        """Every key some record holds, but step and tokens."""
        found = {k for r in self.records for k in r} - {"step", "tokens"}
        return sorted(found)

    @property
    def n_blocks(self) -> int:
        widths = [len(v) - (k == EXTRA_ROW) for r in self.records for k, v in r.items() if isinstance(v, list)]
        return max(widths, default=0)

    def _present(self, key: str, per_block: bool) -> None:
        if not any(key in r for r in self.records):
            raise UserError(f"{self.path}: no {key!r} in these stats; keys: {shortened(self.keys, 40)}")
        lists = [isinstance(r[key], list) for r in self.records if r.get(key) is not None]  # null: not measured
        if lists and any(lists) != per_block:
            other = "scalar" if per_block else "per_block"
            raise UserError(f"{self.path}: {key!r} is {'per block' if any(lists) else 'one number'}; use {other}()")

    def per_block(self, key: str) -> np.ndarray:
        """(steps, blocks) of a per-block key; (steps, blocks + 1) for resid_rms, its last column entering ln_f."""
        self._present(key, per_block=True)
        out = np.full((len(self.records), self.n_blocks + (key == EXTRA_ROW)), np.nan)
        for i, r in enumerate(self.records):
            row = r.get(key)
            if isinstance(row, list):
                values = [_number(v) for v in row[: out.shape[1]]]
                out[i, : len(values)] = values
        return out

    def scalar(self, key: str) -> np.ndarray:
        """(steps,) of a key that is one number per step (ln_f_rms, logits_max, loss_scale, ...)."""
        self._present(key, per_block=False)
        return np.array([_number(r.get(key)) for r in self.records])


def _survivors(records: list[dict]) -> list[dict]:
    """The records of the trajectory that went on: a resumed run logs again from its checkpoint's step, and
    what the killed one logged after that point was undone."""
    kept: list[dict] = []
    for r in records:
        while kept and kept[-1]["step"] >= r["step"]:
            kept.pop()
        kept.append(r)
    return kept


def load_stats(run_path: str | Path) -> Stats | None:
    """The stats of the run at ``run_path``; None when it has no stats.jsonl or not one whole record (it ran
    without ``log.stats_every``). Lines that do not parse (a torn last line after a kill) are left out and
    their numbers kept in ``dropped``; an unreadable file is a UserError naming it."""
    run = RunDir(Path(run_path))
    path, dropped = run.stats_file, []
    if not path.is_file():
        return None
    try:
        records = run.stats(dropped)
    except OSError as e:
        raise UserError(f"{path}: cannot read the run's stats: {os_reason(e)}") from None
    records = _survivors(records)
    return Stats(path, records, dropped) if records else None


# ------------------------------------------------------------------ several runs: what a comparison draws


def _spread(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over runs, position by position (rows of different lengths padded with nan); a
    position no run has is nan."""
    width = max(len(r) for r in rows)
    grid = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        grid[i, : len(r)] = r
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-nan column is nan, as it should be
        return np.nanmean(grid, axis=0), np.nanmin(grid, axis=0), np.nanmax(grid, axis=0)


def _last_finite(matrix: np.ndarray) -> int | None:
    """The last row holding a finite number (a diverged run's last rows are nan or inf)."""
    rows = np.flatnonzero(np.isfinite(matrix).any(axis=1))
    return int(rows[-1]) if len(rows) else None


def group_profiles(groups: list[tuple[str, list[Stats]]]) -> list[dict]:
    """Panel (a) of the comparison: per group, the residual stream's RMS entering each block and ln_f (x: 0..L,
    the last ln_f) at each run's last stats step holding a finite value, as the mean over the group's runs with
    the min and max. Groups (label, runs' stats) whose runs logged no resid_rms are left out."""
    out = []
    for label, runs in groups:
        profiles, steps = [], []
        for s in runs:
            if EXTRA_ROW not in s.keys:
                continue
            rms = s.per_block(EXTRA_ROW)
            last = _last_finite(rms)
            if last is not None:
                profiles.append(rms[last])
                steps.append(int(s.steps[last]))
        if profiles:
            mean, low, high = _spread(profiles)
            blocks = np.arange(len(mean))
            out.append({"group": label, "blocks": blocks, "mean": mean, "low": low, "high": high, "steps": steps})
    return out


REDUCERS = {"max": np.nanmax, "mean": np.nanmean}  # over a step's blocks


def group_curves(groups: list[tuple[str, list[Stats]]], key: str, over_blocks: str) -> list[dict]:
    """Panels (b) and (c): per group, a per-block ``key`` reduced over blocks (``over_blocks``: max or mean) at
    each step, as the mean over the group's runs that logged that step, with the min and max."""
    reduce = REDUCERS[over_blocks]
    out = []
    for label, runs in groups:
        series = []  # per run: step -> the value over its blocks
        for s in runs:
            if key in s.keys:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a step with no finite block is nan
                    series.append(dict(zip(s.steps.tolist(), reduce(s.per_block(key), axis=1))))
        if not series:
            continue
        steps = sorted({step for one in series for step in one})
        mean, low, high = _spread([np.array([one.get(step, np.nan) for step in steps]) for one in series])
        out.append({"group": label, "steps": np.array(steps), "mean": mean, "low": low, "high": high})
    return out
