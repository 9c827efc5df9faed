"""The numbers of a comparison: intervals, paired and unpaired differences, seeds needed, equivalence.

Intervals are two-sided, at ``LEVEL`` (95%), from Student's t distribution. A paired
statistic works on the differences ``d_i = loss(group, seed i) - loss(baseline, seed i)``
over the seeds both groups share: n pairs, mean d, sample standard deviation s, standard
error se = s / sqrt(n), n - 1 degrees of freedom. The current s stands in for the true
standard deviation wherever a future number of seeds is planned, and the power of the paired
t test is computed exactly from the noncentral t distribution (not the central-t shortcut
``(t(1 - alpha/2) + t(power)) * s / sqrt(n)``, which overstates the power at small n).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95  # confidence of every interval and test
POWER = 0.80  # chance that a planned number of seeds resolves a true difference of the stated size
MAX_SEEDS = 10_000  # "seeds needed" beyond this is reported as more than this


def _t(q: float, df: float) -> float:
    return float(stats.t.ppf(q, df))


def mean_interval(xs: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, sample standard deviation, half-width of the t interval); nan where n < 2."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(np.mean(xs))
    if n < 2:
        return mean, math.nan, math.nan
    sd = float(np.std(xs, ddof=1))
    return mean, sd, _t(0.5 + level / 2, n - 1) * sd / math.sqrt(n)


def paired(diffs: list[float], level: float = LEVEL) -> dict:
    """Mean paired difference with its t interval, and the standard deviation of the differences."""
    mean, sd, half = mean_interval(diffs, level)
    return {"method": "paired", "diff": mean, "low": mean - half, "high": mean + half, "n": len(diffs), "sd": sd}


def mcnemar(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p for paired right/wrong answers: of the items exactly one of two models got
    right, ``only_a`` went to the first and ``only_b`` to the second; under no difference each is a fair coin."""
    n = only_a + only_b
    return 1.0 if n == 0 else float(stats.binomtest(only_a, n, 0.5).pvalue)


def welch(xa: list[float], xb: list[float], level: float = LEVEL) -> dict:
    """Difference of means of two unpaired samples, with Welch's t interval."""
    diff = float(np.mean(xa) - np.mean(xb))
    out = {
        "method": "welch",
        "diff": diff,
        "low": math.nan,
        "high": math.nan,
        "n": min(len(xa), len(xb)),
        "sd": math.nan,
    }
    if len(xa) < 2 or len(xb) < 2:
        return out
    va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    half = _t(0.5 + level / 2, df) * se
    return {**out, "low": diff - half, "high": diff + half}


def power(diff: float, sd: float, n: int, level: float = LEVEL) -> float:
    """The probability that the two-sided paired t test at ``level`` rejects "no difference" with n pairs
    when the true mean difference is ``diff`` and the differences' standard deviation ``sd``: exact, from
    the noncentral t distribution of the test statistic (df n - 1, noncentrality diff * sqrt(n) / sd)."""
    if n < 2 or math.isnan(diff) or math.isnan(sd):
        return math.nan
    if sd == 0:  # no spread: any difference is certain, none is never found
        return 1.0 if diff != 0 else 1 - level
    df, critical = n - 1, _t(0.5 + level / 2, n - 1)
    ncp = abs(diff) * math.sqrt(n) / sd
    # P(T > c) + P(T < -c); the lower tail as the upper tail of -T, where scipy stays finite
    return float(stats.nct.sf(critical, df, ncp) + stats.nct.sf(critical, df, -ncp))


def resolvable_difference(sd: float, n: int, level: float = LEVEL, target: float = POWER) -> float:
    """The smallest true mean difference that n pairs detect (two-sided paired t test at ``level``) with
    probability ``target``: the root of ``power(delta, sd, n) = target`` (exact, noncentral t)."""
    if n < 2 or math.isnan(sd):
        return math.nan
    if sd == 0:
        return 0.0
    high = (_t(0.5 + level / 2, n - 1) + _t(target, n - 1)) * sd / math.sqrt(n)  # the central-t shortcut
    while power(high, sd, n, level) < target:  # the shortcut falls short: widen until the power is reached
        high *= 2
    return float(optimize.brentq(lambda delta: power(delta, sd, n, level) - target, 0.0, high, xtol=1e-15, rtol=1e-12))


def seeds_needed(
    diff: float, sd: float, level: float = LEVEL, target: float = POWER, max_seeds: int = MAX_SEEDS
) -> int | None:
    """The fewest pairs (>= 2) with which the paired t test finds a true difference ``diff`` with probability
    ``target`` (the spread sd taken as the truth); None when there is nothing to resolve (diff 0 or unknown)
    or more than ``max_seeds`` would be needed. The power grows with n, so this bisects."""
    if math.isnan(diff) or math.isnan(sd) or diff == 0:
        return None
    if power(diff, sd, max_seeds, level) < target:
        return None
    low, high = 1, 2  # power(low) < target <= power(high), with power(1) taken as 0
    while power(diff, sd, high, level) < target:
        low, high = high, min(2 * high, max_seeds)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(diff, sd, mid, level) >= target else (mid, high)
    return high


