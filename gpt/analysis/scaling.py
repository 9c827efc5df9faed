"""The numbers of a study across model sizes: the loss fitted against size per norm type, with intervals over seeds,
a prediction at a named size, and the trend of a norm type's gap to the baseline with size.

Every function takes one norm type's runs as arrays over D data sets (a study is D = 1; the simulations that test
the coverage pass thousands at once): ``x`` (S,) the sizes' scales (non-norm parameters N, or training FLOPs) and
``losses`` (D, K, S) each of K seeds' test loss at each of S sizes, NaN where a seed has no run at a size (the
trend: ``gaps``, each seed's paired difference to the baseline, the same way).

**Forms.** ``saturating``: ``L(N) = E + A * N^-alpha`` by least squares on the per-size means (each size one
point, whatever its seeds): for a fixed alpha, E and A are a straight-line fit, so alpha is found by profiling the
residual sum of squares over alpha (a grid, then golden-section search between the grid's neighbours of its
minimum). It has three parameters and needs four sizes or more: three points fit any such curve exactly, so E is
not identified by them (nor is the fit's lack of fit visible). ``power``: the log-log line of the reducible part,
``log(L - E0) = log A - alpha * log N``, with the irreducible loss E0 given (default 0: the loss itself is the
power law); two parameters, two sizes or more. ``auto`` is saturating from four sizes, power below.

**Intervals over seeds** (the delta method): every fitted quantity q is, to first order, a linear combination
of the per-size means, ``q ~ sum_s c_s * mean_s`` (c: its gradient with respect to the means; for least squares
the Gauss-Newton sensitivity ``(J'J)^-1 J'``). Where every seed has a loss at every size (a sweep's grid), the
combination is taken seed by seed, ``q_k = sum_s c_s * loss_ks``, and its mean gets the t interval over the K
seeds (K - 1 degrees of freedom): exact for normal noise whatever the noise at each size, and whatever the
correlation between one seed's sizes (the same train.seed gives every size the same data order, so the sizes'
losses are not independent). Otherwise (a run missing), ``var(q) = sum_s c_s^2 var_s`` with Satterthwaite's
degrees of freedom, taking the sizes as independent. tests/analysis/test_scaling_coverage.py simulates both:
seed by seed covers at 95% for 2, 3 and 5 seeds, with or without correlation between sizes. The interval is
over seeds: it is the uncertainty of the fit to these sizes' true mean losses, not of the form of the curve, and
a prediction beyond the sizes fitted (an extrapolation) holds only as far as the form does.

**The gap's trend**: each seed's paired difference to the baseline at each size, their per-size means regressed
on log10 N by ordinary least squares; the slope is the change of the gap per tenfold parameters, its interval
the same way (seed by seed, or by size).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from gpt.analysis.stats import LEVEL, _t_interval_many
from gpt.config.sizes import SIZES

FORMS = ("auto", "saturating", "power")
PARAMETERS = {"saturating": 3, "power": 2}  # what each form fits
NEEDS = {"saturating": 4, "power": 2}  # sizes it needs: saturating one more than its parameters (see above)
FORMULA = {"saturating": "E + A*N^-alpha", "power": "log(L - E0) = log A - alpha*log N"}
ALPHA_GRID = np.geomspace(1e-3, 4.0, 200)  # where the saturating fit's alpha is searched
SEED_BY_SEED = "seed by seed"  # how an interval's se was found (``spread``)
BY_SIZE = "by size, Satterthwaite"
PREDICTABLE = (1e3, 1e15)  # the parameter counts --predict-at accepts
GOLDEN_STEPS = 48  # golden-section steps after the grid: the bracket shrinks by 0.618^48 ~ 1e-10


def chosen_form(form: str, n_sizes: int) -> str:
    """The form ``auto`` stands for with ``n_sizes`` sizes: saturating when it is identified, else power."""
    if form != "auto":
        return form
    return "saturating" if n_sizes >= NEEDS["saturating"] else "power"


def not_fitted(form: str, sizes: list[str]) -> str | None:
    """Why ``form`` cannot be fitted to ``sizes`` (None: it can)."""
    if len(sizes) >= NEEDS[form]:
        return None
    why = (
        "one more than its parameters: three sizes fit any such curve exactly, so E is not identified"
        if form == "saturating"
        else "a line needs two points"
    )
    also = "; the log-log line of L - E0 (--form power) needs 2" if form == "saturating" else ""
    return (
        f"not fitted: {FORMULA[form]} has {PARAMETERS[form]} parameters and these runs have {len(sizes)} "
        f"size{'s' if len(sizes) != 1 else ''} ({', '.join(sizes) or 'none'}): it needs {NEEDS[form]} or more "
        f"({why}){also}"
    )


def _line(z: np.ndarray, means: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of ``means ~ E + A * z`` per data set (rows): E, A and the residual sum of squares."""
    zc, mc = z - z.mean(1, keepdims=True), means - means.mean(1, keepdims=True)
    a = (zc * mc).sum(1) / (zc * zc).sum(1)
    e = means.mean(1) - a * z.mean(1)
    return e, a, ((means - e[:, None] - a[:, None] * z) ** 2).sum(1)


