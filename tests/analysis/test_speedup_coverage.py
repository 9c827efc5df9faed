"""Simulated coverage of the effective speedup's interval (gpt.analysis.speedup), in both routes.

Losses are drawn from a known curve of the baseline, ``E + A x^-alpha`` in its cost x, and each variant's true loss
is the baseline's at ``ES x`` its own cost: its true effective speedup is ES. The estimate is anchored, as the report
computes it: both the variant's loss and the baseline's own at the same cost (rung ``BUDGET``, or the middle size)
read off the fitted curve. Seed noise at the spreads runs show,
different at each rung, one seed's noise shared between its runs (the same train.seed: the same data order) with
correlation 0.5. Token ladder: one size, the baseline at 0.5-2x the token budget (a fixed size's curve: slow, 0.14
nats per e-fold of tokens at the budget); size ladder: five sizes' training FLOPs (Chinchilla-like in N, C = 120
N^2 at 20 tokens per parameter), the variant at the middle one. Every replicate is computed at once.
"""

import math

import numpy as np
import pytest

from gpt.analysis.speedup import identified_many, speedup_many

REPLICATES = 4000  # a 95% coverage known to +-0.7% (2 standard errors)
FRACTIONS = np.array([0.5, 0.71, 1.0, 1.41, 2.0])  # the token ladder, in token budgets
BUDGET = 2  # the budget's rung: the variant's pair


def token_curve(d):
    return 2.9 + 0.45 * d**-0.3  # one size's loss against its tokens (in budgets)


N = np.array([7.1e6, 1.4e7, 2.2e7, 3.1e7, 5.3e7])
FLOPS = 120 * N**2


def size_curve(c):
    return 1.8 + 406 * (c / 120) ** -0.17  # E + A N^-0.34 with N = sqrt(C / 120)


