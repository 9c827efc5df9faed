"""A comparison across model sizes (``model.size``, ``gpt.config.sizes``): each size compared as any comparison is,
then the loss fitted against size per norm type and the trend of each norm type's gap to the baseline with size
(the numbers: ``gpt.analysis.scaling``).

Across sizes, runs may differ only in the size keys (``SIZE_KEYS``) and, where the rate was chosen on validation
at each size, the learning rate: anything else is refused in one line naming the key, as a comparison refuses it.
Every size is evaluated on the same test tokens, and trains its ``train.tokens_per_param`` x its own parameters.
Writes ``<out>/comparison.md`` and ``comparison.json`` (this result), ``scaling.png``, and each size's own
comparison under ``<out>/sizes/<size>/``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gpt.analysis import scaling, speedup
from gpt.analysis.charts import SPEEDUP_CHART, plot_scaling, plot_speedup
from gpt.analysis.comparable import check_comparable, check_names, check_only_the_norm_differs
from gpt.analysis.report import _loss, escaped
from gpt.analysis.runs import AXIS, load_runs
from gpt.analysis.scaling import count_text
from gpt.analysis.selection import LR_KEY
from gpt.analysis.table import compare, json_safe
from gpt.common.errors import UserError
from gpt.common.files import write_atomically, write_json
from gpt.config.sizes import SIZE_KEY, SIZE_KEYS, SIZES, mixed_shapes
from gpt.run.directory import COMPARISON_FILE

SCALING_CHART = "scaling.png"
SIZES_FOLDER = "sizes"  # each size's own comparison: <out>/sizes/<size>/


def _size_order(name: str) -> tuple:
    size = SIZES.get(name)
    return (0, size.n_layers * size.d_model**2, name) if size else (1, 0, name)


def _by_size(runs: list) -> dict[str, list]:
    """The runs by model.size, smallest first; refuse runs without one."""
    unsized = [r.path.name for r in runs if not r.config.get(SIZE_KEY)]
    if unsized:
        raise UserError(
            f"a comparison across sizes needs every run's model.size (a named size, gpt.config.sizes); "
            f"{', '.join(unsized)} have none: train them with --set model.size=NAME (sweep.py --sizes does)"
        )
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(r.config[SIZE_KEY], []).append(r)
    return dict(sorted(out.items(), key=lambda kv: _size_order(kv[0])))


def _scale(runs: list) -> dict:
    """One size's N (non-norm parameters, the count train.tokens_per_param multiplies), planned tokens and training
    FLOPs, from the runs' summaries (None where no run recorded them)."""
    counted = [r for r in runs if r.summary.get("n_params_outside_norms")]
    if not counted:
        return {"n_params": None, "tokens": None, "flops": None}
    counts = {r.summary["n_params_outside_norms"] for r in counted}
    if len(counts) > 1:  # the norm types of one size share every parameter outside their norms
        raise UserError(
            f"runs of model.size {runs[0].config[SIZE_KEY]} count different parameters outside their norms "
            f"({', '.join(map(str, sorted(counts)))}): they are not one size; compare runs of one config"
        )
    tokens, flops = counted[0].planned_tokens, counted[0].summary.get("flops_per_token")
    return {"n_params": counts.pop(), "tokens": tokens, "flops": flops * tokens if flops else None}


LOAD_KEYS = ("which", "split", "precision", "tokens", "offset")  # how a run's evaluation is found (load_run)


