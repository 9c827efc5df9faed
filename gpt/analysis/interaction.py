"""Does a norm type's effect depend on another factor (the optimizer, the block design)? A crossed design's comparison.

The runs cross the norm types with a factor (``compare --by KEY``, repeatable: a *level* is one value of each KEY;
``sweep.py --vary KEY=A,B`` trains such a grid). Then:

- **within every level**, each norm type's difference to the baseline norm type at that level, paired on the seeds
  they share (``stats.difference``: paired, crossed init x data, or Welch), Holm-adjusted over the norm types of the
  level, as a one-factor comparison does;
- **the interaction** of each norm type with each level L besides the reference level R (the keys' defaults where
  the runs have them, else the first): how much the effect at L differs from the effect at R,
  ``(norm - baseline at L) - (norm - baseline at R)``, with its interval. Where the two levels share at least two
  seeds (a sweep's crossed cells always do) it is paired on them: per seed the difference of the two paired
  differences, and the t interval of its mean by the seeds' design (``stats.mean_of``), exact under normal noise.
  Otherwise it is Welch's interval between the two levels' paired differences, whose noise may differ. Holm
  adjusts the interactions' p-values as one family (every norm type x every level but R), and ``resolvable`` is the
  smallest interaction the seeds detect with 80% power.

An interaction is a difference of two differences: with the same seeds and equal noise at both levels its variance
is twice a within-level effect's (less where the seeds' noise is shared across levels), so it needs about twice the
seeds to resolve the same size (docs/studies.md). Coverage and Holm's family-wise error are tested by simulation
(``tests/analysis/test_interaction.py``), vectorised here as ``interaction_many``.
"""

from __future__ import annotations

import math

import numpy as np

from gpt.analysis.runs import AXIS, Group
from gpt.analysis.stats import LEVEL, difference, holm, mean_of_many, resolvable_difference, welch_many
from gpt.common.errors import UserError
from gpt.config import DEFAULT_BASELINE, norm_order


def level_name(by: list[str], level: tuple) -> str:
    """A level as the report names it: the value alone for one key, ``key=value, ...`` for several."""
    return str(level[0]) if len(by) == 1 else ", ".join(f"{k}={v}" for k, v in zip(by, level))


def levels_of(groups: list[Group], by: list[str], default_of) -> list[tuple]:
    """The levels the groups hold, the reference first: the one whose every key is at ``default_of(key)`` (the
    config's default), else the first in sorted order; the others sorted."""
    levels = sorted({_level(g, by) for g in groups}, key=lambda lv: tuple(map(str, lv)))
    if len(levels) < 2:
        raise UserError(f"--by {' '.join(by)}: these runs hold one level ({level_name(by, levels[0])}); a crossed "
                        "comparison needs runs at two levels or more")  # fmt: skip
    reference = next((lv for lv in levels if all(default_of(k) == v for k, v in zip(by, lv))), levels[0])
    return [reference, *(lv for lv in levels if lv != reference)]


def _level(group: Group, by: list[str]) -> tuple:
    """A group's level: its value of each ``by`` key (None for a key its runs all share: not an axis)."""
    return tuple(group.values.get(k) for k in by)


def reference_group(section: dict) -> str:
    """The label of the main table's baseline for a crossed comparison (``crossed``'s section): the baseline norm
    type at the reference level."""
    if section["reference_group"] is None:
        raise UserError(f"no run of the baseline {section['baseline']} at the reference level {section['levels'][0]}: "
                        "train it")  # fmt: skip
    return section["reference_group"]


def baseline_norm(groups: list[Group], baseline: str | None) -> str:
    """The norm type every level's effects are measured against: ``baseline`` (a norm type, or a group's label whose
    norm type it takes), else handrolled_layernorm, else the first in the write-up's order."""
    norms = {g.values[AXIS] for g in groups}
    if baseline is not None:
        norm = next((g.values[AXIS] for g in groups if g.label == baseline), baseline)
        if norm not in norms:
            raise UserError(f"--baseline {baseline!r} is no norm type of these runs; they have: {', '.join(norms)}")
        return norm
    return DEFAULT_BASELINE if DEFAULT_BASELINE in norms else min(norms, key=norm_order)


