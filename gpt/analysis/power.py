"""A study's power before it runs: what its seeds can detect, at the noise of an earlier comparison or a
stated default.

Each question a sweep asks is a t test over independent seeds, so its power is the noncentral t's
(``gpt.analysis.stats.power``):

- **the difference at one size** (``stats.difference``, paired by seed): K seeds give K paired differences of
  standard deviation ``sd``; se = sd / sqrt(K) on K - 1 df;
- **the gap's trend across sizes** (``gpt.analysis.scaling.trend_many``, seed by seed): each seed's slope of its
  paired difference against log10 N is ``sum_s w_s d_s`` with ``w = (x - mean x) / sum (x - mean x)^2``, so with
  independent sizes its standard deviation is ``sd * sqrt(sum w^2)`` and the mean slope's se that over sqrt(K),
  on K - 1 df: exact for normal noise, and simulated against ``trend_many`` itself
  (``tests/analysis/test_power.py``);
- **the interaction with a crossed factor** (``gpt.analysis.interaction``, ``sweep.py --vary``): per seed the
  difference of its paired differences at two levels, sd ``sd * sqrt(2)`` where the levels' noise is
  independent (no correlation across levels: the plan's assumption, the worst case for shared seeds); K - 1 df.

Printed: the smallest true difference (and trend per 10x parameters) detected with 80% power, the power at a
target (``--detect``, ``--detect-trend``) and the seeds that target needs.
"""

from __future__ import annotations

import math

import numpy as np

from gpt.analysis import stats
from gpt.common.errors import UserError
from gpt.common.files import read_json
from gpt.run.directory import COMPARISON_FILE

DEFAULT_SD = 0.02  # nats: the assumed sd of one seed's paired difference in test loss, where no comparison is named


def trend_sd(n_params) -> float:
    """The standard deviation of one seed's slope (per tenfold parameters) over the sizes ``n_params``, per unit
    sd of its paired difference at each size: sqrt(sum w^2)."""
    x = np.log10(np.asarray(n_params, float))
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    return float(np.sqrt((w**2).sum()))


def question(sd: float, seeds: int, detect: float | None) -> dict:
    """One t test over ``seeds`` independent seeds whose per-seed statistic has standard deviation ``sd``: the
    smallest true effect detected with ``stats.POWER``, the power at ``detect`` and the seeds ``detect`` needs."""
    se, df = sd / math.sqrt(seeds), seeds - 1
    return {
        "sd": sd,
        "seeds": seeds,
        "resolvable": stats.resolvable_difference(se, df) if seeds >= 2 else math.nan,
        "detect": detect,
        "power": stats.power(detect, se, df) if detect is not None and seeds >= 2 else None,
        "seeds_needed": stats.pairs_needed(detect, sd) if detect is not None else None,
    }


def plan(
    sd: float,
    seeds: int,
    n_params: list[float] | None,
    detect: float | None = None,
    detect_trend: float | None = None,
    crossed: bool = False,
) -> dict:
    """The study's questions: the difference at one size, (with two sizes or more) the gap's trend, and (``crossed``:
    a factor crossed with the norm types) the interaction, whose target is ``detect`` too."""
    out = {"sd": sd, "seeds": seeds, "difference": question(sd, seeds, detect)}
    if crossed:
        out["interaction"] = question(sd * math.sqrt(2), seeds, detect)
    if n_params is not None and len(n_params) >= 2:
        out["trend"] = {**question(sd * trend_sd(n_params), seeds, detect_trend), "n_params": list(n_params)}
    return out


def noise_from(path) -> tuple[float, str]:
    """The sd of one seed's paired difference from a comparison on disk (its folder or comparison.json): the
    largest over its norm types (the noisiest question sets the plan), and where it came from. A comparison
    across sizes pools each norm type's paired gaps over its sizes."""
    from pathlib import Path

    path = Path(path)
    file = path / COMPARISON_FILE if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"--noise-from {path}: no {COMPARISON_FILE} there; name a comparison folder (compare.py --out)")
    data = read_json(file, "the comparison", fix="name another comparison, or give --noise SD")
    sds = {} if not isinstance(data, dict) else _across_sizes(data) if "norms" in data else _one_size(data)
    sds = {k: v for k, v in sds.items() if v is not None and math.isfinite(v) and v > 0}
    if not sds:
        raise UserError(
            f"--noise-from {path}: no norm type there has two or more seeds paired with the baseline; name a "
            "comparison of two or more seeds, or give --noise SD"
        )
    worst = max(sds, key=sds.get)
    return sds[worst], f"{file} ({worst}, the noisiest of {len(sds)})"


