"""A learning rate chosen on validation (``compare --select-on val``): per norm type, the rate whose runs have the
lowest mean validation loss over their seeds. The test set never chooses; the comparison of test losses then
uses each norm type's chosen rate only.

The groups of a comparison (``gpt.analysis.table``) that differ only in ``optim.lr`` form a *family*: a norm type
(with one value of each other ``--vary`` key). Each run's validation loss is the last its metrics record
(``val_loss``): the trainer measures it at the run's last step too, so it is the loss of the final weights, the
ones the test loss is of. A rate is a candidate when it has a run at every seed any rate of its family has and
every one of them completed with a finite final validation loss (a diverged, unfinished or missing run makes its
rate not eligible, and says why); the chosen rate is the candidate with the lowest mean, a tie going to the lower
rate. The choice is made on the same runs whose test losses are then reported, so those carry the luck that
helped their rate win: each norm type's test loss is low by about ``optimism``'s bound, in favour of the norm type
with more rates near its best, and more seeds shrink it only as the standard error does. The report says so, with
the bound. ``sweep.py --confirm-seeds`` removes it: the rates chosen here are trained again on fresh seeds and only
those are compared (``gpt.sweep``). A chosen rate at either end of its grid is flagged (``edge``): the optimum may
lie beyond it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

from gpt.common.errors import UserError
from gpt.run.directory import COMPLETED

SELECT_ON = ("val",)  # what a rate may be chosen on: the validation loss (never the test loss)
LR_KEY = "optim.lr"
# how the single-stage interval did in tests/analysis/test_selection_coverage.py's designs (the test holds these)
SINGLE_STAGE_COVERED, SINGLE_STAGE_MISSED = (90, 94), (6, 10)  # percent: covered; missed on the favoured side
MEASURE = (
    "each run's last validation loss (metrics.jsonl val_loss; a run measures one at its last step, so it is the "
    "loss of its final weights, whose test loss is reported)"
)


def check_select_on(select_on: str | None, from_results: bool) -> None:
    """Refuse, before anything is read, a selection that cannot be made."""
    if select_on is None:
        return
    if select_on not in SELECT_ON:
        raise UserError(f"--select-on {select_on}: rates are chosen on {', '.join(SELECT_ON)} only, never on test")
    if from_results:
        raise UserError(
            "--select-on val reads each run's validation loss from its folder; a results table holds test losses only"
        )


def final_val_loss(metrics: list[dict]) -> tuple[int, float] | None:
    """(step, loss) of the last validation loss a run's metrics records hold; None if they hold none."""
    for record in reversed(metrics):
        if "val_loss" in record and record["val_loss"] is not None:
            return record["step"], float(record["val_loss"])
    return None


def _family(values: dict, axis: str, key: str) -> str:
    """A family's label: the norm type, then ``, key=value`` for every --vary key but the rate's."""
    return ", ".join([str(values[axis]), *(f"{k}={v}" for k, v in values.items() if k not in (axis, key))])


def _rate(group, key: str, seeds: list[str]) -> dict:
    """One rate of a family: each run's final validation loss, their mean and spread, and whether it may be chosen
    (every run completed with a finite one, and a run at each of the family's ``seeds``)."""
    runs, losses = [], []
    reasons = [f"no run of seed {seed}" for seed in seeds if seed not in {r.seed for r in group.runs}]
    for r in group.runs:
        measured = final_val_loss(r.metrics)
        step, loss = measured if measured is not None else (None, None)
        runs.append({"path": str(r.path), "seed": r.seed, "status": r.status, "val_loss": loss, "val_step": step})
        if r.status != COMPLETED:
            reasons.append(f"seed {r.seed} {r.left_out_because()}")
        elif not math.isfinite(loss):
            reasons.append(f"seed {r.seed} validation loss {loss}")
        else:
            losses.append(loss)
    eligible = not reasons and bool(losses)
    return {
        "group": group.label,
        "value": group.values.get(key),
        "runs": runs,
        "n": len(losses),
        "val_loss_mean": float(np.mean(losses)) if eligible else math.nan,
        "val_loss_sd": float(np.std(losses, ddof=1)) if eligible and len(losses) > 1 else math.nan,
        "val_loss_min": min(losses) if eligible else math.nan,
        "val_loss_max": max(losses) if eligible else math.nan,
        "eligible": eligible,
        "reason": "; ".join(reasons) or None,
        "chosen": False,
    }


