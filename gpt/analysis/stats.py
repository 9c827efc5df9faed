"""The numbers of a comparison: intervals by design, tests, equivalence, planning (the sources of noise, the
variance components of a crossed design, are ``gpt.analysis.variance``'s).

A comparison's numbers are means over seeds: a group's test loss, or its difference to the
baseline on the seeds both share. Which interval is right depends on how the seeds were laid
out, so every estimate starts from its *cells*, ``{(init seed, data seed): value}``, and the
design those cells form (``design``):

- **independent seeds**: no two cells share an initialisation or a data-order seed (the usual
  ``--seeds 0 1 2``): the values are independent, and the interval is Student's t on n - 1
  degrees of freedom (for differences: the paired t).
- **crossed seeds**: every init seed with every data seed, at least 2 x 2 (``--init-seeds A B
  --data-seeds X Y``). Cells that share a seed are correlated, so the cells are analysed with the
  two-way random-effects model ``y_ij = mu + a_i + b_j + e_ij`` (``crossed_mean``): the variance of
  the grand mean is ``var_a / I + var_b / J + var_e / (I J)``, estimated from the mean squares as
  ``(MS_init + MS_data - MS_rest) / (I J)`` with Satterthwaite's degrees of freedom, and never below
  the variance the cells would have if they were independent (their sample variance / (I J), on
  I J - 1 degrees of freedom), which is a lower bound of the true one in expectation.
- **init seeds at one data seed** (or data seeds at one init seed): the t interval over the cells
  is for that one data order (that one initialisation); the component of the seed held fixed is
  not sampled, and the report says so.
- an **incomplete** grid gets no interval: its missing cells are named.

With fewer than two shared seeds a difference is Welch's unpaired interval. Every interval is
two-sided at ``LEVEL`` and comes with the p-value of "no difference" (for several groups against
one baseline, ``holm`` adjusts them as a family). ``equivalence`` is TOST on the same estimate and
degrees of freedom. Planning is prospective (``plan``): the noise of one difference at a one-sided
``PLAN_CONFIDENCE`` upper confidence bound (Browne 1995; Graybill and Wang 1980 for a sum of mean
squares), the smallest difference the current seeds resolve at ``POWER``, and the independent
pairs needed to detect a difference the user names. Coverage, error rates and the family-wise
error are tested by simulation (``tests/simulated.py``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

LEVEL = 0.95  # confidence of every interval and test
POWER = 0.80  # chance that a planned number of seeds detects a true difference of the stated size
PLAN_CONFIDENCE = 0.80  # plans assume the noise at its one-sided 80% upper confidence bound (Browne 1995)
MAX_SEEDS = 10_000  # "pairs needed" beyond this is reported as more than this

INDEPENDENT = "independent seeds"
CROSSED = "crossed seeds"
ONE_DATA = "init seeds at one data seed"
ONE_INIT = "data seeds at one init seed"
INCOMPLETE = "incomplete grid"
UNPAIRED = "unpaired"
ASSUMES = {  # what each design's interval assumes, in the report's words
    INDEPENDENT: "each seed its own initial weights and data order: the values independent; t interval",
    CROSSED: (
        "every init seed with every data seed: two-way random-effects model (init, data, interaction and "
        "run-to-run nondeterminism); se from the mean squares, Satterthwaite degrees of freedom, never below "
        "the independent-cells se"
    ),
    ONE_DATA: "one data order for all: the interval holds for that data order; the data-order noise is not sampled",
    ONE_INIT: "one initialisation for all: the interval holds for those weights; the init noise is not sampled",
    INCOMPLETE: "the seeds share init or data seeds without forming a complete grid: no interval",
    UNPAIRED: "fewer than two seeds shared: Welch's interval, the two groups' runs independent, variances unequal",
}


def _t(q: float, df: float) -> float:
    """Student t's ``q`` quantile on ``df`` degrees of freedom (scipy.stats.t.ppf's own kernel, without its
    argument checks: the simulations call it a million times)."""
    return float(special.stdtrit(df, q))


def design(keys) -> str:
    """The design that cells keyed ``(init seed, data seed)`` form (see the module's docstring)."""
    keys = list(keys)
    inits, datas = {i for i, _ in keys}, {j for _, j in keys}
    if len(inits) == len(keys) and len(datas) == len(keys):
        return INDEPENDENT
    if len(datas) == 1:
        return ONE_DATA
    if len(inits) == 1:
        return ONE_INIT
    if len(inits) >= 2 and len(datas) >= 2 and len(keys) == len(inits) * len(datas):
        return CROSSED
    return INCOMPLETE


def _undefined(n: int, **extra) -> dict:
    return {
        "mean": math.nan,
        "se": math.nan,
        "df": math.nan,
        "low": math.nan,
        "high": math.nan,
        "p": math.nan,
        "n": n,
        "sd": math.nan,
        "no_spread": False,
        "terms": [],
        **extra,
    }


def t_interval(mean: float, se: float, df: float, level: float = LEVEL) -> dict:
    """``mean +- t(df) * se`` and the two-sided p of a true value 0. With se 0 (every value equal) there is no
    interval: a t interval of width 0 would claim certainty that a few equal values cannot give."""
    if se == 0:
        return {"mean": mean, "se": 0.0, "df": df, "low": math.nan, "high": math.nan, "p": math.nan, "no_spread": True}
    half = _t(0.5 + level / 2, df) * se
    p = float(2 * special.stdtr(df, -abs(mean) / se))
    return {"mean": mean, "se": se, "df": df, "low": mean - half, "high": mean + half, "p": p, "no_spread": False}


def as_grid(cells: dict) -> tuple[list, list, np.ndarray | None, list]:
    """Cells keyed ``(init seed, data seed)`` as a grid: its init seeds and data seeds (sorted), the values as an
    array ``[init, data]`` (None where a cell is missing) and the missing ``(init, data)`` cells."""
    inits, datas = sorted({i for i, _ in cells}), sorted({j for _, j in cells})
    missing = [(i, j) for i in inits for j in datas if (i, j) not in cells]
    values = None if missing else np.array([[cells[i, j] for j in datas] for i in inits], dtype=float)
    return inits, datas, values, missing


def mean_of(cells: dict, level: float = LEVEL) -> dict:
    """The mean of ``cells`` (``{(init seed, data seed): value}``) with its interval, by their design.

    Keys of the result: ``mean``, ``se``, ``df``, ``low``/``high`` (the interval), ``p`` (of a true mean 0),
    ``n`` (cells), ``sd`` (the estimated standard deviation of one value from independent seeds), ``design``,
    ``no_spread``, ``terms`` (one value's variance as ``[coefficient, mean square, df]`` terms, for ``plan``);
    crossed designs add their grid and mean squares, incomplete ones the ``missing`` cells.
    """
    kind = design(cells)
    n = len(cells)
    if kind == CROSSED:
        inits, datas, values, _ = as_grid(cells)
        return {**crossed_mean(values, level), "design": kind, "init_seeds": inits, "data_seeds": datas}
    if kind == INCOMPLETE:
        return {**_undefined(n), "design": kind, "missing": as_grid(cells)[3]}
    values = np.array(list(cells.values()), dtype=float)
    if n < 2:
        return {**_undefined(n), "mean": float(values.mean()) if n else math.nan, "design": kind}
    sd = float(values.std(ddof=1))
    out = t_interval(float(values.mean()), sd / math.sqrt(n), n - 1, level)
    return {**out, "n": n, "sd": sd, "design": kind, "terms": [[1.0, sd**2, n - 1]]}


def mean_squares(y: np.ndarray) -> dict:
    """The two-way ANOVA without replication of ``y[i, j]`` (init seed i, data seed j): mean squares and
    degrees of freedom of the rows (init), the columns (data) and the rest (``mean_squares_many`` of one grid)."""
    m = mean_squares_many(np.asarray(y, dtype=float))
    return {"grand": float(m["grand"]), "ms": {k: float(v) for k, v in m["ms"].items()}, "df": m["df"]}


def crossed_mean(y: np.ndarray, level: float = LEVEL) -> dict:
    """The grand mean of a crossed grid ``y[i, j]`` with its interval under the two-way random-effects model.

    ``I J var(mean) = E[MS_init] + E[MS_data] - E[MS_rest]``; its unbiased estimate ``V = MS_init + MS_data -
    MS_rest`` takes Satterthwaite's degrees of freedom. V can fall below, even under, zero when the seed
    components are small; the variance of the mean is never below what independent cells would give (the
    cells' sample variance S2 has expectation ``var_e + (I - 1) J / (IJ - 1) var_a + ...`` <= I J var(mean)),
    so where V < S2 the interval is the independent-cells one (S2, I J - 1 df; ``floored``). Simulated
    coverage: ``tests/simulated.py``.
    """
    y = np.asarray(y, dtype=float)
    m = mean_squares(y)
    ms, df = m["ms"], m["df"]
    n_init, n_data = y.shape
    cells = n_init * n_data
    satterthwaite = ms["init"] + ms["data"] - ms["residual"]
    independent = float(y.var(ddof=1))
    floored = not satterthwaite > independent
    if floored:
        variance, dof = independent, float(cells - 1)
    else:
        dof = satterthwaite**2 / (
            ms["init"] ** 2 / df["init"] + ms["data"] ** 2 / df["data"] + ms["residual"] ** 2 / df["residual"]
        )
        variance = satterthwaite
    out = t_interval(m["grand"], math.sqrt(variance / cells), dof, level)
    # one difference from independent seeds varies by var_a + var_b + var_e = a positive sum of mean squares
    terms = [
        [1 / n_data, ms["init"], df["init"]],
        [1 / n_init, ms["data"], df["data"]],
        [1 - 1 / n_init - 1 / n_data, ms["residual"], df["residual"]],
    ]
    one = sum(c * s for c, s, _ in terms)
    return {
        **out,
        "n": cells,
        "sd": math.sqrt(max(one, 0.0)),
        "terms": terms,
        "floored": floored,
        "mean_squares": ms,
        "ms_df": df,
    }


def difference(a: dict, b: dict, level: float = LEVEL) -> dict:
    """``a - b`` for two groups' cells (``{(init, data): value}``): paired on the cells both have when there
    are at least two (or when an unpaired interval is impossible anyway), by the design those cells form;
    otherwise Welch's unpaired interval over all their cells. ``diff`` is the estimate; ``unpaired`` the
    cells only one of them has."""
    if not a or not b:
        return {**_undefined(0), "diff": math.nan, "method": None, "design": None, "unpaired": []}
    shared = sorted(set(a) & set(b))
    unpaired = sorted(set(a) ^ set(b))
    if len(shared) >= 2 or (shared and min(len(a), len(b)) < 2):
        est = mean_of({k: a[k] - b[k] for k in shared}, level)
        method = "crossed" if est["design"] == CROSSED else "paired"
    else:
        est, method = welch(list(a.values()), list(b.values()), level), "welch"
    return {**est, "diff": est["mean"], "method": method, "unpaired": unpaired}


def welch(xa: list[float], xb: list[float], level: float = LEVEL) -> dict:
    """Difference of means of two unpaired samples, with Welch's t interval."""
    diff = float(np.mean(xa) - np.mean(xb))
    if len(xa) < 2 or len(xb) < 2:
        return {**_undefined(min(len(xa), len(xb))), "mean": diff, "design": UNPAIRED}
    va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    return {**_undefined(min(len(xa), len(xb))), **t_interval(diff, se, df, level), "design": UNPAIRED}


def mcnemar(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p for paired right/wrong answers of two models: of the items exactly one got
    right, ``only_a`` went to the first and ``only_b`` to the second; under no difference each is a fair coin."""
    n = only_a + only_b
    return 1.0 if n == 0 else float(stats.binomtest(only_a, n, 0.5).pvalue)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (NaN: not a member): the adjusted p of the k-th
    smallest of m is max over j <= k of min(1, (m - j + 1) p_(j)). Rejecting where the adjusted p < alpha
    keeps the chance of any false rejection in the family <= alpha, whatever their dependence."""
    members = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m, out, running = len(members), [math.nan] * len(ps), 0.0
    for rank, (p, i) in enumerate(members):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def equivalence(est: dict, margin: float, level: float = LEVEL) -> dict:
    """Two one-sided t tests (TOST) of |true difference| < margin, on an estimate's diff, se and df.

    ``p`` is the larger of the two one-sided p-values; the groups count as equivalent within +-margin when
    p < 1 - level, that is when the (2 * level - 1) interval lies inside +-margin. No spread, no test."""
    diff, se, df = est.get("diff", est.get("mean")), est["se"], est["df"]
    if math.isnan(se) or se == 0:
        return {"margin": margin, "p": math.nan, "equivalent": None, "no_spread": se == 0}
    p_lower = float(stats.t.sf((diff + margin) / se, df))  # H0: true difference <= -margin
    p_upper = float(stats.t.cdf((diff - margin) / se, df))  # H0: true difference >= +margin
    p = max(p_lower, p_upper)
    return {"margin": margin, "p": p, "equivalent": p < 1 - level, "no_spread": False}


def power(delta: float, se: float, df: float, level: float = LEVEL) -> float:
    """The probability that the two-sided t test at ``level`` (``df`` degrees of freedom, standard error ``se``)
    rejects "no difference" when the truth is ``delta``: exact, from the noncentral t distribution of the
    statistic (noncentrality delta / se)."""
    if math.isnan(delta) or math.isnan(se) or math.isnan(df):
        return math.nan
    if se == 0:
        return 1.0 if delta != 0 else 1 - level
    critical, ncp = _t(0.5 + level / 2, df), abs(delta) / se
    # P(T > c) + P(T < -c); the lower tail as the upper tail of -T, where scipy stays finite
    return float(stats.nct.sf(critical, df, ncp) + stats.nct.sf(critical, df, -ncp))


def resolvable_difference(se: float, df: float, level: float = LEVEL, target: float = POWER) -> float:
    """The smallest true difference that a t test with this ``se`` and ``df`` detects with probability
    ``target``: the root of ``power(delta, se, df) = target``."""
    if math.isnan(se) or math.isnan(df):
        return math.nan
    if se == 0:
        return 0.0
    high = (_t(0.5 + level / 2, df) + _t(target, df)) * se  # the central-t shortcut, a start
    while power(high, se, df, level) < target:  # the shortcut falls short: widen until the power is reached
        high *= 2
    return float(optimize.brentq(lambda d: power(d, se, df, level) - target, 0.0, high, xtol=1e-15, rtol=1e-12))


def pairs_needed(
    delta: float, sd: float, level: float = LEVEL, target: float = POWER, max_seeds: int = MAX_SEEDS
) -> int | None:
    """The fewest independent pairs (>= 2) whose paired t test detects a true difference ``delta`` with
    probability ``target`` when one difference varies with standard deviation ``sd``; None when delta is 0
    or unknown, or when more than ``max_seeds`` would be needed. The power grows with n, so this bisects."""
    if math.isnan(delta) or math.isnan(sd) or delta == 0:
        return None

    def enough(n: int) -> bool:
        return power(delta, sd / math.sqrt(n), n - 1, level) >= target

    if not enough(max_seeds):
        return None
    low, high = 1, 2  # enough(low) is False (one pair tests nothing), enough(high) decides
    while not enough(high):
        low, high = high, min(2 * high, max_seeds)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def upper_variance(terms: list, confidence: float = PLAN_CONFIDENCE) -> float:
    """A one-sided upper confidence bound for a variance ``sum c_q E[S_q]`` (every c_q >= 0) from mean squares
    ``S_q`` on ``df_q`` degrees of freedom (``terms``: ``[c_q, S_q, df_q]``): Graybill and Wang's (1980)
    modified large-sample bound ``sum c_q S_q + sqrt(sum (H_q c_q S_q)^2)``, ``H_q = df_q / chi2(1 - confidence;
    df_q) - 1``; with one term it is the exact chi-square bound."""
    if not terms:
        return math.nan
    point = sum(c * s for c, s, _ in terms)
    spread = sum(((d / float(stats.chi2.ppf(1 - confidence, d)) - 1) * c * s) ** 2 for c, s, d in terms if c > 0)
    return point + math.sqrt(spread)


def seeds_needed(est: dict, detect: float | None, level: float = LEVEL, target: float = POWER) -> dict:
    """A prospective plan from an estimate (``mean_of`` / ``difference``): the standard deviation of one
    difference from independent seeds at its ``PLAN_CONFIDENCE`` upper bound (``sd_upper``), the smallest
    difference the current seeds resolve with ``target`` power with the estimate's se at that bound
    (``resolvable``; the se bound from the chi-square on the estimate's df), and the independent pairs needed to
    detect ``detect`` (``pairs_needed``; independent seeds: the fewest runs for a mean difference). None where
    the estimate has no se; ``no_spread`` where every difference was equal."""
    if est.get("no_spread"):
        return {"no_spread": True, "sd_upper": 0.0, "resolvable": math.nan, "pairs_needed": None, "detect": detect}
    if math.isnan(est.get("se", math.nan)) or not est.get("terms"):
        return {
            "no_spread": False,
            "sd_upper": math.nan,
            "resolvable": math.nan,
            "pairs_needed": None,
            "detect": detect,
        }
    sd_upper = math.sqrt(upper_variance(est["terms"]))
    se_upper = est["se"] * math.sqrt(est["df"] / float(stats.chi2.ppf(1 - PLAN_CONFIDENCE, est["df"])))
    return {
        "no_spread": False,
        "sd_upper": sd_upper,
        "resolvable": resolvable_difference(se_upper, est["df"], level, target),
        "pairs_needed": pairs_needed(detect, sd_upper, level, target) if detect is not None else None,
        "detect": detect,
    }


# ---------------------------------------------------------- many replicates at once, for the simulations
#
# The functions above take one comparison's cells; the simulations (tests/simulated.py) draw tens of thousands of
# replicates of one design. The ``*_many`` functions take them as one array, the replicates along the leading
# axes, and give what their namesakes give, each number an array over the replicates: the same formulas, each
# quantile computed once per degrees of freedom. tests/analysis/test_intervals.py checks them against their
# namesakes replicate by replicate.


def _t_many(q: float, df: np.ndarray) -> np.ndarray:
    """``_t(q, df)`` for an array of degrees of freedom, computed once for each distinct one."""
    distinct, where = np.unique(df, return_inverse=True)
    return special.stdtrit(distinct, q)[where].reshape(np.shape(df))


def _t_interval_many(mean: np.ndarray, se: np.ndarray, df: np.ndarray, level: float) -> dict:
    """``t_interval`` over arrays: no interval and no p (NaN) where se is 0."""
    no_spread = se == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        half = _t_many(0.5 + level / 2, df) * se
        p = 2 * special.stdtr(df, -np.abs(mean) / se)
    low, high = np.where(no_spread, np.nan, mean - half), np.where(no_spread, np.nan, mean + half)
    p = np.where(no_spread, np.nan, p)
    return {"mean": mean, "se": se, "df": df, "low": low, "high": high, "p": p, "no_spread": no_spread}


def mean_of_many(values, level: float = LEVEL, crossed: bool = False) -> dict:
    """``mean_of`` for many replicates of one complete design: ``values[..., n]`` the n >= 2 cells of independent
    seeds (a t interval on n - 1 df), or with ``crossed`` ``values[..., I, J]`` crossed grids (``crossed_mean``,
    with its ``floored``). Keys: ``mean``, ``se``, ``df``, ``low``, ``high``, ``p``, ``no_spread`` and ``sd``,
    arrays over the leading axes; ``n``, the cells of one replicate."""
    y = np.asarray(values, dtype=float)
    if crossed:
        return crossed_mean_many(y, level)
    n = y.shape[-1]
    if n < 2:
        raise ValueError(f"a mean with an interval needs at least 2 cells, got {n}")
    sd = y.std(axis=-1, ddof=1)
    out = _t_interval_many(y.mean(axis=-1), sd / math.sqrt(n), np.full(sd.shape, float(n - 1)), level)
    return {**out, "n": n, "sd": sd}


def mean_squares_many(y: np.ndarray) -> dict:
    """``mean_squares`` of grids ``y[..., i, j]``: the grand means and mean squares as arrays."""
    n_init, n_data = y.shape[-2:]
    if n_init < 2 or n_data < 2:
        raise ValueError(f"a crossed design needs at least 2 x 2 runs, got {n_init} x {n_data}")
    grand, rows, cols = y.mean(axis=(-2, -1)), y.mean(axis=-1), y.mean(axis=-2)
    df = {"init": n_init - 1, "data": n_data - 1, "residual": (n_init - 1) * (n_data - 1)}
    rest = y - rows[..., :, None] - cols[..., None, :] + grand[..., None, None]
    ms = {
        "init": n_data * ((rows - grand[..., None]) ** 2).sum(axis=-1) / df["init"],
        "data": n_init * ((cols - grand[..., None]) ** 2).sum(axis=-1) / df["data"],
        "residual": (rest**2).sum(axis=(-2, -1)) / df["residual"],
    }
    return {"grand": grand, "ms": ms, "df": df}


def crossed_mean_many(y: np.ndarray, level: float = LEVEL) -> dict:
    """``crossed_mean`` of grids ``y[..., i, j]`` (the interval, its ``floored``, ``sd``; not the plan's terms)."""
    y = np.asarray(y, dtype=float)
    m = mean_squares_many(y)
    ms, df = m["ms"], m["df"]
    n_init, n_data = y.shape[-2:]
    cells = n_init * n_data
    satterthwaite = ms["init"] + ms["data"] - ms["residual"]
    independent = y.reshape(*y.shape[:-2], cells).var(axis=-1, ddof=1)
    floored = ~(satterthwaite > independent)
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = satterthwaite**2 / (
            ms["init"] ** 2 / df["init"] + ms["data"] ** 2 / df["data"] + ms["residual"] ** 2 / df["residual"]
        )
    dof = np.where(floored, float(cells - 1), dof)
    variance = np.where(floored, independent, satterthwaite)
    out = _t_interval_many(m["grand"], np.sqrt(variance / cells), dof, level)
    one = 1 / n_data * ms["init"] + 1 / n_init * ms["data"] + (1 - 1 / n_init - 1 / n_data) * ms["residual"]
    return {**out, "n": cells, "sd": np.sqrt(np.maximum(one, 0.0)), "floored": floored}


def difference_many(a, b, level: float = LEVEL, crossed: bool = False) -> dict:
    """``difference`` of replicates whose two groups share every cell (the paired and crossed designs): ``a`` and
    ``b`` broadcast to ``[..., n]`` (seed k of one with seed k of the other) or, ``crossed``, to ``[..., I, J]``;
    ``mean_of_many`` of ``a - b``, with ``diff``."""
    est = mean_of_many(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), level, crossed)
    return {**est, "diff": est["mean"], "method": "crossed" if crossed else "paired"}


def welch_many(a, b, level: float = LEVEL) -> dict:
    """``welch`` of many replicates: ``a[..., na]`` and ``b[..., nb]`` two unpaired samples each (na, nb >= 2).
    Keys: ``diff``, ``se``, ``df``, ``low``, ``high``, ``p``, arrays over the leading axes."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1) / na, b.var(axis=-1, ddof=1) / nb
    se = np.sqrt(va + vb)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(se > 0, (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1)), 1.0)
    out = _t_interval_many(a.mean(axis=-1) - b.mean(axis=-1), se, df, level)
    return {**out, "diff": out["mean"]}


def equivalence_many(est: dict, margin: float, level: float = LEVEL) -> dict:
    """``equivalence`` (TOST) of ``difference_many``'s estimates: ``p`` (NaN where there is no spread) and
    ``equivalent`` (False there, where ``equivalence`` says None)."""
    diff, se, df = est["diff"], est["se"], est["df"]
    with np.errstate(divide="ignore", invalid="ignore"):
        p_lower = special.stdtr(df, -(diff + margin) / se)  # H0: true difference <= -margin
        p_upper = special.stdtr(df, (diff - margin) / se)  # H0: true difference >= +margin
    p = np.where(np.isnan(se) | (se == 0), np.nan, np.maximum(p_lower, p_upper))
    return {"margin": margin, "p": p, "equivalent": p < 1 - level, "no_spread": se == 0}


def holm_many(ps) -> np.ndarray:
    """``holm`` of many families at once, one a row of ``ps[..., m]`` (NaN: not a member)."""
    ps = np.asarray(ps, dtype=float)
    order = np.argsort(ps, axis=-1, kind="stable")  # NaN last; equal p-values in their order, as sorted() has them
    ranked = np.take_along_axis(ps, order, axis=-1)
    members = (~np.isnan(ps)).sum(axis=-1, keepdims=True)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (members - np.arange(ps.shape[-1])) * ranked), axis=-1)
    out = np.empty_like(ps)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out


def mcnemar_many(only_a, only_b) -> np.ndarray:
    """``mcnemar`` of arrays of counts: binomtest's two-sided p for a fair coin, whose terms of the other tail are
    those at or beyond the mirror image of the smaller count."""
    only_a, only_b = np.asarray(only_a), np.asarray(only_b)
    n, fewer = only_a + only_b, np.minimum(only_a, only_b)
    with np.errstate(invalid="ignore"):
        p = stats.binom.cdf(fewer, n, 0.5) + stats.binom.sf(n - fewer - 1, n, 0.5)
    return np.where(only_a == only_b, 1.0, np.minimum(1.0, p))
