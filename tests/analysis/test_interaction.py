"""The interaction of a crossed norm x factor design, by simulation: its 95% interval covers the true interaction
93-97% of the time with shared and unshared seeds, 2-5 seeds, unequal noise per level; Holm over the family of
interactions holds the family-wise error at 5%; the vectorised form equals the comparison's own computation."""

import math

import numpy as np
import pytest

from gpt.analysis.interaction import interaction_many
from gpt.analysis.stats import difference, holm_many

REPS = 6000


def crossed_runs(rng, n: int, shared: bool, noise: tuple[float, float], norms: int = 1, interaction: float = 0.01):
    """Test losses [rep, norm (0: the baseline), level (0: the reference), seed] of a crossed design: each norm type
    and level its mean (a main effect of the norm, of the level, and ``interaction`` for every non-baseline norm at
    level 1), a seed effect every run of that seed shares (the same at both levels when ``shared``; drawn afresh
    per level otherwise), a seed x level effect, and run noise of sd ``noise[level]``."""
    mean = np.zeros((norms + 1, 2))
    mean[1:, :] += -0.02  # the norm's main effect
    mean[:, 1] += 0.05  # the level's
    mean[1:, 1] += interaction
    seed = rng.normal(0, 0.03, (REPS, 1, 1 if shared else 2, n))
    seed_level = rng.normal(0, 0.01, (REPS, 1, 2, n))
    run = rng.normal(0, 1, (REPS, norms + 1, 2, n)) * np.array(noise)[None, None, :, None]
    return mean[None, :, :, None] + seed + seed_level + run


@pytest.mark.parametrize("shared, n", [(True, 2), (True, 3), (True, 5), (False, 3), (False, 5)])
@pytest.mark.parametrize("noise", [(0.01, 0.03), (0.02, 0.01)])
def test_the_interaction_interval_covers_93_to_97_percent(shared, n, noise):
    y = crossed_runs(np.random.default_rng(10 * n + shared), n, shared, noise)
    est = interaction_many(y[:, 1, 1], y[:, 0, 1], y[:, 1, 0], y[:, 0, 0], shared)
    covered = np.mean((est["low"] <= 0.01) & (est["high"] >= 0.01))
    assert 0.93 <= covered <= 0.97, covered


@pytest.mark.parametrize("noise, band", [((0.01, 0.03), (0.93, 0.97)), ((0.02, 0.01), (0.95, 0.98)),
                                         ((0.02, 0.02), (0.96, 0.99))])  # fmt: skip
def test_unshared_seeds_at_two_per_level_cover_at_least_95_percent(noise, band):
    """Welch's interval on 2 + 2 paired differences over-covers where the levels' noise is within ~2.5x of each
    other (97.7% at equal noise: its degrees of freedom, between 1 and 2, are too few), and is in 93-97% beyond;
    docs/studies.md says so. Never under 95% here."""
    y = crossed_runs(np.random.default_rng(3), 2, False, noise)
    est = interaction_many(y[:, 1, 1], y[:, 0, 1], y[:, 1, 0], y[:, 0, 0], False)
    covered = np.mean((est["low"] <= 0.01) & (est["high"] >= 0.01))
    assert band[0] <= covered <= band[1], covered


@pytest.mark.parametrize("shared", [True, False])
def test_holm_holds_the_family_wise_error_of_the_interactions_at_5_percent(shared):
    # 4 norm types against one baseline at 2 levels: 4 interactions sharing the baseline's runs, none real
    y = crossed_runs(np.random.default_rng(7 + shared), 3, shared, (0.01, 0.02), norms=4, interaction=0.0)
    ps = np.stack(
        [interaction_many(y[:, k, 1], y[:, 0, 1], y[:, k, 0], y[:, 0, 0], shared)["p"] for k in range(1, 5)], axis=-1
    )
    unadjusted = np.mean((ps < 0.05).any(axis=-1))
    adjusted = np.mean((holm_many(ps) < 0.05).any(axis=-1))
    assert adjusted <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / REPS), adjusted
    assert unadjusted > 0.1  # four tests at 5% each: the family needs the adjustment


@pytest.mark.parametrize("shared", [True, False])
def test_the_vectorised_interaction_is_the_comparisons_own(shared):
    y = crossed_runs(np.random.default_rng(5), 4, shared, (0.01, 0.03))[:20]
    many = interaction_many(y[:, 1, 1], y[:, 0, 1], y[:, 1, 0], y[:, 0, 0], shared)
    for r in range(20):
        seeds = range(4) if shared else range(4, 8)  # unshared: the other level's seeds are others
        at_l = {(s, s): y[r, 1, 1, s] - y[r, 0, 1, s] for s in range(4)}
        at_ref = {(t, t): y[r, 1, 0, i] - y[r, 0, 0, i] for i, t in enumerate(seeds)}
        one = difference(at_l, at_ref)
        assert one["method"] == ("paired" if shared else "welch")
        for key in ("diff", "low", "high", "p"):
            assert many[key][r] == pytest.approx(one[key], rel=1e-12, abs=1e-15)