def _saturating(x: np.ndarray, means: np.ndarray) -> dict:
    """``E + A * x^-alpha`` by profile least squares (module docstring); ``at_edge``: the best alpha is at the end of
    the searched range, so no minimum was found inside it (a curve that does not bend, or rises)."""
    d = means.shape[0]

    def rss(alpha: np.ndarray) -> np.ndarray:
        return _line(x[None, :] ** -alpha[:, None], means)[2]

    grid = np.stack([rss(np.full(d, a)) for a in ALPHA_GRID], 1)  # (D, grid)
    best = np.nanargmin(np.where(np.isnan(grid), np.inf, grid), 1)
    low, high = ALPHA_GRID[np.maximum(best - 1, 0)], ALPHA_GRID[np.minimum(best + 1, len(ALPHA_GRID) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, e = high - ratio * (high - low), low + ratio * (high - low)
    rss_c, rss_e = rss(c), rss(e)
    for _ in range(GOLDEN_STEPS):  # each step keeps one inner point and its sum of squares: one new evaluation
        left = rss_c < rss_e  # the minimum lies in [low, e]: e becomes high, c the new e
        high, low = np.where(left, e, high), np.where(left, low, c)
        new = np.where(left, high - ratio * (high - low), low + ratio * (high - low))
        rss_new = rss(new)
        c, e = np.where(left, new, e), np.where(left, c, new)
        rss_c, rss_e = np.where(left, rss_new, rss_e), np.where(left, rss_c, rss_new)
    alpha = (low + high) / 2
    z = x[None, :] ** -alpha[:, None]
    e, a, _ = _line(z, means)
    jac = np.stack([np.ones_like(z), z, -a[:, None] * z * np.log(x)[None, :]], 2)  # (D, S, [E, A, alpha])
    with np.errstate(all="ignore"):
        sens = np.linalg.solve(np.einsum("dsi,dsj->dij", jac, jac), np.swapaxes(jac, 1, 2))  # (D, 3, S)
    at_edge = (best == 0) | (best == len(ALPHA_GRID) - 1)
    return {"E": e, "A": a, "alpha": alpha, "sensitivity": sens, "at_edge": at_edge}


def _power(x: np.ndarray, means: np.ndarray, irreducible: float) -> dict:
    """The log-log line of ``means - irreducible`` against x (module docstring); ``at_edge``: some mean is not above
    the irreducible loss, so it has no logarithm."""
    reducible = means - irreducible
    at_edge = (reducible <= 0).any(1)
    with np.errstate(all="ignore"):
        y = np.log(reducible)
    lx = np.log(x)
    design = np.stack([np.ones_like(lx), lx], 1)  # (S, 2)
    hat = np.linalg.solve(design.T @ design, design.T)  # (2, S): the line's coefficients from y
    coef = y @ hat.T  # (D, 2): log A, -alpha
    a = np.exp(coef[:, 0])
    with np.errstate(all="ignore"):
        dy = hat[None, :, :] / reducible[:, None, :]  # (D, 2, S): d coef / d means
    sens = np.stack([np.zeros_like(dy[:, 0]), a[:, None] * dy[:, 0], -dy[:, 1]], 1)  # (D, [E, A, alpha], S)
    e = np.full(means.shape[0], float(irreducible))
    return {"E": e, "A": a, "alpha": -coef[:, 1], "sensitivity": sens, "at_edge": at_edge}


def satterthwaite(c: np.ndarray, var: np.ndarray, df: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The se and Welch-Satterthwaite degrees of freedom of ``sum_s c_s * mean_s`` with independent means of
    variance ``var`` on ``df`` degrees of freedom (rows: data sets). NaN where a mean has no variance (one seed)."""
    terms = c * c * var
    total = terms.sum(-1)
    with np.errstate(all="ignore"):
        dof = total**2 / (terms**2 / df).sum(-1)
    return np.sqrt(total), dof


def spread(c: np.ndarray, losses: np.ndarray) -> dict:
    """The se and degrees of freedom of ``sum_s c_s * mean_s`` (c: (D, S)) from the seeds' ``losses`` (D, K, S; NaN
    where a seed has no loss at a size). Where every seed has a loss at every size (a sweep's grid), seed by seed:
    the combination of each seed's losses, ``q_k = sum_s c_s * loss_ks``, is one draw per seed, and its mean's t
    interval over the K seeds is exact for normal noise, however the noise differs between sizes and however the
    sizes' losses of one seed are correlated (the same train.seed gives every size the same data order). Otherwise,
    per size, Satterthwaite's sum (``satterthwaite``), which takes the sizes as independent."""
    missing = np.isnan(losses)
    complete = ~missing.any((1, 2))
    k = losses.shape[1]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a size with one seed: no variance, NaN
        q = np.einsum("ds,dks->dk", c, np.where(missing, 0.0, losses))
        by_seed = q.std(1, ddof=1) / math.sqrt(k) if k > 1 else np.full(len(q), np.nan)
        n = (~missing).sum(1)
        se, df = satterthwaite(c, np.nanvar(losses, 1, ddof=1) / n, n - 1.0)
    return {
        "se": np.where(complete, by_seed, se),
        "df": np.where(complete, k - 1.0, df),
        "method": np.where(complete, SEED_BY_SEED, BY_SIZE),
    }


def _interval(estimate: np.ndarray, c: np.ndarray, losses: np.ndarray, level: float) -> dict:
    s = spread(c, losses)
    return {**_t_interval_many(estimate, s["se"], s["df"], level), "method": s["method"]}


def fitted_scaled(x: np.ndarray, losses: np.ndarray, form: str, irreducible: float) -> tuple[dict, float, np.ndarray]:
    """``form`` fitted to the per-x means of ``losses`` (D, K, S) at ``x / ref``, ref the geometric mean of x: the
    fit in that scaled unit (E, A, alpha, their ``sensitivity`` (D, 3, S) to the means, ``at_edge``), ref, and the
    means (D, S)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a size no seed reached: NaN
        means = np.nanmean(losses, 1)
    ref = float(np.exp(np.log(x).mean()))
    raw = _saturating(x / ref, means) if form == "saturating" else _power(x / ref, means, irreducible)
    return raw, ref, means


def fit_many(
    x: np.ndarray,
    losses: np.ndarray,
    form: str,
    *,
    irreducible: float = 0.0,
    predict_at: float | None = None,
    level: float = LEVEL,
) -> dict:
    """Fit ``form`` (saturating or power) to the mean over seeds of ``losses`` (D, K seeds, S sizes; NaN: no
    loss) at scales ``x`` (S): E, A (in x's own unit), alpha with its interval and, at ``predict_at`` (x's unit),
    the predicted loss with its interval (``spread``). x is scaled by its geometric mean inside (the fit's numbers
    stay well conditioned over 6 orders of size)."""
    x, losses = np.asarray(x, float), np.asarray(losses, float)
    raw, ref, means = fitted_scaled(x, losses, form, irreducible)
    scaled = x / ref
    sens, alpha, a = raw["sensitivity"], raw["alpha"], raw["A"]
    out = {
        "E": raw["E"],
        "A": a * ref**alpha,  # back in x's own unit: A_ref * (x/ref)^-alpha = (A_ref * ref^alpha) * x^-alpha
        "alpha": _interval(alpha, sens[:, 2], losses, level),
        "at_edge": raw["at_edge"],
        "fitted": raw["E"][:, None] + a[:, None] * scaled[None, :] ** -alpha[:, None],
        "means": means,
    }
    if form == "saturating":
        out["E_interval"] = _interval(raw["E"], sens[:, 0], losses, level)
    if predict_at is not None:
        z = (predict_at / ref) ** -alpha
        grad = np.stack([np.ones_like(z), z, -a * z * math.log(predict_at / ref)], 1)  # d loss / d (E, A, alpha)
        out["predicted"] = _interval(raw["E"] + a * z, np.einsum("di,dis->ds", grad, sens), losses, level)
    return out


def trend_many(n: np.ndarray, gaps: np.ndarray, level: float = LEVEL) -> dict:
    """The slope of the gap against log10 N (``gaps``: D, K seeds, S sizes at ``n`` parameters; each a seed's paired
    difference, NaN where it has none), least squares on the per-size means, with its interval (``spread``): the
    gap's change per tenfold parameters."""
    lx = np.log10(np.asarray(n, float))
    w = (lx - lx.mean()) / ((lx - lx.mean()) ** 2).sum()
    gaps = np.asarray(gaps, float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        slope = (w * np.nanmean(gaps, 1)).sum(-1)
    return _interval(slope, np.broadcast_to(w, (len(gaps), len(w))), gaps, level)


def seed_order(label: str) -> tuple[int, str]:
    """A sort key of seed labels (``gpt.analysis.runs.seed_label``) in numeric order, 2 before 10, without parsing
    them: the order of a seed matrix's rows. Here, not beside seed_label, so that a sweep's checks import no torch."""
    return len(label), label


def first(many: dict) -> dict:
    """One data set's numbers out of a ``*_many`` result: plain floats (and bools), nested dicts alike."""
    out = {}
    for key, value in many.items():
        if isinstance(value, dict):
            out[key] = first(value)
        elif isinstance(value, np.ndarray) and value.ndim == 2:
            out[key] = [float(v) for v in value[0]]
        elif isinstance(value, np.ndarray):
            out[key] = value[0].item()
        else:
            out[key] = value
    return out


def add_arguments(parser, sweep: bool = False) -> None:
    """A command's options of the size axis: --predict-at, then a sweep's --sizes (each size trained) or a
    comparison's --across-sizes, --form and --irreducible (runs of several sizes compared)."""
    from argparse import ArgumentTypeError

    def count(text: str) -> float:
        try:
            value = parse_count(text)
        except ValueError as e:
            raise ArgumentTypeError(str(e)) from None
        if not PREDICTABLE[0] <= value <= PREDICTABLE[1]:
            raise ArgumentTypeError(f"{text!r}: a model's parameter count, between 1k and 1000T")
        return value

    def irreducible(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ArgumentTypeError(f"{text!r}: a loss in nats, finite and 0 or more")
        return value

    add = parser.add_argument
    add("--predict-at", type=count, metavar="N", help="also predict each norm type's test loss at N parameters "
        "outside the norms (124M, 1.5B) with its interval, said an extrapolation beyond the sizes fitted")  # fmt: skip
    if sweep:
        add("--sizes", nargs="+", choices=list(SIZES), metavar="SIZE", help="model sizes crossed with the grid, "
            "each trained on train.tokens_per_param x its parameters, then compared across sizes "
            f"(compare.py --across-sizes); sizes: {' '.join(SIZES)}")  # fmt: skip
        return
    add("--across-sizes", action="store_true", help="runs of several model.size: each size compared, then the "
        "loss fitted against size per norm type, and the gap's trend with size")  # fmt: skip
    add("--form", choices=FORMS, default="auto", help="saturating: E + A*N^-alpha (4 sizes or more); power: the "
        "log-log line of L - E0 (2 or more); auto (default): saturating from 4 sizes")  # fmt: skip
    add("--irreducible", type=irreducible, default=None, metavar="E0", help="the power form's irreducible loss "
        "(default 0; the saturating form fits its own E)")  # fmt: skip


def count_text(x: float | None) -> str:
    """A count as a reader takes it in, ``parse_count``'s way back: 124M, 1.5B, 350k, 3.26T (3 digits); "-" for None."""
    if x is None:
        return "-"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def parse_count(text: str) -> float:
    """A parameter count as a user writes it: 124M, 1.5B, 350k, 2e9 (k, M, B or G, T: powers of 1000)."""
    units = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    body, scale = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1.0)
    try:
        value = float(body) * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: expected a positive count such as 124M, 1.5B, 350k or 2e9")
    return value