def compare_sizes(
    paths: list[Path],
    out: Path,
    baseline: str | None = None,
    *,
    predict_at: float | None = None,
    form: str = "auto",
    irreducible: float | None = None,
    failed: dict[str, str] | None = None,
    plots: bool = True,
    **options,
) -> dict:
    """Compare ``paths`` (runs of several sizes) into ``out``; return the result (module docstring).
    ``predict_at``: a parameter count to predict each norm type's loss at; ``form``: ``gpt.analysis.scaling``'s
    (auto, saturating, power); ``irreducible``: the power form's E0; ``failed``: runs that ended without a
    result, named in the report; ``options``: ``gpt.analysis.table.compare``'s, applied within each size."""
    if form not in scaling.FORMS:
        raise UserError(f"--form {form}: one of {', '.join(scaling.FORMS)}")
    if form == "saturating" and irreducible is not None:
        raise UserError(
            f"--irreducible {irreducible:g} with --form saturating: E + A*N^-alpha fits its own E; drop --irreducible, "
            "or fit the log-log line of L - E0 with --form power"
        )
    irreducible = irreducible or 0.0
    allow_differ = list(options.get("allow_differ") or ())
    vary = list(dict.fromkeys([*(options.get("vary") or ()), *([LR_KEY] if options.get("select_on") else [])]))
    load = {k: options[k] for k in LOAD_KEYS if k in options}
    runs = load_runs(paths, None, [*SIZE_KEYS, *vary], allow_differ, **load)
    check_names(runs, vary, allow_differ)
    check_only_the_norm_differs(runs, [*SIZE_KEYS, *vary], allow_differ, axes="the norm, the seeds and the size")
    check_comparable(runs, lengths=False)  # the same test tokens at every size; lengths are checked within one
    out = Path(out)
    sizes, by_path = [], {str(r.path): r for r in runs}
    for name, size_runs in _by_size(runs).items():
        folder = out / SIZES_FOLDER / name
        try:
            result = compare([r.path for r in size_runs], folder, baseline, plots=plots, **options)
        except UserError as e:  # say which size
            raise UserError(f"model.size {name}: {e}") from None
        sizes.append({"size": name, **_scale(size_runs), "comparison": result, "folder": str(folder)})
    result = _result(sizes, predict_at, form, irreducible)
    ladder = [(s["size"], s["comparison"], by_path) for s in sizes]
    result["effective_speedup"] = speedup.size_ladder(ladder, result["baseline"], form=form, irreducible=irreducible)
    result["failed"] = [{"run": name, "error": error} for name, error in (failed or {}).items()]
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "comparison.md", markdown(result))
    write_json(out / COMPARISON_FILE, json_safe(result), default=str, allow_nan=False)
    result["plots"] = [str(plot_scaling(result, out / SCALING_CHART))] if plots else []
    if plots and not result["effective_speedup"].get("not_computed"):
        result["plots"].append(str(plot_speedup(result["effective_speedup"], out / SPEEDUP_CHART)))
    return result


def _norm_points(sizes: list[dict]) -> tuple[str, dict[str, list[dict]], dict[str, list[str]]]:
    """The baseline norm type and, per norm type, a point per size where it has evaluated runs: the size, N,
    FLOPs, its seeds' test losses (by seed), their mean, its paired differences to the baseline seed by seed and
    the size's comparison of the two (``gpt.analysis.stats.difference``, as its own report gives it); and per
    norm type a line for each size where none of its runs has a finite test loss (left out, and said)."""
    points: dict[str, list[dict]] = {}
    bases = {s["size"]: _norm_of(s["comparison"], s["comparison"]["baseline"]) for s in sizes}
    if len(set(bases.values())) > 1:
        raise UserError(
            "the baseline is another norm type at another size ("
            + ", ".join(f"{size}: {norm}" for size, norm in bases.items())
            + "): give --baseline NORM_TYPE, one that every size has"
        )
    base = next(iter(bases.values()))
    without: dict[str, list[str]] = {}  # norm type -> a line per size where it has no loss
    for s in sizes:
        comparison = s["comparison"]
        losses = {}
        absent = {}  # group -> seed -> why it has no loss here
        for row in comparison["groups"]:
            runs = [r for r in row["runs"] if r["status"] == "completed" and r["test_loss"] is not None]
            losses[row["group"]] = {r["seed"]: r["test_loss"] for r in runs if math.isfinite(r["test_loss"])}
            absent[row["group"]] = {r["seed"]: f"{Path(r['path']).name}: {r['reason']}" for r in row["left_out"]}
            absent[row["group"]] |= {
                r["seed"]: f"{Path(r['path']).name}: test loss {r['test_loss']}"
                for r in runs
                if not math.isfinite(r["test_loss"])
            }
        base_losses = losses[comparison["baseline"]]
        for row in comparison["groups"]:
            norm, mine = row["values"][AXIS], losses[row["group"]]
            if not mine and s["n_params"] is not None:  # every run of it diverged or failed here: said, not dropped
                why = "; ".join(f"seed {k}: {v}" for k, v in absent[row["group"]].items()) or "no runs"
                without.setdefault(norm, []).append(f"{s['size']} left out: no run with a finite test loss ({why})")
            if not mine or s["n_params"] is None:
                continue
            v = row["vs_baseline"]
            points.setdefault(norm, []).append({
                "size": s["size"], "n_params": s["n_params"], "flops": s["flops"], "group": row["group"],
                "losses": mine, "absent": absent[row["group"]], "mean": float(np.mean(list(mine.values()))),
                "mean_bits_per_byte": _per_byte(comparison, float(np.mean(list(mine.values())))),
                "gaps": {k: mine[k] - base_losses[k] for k in mine if k in base_losses},
                "gap": None if v is None else {k: v.get(k) for k in ("diff", "se", "df", "low", "high", "method")},
            })  # fmt: skip
    return base, points, without