def select_rates(groups: list, axis: str, key: str = LR_KEY) -> dict:
    """Per family of ``groups`` (``gpt.analysis.runs.Group``; ``axis``: the norm type's key), every rate's
    validation loss and the rate chosen; refuses groups that do not vary ``key`` and a completed run without a
    validation loss."""
    rates = {g.values.get(key) for g in groups}
    if len(rates) < 2:
        raise UserError(
            f"--select-on val chooses among learning rates, but every run has {key}={rates.pop()}; compare runs "
            f"at several rates (sweep.py --lrs), or drop --select-on"
        )
    for g in groups:
        for r in g.runs:
            if r.status == COMPLETED and final_val_loss(r.metrics) is None:
                raise UserError(
                    f"--select-on val: {r.path.name} completed without a validation loss in its metrics (a run "
                    "measures one every train.eval_every steps and at its end); compare runs that recorded it"
                )
    members: dict[str, list] = {}
    for g in groups:
        members.setdefault(_family(g.values, axis, key), []).append(g)
    families = {}
    for label, family_groups in members.items():
        seeds = sorted({r.seed for g in family_groups for r in g.runs})
        rates = [_rate(g, key, seeds) for g in family_groups]
        families[label] = {"family": label, "chosen": None, "chosen_value": None, "rates": rates}
    for family in families.values():
        family["rates"].sort(key=lambda rate: rate["value"])
        candidates = [rate for rate in family["rates"] if rate["eligible"]]
        if candidates:
            best = min(candidates, key=lambda rate: (rate["val_loss_mean"], rate["value"]))
            best["chosen"] = True
            family["chosen"], family["chosen_value"] = best["group"], best["value"]
    for family in families.values():
        family["edge"] = edge(family)
    steps = {run["val_step"] for f in families.values() for r in f["rates"] for run in r["runs"] if r["eligible"]}
    return {
        "on": "val",
        "key": key,
        "measure": MEASURE,
        "val_steps": sorted(steps),  # where the runs that could be chosen measured it
        "families": list(families.values()),
    }


def edge(family: dict) -> str | None:
    """ "lowest" or "highest" when the family's chosen rate is its grid's smallest or largest (of three or more
    rates... or two: either is an end), else None: the optimum may then lie beyond the grid."""
    values = [rate["value"] for rate in family["rates"]]
    if family["chosen_value"] is None or len(values) < 2:
        return None
    if family["chosen_value"] == min(values):
        return "lowest"
    return "highest" if family["chosen_value"] == max(values) else None


def edge_line(family: dict, key: str = LR_KEY) -> str | None:
    """The one line that flags a chosen rate at an end of the grid; None where it is inside."""
    side = family.get("edge")
    if side is None:
        return None
    way = "below" if side == "lowest" else "above"
    return (
        f"{family['family']}: the chosen {key} {family['chosen_value']:g} is the grid's {side}: its best rate may lie "
        f"{way} it; add rates {way} to --lrs"
    )