def crossed(groups: list[Group], by: list[str], baseline: str | None, default_of) -> dict:
    """The crossed comparison's section (see the module): levels, each norm type's effect per level and its
    interactions, with Holm over each family and a verdict per interaction; ``reference_group``: the label of the
    baseline norm type's group at the reference level (None where it has no runs)."""
    levels = levels_of(groups, by, default_of)
    base = baseline_norm(groups, baseline)
    cells = {(g.values[AXIS], _level(g, by)): g.losses_by_cell() for g in groups}
    norms = [n for n in dict.fromkeys(g.values[AXIS] for g in groups) if n != base]
    rows = [{"norm": n, "effects": [], "interactions": []} for n in norms]
    for level in levels:
        row_effects = [_effect(cells.get((n, level)), cells.get((base, level))) for n in norms]
        for row, est, adjusted in zip(rows, row_effects, holm([e["p"] for e in row_effects])):
            row["effects"].append({**est, "level": level_name(by, level), "holm_p": adjusted})
    family = []
    for row in rows:
        ref = row["effects"][0]
        for effect in row["effects"][1:]:
            est = difference(effect["paired"], ref["paired"]) if effect["paired"] and ref["paired"] else _none()
            row["interactions"].append({**_public(est), "level": effect["level"], "reference": ref["level"],
                                        "resolvable": _resolvable(est)})  # fmt: skip
            family.append((row["norm"], row["interactions"][-1]))
    for (norm, item), adjusted in zip(family, holm([i["p"] for _, i in family])):
        item["holm_p"] = adjusted
        item["verdict"] = verdict(item, norm, base)
    for row in rows:
        for e in row["effects"]:
            e.pop("paired")
    reference = next((g.label for g in groups if g.values[AXIS] == base and _level(g, by) == levels[0]), None)
    return {"by": list(by), "baseline": base, "levels": [level_name(by, lv) for lv in levels], "rows": rows,
            "level": LEVEL, "reference_group": reference}  # fmt: skip


def _effect(a: dict | None, b: dict | None) -> dict:
    """A norm type's difference to the baseline at one level, with the per-seed paired differences it rests on."""
    if not a or not b:
        return {**_none(), "paired": {}}
    shared = sorted(set(a) & set(b))
    return {**_public(difference(a, b)), "paired": {k: a[k] - b[k] for k in shared}}


def _none() -> dict:
    nan = math.nan
    return {"diff": nan, "low": nan, "high": nan, "p": nan, "se": nan, "df": nan, "n": 0, "method": None}


def _public(est: dict) -> dict:
    keys = ("diff", "low", "high", "p", "se", "df", "n", "method", "design", "no_spread", "missing", "init_seeds",
            "data_seeds")  # fmt: skip
    return {k: est[k] for k in keys if k in est}


def _resolvable(est: dict) -> float:
    se, df = est.get("se", math.nan), est.get("df", math.nan)
    return math.nan if not (se and df) or math.isnan(se) or math.isnan(df) else resolvable_difference(se, df)


def verdict(item: dict, norm: str, base: str) -> str:
    """One line: whether the effect of ``norm`` vs ``base`` differs between the reference level and this one."""
    d, low, high, p = item["diff"], item["low"], item["high"], item["holm_p"]
    between = f"between {item['reference']} and {item['level']}"
    if math.isnan(d):
        return f"the effect of {norm} vs {base} {between}: not estimated (a level lacks runs of one of them)"
    interval = "no interval" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]"
    if not math.isnan(p) and p < 1 - LEVEL:
        return f"the effect of {norm} vs {base} differs {between} by {d:+.4f} {interval} (Holm p {p:.3g})"
    held = "" if math.isnan(p) else f" (Holm p {p:.3g})"
    return f"no interaction resolved {between}: the effect of {norm} vs {base} changes by {d:+.4f} {interval}{held}"


# --------------------------------------------------------------------------- simulation's vectorised form


def interaction_many(norm_l, base_l, norm_r, base_r, shared: bool, level: float = LEVEL) -> dict:
    """The interaction of many replicates at once: arrays ``[..., n]`` of the norm's and the baseline's losses at
    level L and at the reference level R, seed k of each paired with seed k of the other at the same level; with
    ``shared`` the levels' seed k is the same seed too (the paired difference of differences), else the levels'
    seeds are unrelated (Welch). Keys: ``diff``, ``low``, ``high``, ``p``, arrays over the leading axes."""
    d_l = np.asarray(norm_l, dtype=float) - np.asarray(base_l, dtype=float)
    d_r = np.asarray(norm_r, dtype=float) - np.asarray(base_r, dtype=float)
    if shared:
        est = mean_of_many(d_l - d_r, level)
        return {**est, "diff": est["mean"]}
    return welch_many(d_l, d_r, level)
