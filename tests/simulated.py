"""Simulated coverage and error rates of the comparison's statistics, design by design.

    python tests/simulated.py      # the table the README quotes: coverage now and with the method before

Each function draws seeded replicates of a design whose truth is known (a true difference of 0, or
of the equivalence margin), runs them all at once through the ``*_many`` estimators of
``gpt.analysis.stats`` (what ``compare`` computes with their namesakes, replicate by replicate: the tests
check that they agree cell by cell) and returns how often the promise held. The tests
(``tests/analysis/test_intervals.py``) assert the rates; this script prints them with more replicates, beside
what the harness did before this release: all I x J crossed cells as independent pairs, HellaSwag paired over
items, no multiplicity adjustment.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpt.analysis import stats, variance  # noqa: E402

# Variance components (init, data, rest) of the paired differences: each dominated by one source.
COMPONENTS = {
    "init-dominated": (1.0, 0.1, 0.1),
    "data-dominated": (0.1, 1.0, 0.1),
    "remainder-dominated": (0.25, 0.25, 1.0),
}
GRIDS = ((2, 2), (2, 3), (3, 3), (3, 4))


def crossed_grids(n_init: int, n_data: int, components: tuple, reps: int, seed: int) -> np.ndarray:
    """``reps`` grids of differences d_ij = a_i + b_j + e_ij with a true mean difference of 0."""
    rng = np.random.default_rng(seed)
    va, vb, ve = components
    return (
        rng.normal(0, math.sqrt(va), (reps, n_init, 1))
        + rng.normal(0, math.sqrt(vb), (reps, 1, n_data))
        + rng.normal(0, math.sqrt(ve), (reps, n_init, n_data))
    )


def _covers(est: dict, truth: float = 0.0) -> np.ndarray:
    """Whether each replicate's interval holds the truth (no interval: it does not)."""
    return (est["low"] <= truth) & (truth <= est["high"])


def crossed_coverage(n_init: int, n_data: int, components: tuple, reps: int = 2000, seed: int = 0) -> float:
    """How often the comparison's interval for a crossed grid (``stats.difference`` against a baseline of 0s)
    covers the true difference 0."""
    grids = crossed_grids(n_init, n_data, components, reps, seed)
    return float(np.mean(_covers(stats.difference_many(grids, 0.0, crossed=True))))


def cells_as_pairs_coverage(n_init: int, n_data: int, components: tuple, reps: int = 2000, seed: int = 0) -> float:
    """The method before: every cell of the grid one independent pair (a paired t on I J - 1 df)."""
    grids = crossed_grids(n_init, n_data, components, reps, seed)
    return float(np.mean(_covers(stats.mean_of_many(grids.reshape(reps, -1)))))


def paired_coverage(n: int, reps: int = 2000, seed: int = 0) -> float:
    """Independent seeds: n pairs whose differences share a seed-level effect within the pair only."""
    # each replicate draws its n baseline losses, then the n differences: a row of 2 n normal draws
    z = np.random.default_rng(seed).standard_normal((reps, 2 * n))
    base = 3.6 + 0.01 * z[:, :n]
    group = base + 0.004 * z[:, n:]  # true difference 0
    return float(np.mean(_covers(stats.difference_many(group, base))))


def hellaswag_runs(rng, n_seeds: int, n_items: int, seed_sd: float) -> tuple[list, list]:
    """Two groups of ``n_seeds`` runs from the same distribution answering the same ``n_items`` binary items:
    each item has its own difficulty, each run a true accuracy offset (sd ``seed_sd``), half of it shared with
    the run of the other group that has the same seed (the same initial weights outside the norm)."""
    difficulty = rng.uniform(0.1, 0.6, n_items)  # chance of a right answer for an average run
    shared = rng.normal(0, seed_sd / math.sqrt(2), n_seeds)
    groups = []
    for _ in range(2):
        offsets = shared + rng.normal(0, seed_sd / math.sqrt(2), n_seeds)
        p = np.clip(difficulty[None, :] + offsets[:, None], 0, 1)
        groups.append(rng.random((n_seeds, n_items)) < p)
    return groups[0], groups[1]


def hellaswag_error_rates(
    n_seeds: int, seed_sd: float, reps: int = 1000, n_items: int = 10_042, seed: int = 0
) -> dict[str, float]:
    """Under no difference between the norm types: how often the seed-level interval (each run's accuracy,
    paired by seed: what compare reports) excludes 0, and how often the item-paired interval and McNemar's
    test (the checkpoint statements, and the comparison before) call a difference at 5%."""
    rng = np.random.default_rng(seed)
    accuracy = np.empty((2, reps, n_seeds))  # each run's accuracy: group, replicate, seed
    items = np.empty(reps, dtype=bool)
    only = np.empty((2, reps), dtype=int)  # the items only the first (second) group's seed-0 run got right
    for r in range(reps):
        a, b = hellaswag_runs(rng, n_seeds, n_items, seed_sd)
        accuracy[:, r] = a.mean(1), b.mean(1)
        d = a.mean(0) - b.mean(0)
        items[r] = abs(d.mean()) > 1.96 * d.std(ddof=1) / math.sqrt(n_items)
        only[:, r] = (a[0] & ~b[0]).sum(), (~a[0] & b[0]).sum()
    seed_level = ~_covers(stats.difference_many(accuracy[0], accuracy[1]))
    mcnemar = stats.mcnemar_many(only[0], only[1]) < 0.05
    return {"seed-level": float(seed_level.mean()), "items": float(items.mean()), "mcnemar": float(mcnemar.mean())}


