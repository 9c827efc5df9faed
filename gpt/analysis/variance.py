"""Where seed-to-seed noise comes from: the variance components of a group whose initialisation and data-order
seeds are crossed (two-way random-effects ANOVA without replication), their intervals (exact for the rest, Ting et
al.'s modified large-sample interval for the others) and each one's share with its interval from generalized
pivotal quantities. The mean squares are ``gpt.analysis.stats``' (the crossed design's interval uses them too);
``variance_components_many`` takes many grids at once, for the simulations (tests/simulated.py)."""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from gpt.analysis import stats
from gpt.analysis.stats import LEVEL

SHARE_DRAWS = 20_000  # Monte Carlo draws of the generalized pivotal quantities behind the shares' intervals


def variance_components(losses: np.ndarray, level: float = LEVEL, draws: int = SHARE_DRAWS) -> dict:
    """Where seed-to-seed noise comes from, in a crossed design: ``losses[i, j]`` is the test loss of the run
    with initialisation seed i and data-order seed j (every pair once, at least 2 x 2).

    Two-way random-effects ANOVA without replication, ``y_ij = mu + a_i + b_j + e_ij``: from the mean squares
    (``stats.mean_squares``) the method-of-moments estimates ``var_init = (MS_init - MS_rest) / J``, ``var_data =
    (MS_data - MS_rest) / I`` and ``var_rest = MS_rest`` (a negative estimate is reported as 0). With one run
    per seed pair the rest is the interaction of weights and data order *and* any run-to-run nondeterminism
    (bf16, compile, atomics on a GPU are not bitwise deterministic): nothing tells the two apart. Intervals at
    ``level``: exact (chi-square) for the rest; for the two others, which are differences of mean squares, the
    modified large-sample interval of Ting, Burdick, Graybill, Jeyaratnam and Lu (1990), as given by Burdick
    and Graybill (1992, section 3.3), its lower end cut at 0. ``share`` is each estimate over their sum; its
    interval is from generalized pivotal quantities (Weerahandi 1993): each mean square's pivot ``SS_q /
    chi2(df_q)`` drawn ``draws`` times from a fixed seed, the components truncated at 0 as the estimates are.
    """
    many = variance_components_many(losses, level, draws)  # one grid: every number a 0-d array
    components = {
        name: {
            **{k: float(v) if isinstance(v, np.ndarray) else v for k, v in c.items() if k != "share_interval"},
            "share_interval": [float(q) for q in c["share_interval"]],
        }
        for name, c in many["components"].items()
    }
    return {
        **many,
        "mean": float(many["mean"]),
        "total_variance": float(many["total_variance"]),
        "components": components,
    }


