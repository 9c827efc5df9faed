"""The effective speedup of a norm type over the baseline: how much more compute (or GPU time) the baseline would
need to reach the variant's test loss, as Marin defines it, ``ES = C_base(L_variant) / C_variant``, read from the
baseline's fitted loss-vs-cost curve. ES > 1: the variant gets there cheaper.

**The baseline's curve** is ``gpt.analysis.scaling``'s (``E + A * x^-alpha``, or the log-log line of L - E0) fitted
to the baseline's runs at several costs x: a **token ladder** (one size, the baseline trained to several fractions
of the token budget, each a complete run with its own schedule: ``sweep.py --token-fractions``) or the **size
ladder** (``--sizes``: one point per size). Its inverse at the variant's mean loss is the cost the baseline needs,
``x* = ref * ((L - E) / A)^(-1/alpha)``; where the variant's loss lies outside the losses the baseline's rungs
span, x* is an extrapolation and says so.

**Two costs.** Compute-matched: training FLOPs (``flops_per_token`` x tokens, the norms not counted, so at one size
the same for every norm type): what the norm changes in the function learned. Time-matched: seconds of the same
hardware, tokens / steady-state tokens/s: what it costs in kernel time besides. At one cost per token,
``ES_time = ES_compute x (tokens/s of the variant / tokens/s of the baseline)``.

**The interval** (the delta method, seed by seed, as the fits'): log ES is, to first order, a linear combination of
the baseline's per-rung mean losses (through the curve's sensitivity, implicit in x*), the variant's mean loss and,
time-matched, the mean of each seed's log throughput ratio; where every seed has every value, the combination is
taken seed by seed and gets a t interval over the seeds (``gpt.analysis.scaling.spread``), so the correlation of
one seed's runs (the same data order) is in it. tests/analysis/test_speedup_coverage.py simulates both routes with
2, 3 and 5 seeds.
"""

from __future__ import annotations

import math

import numpy as np

from gpt.analysis.scaling import fitted_scaled, spread
from gpt.analysis.stats import LEVEL, _t_interval_many


def speedup_many(
    x: np.ndarray,
    base: np.ndarray,
    x_variant: float,
    variant: np.ndarray,
    form: str = "power",
    *,
    irreducible: float = 0.0,
    log_ratio: np.ndarray | None = None,
    level: float = LEVEL,
) -> dict:
    """The effective speedup over D data sets: the baseline's losses ``base`` (D, K seeds, S rungs) at costs ``x``
    (S), the variant's ``variant`` (D, K) at cost ``x_variant``; ``log_ratio`` (D, K), time-matched: each seed's
    log(tokens/s of the variant / of the baseline), added to log ES. NaN where a value is missing. Returns ``log``
    (log ES with its interval), ``es``/``low``/``high`` (exp of them), ``needed`` (x*, the cost the baseline needs),
    ``inside`` (x* within the rungs' costs) and ``crosses`` (the variant's loss is above the curve's floor E)."""
    x, base, variant = np.asarray(x, float), np.asarray(base, float), np.asarray(variant, float)
    raw, ref, _ = fitted_scaled(x, base, form, irreducible)
    e, a, alpha, sens = raw["E"], raw["A"], raw["alpha"], raw["sensitivity"]
    target = np.nanmean(variant, 1)  # (D,)
    reducible = target - e
    crosses = reducible > 0
    with np.errstate(all="ignore"):
        log_z = -(np.log(reducible) - np.log(a)) / alpha  # f(z*) = target, f = E + A z^-alpha
        # d log z* / d(E, A, alpha): the implicit function's, -(df/dtheta) / (df/dlog z), df/dlog z = -alpha * r
        dtheta = np.stack([1 / (alpha * reducible), 1 / (alpha * a), -log_z / alpha], 1)  # (D, 3)
        c_base = np.einsum("di,dis->ds", dtheta, sens)  # (D, S)
        c_variant = -1 / (alpha * reducible)  # (D,)
    values, coefs = [base, variant[:, :, None]], [c_base, c_variant[:, None]]
    estimate = log_z + math.log(ref) - math.log(x_variant)
    if log_ratio is not None:
        log_ratio = np.asarray(log_ratio, float)
        values.append(log_ratio[:, :, None])
        coefs.append(np.ones((len(base), 1)))
        with np.errstate(all="ignore"):
            estimate = estimate + np.nanmean(log_ratio, 1)
    s = spread(np.concatenate(coefs, 1), np.concatenate(values, 2))
    log = {**_t_interval_many(estimate, s["se"], s["df"], level), "method": s["method"]}
    z = np.exp(log_z)
    scaled = x / ref
    with np.errstate(all="ignore"):
        return {
            "log": log,
            "es": np.exp(estimate),
            "low": np.exp(log["low"]),
            "high": np.exp(log["high"]),
            "needed": z * ref,
            "inside": crosses & (z >= scaled.min() * (1 - 1e-9)) & (z <= scaled.max() * (1 + 1e-9)),
            "crosses": crosses & ~raw["at_edge"],
        }