def _per_byte(comparison: dict, loss: float) -> float | None:
    """``loss`` (nats per token) in bits per byte of the size's scored test text (None: its bytes not counted)."""
    factor = (comparison.get("test_range") or {}).get("bits_per_byte_per_nat")
    return None if factor is None else loss * factor


def _norm_of(comparison: dict, group: str) -> str:
    return next(row["values"][AXIS] for row in comparison["groups"] if row["group"] == group)


def _seeds(points: list[dict], key: str) -> list[str]:
    """Every seed that ``points`` hold a value for under ``key`` (losses or gaps), in seed order."""
    return sorted({k for p in points for k in p[key]}, key=scaling.seed_order)


def seed_matrix(points: list[dict], key: str) -> np.ndarray:
    """``points``' values by seed (``key``: losses or gaps) as one data set (1, K seeds, S sizes): NaN where a seed
    has none at a size (``gpt.analysis.scaling.spread`` then takes the sizes one by one)."""
    seeds = _seeds(points, key)
    return np.array([[[p[key].get(k, math.nan) for p in points] for k in seeds]], float)


def _fit(points: list[dict], x_key: str, form: str, irreducible: float, predict_at: float | None) -> dict:
    """One norm type's fit against ``x_key`` (n_params or flops) at its sizes, or why it has none. ``auto`` takes
    the saturating form only where its E comes out identified (``_unidentified``), else the log-log line, and
    says why; a saturating fit asked for by name keeps its numbers and says what is wrong with them."""
    points, left_out = _spread_points([p for p in points if p[x_key]], "losses")
    fit = _fit_chosen(points, x_key, form, irreducible, predict_at)
    if left_out:
        fit["left_out"] = left_out
    if predict_at is not None and "predicted" in fit and form == "auto":  # the other form, where it fits
        other = "power" if fit["form"] == "saturating" else "saturating"
        alt = _fit_form(points, x_key, other, irreducible, predict_at)
        if "predicted" in alt:
            fit["other_form"] = {"form": other, "formula": alt["formula"], "predicted": alt["predicted"],
                                 "problem": _unidentified(alt) if other == "saturating" else None}  # fmt: skip
    return fit


def _spread_points(points: list[dict], key: str) -> tuple[list[dict], list[str]]:
    """``points`` without the sizes whose one seed gives no spread where other sizes have two or more (their
    intervals would be NaN), and a line per size left out naming the seeds it lacks and why."""
    seeds = _seeds(points, key)
    if len(seeds) < 2:
        return points, []
    kept, said = [], []
    for p in points:
        if len(p[key]) >= 2:
            kept.append(p)
            continue
        lacks = [f"seed {k} ({p.get('absent', {}).get(k, 'no run')})" for k in seeds if k not in p[key]]
        said.append(f"{p['size']} left out: it has {len(p[key])} seed(s), no spread; it lacks {', '.join(lacks)}")
    return kept, said