def equivalence(diffs: list[float], margin: float, level: float = LEVEL) -> dict:
    """Two one-sided t tests (TOST) of |true mean difference| < margin on paired differences.

    ``p`` is the larger of the two one-sided p-values; the groups count as equivalent within
    +-margin when p < 1 - level, that is when the (2 * level - 1) interval lies inside +-margin.
    """
    n = len(diffs)
    if n < 2:
        return {"margin": margin, "p": math.nan, "equivalent": None}
    mean, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    se = sd / math.sqrt(n)
    if se == 0:  # no spread: the observed difference is the answer
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p_lower = float(stats.t.sf((mean + margin) / se, n - 1))  # H0: true difference <= -margin
        p_upper = float(stats.t.cdf((mean - margin) / se, n - 1))  # H0: true difference >= +margin
        p = max(p_lower, p_upper)
    return {"margin": margin, "p": p, "equivalent": p < 1 - level}


def variance_components(losses: np.ndarray, level: float = LEVEL) -> dict:
    """Where seed-to-seed noise comes from, in a crossed design: ``losses[i, j]`` is the test loss of
    the run with initialisation seed i and data-order seed j (every pair once, at least 2 x 2).

    Two-way random-effects ANOVA without replication, ``y_ij = mu + a_i + b_j + e_ij``: the
    mean squares of the rows (MS_init, I - 1 df), the columns (MS_data, J - 1 df) and the
    residual (MS_res, (I - 1)(J - 1) df) give the method-of-moments estimates
    ``var_init = (MS_init - MS_res) / J``, ``var_data = (MS_data - MS_res) / I`` and
    ``var_res = MS_res`` (a negative estimate is reported as 0). The residual holds the
    interaction of weights and data order: with a deterministic loop one (init, data) pair
    gives one loss, so nothing else is left. Intervals at ``level``: exact (chi-square)
    for the residual; for the two others the modified large-sample interval of Graybill
    and Wang (Burdick and Graybill 1992, section 3.2) on a difference of mean squares,
    with the lower end cut at 0. ``share`` is each estimate over their sum.
    """
    y = np.asarray(losses, dtype=float)
    n_init, n_data = y.shape
    if n_init < 2 or n_data < 2:
        raise ValueError(f"a crossed design needs at least 2 x 2 runs, got {n_init} x {n_data}")
    grand, rows, cols = y.mean(), y.mean(axis=1), y.mean(axis=0)
    df = {"init": n_init - 1, "data": n_data - 1, "residual": (n_init - 1) * (n_data - 1)}
    ms = {
        "init": n_data * float(((rows - grand) ** 2).sum()) / df["init"],
        "data": n_init * float(((cols - grand) ** 2).sum()) / df["data"],
        "residual": float(((y - rows[:, None] - cols[None, :] + grand) ** 2).sum()) / df["residual"],
    }
    alpha = (1 - level) / 2
    residual = (
        df["residual"] * ms["residual"] / float(stats.chi2.ppf(1 - alpha, df["residual"])),
        df["residual"] * ms["residual"] / float(stats.chi2.ppf(alpha, df["residual"])),
    )
    parts = {
        "init": (
            (ms["init"] - ms["residual"]) / n_data,
            _difference_interval(ms["init"], df["init"], ms["residual"], df["residual"], 1 / n_data, alpha),
        ),
        "data": (
            (ms["data"] - ms["residual"]) / n_init,
            _difference_interval(ms["data"], df["data"], ms["residual"], df["residual"], 1 / n_init, alpha),
        ),
        "residual": (ms["residual"], residual),
    }
    total = sum(max(est, 0.0) for est, _ in parts.values())
    components = {name: _component(est, interval, total, ms[name], df[name]) for name, (est, interval) in parts.items()}
    return {
        "n_init": n_init,
        "n_data": n_data,
        "mean": float(grand),
        "level": level,
        "total_variance": total,
        "components": components,
    }


def _component(estimate: float, interval: tuple[float, float], total: float, mean_square: float, df: int) -> dict:
    """One variance component as reported: a negative estimate (and interval end) read as 0."""
    variance = max(estimate, 0.0)
    return {
        "variance": variance,
        "estimate": estimate,
        "sd": math.sqrt(variance),
        "low": max(interval[0], 0.0),
        "high": max(interval[1], 0.0),
        "share": variance / total if total else math.nan,
        "mean_square": mean_square,
        "df": df,
    }


def _difference_interval(ms1: float, df1: int, ms2: float, df2: int, c: float, alpha: float) -> tuple[float, float]:
    """Graybill and Wang's modified large-sample interval for ``c * (E[ms1] - E[ms2])``, two-sided with
    ``alpha`` in each tail (Burdick and Graybill 1992, eq. 3.8 and 3.9)."""

    def chi_f(q: float, df: int) -> float:  # the F(df, infinity) quantile
        return float(stats.chi2.ppf(q, df)) / df

    f_hi, f_lo = float(stats.f.ppf(1 - alpha, df1, df2)), float(stats.f.ppf(alpha, df1, df2))
    g1, h1 = 1 - 1 / chi_f(1 - alpha, df1), 1 / chi_f(alpha, df1) - 1
    g2, h2 = 1 - 1 / chi_f(1 - alpha, df2), 1 / chi_f(alpha, df2) - 1
    g12 = ((f_hi - 1) ** 2 - g1**2 * f_hi**2 - h2**2) / f_hi
    h12 = ((1 - f_lo) ** 2 - h1**2 * f_lo**2 - g2**2) / f_lo
    estimate = c * (ms1 - ms2)
    low = estimate - c * math.sqrt(max(g1**2 * ms1**2 + h2**2 * ms2**2 + g12 * ms1 * ms2, 0.0))
    high = estimate + c * math.sqrt(max(h1**2 * ms1**2 + g2**2 * ms2**2 + h12 * ms1 * ms2, 0.0))
    return low, high
