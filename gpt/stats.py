"""The numbers of a comparison: intervals, paired and unpaired differences, seeds needed, equivalence.

Intervals are two-sided, at ``LEVEL`` (95%), from Student's t distribution. A paired
statistic works on the differences ``d_i = loss(group, seed i) - loss(baseline, seed i)``
over the seeds both groups share: n pairs, mean d, sample standard deviation s, standard
error se = s / sqrt(n), n - 1 degrees of freedom. The current s stands in for the true
standard deviation wherever a future number of seeds is planned.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

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


def welch(xa: list[float], xb: list[float], level: float = LEVEL) -> dict:
    """Difference of means of two unpaired samples, with Welch's t interval."""
    diff = float(np.mean(xa) - np.mean(xb))
    out = {"method": "welch", "diff": diff, "low": math.nan, "high": math.nan, "n": min(len(xa), len(xb)),
           "sd": math.nan}
    if len(xa) < 2 or len(xb) < 2:
        return out
    va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    half = _t(0.5 + level / 2, df) * se
    return {**out, "low": diff - half, "high": diff + half}


def resolvable_difference(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float:
    """The smallest true mean difference that n pairs detect (two-sided test at ``level``) with
    probability ``power``: (t(1 - alpha/2, n-1) + t(power, n-1)) * sd / sqrt(n)."""
    if n < 2 or math.isnan(sd):
        return math.nan
    return (_t(0.5 + level / 2, n - 1) + _t(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(diff: float, sd: float, level: float = LEVEL, power: float = POWER,
                 max_seeds: int = MAX_SEEDS) -> int | None:
    """The fewest pairs (>= 2) whose resolvable difference is at most |diff|, given the spread sd;
    None when there is nothing to resolve (diff 0 or unknown) or more than ``max_seeds`` would do."""
    if math.isnan(diff) or math.isnan(sd) or diff == 0:
        return None
    for n in range(2, max_seeds + 1):
        if resolvable_difference(sd, n, level, power) <= abs(diff):
            return n
    return None


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
