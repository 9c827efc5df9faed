"""Simulated coverage of the fits across sizes and the error rate of the gap's trend (gpt.analysis.scaling).

Losses are drawn from a known ``E + A N^-alpha`` (Chinchilla-like: alpha 0.34, E 1.8) at five sizes of GPT-2's
ladder, with seed noise at the spreads runs show (0.02 nats at the smallest size down to 0.008 at the largest),
the noise of one seed correlated across its sizes or not (the same train.seed gives every size the same data
order). Every replicate is fitted at once (``fit_many``), so thousands cost seconds.
"""

import numpy as np
import pytest

from gpt.analysis import scaling

N = np.array([7.1e6, 1.4e7, 2.2e7, 3.1e7, 5.3e7])  # about 1x64 ... 6x384's non-norm parameters
E, A, ALPHA = 1.8, 406.0, 0.34
SD = np.array([0.02, 0.015, 0.012, 0.01, 0.008])  # seed-to-seed sd at each size
AT = 1.24e8  # GPT-2 small: an extrapolation
REPLICATES = 8000  # a 95% coverage is then known to +-0.5% (2 standard errors)


def draws(truth: np.ndarray, seeds: int, correlation: float, reps: int, seed: int) -> np.ndarray:
    """(reps, seeds, sizes) losses: the truth plus each seed's noise, ``correlation`` shared between its sizes."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((reps, seeds, 1))
    own = rng.standard_normal((reps, seeds, len(truth)))
    return truth + SD[: len(truth)] * (np.sqrt(correlation) * shared + np.sqrt(1 - correlation) * own)


def covered(interval: dict, truth: float) -> float:
    return float(((interval["low"] <= truth) & (truth <= interval["high"])).mean())


@pytest.mark.parametrize("seeds", [2, 3])
@pytest.mark.parametrize("correlation", [0.0, 0.5])
def test_alpha_and_the_predicted_loss_cover_at_95(seeds, correlation):
    losses = draws(E + A * N**-ALPHA, seeds, correlation, REPLICATES, seed=seeds * 10 + int(correlation * 2))
    fit = scaling.fit_many(N, losses, "saturating", predict_at=AT)
    assert not fit["at_edge"].any()
    assert (fit["alpha"]["method"] == scaling.SEED_BY_SEED).all()
    assert 0.93 <= covered(fit["alpha"], ALPHA) <= 0.97
    assert 0.93 <= covered(fit["predicted"], E + A * AT**-ALPHA) <= 0.97


def test_the_log_log_line_covers_at_95_where_the_loss_is_a_power_law():
    truth = 20 * N[:3] ** -0.15  # three sizes: the power form, with E0 = 0 the truth
    losses = draws(truth, 3, 0.5, REPLICATES, seed=7)
    fit = scaling.fit_many(N[:3], losses, "power", predict_at=AT)
    assert 0.93 <= covered(fit["alpha"], 0.15) <= 0.97
    assert 0.93 <= covered(fit["predicted"], 20 * AT**-0.15) <= 0.97


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_the_trend_test_holds_its_5_percent_error_when_the_gap_is_constant(seeds):
    reps = 40_000  # an error rate of 5% known to +-0.22%
    gaps = 0.05 + 0.7 * draws(np.zeros(len(N)), seeds, 0.5, reps, seed=seeds)  # paired: less noise than a loss
    trend = scaling.trend_many(N, gaps)
    rejected = float((~((trend["low"] <= 0) & (trend["high"] >= 0))).mean())
    assert 0.04 <= rejected <= 0.06
    assert float((trend["p"] < 0.05).mean()) == pytest.approx(rejected, abs=1e-12)  # the p-value says the same


def test_by_size_intervals_take_the_sizes_as_independent():
    """With a run missing the intervals are by size (Satterthwaite): close to 95% where the sizes' noise is
    independent, and on the safe side for the prediction where one seed's sizes are correlated (the seed-by-seed
    interval is what corrects that)."""
    truth = E + A * N**-ALPHA
    for correlation, low, high in ((0.0, 0.93, 0.975), (0.5, 0.95, 1.0)):
        losses = draws(truth, 3, correlation, REPLICATES, seed=11)
        losses[:, 0, 0] = np.nan
        fit = scaling.fit_many(N, losses, "saturating", predict_at=AT)
        assert (fit["predicted"]["method"] == scaling.BY_SIZE).all()
        assert low <= covered(fit["predicted"], E + A * AT**-ALPHA) <= high