def draws(truth: np.ndarray, variant: float, sd: np.ndarray, seeds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(reps, seeds, rungs) baseline losses and (reps, seeds) the variant's: the truth plus each seed's noise."""
    sd = np.append(sd, sd[len(sd) // 2])  # the variant's noise: the middle rung's
    shared = rng.standard_normal((REPLICATES, seeds, 1))
    own = rng.standard_normal((REPLICATES, seeds, len(truth) + 1))
    y = np.append(truth, variant) + sd * (math.sqrt(0.5) * shared + math.sqrt(0.5) * own)
    return y[:, :, :-1], y[:, :, -1]


def covered(r: dict, truth: float) -> float:
    return float(((r["low"] <= truth) & (truth <= r["high"])).mean())


@pytest.mark.parametrize("seeds", [2, 3, 5])
@pytest.mark.parametrize("es", [1.0, 1.25])
def test_the_token_ladder_s_interval_covers_at_95(seeds, es):
    rng = np.random.default_rng(seeds * 7 + int(es * 4))
    sd = np.array([0.02, 0.017, 0.015, 0.013, 0.012])
    base, variant = draws(token_curve(FRACTIONS), token_curve(es), sd, seeds, rng)
    r = speedup_many(FRACTIONS, base, 1.0, variant, "saturating", anchor=BUDGET)
    assert (r["log"]["method"] == "seed by seed").all() and r["inside"].mean() > 0.9
    assert 0.93 <= covered(r, es) <= 0.97
    assert np.median(r["es"]) == pytest.approx(es, rel=0.01)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_auto_s_choice_of_form_covers_at_95_on_the_token_ladder(seeds):
    """``auto`` as the report applies it (``identified_many``): the saturating form where it identifies E (84-95%
    of these replicates), the log-log line elsewhere (biased a few percent on a curve that levels off)."""
    rng = np.random.default_rng(300 + seeds)
    sd = np.array([0.02, 0.017, 0.015, 0.013, 0.012])
    base, variant = draws(token_curve(FRACTIONS), token_curve(1.25), sd, seeds, rng)
    kept = identified_many(FRACTIONS, base)
    assert 0.75 < kept.mean() < 0.99  # both forms are exercised
    sat, line = (speedup_many(FRACTIONS, base, 1.0, variant, form, anchor=BUDGET) for form in ("saturating", "power"))
    chosen = {k: np.where(kept, sat[k], line[k]) for k in ("low", "high")}
    assert 0.93 <= covered(chosen, 1.25) <= 0.97


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_the_size_ladder_s_interval_covers_at_95(seeds):
    rng = np.random.default_rng(100 + seeds)
    sd = np.array([0.02, 0.015, 0.012, 0.01, 0.008])
    base, variant = draws(size_curve(FLOPS), size_curve(1.2 * FLOPS[2]), sd, seeds, rng)
    r = speedup_many(FLOPS, base, FLOPS[2], variant, "saturating", anchor=2)
    assert 0.93 <= covered(r, 1.2) <= 0.97


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_anchoring_keeps_the_coverage_where_the_form_is_wrong(seeds):
    """The log-log line fitted across sizes whose loss levels off: read against the cost actually spent, ES comes
    out 1.30 for a true 1.20 and its interval covers 82%, 55% and 10% with 2, 3 and 5 seeds (more seeds, a narrower
    interval around the wrong value); anchored at the baseline's own runs of that size, the lack of fit cancels."""
    rng = np.random.default_rng(400 + seeds)
    sd = np.array([0.02, 0.015, 0.012, 0.01, 0.008])
    base, variant = draws(size_curve(FLOPS), size_curve(1.2 * FLOPS[2]), sd, seeds, rng)
    plain = speedup_many(FLOPS, base, FLOPS[2], variant, "power")
    anchored = speedup_many(FLOPS, base, FLOPS[2], variant, "power", anchor=2)
    assert np.median(plain["es"]) == pytest.approx(1.30, abs=0.02) and covered(plain, 1.2) < 0.9
    assert 0.93 <= covered(anchored, 1.2) <= 0.97


def test_the_log_log_line_covers_at_95_where_the_loss_is_a_power_law():
    rng = np.random.default_rng(5)
    base, variant = draws(3.4 * FRACTIONS**-0.04, 3.4 * 1.15**-0.04, np.full(5, 0.015), 3, rng)
    r = speedup_many(FRACTIONS, base, 1.0, variant, "power", anchor=BUDGET)
    assert 0.93 <= covered(r, 1.15) <= 0.97


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_a_variant_as_good_but_10_percent_faster_reads_1_10_time_matched_and_1_00_compute_matched(seeds):
    rng = np.random.default_rng(200 + seeds)
    base, variant = draws(token_curve(FRACTIONS), token_curve(1.0), np.full(5, 0.015), seeds, rng)
    ratio = math.log(1.1) + 0.03 * rng.standard_normal((REPLICATES, seeds))  # each seed's tokens/s ratio, measured
    compute = speedup_many(FRACTIONS, base, 1.0, variant, "saturating", anchor=BUDGET)
    time = speedup_many(FRACTIONS, base, 1.0, variant, "saturating", log_ratio=ratio, anchor=BUDGET)
    assert 0.93 <= covered(compute, 1.0) <= 0.97
    assert 0.93 <= covered(time, 1.1) <= 0.97
    assert np.median(time["es"]) == pytest.approx(1.1, rel=0.01)
    assert np.median(compute["es"]) == pytest.approx(1.0, abs=0.01)


def test_a_loss_below_the_baseline_s_floor_or_beyond_its_rungs_is_said():
    base = np.broadcast_to(token_curve(FRACTIONS), (1, 2, 5)) + np.array([0.0, 0.001])[None, :, None]
    far = speedup_many(FRACTIONS, base, 1.0, np.array([[token_curve(3.0)] * 2]), "saturating")
    assert not far["inside"][0] and far["crosses"][0] and far["es"][0] == pytest.approx(3.0, rel=0.05)
    below = speedup_many(FRACTIONS, base, 1.0, np.array([[2.5, 2.5]]), "saturating")
    assert not below["crosses"][0] and math.isnan(below["es"][0])
