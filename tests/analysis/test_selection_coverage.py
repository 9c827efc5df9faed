"""Choosing the learning rate on the same runs whose test losses are reported bends the interval; choosing on some
seeds and reporting on fresh ones (sweep.py --confirm-seeds) does not. Simulated with the selection rule of
``gpt.analysis.selection`` (per norm type, the rate with the lowest mean validation loss over its seeds) and the
paired interval of ``gpt.analysis.stats``, vectorised over 20,000 draws per design.

The model: a norm type's true loss is quadratic in log-lr (its own curvature and optimum); a run's validation
loss adds its seed's shared effect (the same for every norm type and rate: same init and data order) and a
run-level draw (sd per norm type); its test loss adds the same seed effect and a run-level draw correlated rho
with the validation one (a run's val and test losses are nearly the same draw: 0.981 measured on a real sweep)."""

import numpy as np
import pytest

from gpt.analysis import selection, stats
from gpt.analysis.selection import expected_max_normal

DRAWS = 20_000


def losses(rng, mu, sd, rho, seeds, seed_sd=0.01):
    """(val, test) of every run: arrays (draws, norm types, rates, seeds)."""
    draws, norms, rates = DRAWS, *mu.shape
    shared = seed_sd * rng.standard_normal((draws, 1, 1, seeds))  # a seed's effect, on every norm type and rate
    val_noise = rng.standard_normal((draws, norms, rates, seeds))
    test_noise = rho * val_noise + np.sqrt(1 - rho**2) * rng.standard_normal((draws, norms, rates, seeds))
    scale = sd[None, :, None, None]
    return mu[None, :, :, None] + shared + scale * val_noise, mu[None, :, :, None] + shared + scale * test_noise


def choose(val):
    """Each norm type's rate: the lowest mean validation loss over its seeds (argmin takes the lower rate on a
    tie, as select_rates does); (draws, norm types)."""
    return val.mean(axis=-1).argmin(axis=-1)


def at(values, chosen):
    """Each draw's runs at each norm type's chosen rate: (draws, norm types, seeds)."""
    return np.take_along_axis(values, chosen[:, :, None, None], axis=2)[:, :, 0, :]


def true_difference(mu, chosen):
    """B - A of the true losses at the rates chosen: what the interval is of."""
    return mu[1][chosen[:, 1]] - mu[0][chosen[:, 0]]


def design(rates, curvature, sd):
    """Two norm types, log-lr grid of ``rates`` points: A curved, B ``curvature`` x as curved (flatter: more rates
    near its best), both best at the middle of the grid; seed spreads ``sd`` (A, B)."""
    x = np.linspace(-1, 1, rates)
    mu = np.stack([3.3 + 0.02 * x**2, 3.3 + 0.02 * curvature * x**2])
    return mu, np.array(sd)


def coverage(rng, mu, sd, rho, n1, n2=None):
    """Coverage of the true difference at the chosen rates, how often the interval lies wholly below it (it
    favours B beyond its width: nominally 2.5%) and the mean error, choosing on n1 seeds; n2: report on n2 fresh
    seeds (two stages), else on the same."""
    val, test = losses(rng, mu, sd, rho, n1)
    chosen = choose(val)
    if n2 is not None:  # fresh seeds at the chosen rates: new draws, the choice already made
        _, test = losses(rng, mu, sd, rho, n2)
    reported = at(test, chosen)
    est = stats.difference_many(reported[:, 1], reported[:, 0])
    truth = true_difference(mu, chosen)
    covered = (est["low"] <= truth) & (truth <= est["high"])
    favours_b = est["high"] < truth
    return covered.mean(), favours_b.mean(), (est["mean"] - truth).mean()


# The worst designs of the review: one norm's seed noise 2-4x the other's, 6-8 rates, val/test correlation 0.99,
# and a flat B; plus the documented study (3 rates, 2 seeds to choose, 3 to report).
WORST = [
    (8, 0.0, (0.005, 0.02), 0.99, 2, 3),
    (6, 0.1, (0.005, 0.015), 0.99, 3, 3),
    (8, 0.0, (0.005, 0.01), 0.95, 5, 2),
    (3, 0.2, (0.01, 0.02), 0.98, 2, 3),
]