def variance_components_many(losses, level: float = LEVEL, draws: int = SHARE_DRAWS) -> dict:
    """``variance_components`` of grids ``losses[..., i, j]``: the same keys, every number an array over the
    leading axes (a ``share_interval`` of shape ``[..., 2]``). ``draws`` 0 skips the shares' intervals (NaN), most
    of the time taken: for a simulation of the components' own intervals."""
    y = np.asarray(losses, dtype=float)
    m = stats.mean_squares_many(y)
    ms, df = m["ms"], m["df"]
    n_init, n_data = y.shape[-2:]
    alpha = (1 - level) / 2
    residual = (
        df["residual"] * ms["residual"] / float(scipy_stats.chi2.ppf(1 - alpha, df["residual"])),
        df["residual"] * ms["residual"] / float(scipy_stats.chi2.ppf(alpha, df["residual"])),
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
    total = sum(np.maximum(est, 0.0) for est, _ in parts.values())
    shares = _share_intervals_many(ms, df, n_init, n_data, alpha, draws)
    components = {}
    for name, (estimate, (low, high)) in parts.items():
        variance = np.maximum(estimate, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(total != 0, variance / total, np.nan)
        components[name] = {
            "variance": variance,
            "estimate": estimate,
            "sd": np.sqrt(variance),
            "low": np.maximum(low, 0.0),
            "high": np.maximum(high, 0.0),
            "share": share,
            "mean_square": ms[name],
            "df": df[name],
            "share_interval": shares[name],
        }
    return {
        "n_init": n_init,
        "n_data": n_data,
        "mean": m["grand"],
        "level": level,
        "total_variance": total,
        "components": components,
    }


def _share_intervals_many(ms: dict, df: dict, n_init: int, n_data: int, alpha: float, draws: int) -> dict:
    """``_share_intervals`` of many grids: the same chi-square draws for every grid, as each call of it draws them,
    the quantiles taken a block of grids at a time (a block's pivots held in memory, a few MB)."""
    shape = np.shape(ms["residual"])
    if draws == 0:
        return {k: np.full((*shape, 2), np.nan) for k in ms}
    rng = np.random.default_rng(0)
    chi = {k: rng.chisquare(df[k], draws) for k in ms}
    flat = {k: np.reshape(v, -1) for k, v in ms.items()}
    out = {k: np.empty((flat["residual"].size, 2)) for k in ms}
    block = max(1, 2**18 // draws)
    for start in range(0, flat["residual"].size, block):
        pivot = {k: flat[k][start : start + block, None] * df[k] / chi[k] for k in ms}
        parts = {
            "init": np.maximum(pivot["init"] - pivot["residual"], 0.0) / n_data,
            "data": np.maximum(pivot["data"] - pivot["residual"], 0.0) / n_init,
            "residual": pivot["residual"],
        }
        total = parts["init"] + parts["data"] + parts["residual"]
        for k, v in parts.items():
            out[k][start : start + block] = np.quantile(v / total, [alpha, 1 - alpha], axis=-1).T
    return {k: v.reshape(*shape, 2) for k, v in out.items()}


def _difference_interval(ms1, df1: int, ms2, df2: int, c: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The modified large-sample interval for ``c * (E[ms1] - E[ms2])`` of Ting et al. (1990), two-sided with
    ``alpha`` in each tail (Burdick and Graybill 1992, eq. 3.8 and 3.9), for mean squares ``ms1``, ``ms2`` (arrays
    over replicates, or numbers)."""
    g1, h1, g2, h2, g12, h12 = _ting_coefficients(df1, df2, alpha)
    estimate = c * (ms1 - ms2)
    low = estimate - c * np.sqrt(np.maximum(g1**2 * ms1**2 + h2**2 * ms2**2 + g12 * ms1 * ms2, 0.0))
    high = estimate + c * np.sqrt(np.maximum(h1**2 * ms1**2 + g2**2 * ms2**2 + h12 * ms1 * ms2, 0.0))
    return low, high


def _ting_coefficients(df1: int, df2: int, alpha: float) -> tuple[float, ...]:
    """``G1, H1, G2, H2, G12, H12`` of Ting et al.'s interval (``_difference_interval``): they depend on the
    degrees of freedom and ``alpha`` only."""

    def chi_f(q: float, df: int) -> float:  # the F(df, infinity) quantile
        return float(scipy_stats.chi2.ppf(q, df)) / df

    f_hi, f_lo = float(scipy_stats.f.ppf(1 - alpha, df1, df2)), float(scipy_stats.f.ppf(alpha, df1, df2))
    g1, h1 = 1 - 1 / chi_f(1 - alpha, df1), 1 / chi_f(alpha, df1) - 1
    g2, h2 = 1 - 1 / chi_f(1 - alpha, df2), 1 / chi_f(alpha, df2) - 1
    g12 = ((f_hi - 1) ** 2 - g1**2 * f_hi**2 - h2**2) / f_hi
    h12 = ((1 - f_lo) ** 2 - h1**2 * f_lo**2 - g2**2) / f_lo
    return g1, h1, g2, h2, g12, h12
