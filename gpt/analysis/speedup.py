"""The effective speedup of a norm type over the baseline: how much more compute (or training time) the baseline
would need to reach the variant's test loss, as Marin defines it, ``ES = C_base(L_variant) / C_variant``, read from
the baseline's fitted loss-vs-cost curve. ES > 1: the variant gets there cheaper. **Anchored**: ``C_variant`` is read
off the same curve too, at the baseline's own mean loss at that cost (``C_base(L_baseline)``, the same number where
the curve fits): a form that does not bend as the losses do is off by its lack of fit at that point in both, which
cancels (simulated: the log-log line across sizes whose loss levels off reads 1.30 for a true 1.20 against the cost
spent, 1.19 anchored, and only the anchored interval covers), and the two losses enter seed by seed, paired.

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

from gpt.analysis.scaling import FORMULA, NEEDS, count_text, first, fit_many, fitted_scaled, seed_order, spread
from gpt.analysis.stats import LEVEL, _t_interval_many
from gpt.common.errors import UserError


def _inverse(target: np.ndarray, raw: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """log z* where the fitted ``E + A z^-alpha`` reaches ``target`` (D,), with its first-order sensitivity to the
    rungs' means (D, S) and to the target (D,), and the target's reducible part (NaN log where it is <= 0)."""
    e, a, alpha, sens = raw["E"], raw["A"], raw["alpha"], raw["sensitivity"]
    reducible = target - e
    with np.errstate(all="ignore"):
        log_z = -(np.log(reducible) - np.log(a)) / alpha
        # d log z* / d(E, A, alpha): the implicit function's, -(df/dtheta) / (df/dlog z), df/dlog z = -alpha * r
        dtheta = np.stack([1 / (alpha * reducible), 1 / (alpha * a), -log_z / alpha], 1)  # (D, 3)
        return log_z, np.einsum("di,dis->ds", dtheta, sens), -1 / (alpha * reducible), reducible


def speedup_many(
    x: np.ndarray,
    base: np.ndarray,
    x_variant: float,
    variant: np.ndarray,
    form: str = "power",
    *,
    irreducible: float = 0.0,
    log_ratio: np.ndarray | None = None,
    anchor: int | None = None,
    level: float = LEVEL,
) -> dict:
    """The effective speedup over D data sets: the baseline's losses ``base`` (D, K seeds, S rungs) at costs ``x``
    (S), the variant's ``variant`` (D, K) at cost ``x_variant``; ``log_ratio`` (D, K), time-matched: each seed's
    log(tokens/s of the variant / of the baseline), added to log ES. NaN where a value is missing.

    ``anchor``: the rung of the baseline's own runs at the variant's cost. Its cost is then read off the curve too,
    ``ES = C_base(L_variant) / C_base(L_anchor)``: the same quantity where the curve fits, and where it does not
    (a form that does not bend as the losses do), its lack of fit at that point cancels; the two losses enter
    seed by seed, paired. Returns ``log`` (log ES with its interval), ``es``/``low``/``high`` (exp of them),
    ``needed`` (x*, the cost the baseline needs), ``inside`` (x* within the rungs' costs) and ``crosses`` (the
    variant's loss is above the curve's floor E)."""
    x, base, variant = np.asarray(x, float), np.asarray(base, float), np.asarray(variant, float)
    raw, ref, _ = fitted_scaled(x, base, form, irreducible)
    log_z, c_base, c_variant, reducible = _inverse(np.nanmean(variant, 1), raw)
    crosses = reducible > 0
    curve = log_z + math.log(ref) - math.log(x_variant)  # log ES from the losses alone
    if anchor is not None:
        log_a, c_base_a, c_anchor, _ = _inverse(np.nanmean(base[:, :, anchor], 1), raw)
        curve = log_z - log_a
        c_base = c_base - c_base_a
        c_base[:, anchor] -= c_anchor
    values, coefs, estimate = [base, variant[:, :, None]], [c_base, c_variant[:, None]], curve
    if log_ratio is not None:
        log_ratio = np.asarray(log_ratio, float)
        values.append(log_ratio[:, :, None])
        coefs.append(np.ones((len(base), 1)))
        with np.errstate(all="ignore"):
            estimate = curve + np.nanmean(log_ratio, 1)
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
            "needed": x_variant * np.exp(curve),  # the baseline's cost for the variant's loss (anchored: shifted)
            "inside": crosses & (z >= scaled.min() * (1 - 1e-9)) & (z <= scaled.max() * (1 + 1e-9)),
            "crosses": crosses & ~raw["at_edge"],
        }


# --- from runs to the section -------------------------------------------------------------------------------------

THROUGHPUT_SPREAD = 1.15  # a group's tokens/s max / min beyond which its runs' own throughput is not trusted
HARDWARE_KEYS = ("hardware.device", "hardware.name", "hardware.world_size")  # what time-matched runs must share
BENCH_HINT = (
    "time the norm types side by side in one process with scripts/bench.py CONFIG --norm-types ... --jsonl "
    "BENCH.jsonl and give it to compare.py --throughput BENCH.jsonl"
)


def point(runs: list, label: str) -> dict:
    """Runs of one cost (one group, or one rung of the ladder) as the section takes them: its tokens and training
    FLOPs (from the runs' summaries), each seed's test loss and steady-state tokens/s, and the runs' names."""
    used = [r for r in runs if r.usable and math.isfinite(r.evaluation["loss"])]
    tokens = next((r.planned_tokens for r in used if r.planned_tokens), None)
    per_token = next((r.summary.get("flops_per_token") for r in used if r.summary.get("flops_per_token")), None)
    return {
        "label": label,
        "tokens": tokens,
        "flops": per_token * tokens if per_token and tokens else None,
        "losses": {r.seed: r.evaluation["loss"] for r in used},
        "tokens_per_s": {r.seed: r.summary["tokens_per_s"] for r in used if r.summary.get("tokens_per_s")},
        "runs": [r.path.name for r in used],
        "left_out": [
            f"{r.path.name} ({r.left_out_because() if not r.usable else 'a test loss that is not finite'})"
            for r in runs
            if r not in used
        ],  # fmt: skip
    }


def hardware_problem(runs: list) -> str | None:
    """Why these runs' tokens/s cannot be set side by side: they ran on more than one device type or count (or
    one run changed device between its segments); None when they all ran on one."""
    kinds: dict[str, list[str]] = {}
    for r in runs:
        kind = ", ".join(f"{k.split('.')[1]} {r.view.get(k)}" for k in HARDWARE_KEYS)
        kinds.setdefault(kind, []).append(r.path.name)
    if len(kinds) < 2:
        return None
    said = "; ".join(f"{kind} ({len(names)} run(s): {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                     for kind, names in kinds.items())  # fmt: skip
    return (
        f"time-matched effective speedup refused: the runs ran on different hardware ({said}); tokens/s compare only "
        "on one device type and count: train them on one kind of machine, or " + BENCH_HINT
    )


def spread_problem(points: list[dict]) -> str | None:
    """Why the runs' own tokens/s are no measurement of the norm: a point's runs (one model, one machine) spread
    more than ``THROUGHPUT_SPREAD``-fold, or some run recorded none; None when they agree."""
    for p in points:
        rates = list(p["tokens_per_s"].values())
        if len(rates) < len(p["losses"]):
            return (
                f"time-matched effective speedup not computed: runs of {p['label']} recorded no steady tokens/s; "
                + BENCH_HINT
            )
        if rates and max(rates) / min(rates) > THROUGHPUT_SPREAD:
            shown = ", ".join(f"{v:,.0f}" for v in rates)
            return (
                f"time-matched effective speedup not computed: the runs of {p['label']} trained at {shown} tokens/s, "
                f"{max(rates) / min(rates):.2f}-fold apart (more than {THROUGHPUT_SPREAD:g}): the same model on the "
                "same machine, so the machine was shared with other work and these tokens/s measure that, not the "
                f"norm; {BENCH_HINT}"
            )
    return None


def chosen_form(x: np.ndarray, base: np.ndarray, form: str, irreducible: float) -> tuple[str, str | None]:
    """The curve's form: ``form``, or for ``auto`` the saturating form where it is identified (4 rungs or more,
    alpha inside its range, E in [0, the lowest mean loss)), else the log-log line, with why."""
    if form != "auto":
        return form, None
    if len(x) < NEEDS["saturating"]:
        return "power", f"{len(x)} costs: E + A*x^-alpha needs {NEEDS['saturating']} or more"
    if not identified_many(x, base)[0]:
        return "power", "E + A*x^-alpha does not identify E at these costs (the losses do not level off)"
    return "saturating", None


def identified_many(x: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Per data set (``base``: D, K, S), whether ``E + A*x^-alpha`` identifies E: alpha's best value inside its range
    and E in [0, the lowest mean loss). Where it does not, ``auto`` fits the log-log line."""
    raw, _, means = fitted_scaled(np.asarray(x, float), np.asarray(base, float), "saturating", 0.0)
    with np.errstate(invalid="ignore"):
        return ~raw["at_edge"] & (raw["E"] >= 0) & (raw["E"] < np.nanmin(means, 1))


def _matrix(points: list[dict], seeds: list[str], key: str = "losses") -> np.ndarray:
    return np.array([[[p[key].get(k, math.nan) for p in points] for k in seeds]], float)


def _one(x, rungs, variant, x_variant, seeds, form, irreducible, log_ratio=None, anchor=None) -> dict:
    """One effective speedup (one variant, one cost; ``anchor``: its pair's rung) as plain numbers."""
    r = speedup_many(np.asarray(x, float), _matrix(rungs, seeds), x_variant, _matrix([variant], seeds)[:, :, 0],
                     form, irreducible=irreducible, log_ratio=log_ratio, anchor=anchor)  # fmt: skip
    out = first({k: v for k, v in r.items() if k != "log"})
    out.update({"log_" + k: v for k, v in first(r["log"]).items() if k in ("se", "df", "method", "no_spread")})
    return out


def _geo(rates: dict) -> float:
    return float(np.exp(np.mean(np.log(list(rates.values())))))


def section(
    rungs: list[dict],
    variants: list[tuple[dict, int]],
    baseline: str,
    route: str,
    *,
    form: str = "auto",
    irreducible: float = 0.0,
    one_model: bool = False,
    throughput: dict | None = None,
) -> dict:
    """The effective speedup of each variant over the baseline (module docstring). ``rungs``: the baseline's points
    (``point``) in cost order; ``variants``: each variant's point and the index of the rung of its own size and
    budget (its pair); ``route``: "token ladder" or "size ladder"; ``one_model``: every rung is one model (a token
    ladder), so each is timed at its budget rung's tokens/s; ``throughput``: {"problem": why time-matched is not
    computed, or None; "bench": {norm label: tokens/s} from bench.py, or None: the runs' own}."""
    throughput = throughput or {"problem": None, "bench": None}
    rungs = [r for r in rungs if r["losses"] and r["flops"]]
    head = {"route": route, "baseline": baseline, "rungs": rungs, "throughput": throughput, "norms": {}}
    if len(rungs) < NEEDS["power"]:
        return {
            **head,
            "not_computed": f"the baseline has {len(rungs)} cost(s) with a test loss: its curve needs 2 or more",
        }
    seeds = sorted({k for p in [*rungs, *(v for v, _ in variants)] for k in p["losses"]}, key=seed_order)
    flops = np.array([r["flops"] for r in rungs])
    chosen, why = chosen_form(flops, _matrix(rungs, seeds), form, irreducible)
    head.update(form=chosen, formula=FORMULA[chosen].replace("N", "x"), form_why=why, irreducible=irreducible)
    seconds = _seconds(rungs, variants, baseline, throughput, one_model)
    for name, x in (("compute", flops), ("time", seconds)):
        fit = (
            None
            if x is None
            else first(fit_many(np.asarray(x), _matrix(rungs, seeds), chosen, irreducible=irreducible))
        )
        head.setdefault("curve", {})[name] = None if fit is None else {
            "x": list(x), "E": fit["E"], "A": fit["A"], "alpha": fit["alpha"]["mean"]}  # fmt: skip
    for v, at in variants:
        head["norms"][v["label"]] = _variant(v, rungs, at, baseline, seeds, chosen, irreducible, throughput, seconds)
    # the baseline's own runs read off its own curve: 1 but for the fit's lack of fit there (which anchoring cancels)
    pairs = sorted({at for _, at in variants})
    head["lack_of_fit"] = {rungs[i]["label"]: _one(flops, rungs, rungs[i], rungs[i]["flops"], seeds, chosen,
                                                    irreducible)["es"] for i in pairs}  # fmt: skip
    return head


def _seconds(rungs: list[dict], variants: list, baseline: str, throughput: dict, one_model: bool) -> list[float] | None:
    """Each rung's training seconds at the tokens/s it is timed at (None: time-matched is not computed): one model
    (a token ladder) at its budget rung's (or bench.py's) rate, else each rung at its own runs' rate."""
    if throughput["problem"] is not None:
        return None
    if throughput.get("bench"):
        rates = [throughput["bench"][baseline]] * len(rungs)
    elif one_model:
        rates = [_geo(rungs[variants[0][1] if variants else 0]["tokens_per_s"])] * len(rungs)
    else:
        rates = [_geo(r["tokens_per_s"]) for r in rungs]
    return [r["tokens"] / rate for r, rate in zip(rungs, rates)]


def _variant(v: dict, rungs: list[dict], at: int, baseline: str, seeds: list, form, irreducible, throughput, seconds):
    """One variant's effective speedup, compute- and (where its throughput can be trusted) time-matched: its
    tokens at its pair's rate, plus each seed's log ratio of its tokens/s to its pair's (bench.py's: one ratio)."""
    out = {"loss_mean": float(np.mean(list(v["losses"].values()))), "pair": rungs[at]["label"], "time": None}
    out["compute"] = _one([r["flops"] for r in rungs], rungs, v, v["flops"], seeds, form, irreducible, anchor=at)
    out["compute"]["x_variant"] = v["flops"]
    if seconds is not None:
        bench, base = throughput.get("bench"), rungs[at]["tokens_per_s"]
        if bench:
            ratio = np.full((1, len(seeds)), math.log(bench[v["label"]] / bench[baseline]))
        else:
            ratio = np.array([[math.log(v["tokens_per_s"][k] / base[k]) if k in v["tokens_per_s"] and k in base
                               else math.nan for k in seeds]])  # fmt: skip
        x_variant = seconds[at] * v["tokens"] / rungs[at]["tokens"]  # its tokens at its pair's rate
        out["time"] = _one(seconds, rungs, v, x_variant, seeds, form, irreducible, ratio, anchor=at)
        out["time"]["x_variant"] = x_variant / math.exp(float(np.nanmean(ratio)))  # at its own tokens/s
    out["verdict"] = verdict(v["label"], out, rungs, baseline)
    return out


def _x(es: dict, invert: bool = False) -> str:
    """ES with its interval (``invert``: 1/ES, the share of the baseline's cost the variant needs), to 2 decimals,
    or 3 where the interval is narrower than 0.05."""

    def f(v: float) -> float:
        return 1 / v if invert else v

    if es["low"] is None or not math.isfinite(es["low"]):
        return f"{f(es['es']):.2f}x"
    low, high = sorted((f(es["low"]), f(es["high"])))
    d = 3 if high - low < 0.05 else 2
    return f"{f(es['es']):.{d}f}x [{low:.{d}f}, {high:.{d}f}]"


def _share(es: dict) -> str:
    return _x(es, invert=True)


def verdict(label: str, v: dict, rungs: list[dict], base: str) -> str:
    """One line: what share of the baseline's training time (and compute) the variant needs for its own test loss."""
    c, t = v["compute"], v["time"]
    means = [float(np.mean(list(r["losses"].values()))) for r in rungs]
    if not c["crosses"]:
        return (f"{label}'s test loss {v['loss_mean']:.4f} lies below the floor of {base}'s fitted curve: no cost of "
                "the baseline reaches it on this curve (no effective speedup is read off it)")  # fmt: skip
    where = "" if c["inside"] else (
        f" (**extrapolated**: its loss {v['loss_mean']:.4f} lies outside the {min(means):.4f}-{max(means):.4f} "
        f"the baseline's runs span; the curve's form decides these figures, not the runs)")  # fmt: skip
    if t is None:
        return (f"{label} reaches its test loss with {_share(c)} of the compute {base} needs for it (compute-matched "
                f"effective speedup {_x(c)}); time-matched: not computed (below){where}")  # fmt: skip
    return (f"{label} reaches its test loss with {_share(t)} of the training time {base} needs for it (time-matched "
            f"effective speedup {_x(t)}); compute-matched {_x(c)}{where}")  # fmt: skip


LENGTH_KEYS = ("train.steps", "train.tokens", "train.tokens_per_param")  # what a token ladder's rungs differ in


def token_ladder(groups: list, baseline: str, ladder: list, *, form="auto", irreducible=0.0, bench=None,
                 allow_differ=()) -> dict:  # fmt: skip
    """The section at one size: the baseline group's runs (the budget) and ``ladder``, the baseline's runs at other
    token budgets (``sweep.py --token-fractions``, each checked to differ from the baseline's runs in its length
    and seed alone), as the baseline's curve; each other group a variant at the budget. ``bench``: tokens/s per norm
    type from bench.py (``bench_rates``) instead of the runs' own; ``allow_differ``: the comparison's keys that may
    differ (--allow-differ), here too."""
    base = next(g for g in groups if g.label == baseline)
    others = [g for g in groups if g.label != baseline]
    check_ladder(base.runs, ladder, allow_differ)
    by_tokens: dict = {}
    for r in ladder:
        by_tokens.setdefault(r.planned_tokens, []).append(r)
    budget = point(base.runs, f"{baseline} (the budget)")
    rungs = [budget] + [point(rs, f"{baseline} at {t / budget['tokens']:.3g}x") for t, rs in by_tokens.items()]
    rungs = sorted(rungs, key=lambda p: p["tokens"] or 0)
    variants = [(point(g.runs, g.label), rungs.index(budget)) for g in others]
    runs = [*base.runs, *ladder, *(r for g in others for r in g.runs)]
    throughput = throughput_check(runs, rungs, variants, baseline, bench)
    return section(rungs, variants, baseline, "token ladder", form=form, irreducible=irreducible, one_model=True,
                   throughput=throughput)  # fmt: skip


def throughput_check(runs: list, rungs: list[dict], variants: list, baseline: str, bench: dict | None) -> dict:
    """Whether the time-matched figure can be computed, and from what: the runs' own tokens/s (one device type
    and count, no spread beyond ``THROUGHPUT_SPREAD`` within a point), or bench.py's rows (every norm type)."""
    if bench is not None:
        missing = [label for label in [baseline, *(v["label"] for v, _ in variants)] if label not in bench["rates"]]
        problem = (f"time-matched effective speedup not computed: {bench['file']} has no step row of "
                   f"{', '.join(missing)}; bench.py --norm-types names them") if missing else None  # fmt: skip
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in bench["rates"].items())
        rounds = f", the median of {bench['rounds']} rounds" if bench["rounds"] > 1 else ""
        source = (
            f"bench.py's steps, timed one norm type after another in one process on {bench['device']} ({rates} "
            f"tokens/s{rounds}), from {bench['file']}"
        )
        return {"problem": problem, "bench": bench["rates"], "source": source}
    used = [r for r in runs if r.usable]
    problem = hardware_problem(used) or spread_problem([*rungs, *(v for v, _ in variants)])
    return {"problem": problem, "bench": None, "source": "the runs' own steady-state tokens/s"}


def check_ladder(base_runs: list, ladder: list, allow_differ=()) -> None:
    """Refuse, in one line, ladder runs that are not the baseline's runs at other lengths."""
    from gpt.analysis.comparable import check_comparable, check_only_the_norm_differs
    from gpt.analysis.runs import AXIS

    norm = base_runs[0].config[AXIS]
    wrong = [r.path.name for r in ladder if r.config.get(AXIS) != norm]
    if wrong:
        raise UserError(
            f"--ladder {', '.join(wrong)}: a token ladder is the baseline's ({norm}) runs at other token budgets; "
            "give those, or --baseline their norm type"
        )
    check_comparable([*base_runs, *ladder], lengths=False)
    try:
        keys = [*LENGTH_KEYS, *allow_differ]
        check_only_the_norm_differs([*base_runs, *ladder], [], keys, axes="the length and the seeds")
    except UserError as e:
        raise UserError(f"--ladder: {e}") from None


def bench_rates(path, compile_: bool | None = None) -> dict:
    """Each norm type's tokens/s from a bench.py JSON-lines file (its step rows; of ``compile_`` where it has
    rows of both settings; the median where bench.py ran more than once into the file, a round of every norm type
    each time, so that a drift of the machine's speed falls on all of them): {"file", "rates", "rounds",
    "device"}; a file that is not one is refused in one line."""
    import json
    from pathlib import Path

    path = Path(path)
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(
            f"--throughput {path}: not a bench.py JSON-lines file ({type(e).__name__}); {BENCH_HINT}"
        ) from None
    steps = [r for r in rows if isinstance(r, dict) and r.get("mode") == "step" and r.get("tokens_per_s")]
    if compile_ is not None and len({r.get("compile") for r in steps}) > 1:
        steps = [r for r in steps if r.get("compile") == compile_]
    if not steps:
        raise UserError(f"--throughput {path}: no training-step row with tokens/s in it; {BENCH_HINT}")
    by_norm: dict[str, list[float]] = {}
    for r in steps:
        by_norm.setdefault(r["norm_type"], []).append(r["tokens_per_s"])
    return {"file": str(path), "rates": {k: float(np.median(v)) for k, v in by_norm.items()},
            "rounds": min(len(v) for v in by_norm.values()),
            "device": f"{steps[0].get('device')} x {steps[0].get('world_size')}"}  # fmt: skip


SPEEDUP_HEADING = "Effective speedup"


def lines(s: dict | None) -> list[str]:
    """The section as Markdown: the baseline's curve, each norm type's verdict with both figures, the throughput."""
    if not s:
        return []
    out = ["", f"## {SPEEDUP_HEADING}", ""]
    if s.get("not_computed"):
        return [*out, f"Not computed: {s['not_computed']}."]
    ladder = "its runs at several token budgets at this size" if s["route"] == "token ladder" else "its sizes"
    out += [
        f"ES = C_base(L) / C: the cost {s['baseline']} needs to reach a norm type's test loss L, read from its "
        f"fitted curve ({s['route']}: {ladder}; {s['formula']}"
        + (f", E0 = {s['irreducible']:g}" if s["form"] == "power" else "")
        + (f"; the log-log line because {s['form_why']}" if s.get("form_why") else "")
        + "), over the norm type's own cost (read off the same curve at the baseline's own loss at that cost, so that "
        "the curve's lack of fit there cancels). Compute-matched: training FLOPs (what the norm changes in the "
        "function learned); time-matched: seconds at steady-state tokens/s (the kernels' cost besides). ES > 1: "
        "cheaper than the baseline. Intervals: 95% over seeds, the delta method seed by seed, the two losses paired "
        "(gpt.analysis.speedup).",
        "",
        "| baseline's runs | tokens | training FLOPs | seeds | mean test loss | tokens/s (min-max) |",
        "|---|---|---|---|---|---|",
    ]
    for r in s["rungs"]:
        rates = list(r["tokens_per_s"].values())
        shown = f"{min(rates):,.0f}-{max(rates):,.0f}" if rates else "-"
        mean = float(np.mean(list(r["losses"].values())))
        out.append(
            f"| {r['label']} | {count_text(r['tokens'])} | {count_text(r['flops'])} | {len(r['losses'])} | "
            f"{mean:.4f} | {shown} |"
        )
    left = [x for r in s["rungs"] for x in r.get("left_out", [])] + list(s.get("missing") or [])
    out += ["", f"Left out of the baseline's curve: {'; '.join(left)}."] if left else []
    out += [""] + [f"- {v['verdict']}" for v in s["norms"].values()]
    lack = ", ".join(f"{label} {es:.3f}x" for label, es in (s.get("lack_of_fit") or {}).items())
    out += ["", "Each figure reads the cost of both losses off the curve, the norm type's and the baseline's own at "
            "the same cost, so the curve's lack of fit there cancels; read against the cost actually spent, the "
            f"baseline's own runs would give {lack}."] if lack else []  # fmt: skip
    t = s["throughput"]
    out += ["", f"Throughput: {t['source']}" + (f". {t['problem']}." if t["problem"] else ".")]
    return out


def add_arguments(parser, sweep: bool = False) -> None:
    """A command's options of the effective speedup: a sweep's --token-fractions (the baseline's ladder trained), or
    a comparison's --ladder (those runs) and --throughput (bench.py's tokens/s instead of the runs' own)."""
    from pathlib import Path

    add = parser.add_argument
    if sweep:
        add("--token-fractions", nargs="+", type=float, metavar="F", help="the baseline also trained to F x the "
            "token budget (complete runs): its curve, for each norm's effective speedup (0.5 0.71 1.41 2)")  # fmt: skip
        add("--throughput", type=Path, metavar="BENCH.jsonl", help="with --token-fractions: bench.py's tokens/s for "
            "the time-matched figure, instead of the runs' own")  # fmt: skip
        return
    add("--ladder", nargs="+", type=Path, default=[], metavar="RUN", help="the baseline's runs at other token "
        "budgets (sweep.py --token-fractions): its curve, for each norm type's effective speedup")  # fmt: skip
    add("--throughput", type=Path, metavar="BENCH.jsonl", help="with --ladder: the tokens/s of bench.py --jsonl "
        "(steps timed side by side) for the time-matched figure, instead of the runs' own")  # fmt: skip


def size_ladder(sizes: list[tuple[str, dict, dict]], baseline: str, *, form="auto", irreducible=0.0) -> dict:
    """The section across sizes: the baseline's runs at each size (``sizes``: each size's name, its comparison and
    its runs by path, smallest first) as its curve against training FLOPs, each other norm type at each size a
    variant paired with the baseline's point of that size; timed at each size's own tokens/s."""
    rungs, variants, runs = [], [], []
    for name, comparison, by_path in sizes:
        rows = {
            row["values"]["model.norm_type"]: [by_path[r["path"]] for r in row["runs"]] for row in comparison["groups"]
        }
        if baseline not in rows:
            continue
        rungs.append(point(rows[baseline], f"{baseline} at {name}"))
        runs += [r for rs in rows.values() for r in rs]
        variants += [(point(rs, f"{norm} at {name}"), len(rungs) - 1) for norm, rs in rows.items() if norm != baseline]
    kept = [i for i, r in enumerate(rungs) if r["losses"] and r["flops"]]
    variants = [(v, kept.index(at)) for v, at in variants if at in kept and v["losses"] and v["flops"]]
    rungs = [rungs[i] for i in kept]
    throughput = throughput_check(runs, rungs, variants, baseline, None)
    return section(rungs, variants, baseline, "size ladder", form=form, irreducible=irreducible, throughput=throughput)