@pytest.mark.parametrize("rates,curvature,sd,rho,n1,n2", WORST)
def test_two_stage_intervals_cover_and_single_stage_ones_do_not(rates, curvature, sd, rho, n1, n2):
    rng = np.random.default_rng(rates * 1000 + n1 * 10 + n2)
    mu, sd = design(rates, curvature, sd)
    two_cover, two_false, two_bias = coverage(rng, mu, sd, rho, n1, n2)
    assert 0.93 <= two_cover <= 0.97, two_cover  # a 95% interval: the choice's luck is not in fresh seeds
    assert 0.015 <= two_false <= 0.035 and abs(two_bias) < 0.001, (two_false, two_bias)
    # the same seeds choose and report, all n1 + n2 of them at every rate (more runs than the two stages): the
    # flatter, noisier norm type is favoured (B's loss reads low), the interval misses on its side 2.5-4x as often
    one_cover, one_false, one_bias = coverage(rng, mu, sd, rho, n1 + n2)
    assert one_bias < -0.003, one_bias
    # what the report and docs/studies.md print (selection.SINGLE_STAGE_*), to the percent
    (low, high), (missed_low, missed_high) = selection.SINGLE_STAGE_COVERED, selection.SINGLE_STAGE_MISSED
    assert low - 0.5 <= 100 * one_cover < high + 0.5 and missed_low - 0.5 <= 100 * one_false < missed_high + 0.5


@pytest.mark.parametrize("rates,n", [(3, 2), (6, 3), (8, 5)])
def test_the_reported_optimism_is_the_simulated_bias(rates, n):
    """What the report prints as a chosen rate's optimism, rho * sd * E[max of K normals] / sqrt(n), is the bias
    of the chosen rate's test loss when all K rates are equally good (within 10%): so more seeds shrink it only as
    the standard error."""
    rng = np.random.default_rng(rates + n)
    sd, rho = 0.02, 0.98
    mu = np.full((2, rates), 3.3)
    val, test = losses(rng, mu, np.array([sd, sd]), rho, n, seed_sd=0.0)
    chosen_test = at(test, choose(val)).mean(axis=-1)  # each norm type's reported test loss
    bias = (chosen_test - 3.3).mean()
    predicted = rho * sd * expected_max_normal(rates) / np.sqrt(n)
    assert bias == pytest.approx(-predicted, rel=0.1)


# The optimism the single-stage report prints (gpt.analysis.selection.family_optimism): two norm types' families,
# each a curve over the rates (flat: every rate equally good; bowl: the edges 3 standard errors of a rate mean above
# the middle; one-best: one rate 6 above the rest), run noise sd, a seed effect shared by every rate and family
# (seed_sd x sd), val/test correlation rho. Its truth: rho * sd / sqrt(n) * selected_noise(curve), the expected
# amount by which the chosen rate's test loss reads low (checked against the simulated one below).
OPTIMISM_DRAWS = 600
LIMITS = ("lower", "upper")
CURVES = ("flat", "bowl", "one-best")