def _fit_chosen(points: list[dict], x_key: str, form: str, irreducible: float, predict_at: float | None) -> dict:
    chosen = scaling.chosen_form(form, len(points))
    fit = _fit_form(points, x_key, chosen, irreducible, predict_at)
    problem = _unidentified(fit) if chosen == "saturating" else None
    if problem and form == "auto":
        return {**_fit_form(points, x_key, "power", irreducible, predict_at), "instead_of_saturating": problem}
    return {**fit, "warning": problem} if problem and "not_fitted" not in fit else fit


def _unidentified(fit: dict) -> str | None:
    """Why a saturating fit does not identify E: no minimum inside alpha's range, or an E outside [0, the
    smallest mean loss), where no loss could saturate."""
    if "not_fitted" in fit:
        return fit["not_fitted"].removeprefix("not fitted: ")
    if not 0 <= fit["E"] < min(fit["means"]):
        return (
            f"E + A*N^-alpha puts E at {fit['E']:.4g}, outside [0, the smallest mean loss {min(fit['means']):.4g}): "
            "these sizes do not show the loss levelling off"
        )
    return None


def _fit_form(points: list[dict], x_key: str, form: str, irreducible: float, predict_at: float | None) -> dict:
    names = [p["size"] for p in points]
    head = {"form": form, "formula": scaling.FORMULA[form], "sizes": names}
    if form == "power":
        head["irreducible"] = irreducible
    why = scaling.not_fitted(form, names)
    if why:
        return {**head, "not_fitted": why}
    x = np.array([p[x_key] for p in points], float)
    losses = seed_matrix(points, "losses")
    fit = scaling.first(scaling.fit_many(x, losses, form, irreducible=irreducible, predict_at=predict_at))
    if fit["at_edge"]:
        reason = (
            f"alpha's best value lies at the end of the range searched ({scaling.ALPHA_GRID[0]:g} to "
            f"{scaling.ALPHA_GRID[-1]:g}): the losses do not bend like E + A*N^-alpha"
            if form == "saturating"
            else f"a mean loss is not above the irreducible loss E0 = {irreducible:g}"
        )
        return {**head, "not_fitted": f"not fitted: {reason}"}
    fit["residuals"] = [float(m - f) for m, f in zip(fit["means"], fit["fitted"])]
    if predict_at is not None:
        fit["predicted"]["at"] = predict_at
        fit["predicted"]["extrapolation"] = not (x.min() <= predict_at <= x.max())
    return {**head, **fit, "x": x.tolist()}


def _trend(points: list[dict], norm: str, base: str) -> dict:
    """The slope of ``norm``'s paired gap to the baseline against log10 N, with its interval and one line."""
    paired, left_out = _spread_points([p for p in points if p["gaps"]], "gaps")
    said = f"; {'; '.join(left_out)}" if left_out else ""
    if len(paired) < 2:
        return {
            "verdict": f"no trend: {norm} is paired with {base} at {len(paired)} size(s); it needs 2 or more{said}",
            "left_out": left_out,
        }
    n = np.array([p["n_params"] for p in paired], float)
    slope = scaling.first(scaling.trend_many(n, seed_matrix(paired, "gaps")))
    slope["center_log10_n"] = float(np.log10(n).mean())
    slope["gap_at_center"] = float(np.mean([np.mean(list(p["gaps"].values())) for p in paired]))
    slope["sizes"] = [p["size"] for p in paired]
    slope["left_out"] = left_out
    if not math.isfinite(slope["low"]):
        why = "one seed at every size" if max(len(p["gaps"]) for p in paired) < 2 else "equal gaps"
        return {**slope, "verdict": f"no trend interval: the seeds give no spread ({why}){said}"}
    interval = f"{slope['mean']:+.4f} [{slope['low']:+.4f}, {slope['high']:+.4f}] per 10x parameters"
    if not slope["low"] <= 0 <= slope["high"]:  # the interval excludes no change
        grows = (slope["mean"] > 0) == (slope["gap_at_center"] > 0)
        side = "loses ground to" if slope["mean"] > 0 else "gains on"
        verdict = f"the gap {'grows' if grows else 'shrinks'} with size: {norm} {side} {base} by {interval}"
    else:
        verdict = f"no trend detected: a constant gap fits; {norm} - {base} changes by {interval}"
    return {**slope, "verdict": f"{verdict} (p = {slope['p']:.3g}, {len(paired)} sizes, {slope['method']}){said}"}