def _one_size(data: dict) -> dict:
    rows = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return {}
    out = {}
    for row in rows:
        v = row.get("vs_baseline") if isinstance(row, dict) else None
        if isinstance(v, dict) and v.get("method") == "paired" and isinstance(v.get("sd"), (int, float)):
            out[str(row.get("group"))] = float(v["sd"])
    return out


def _across_sizes(data: dict) -> dict:
    out = {}
    norms = data.get("norms")
    for norm, fits in (norms if isinstance(norms, dict) else {}).items():
        squares, df = 0.0, 0
        points = fits.get("points") if isinstance(fits, dict) else None
        for point in points if isinstance(points, list) else []:
            gaps = point.get("gaps") if isinstance(point, dict) else None
            gaps = [g for g in gaps.values() if isinstance(g, (int, float))] if isinstance(gaps, dict) else []
            if len(gaps) >= 2:
                squares += float(np.var(gaps, ddof=1)) * (len(gaps) - 1)
                df += len(gaps) - 1
        if df:
            out[norm] = math.sqrt(squares / df)
    return out


def lines(p: dict, source: str) -> list[str]:
    """The plan in words."""
    d = p["difference"]
    out = [
        f"Power (80%, two-sided 5% tests) at sd {p['sd']:.4g} nats of one seed's paired difference ({source}), "
        f"{p['seeds']} seed(s):"
    ]
    if p["seeds"] < 2:
        out.append("- one seed gives no spread: no interval, no test; plan two or more")
        return out
    out.append(f"- the difference at one size: detects {d['resolvable']:.4f} nats or more")
    out += _target(d, "a difference of {:.4f} nats")
    t = p.get("trend")
    if t is not None:
        out.append(
            f"- the gap's trend across {len(t['n_params'])} sizes: detects a change of {t['resolvable']:.4f} nats "
            "per 10x parameters or more (independent sizes)"
        )
        out += _target(t, "a trend of {:.4f} nats per 10x")
    i = p.get("interaction")
    if i is None:
        out.append("- an interaction of crossed factors: none in this sweep (--vary KEY=A,B crosses one; across "
                   "sizes, the trend is the norm x size one)")  # fmt: skip
        return out
    out.append(f"- the interaction with the crossed factor (a norm's effect at one level minus at another, the same "
               f"seeds, the levels' noise independent): detects {i['resolvable']:.4f} nats or more")  # fmt: skip
    return out + _target(i, "an interaction of {:.4f} nats")


def _target(q: dict, what: str) -> list[str]:
    if q["detect"] is None:
        return []
    needed = q["seeds_needed"]
    seeds = f"{needed} seeds reach 80%" if needed is not None else f"more than {stats.MAX_SEEDS} seeds would be needed"
    return [f"  - {what.format(q['detect'])}: power {q['power']:.0%} with {q['seeds']} seeds; {seeds}"]


PLAN_KEYS = ("noise_from", "noise", "detect", "detect_trend")  # what --plan reads besides the sweep's own


def add_arguments(parser) -> None:
    """A sweep's --plan and what it reads: the noise (an earlier comparison's, or an sd) and the targets."""
    from argparse import ArgumentTypeError
    from pathlib import Path

    def positive(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:  # NaN too
            raise ArgumentTypeError(f"{text!r}: a finite number above 0, in nats")
        return value

    add = parser.add_argument
    add("--plan", action="store_true", help="print the cells and what the seeds can detect (80%% power); run nothing")
    add("--noise-from", type=Path, metavar="COMPARISON", help="with --plan: the noise of this earlier comparison")
    add("--noise", type=positive, metavar="SD", help="with --plan: the sd of one seed's paired difference (nats)")
    add("--detect", type=positive, metavar="DELTA", help="with --plan: a difference to detect; the seeds it needs")
    add("--detect-trend", type=positive, metavar="DELTA", help="with --plan: a trend per 10x parameters to detect")


def planned(args) -> bool:
    """Whether the command asks for the plan; its options without --plan are refused (they would do nothing)."""
    given = [f"--{k.replace('_', '-')}" for k in PLAN_KEYS if getattr(args, k) is not None]
    if given and not args.plan:
        raise UserError(f"{' '.join(given)} without --plan: they set the plan's noise and targets; add --plan")
    return args.plan