def curve(kind, rates, se):
    x = np.linspace(-1, 1, rates)
    if kind == "flat":
        return np.zeros(rates)
    if kind == "bowl":
        return 3 * se * x**2
    return np.where(np.arange(rates) == rates // 2, 0.0, 6 * se)


def optimism_draws(rng, kinds, sds, rates, n, rho, seed_sd, draws=OPTIMISM_DRAWS):
    """Per family: (the printed numbers over ``draws``, the truth, the simulated mean optimism)."""
    shared = seed_sd * rng.standard_normal((draws, 1, n))
    runs, resid = [], []
    for kind, sd in zip(kinds, sds, strict=True):
        mu = curve(kind, rates, sd / np.sqrt(n))[None, :, None]
        zv = rng.standard_normal((draws, rates, n))
        zt = rho * zv + np.sqrt(1 - rho**2) * rng.standard_normal((draws, rates, n))
        val, test = mu + sd * (shared + zv), mu + sd * (shared + zt)
        runs.append((mu[0, :, 0], sd, val, test))
        resid.append([selection._double_centred(m).reshape(draws, -1) for m in (val, test)])
    df = len(kinds) * (rates - 1) * (n - 1)
    rho_hat, rho_low = selection.correlation(*(np.concatenate(r, 1) for r in zip(*resid, strict=True)), df)
    out = []
    for mu, sd, val, test in runs:
        se = sd / np.sqrt(n)
        chosen = val.mean(-1).argmin(-1)
        simulated = (mu[chosen] - test.mean(-1)[np.arange(draws), chosen]).mean()
        truth = rho * se * selection.selected_noise(mu[None] / se)[0]
        out.append((selection.family_optimism(val, rho_hat, rho_low), truth, simulated))
    return out


# (curves, sds, rates, seeds, rho, seed effect): every curve pair, 3-8 rates, 2-5 seeds, rho 0.5-0.99, with and
# without a seed effect as large as the run noise, one family's noise equal to or 3x the other's
OPTIMISM_DESIGNS = [
    (("flat", "flat"), (0.01, 0.01), 3, 2, 0.99, 0.0),
    (("flat", "flat"), (0.01, 0.01), 3, 2, 0.99, 1.0),
    (("flat", "flat"), (0.01, 0.03), 8, 5, 0.5, 1.0),
    (("flat", "flat"), (0.02, 0.01), 5, 3, 0.9, 0.0),
    (("bowl", "flat"), (0.01, 0.01), 3, 2, 0.99, 1.0),
    (("bowl", "flat"), (0.01, 0.03), 8, 2, 0.99, 0.0),
    (("bowl", "flat"), (0.03, 0.01), 5, 5, 0.5, 1.0),
    (("one-best", "flat"), (0.01, 0.01), 3, 5, 0.99, 0.0),
    (("one-best", "flat"), (0.01, 0.03), 8, 3, 0.5, 1.0),
    (("one-best", "flat"), (0.005, 0.03), 8, 5, 0.99, 1.0),  # the flat, noisy family is much favoured
]


@pytest.fixture(scope="module")
def optimism_study():
    rng = np.random.default_rng(62)
    return [(d, optimism_draws(rng, *d)) for d in OPTIMISM_DESIGNS]


def test_the_truth_is_the_simulated_optimism(optimism_study):
    """The analytic expectation the other tests call the truth is what the simulated choice does (within 4 Monte
    Carlo standard errors of a draw's mean optimism)."""
    for d, families in optimism_study:
        for (_, truth, simulated), sd in zip(families, d[1], strict=True):
            assert abs(simulated - truth) < 4 * sd / np.sqrt(d[3]) / np.sqrt(OPTIMISM_DRAWS), (d, truth, simulated)


def test_at_most_bounds_the_optimism(optimism_study):
    """``upper`` ("at most") lies below the true optimism in at most 5% of draws in every design."""
    for d, families in optimism_study:
        for printed, truth, _ in families:
            assert (printed["upper"] < truth).mean() <= 0.05, d


def test_the_estimate_is_unbiased_on_flat_curves(optimism_study):
    """``bound`` ("about") is within 0.75-1.25 of the truth on average where the curve is flat (every rate
    equally good, where the choice's luck is largest), with or without the seed effect every rate shares."""
    checked = 0
    for d, families in optimism_study:
        for kind, (printed, truth, _) in zip(d[0], families, strict=True):
            if kind == "flat":
                assert 0.75 <= printed["bound"].mean() / truth <= 1.25, (d, printed["bound"].mean() / truth)
                checked += 1
    assert checked == 14


def test_the_direction_is_named_only_where_it_is_right(optimism_study):
    """The norm type the bias favours (``selection.direction``) is right in >= 95% of draws in every design where
    it is named; elsewhere the row says "direction unclear". (With these seeds it is hardly ever named: a curve
    whose rates lie several standard errors apart cannot be ruled out, and it makes the choice's luck small.)"""
    for d, ((a, truth_a, _), (b, truth_b, _)) in optimism_study:
        declared = [
            selection.direction("A", {k: a[k][i] for k in LIMITS}, "B", {k: b[k][i] for k in LIMITS})
            for i in range(OPTIMISM_DRAWS)
        ]
        right = "A" if truth_a > truth_b else "B"
        tie = abs(truth_a - truth_b) < 1e-9
        wrong = np.mean([x is not None and (tie or x != right) for x in declared])
        assert wrong <= 0.05, (d, wrong)
    ours, theirs = {"lower": 0.011, "upper": 0.03}, {"lower": 0.0, "upper": 0.01}  # separate: named
    assert selection.direction("A", ours, "B", theirs) == "A" and selection.direction("B", theirs, "A", ours) == "A"
    assert selection.direction("A", {"lower": 0.009, "upper": 0.03}, "B", theirs) is None  # they overlap


def test_the_docs_print_the_simulated_range():
    """docs/studies.md says the single-stage coverage the report says (one range, the one the simulation holds)."""
    from pathlib import Path

    (low, high), (missed_low, missed_high) = selection.SINGLE_STAGE_COVERED, selection.SINGLE_STAGE_MISSED
    text = " ".join((Path(__file__).parents[2] / "docs" / "studies.md").read_text().split())
    assert (
        f"single-stage interval covered {low}-{high}% and missed on the favoured side {missed_low}-{missed_high}%"
        in text
    )