def _result(sizes: list[dict], predict_at: float | None, form: str, irreducible: float) -> dict:
    base, points, without = _norm_points(sizes)
    norms = {}
    for norm, pts in points.items():
        norms[norm] = {
            "points": pts,
            "sizes_without": without.get(norm, []),
            "fit_n_params": _fit(pts, "n_params", form, irreducible, predict_at),
            "fit_flops": _fit(pts, "flops", form, irreducible, None),
            "trend": None if norm == base else _trend(pts, norm, base),
        }
    return {
        "baseline": base,
        "mixed_shapes": mixed_shapes([s["size"] for s in sizes]),
        "predict_at": predict_at,
        "sizes": [
            {k: s[k] for k in ("size", "n_params", "tokens", "flops", "folder")}
            | {"baseline_group": s["comparison"]["baseline"], "shared": s["comparison"]["shared"]}
            | {"chosen_rates": _chosen(s["comparison"].get("selection"))}
            for s in sizes
        ],
        "norms": norms,
    }


def _chosen(selection: dict | None) -> dict | None:
    """Each norm type's learning rate chosen on validation at one size (None: no rate was chosen there)."""
    return {f["family"]: f["chosen_value"] for f in selection["families"]} if selection else None


def _ci(v: dict, spec: str = ".4f") -> str:
    if v.get("low") is None or not math.isfinite(v["low"]):
        return f"{v['mean']:{spec}} (no interval: the seeds give no spread)"
    return f"{v['mean']:{spec}} [{v['low']:{spec}}, {v['high']:{spec}}] ({v['method']}, df {v['df']:.3g})"


def _gap(g: dict) -> str:
    return f"{_loss(g['diff'], '+')} [{_loss(g['low'], '+')}, {_loss(g['high'], '+')}] ({g['method']})"


def _fit_line(fit: dict) -> str:
    if "not_fitted" in fit:
        return fit["not_fitted"]
    words = f"alpha {_ci(fit['alpha'])}"
    if fit.get("instead_of_saturating"):
        words = f"(the log-log line, as {fit['instead_of_saturating']}) {words}"
    if fit["form"] == "saturating":
        words += f", E {_ci(fit['E_interval'])}, A {fit['A']:.4g}"
    else:
        words += f", A {fit['A']:.4g} (E0 = {fit['irreducible']:g} given)"
    return words + (f"; but {fit['warning']}" if fit.get("warning") else "")


def _prediction_lines(fit: dict) -> list[str]:
    """The predicted test loss, by which form, and the other form's where their intervals do not overlap: an
    interval covers the seeds' noise for one form, not the choice between forms."""
    pred = fit.get("predicted")
    if pred is None:
        return []
    kind = "an extrapolation beyond the sizes fitted" if pred["extrapolation"] else "within the sizes fitted"
    lines = [
        f"  - predicted test loss at N = {count_text(pred['at'])} by {fit['formula']}: {_ci(pred)} ({kind}; the "
        "interval is over seeds for this form and does not cover the choice of form)"
    ]
    other = fit.get("other_form")
    if other and not (other["predicted"]["low"] <= pred["high"] and pred["low"] <= other["predicted"]["high"]):
        but = f", though {other['problem']}" if other.get("problem") else ""
        lines.append(
            f"  - **the forms disagree**: {other['formula']} predicts {_ci(other['predicted'])}{but}; the intervals "
            "do not overlap, so the prediction depends on the form more than on the seeds: these sizes cannot "
            "tell which holds at that size"
        )
    return lines