def tost_error_paired(n: int, margin: float = 0.01, sd: float = 0.01, reps: int = 4000, seed: int = 0) -> float:
    """How often TOST calls two groups equivalent within +-margin when the true difference is the margin."""
    group = margin + sd * np.random.default_rng(seed).standard_normal((reps, n))
    return float(np.mean(stats.equivalence_many(stats.difference_many(group, 0.0), margin)["equivalent"]))


def tost_error_crossed(
    n_init: int, n_data: int, components: tuple, margin: float = 1.0, reps: int = 2000, seed: int = 0
) -> float:
    """TOST's type I error at the margin for a crossed grid (components in units of the margin squared)."""
    grids = crossed_grids(n_init, n_data, components, reps, seed) + margin
    return float(np.mean(stats.equivalence_many(stats.difference_many(grids, 0.0, crossed=True), margin)["equivalent"]))


def family_wise_error(
    n_groups: int = 7, n_seeds: int = 3, reps: int = 2000, seed: int = 0, adjust: bool = True
) -> float:
    """Under the global null (every norm type the same): how often at least one of the n_groups - 1
    comparisons with the baseline is called a difference at 5%, with Holm's adjustment (or without)."""
    # each replicate draws the seeds' effects, then each group's runs, seed by seed: a row of normal draws
    z = np.random.default_rng(seed).standard_normal((reps, (1 + n_groups) * n_seeds))
    seed_effect = 0.01 * z[:, None, :n_seeds]  # the same seed: the same initial weights in every group
    groups = 3.6 + seed_effect + 0.005 * z[:, n_seeds:].reshape(reps, n_groups, n_seeds)
    ps = stats.difference_many(groups[:, 1:], groups[:, :1])["p"]
    ps = stats.holm_many(ps) if adjust else ps
    return float(np.mean((ps < 0.05).any(axis=-1)))


def share_coverage(n_init: int, n_data: int, components: tuple, reps: int = 400, seed: int = 0) -> dict:
    """How often each share's interval (``variance.variance_components``) covers the true share."""
    grids = crossed_grids(n_init, n_data, components, reps, seed)
    truth = dict(zip(("init", "data", "residual"), np.array(components) / sum(components)))
    c = variance.variance_components_many(grids, draws=4000)["components"]
    hits = {}
    for k, share in truth.items():
        low, high = np.moveaxis(c[k]["share_interval"], -1, 0)
        hits[k] = float(np.mean((low <= share) & (share <= high)))
    return hits


def main() -> None:
    reps = 10_000
    designs = {**COMPONENTS, "1/1/1": (1, 1, 1), "1/0/1": (1, 0, 1), "1/1/0.2": (1, 1, 0.2), "0/0/1": (0, 0, 1)}
    print(f"95% intervals for a crossed grid, true difference 0, {reps:,} grids each: coverage now / before")
    for n_init, n_data in (*GRIDS, (2, 4)):
        line = [f"{n_init}x{n_data}"]
        for name, comps in designs.items():
            now = crossed_coverage(n_init, n_data, comps, reps, seed=1)
            before = cells_as_pairs_coverage(n_init, n_data, comps, reps, seed=1)
            line.append(f"{name} {now:.3f} / {before:.3f}")
        print("  " + "; ".join(line), flush=True)
    print("independent pairs: " + ", ".join(f"n={n} {paired_coverage(n, reps, 1):.3f}" for n in (2, 3, 5, 10)))
    for sd in (0.0, 0.003, 0.006):
        r = hellaswag_error_rates(3, sd, reps=2000, seed=1)
        called = f"seed-level {r['seed-level']:.3f}, items {r['items']:.3f}, McNemar (one seed each) {r['mcnemar']:.3f}"
        print(f"HellaSwag, 3 seeds, seed-level sd {sd}: a difference called under no difference: {called}")
    tost = [f"{n} pairs {tost_error_paired(n, reps=reps, seed=1):.3f}" for n in (3, 5, 10)]
    print("TOST at the margin: " + ", ".join(tost))
    for n_init, n_data in GRIDS:
        rates = [f"{k} {tost_error_crossed(n_init, n_data, c, reps=4000, seed=1):.3f}" for k, c in COMPONENTS.items()]
        print(f"TOST at the margin, {n_init}x{n_data}: " + ", ".join(rates))
    holm, plain = family_wise_error(reps=reps, seed=1), family_wise_error(reps=reps, seed=1, adjust=False)
    print(f"family-wise error, 6 comparisons, 3 seeds: Holm {holm:.3f}, unadjusted {plain:.3f}")
    for n_init, n_data in ((3, 3), (3, 4)):
        for k, c in {**COMPONENTS, "1/1/1": (1, 1, 1)}.items():
            rates = share_coverage(n_init, n_data, c, reps=1000, seed=1)
            print(f"shares {n_init}x{n_data} {k}: " + ", ".join(f"{s} {h:.3f}" for s, h in rates.items()))


if __name__ == "__main__":
    main()