def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (0 for k = 1): ``selected_noise`` of k equal means."""
    return float(selected_noise(np.zeros((1, max(k, 1))))[0])


GRID = np.linspace(-8.0, 8.0, 81)  # where selected_noise integrates (a smooth, fast-decaying integrand)


def selected_noise(gaps: np.ndarray) -> np.ndarray:
    """E[-Z_chosen] where the chosen of R means ``gaps_r + Z_r`` (Z standard normal) is the lowest: how far below
    its true mean the winner's mean lands, in standard errors of one mean. ``gaps`` (..., R): the true means in
    standard errors (only their differences matter). All equal gives E[max of R normals]; one mean far below the
    rest gives 0. Rate r wins with Z_r = z when every other Z_j > z + gaps_r - gaps_j, so the answer is
    ``sum_r integral -z phi(z) prod_(j != r) Phi(-(z + gaps_r - gaps_j)) dz``, integrated on ``GRID``."""
    gaps = np.asarray(gaps, float)
    d = gaps[..., :, None] - gaps[..., None, :]  # (..., r, j): gaps_r - gaps_j
    beaten = special.ndtr(-(d[..., None] + GRID))  # (..., r, j, z): P(Z_j > z + gaps_r - gaps_j)
    beaten[..., np.arange(d.shape[-1]), np.arange(d.shape[-1]), :] = 1.0  # r does not compete with itself
    wins = beaten.prod(-2)  # (..., r, z): r's mean is the lowest given Z_r = z
    integrand = -GRID * scipy_stats.norm.pdf(GRID) * wins.sum(-2)
    return np.maximum(0.0, np.trapezoid(integrand, GRID, axis=-1))  # >= 0: rounding aside, the winner gains


LEVEL_EACH = 0.99  # each part of a bound (the spread, the curve, the correlation) holds with this confidence


def _double_centred(values: np.ndarray) -> np.ndarray:
    """Residuals of (..., rates, seeds) matrices around their rate means and seed means: what is left of a run once
    its rate's effect and its seed's (the same init and data order at every rate, which cannot make one rate win)
    are taken out; (rates - 1) x (seeds - 1) degrees of freedom."""
    return (
        values - values.mean(-1, keepdims=True) - values.mean(-2, keepdims=True) + values.mean((-2, -1), keepdims=True)
    )


def family_optimism(val: np.ndarray, rho, rho_low) -> dict:
    """Families' optimism from their eligible rates' validation losses ``val`` (..., rates, seeds; the chosen rate
    is the row with the lowest mean), in nats: ``bound`` the estimate, ``upper`` and ``lower`` confidence limits
    (arrays over the leading axes; ``rho``, ``rho_low`` broadcast against them).

    sd: the run noise, from the double-centred residuals (``_double_centred``), made unbiased (c4). The estimate is
    ``rho * sd / sqrt(n) * selected_noise(curve)``, the curve being the rate means shrunk towards their mean by
    the share of their spread that the noise does not explain (empirical Bayes: a flat curve's means differ by
    noise alone and shrink to flat). ``upper``: the correlation taken as 1, sd at its upper limit and every gap to
    the chosen rate at its smallest (Bonferroni over the rate pairs), where the chosen rate gains most;
    ``lower``: the correlation and sd at their lower limits and every gap at its largest. Each limit's parts hold
    with LEVEL_EACH confidence each."""
    val = np.asarray(val, float)
    rates, n = val.shape[-2:]
    df = (rates - 1) * (n - 1)
    root_ms = np.sqrt((_double_centred(val) ** 2).sum((-2, -1)) / df)  # its limits are chi-square's
    chi_low, chi_high = scipy_stats.chi2.ppf([LEVEL_EACH, 1 - LEVEL_EACH], df)
    sd_low, sd_high = root_ms * math.sqrt(df / chi_low), root_ms * math.sqrt(df / chi_high)
    c4 = math.sqrt(2 / df) * math.exp(special.gammaln((df + 1) / 2) - special.gammaln(df / 2))
    sd = root_ms / c4  # unbiased for the noise's sd (the root mean square reads low by c4: 0.89 at 2 df)
    means = val.mean(-1)
    se = sd / math.sqrt(n)
    spread = means.var(-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(spread > 0, np.maximum(0.0, 1.0 - se**2 / spread), 0.0)  # the curve's share of it
        gaps = means - means.min(-1, keepdims=True)
        margin = scipy_stats.norm.ppf(1 - (1 - LEVEL_EACH) / (rates * (rates - 1))) * math.sqrt(2)
        low_gaps = np.clip(np.nan_to_num(gaps / (sd_high / math.sqrt(n))[..., None], posinf=1e6) - margin, 0.0, 1e6)
        high_gaps = np.minimum(np.nan_to_num(gaps / (sd_low / math.sqrt(n))[..., None], posinf=1e6) + margin, 1e6)
        high_gaps = np.where(gaps == 0, 0.0, high_gaps)  # the chosen rate
        shrunk = share[..., None] * (means - means.mean(-1, keepdims=True)) / se[..., None]
        shrunk = np.clip(np.nan_to_num(shrunk, posinf=1e6, neginf=-1e6), -1e6, 1e6)  # a noiseless curve: far apart
    return {
        "k": rates, "n": n, "df": df, "sd": sd, "curve_share": share,
        "bound": np.asarray(rho) * se * selected_noise(shrunk),
        "upper": sd_high / math.sqrt(n) * selected_noise(low_gaps),
        "lower": np.asarray(rho_low) * sd_low / math.sqrt(n) * selected_noise(high_gaps),
    }  # fmt: skip


def correlation(val: np.ndarray, test: np.ndarray, df) -> tuple:
    """The validation-test correlation of runs' double-centred residuals (``val``, ``test``: (..., runs), the
    residuals of the families pooled), its lower confidence limit (Fisher's z, the residuals counting as ``df`` +
    1 runs, LEVEL_EACH) : 1 and 0 where it cannot be estimated (no spread, or df under 3)."""
    vv, tt, vt = (val * val).sum(-1), (test * test).sum(-1), (val * test).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where((vv > 0) & (tt > 0) & (df >= 2), np.clip(vt / np.sqrt(vv * tt), 0.0, 1.0), 1.0)
        z = np.arctanh(np.minimum(rho, 1 - 1e-12)) - scipy_stats.norm.ppf(LEVEL_EACH) / np.sqrt(
            np.maximum(df - 2, 1e-12)
        )
    low = np.where((df > 2) & (vv > 0) & (tt > 0), np.maximum(0.0, np.tanh(z)), 0.0)
    return rho, low


def optimism(selection: dict, groups: list) -> dict:
    """How optimistic each chosen rate's test loss is when the rate was chosen on the same runs, per family, in
    nats (``family_optimism``): the chosen rate's seeds that happened to train well carry that luck into its test
    loss through the correlation of a run's validation and test losses (``correlation``, pooled over the families
    whose runs all have both). A family with more rates near its best (a flatter curve), or noisier seeds, is
    favoured more; the difference of two norm types is then biased towards one of them, which ``direction``
    names only where the bounds separate."""
    by_label = {g.label: g for g in groups}
    matrices = {}
    for family in selection["families"]:
        eligible = [rate for rate in family["rates"] if rate["eligible"]]
        seeds = sorted({run["seed"] for rate in eligible for run in rate["runs"]})
        if family["chosen"] is None or len(eligible) < 2 or len(seeds) < 2:
            continue
        val = np.array([[_run_of(rate, s)["val_loss"] for s in seeds] for rate in eligible], float)
        tests = [[_test_loss(by_label[rate["group"]], _run_of(rate, s)) for s in seeds] for rate in eligible]
        matrices[family["family"]] = (family, val, np.array(tests, float))
    pairs = [(_double_centred(v).ravel(), _double_centred(t).ravel(), (v.shape[0] - 1) * (v.shape[1] - 1))
             for _, v, t in matrices.values() if np.isfinite(t).all()]  # fmt: skip
    df = sum(p[2] for p in pairs)
    v, t = (np.concatenate([p[i] for p in pairs]) if pairs else np.zeros(0) for i in (0, 1))
    rho, rho_low = (float(x) for x in correlation(v, t, df))
    out = {"rho": rho, "rho_low": rho_low, "rho_df": df, "level_each": LEVEL_EACH, "families": {}}
    for family in selection["families"]:
        entry = matrices.get(family["family"])
        if entry is not None:
            numbers = family_optimism(entry[1], rho, rho_low)
            entry = {
                "group": family["chosen"],
                **{k: v if isinstance(v, int) else float(v) for k, v in numbers.items()},
            }
        out["families"][family["family"]] = entry
    return out


def _run_of(rate: dict, seed: str) -> dict:
    return next(run for run in rate["runs"] if run["seed"] == seed)


def _test_loss(group, run: dict) -> float:
    """A selection row's run's test loss (NaN where it has none)."""
    for r in group.runs:
        if str(r.path) == run["path"] and r.usable and r.evaluation is not None:
            return float(r.evaluation["loss"])
    return math.nan


def direction(group: str, ours: dict, baseline: str, theirs: dict) -> str | None:
    """Which of two chosen rates' test losses reads lower by its choice (the difference is biased towards it),
    named only where the bounds separate: one's lower limit above the other's upper. It is wrong only where one of
    those two limits fails: at most 3 + 2 parts of 1 - LEVEL_EACH, 5%. None: unclear."""
    if ours["lower"] > theirs["upper"]:
        return group
    if theirs["lower"] > ours["upper"]:
        return baseline
    return None