def _loss_table(result: dict) -> list[str]:
    """Each norm type's mean test loss at each size (in bits per byte too), its fitted value against N and residual."""
    lines = ["", "## Test loss by size", "", "| norm type | size | group | seeds | mean | bits/byte | fitted (N) | "
              "residual |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for norm, n in result["norms"].items():
        fit = n["fit_n_params"]
        fitted = dict(zip(fit["sizes"], zip(fit["fitted"], fit["residuals"]))) if "fitted" in fit else {}
        for p in n["points"]:
            f = fitted.get(p["size"])
            cells = f"{_loss(f[0])} | {_loss(f[1], '+')}" if f is not None else "- | -"
            bpb = "-" if p.get("mean_bits_per_byte") is None else f"{p['mean_bits_per_byte']:.4f}"
            lines.append(
                f"| {norm} | {p['size']} | {p['group']} | {len(p['losses'])} | {_loss(p['mean'])} | {bpb} | {cells} |"
            )
    return lines


def markdown(result: dict) -> str:
    """The comparison across sizes as Markdown (from the result alone, as comparison.json holds it)."""
    result = escaped(result)
    lines = [f"# Comparison across sizes (baseline: {result['baseline']})", ""]
    lines += [
        "Each size is its own comparison (sizes/<size>/comparison.md): the same rules, paired by seed. Across sizes "
        "only the size keys (model.size, n_layers, d_model, n_heads) and the length that train.tokens_per_param "
        "gives each size differ. N: parameters outside the norm layers; FLOPs: training FLOPs (6 x matmul "
        "weights + attention, per token, x tokens).",
        "",
    ]
    if result.get("mixed_shapes"):
        lines += [f"**Not one ladder:** {result['mixed_shapes']}; read the fits below with that in mind.", ""]
    if any(s["chosen_rates"] for s in result["sizes"]):
        lines += [
            "Each norm type's learning rate was chosen on validation loss at each size (sizes/<size>/comparison.md, "
            "'Learning rate chosen on validation'); the test losses below are at the chosen rates, on the runs that "
            "chose them, so every interval here is optimistic by that choice.",
            "",
        ]
    lines += ["| size | N | tokens | training FLOPs | baseline group |", "|---|---|---|---|---|"]
    for s in result["sizes"]:
        lines.append(
            f"| {s['size']} | {count_text(s['n_params'])} | {count_text(s['tokens'])} | {count_text(s['flops'])} | "
            f"{s['baseline_group']} |"
        )
    lines += _loss_table(result)
    lines += [
        "",
        "## Fits per norm type",
        "",
        "Least squares on the per-size means: saturating, E + A*N^-alpha (4 sizes or more), or power, the log-log "
        "line of L - E0 (below 4 sizes, where E cannot be identified). Intervals: 95% over seeds by the delta "
        "method, seed by seed where every seed has every size (a t interval over the seeds), else by size "
        "(Satterthwaite) (gpt.analysis.scaling); they hold for these sizes, not for the choice of the curve's form.",
        "",
    ]
    for norm, n in result["norms"].items():
        lines.append(f"- **{norm}** against N ({n['fit_n_params']['formula']}): {_fit_line(n['fit_n_params'])}")
        lines.append(f"  - against training FLOPs: {_fit_line(n['fit_flops'])}")
        lines += [f"  - {said}" for said in [*n.get("sizes_without", []), *(n["fit_n_params"].get("left_out") or [])]]
        lines += _prediction_lines(n["fit_n_params"])
    lines += ["", "## The gap to the baseline with size", ""]
    for norm, n in result["norms"].items():
        if n["trend"] is None:
            continue
        gaps = [f"{p['size']}: {_gap(p['gap'])}" for p in n["points"] if p["gap"] is not None]
        lines += [f"- **{norm}** - {result['baseline']}, paired by seed: {'; '.join(gaps)}"]
        lines += [f"  - {n['trend']['verdict']}"] + [f"  - {said}" for said in n.get("sizes_without", [])]
    failed = [x for f in result.get("failed") or [] for x in ("", f"**Failed, no result:** {f['run']}: {f['error']}")]
    return "\n".join([*lines, *speedup.lines(result.get("effective_speedup")), *failed]) + "\n"
