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
from scipy import stats as scipy_stats

from gpt.common.errors import UserError
from gpt.run.directory import COMPLETED

SELECT_ON = ("val",)  # what a rate may be chosen on: the validation loss (never the test loss)
LR_KEY = "optim.lr"
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
    """E[max of k independent standard normals] (0 for k = 1): integral of x k phi(x) Phi(x)^(k-1)."""
    if k <= 1:
        return 0.0
    x = np.linspace(-10.0, 10.0, 40_001)
    density = k * scipy_stats.norm.pdf(x) * scipy_stats.norm.cdf(x) ** (k - 1)
    return float(np.sum(x * density) * (x[1] - x[0]))


NEAR = 2.0  # a rate is "near" the chosen one within NEAR standard errors of a difference of two means


def optimism(selection: dict, groups: list) -> dict:
    """How optimistic each chosen rate's test loss is when the rate was chosen on the same runs (a bound, in nats,
    per family), by ``rho * sd * E[max of K normals] / sqrt(n)``: rho the correlation of a run's validation and
    test losses around its rate's mean (pooled over every rate with two or more runs; 1 where it cannot be
    estimated), sd the seed-to-seed spread of the family's validation losses (pooled over its eligible rates), n
    its seeds, K its rates whose mean is within NEAR standard errors of the chosen one (the ones that could have
    won by luck; ``worst``: K all its eligible rates, as if all were equally good). A family whose K is larger (a
    flatter curve) is favoured more."""
    pairs = []  # (val residual, test residual) of every run, around its rate's means
    for g in groups:
        runs = [r for r in g.runs if r.usable and final_val_loss(r.metrics) is not None]
        if len(runs) < 2:
            continue
        val = np.array([final_val_loss(r.metrics)[1] for r in runs])
        test = np.array([r.evaluation["loss"] for r in runs])
        if np.all(np.isfinite(val)) and np.all(np.isfinite(test)):
            pairs += list(zip(val - val.mean(), test - test.mean(), strict=True))
    v, t = (np.array(x) for x in zip(*pairs, strict=True)) if pairs else (np.zeros(0), np.zeros(0))
    rho = (
        float(np.clip(np.sum(v * t) / np.sqrt(np.sum(v * v) * np.sum(t * t)), 0.0, 1.0))
        if len(v) > 2 and np.any(v) and np.any(t)
        else 1.0
    )
    out = {"rho": rho, "near_within_se": NEAR, "families": {}}
    for family in selection["families"]:
        eligible = [rate for rate in family["rates"] if rate["eligible"]]
        n = min((rate["n"] for rate in eligible), default=0)
        if family["chosen"] is None or n < 2:
            out["families"][family["family"]] = None
            continue
        sd = math.sqrt(np.mean([rate["val_loss_sd"] ** 2 for rate in eligible]))
        best = min(rate["val_loss_mean"] for rate in eligible)
        near = sum(rate["val_loss_mean"] - best <= NEAR * sd * math.sqrt(2 / n) for rate in eligible)
        bound, worst = (rho * sd * expected_max_normal(k) / math.sqrt(n) for k in (near, len(eligible)))
        out["families"][family["family"]] = {
            "group": family["chosen"], "k_near": near, "k": len(eligible), "sd": sd, "n": n, "bound": bound,
            "worst": worst,  # were all K eligible rates equally good
        }  # fmt: skip
    return out
