"""The numbers of a comparison: each group's row (its test loss's mean and interval by design, its difference
to the baseline paired by seed with TOST and a plan, its tasks' metrics over seeds, item-level tests of two
checkpoints, its variance components where its seeds are crossed) and Holm's adjustment over each family
(``gpt.analysis.stats`` holds the formulas)."""

from __future__ import annotations

import math

import numpy as np

from gpt.analysis import stats, variance
from gpt.analysis.runs import Group, Run, seed_label
from gpt.data.tokenizer import bits_per_byte
from gpt.evaluation.tasks import TASKS
from gpt.run.directory import COMPLETED, DIVERGED


def versus(cells: dict, base: dict, margin: float | None, detect: float | None) -> dict:
    """``cells - base`` (``stats.difference``) with its TOST verdict (with a margin) and its prospective plan."""
    v = stats.difference(cells, base)
    usable = v["method"] is not None and not math.isnan(v["se"])
    return {
        **v,
        "unpaired": [seed_label(k) for k in v["unpaired"]],
        "equivalence": stats.equivalence(v, margin) if margin is not None and usable else None,
        "plan": stats.seeds_needed(v, detect) if v["method"] in ("paired", "crossed") else None,
    }


def crossed(group: Group) -> dict | None:
    """The variance components of a group whose initialisation and data-order seeds are crossed (every
    pair of at least 2 x 2 evaluated); the missing pairs of a design that is crossed but incomplete;
    None for a group whose seeds are not crossed (one data seed per initialisation, the usual case)."""
    cells = group.losses_by_cell()
    inits, datas, values, missing = stats.as_grid(cells)
    per_init = max((sum(i == k for k, _ in cells) for i in inits), default=0)
    per_data = max((sum(j == k for _, k in cells) for j in datas), default=0)
    if per_init < 2 or per_data < 2:
        return None
    if missing:
        return {"init_seeds": inits, "data_seeds": datas, "missing": [f"{i}/{j}" for i, j in missing]}
    return {"init_seeds": inits, "data_seeds": datas, "missing": [], **variance.variance_components(values)}


def summarise(
    groups: list[Group], baseline_label: str, margin: float | None = None, detect: float | None = None
) -> dict:
    """Every group's row, the family of comparisons with the baseline and the test range; ``detect``: the
    difference a plan is for (default: ``margin``)."""
    detect = margin if detect is None else detect
    baseline = next(g for g in groups if g.label == baseline_label)
    rows = [_row(g, baseline, margin, detect) for g in groups]
    families = _adjust_for_multiplicity(rows)
    test = next((r.evaluation for g in groups for r in g.runs if r.evaluation), None)
    per_byte = bits_per_nat(test)
    for row in rows:  # every test loss in bits per byte too: the runs share their test tokens (check_comparable)
        row["test_loss_bits_per_byte"] = None if per_byte is None else row["test_loss_mean"] * per_byte
        for r in row["runs"]:
            r["bits_per_byte"] = None if per_byte is None or r["test_loss"] is None else r["test_loss"] * per_byte
    return {
        "baseline": baseline_label,
        "equivalence_margin": margin,
        "detect": detect,
        "level": stats.LEVEL,
        "power": stats.POWER,
        "plan_confidence": stats.PLAN_CONFIDENCE,
        "families": families,
        "groups": rows,
        "test_range": None
        if test is None or "split" not in test
        else {
            k: test.get(k)
            for k in (
                *("data_dir", "split", "offset", "n_tokens", "targets_scored", "bytes_scored"),
                "tokenizer",
                "precision",
            )
        }
        | {"bits_per_byte_per_nat": per_byte},
    }


def bits_per_nat(evaluation: dict | None) -> float | None:
    """What a test loss in nats per token is multiplied by to read in bits per byte of the scored text
    (``gpt.data.tokenizer.bits_per_byte`` of one nat): None where the evaluation did not count its bytes (one from
    before they were counted, or a tokenizer not known here)."""
    if not evaluation or not evaluation.get("targets_scored"):
        return None
    return bits_per_byte(1.0, evaluation["targets_scored"], evaluation.get("bytes_scored"))


def _adjust_for_multiplicity(rows: list[dict]) -> dict:
    """Holm-adjust each family of comparisons with the baseline, in place (``p_holm``); return each family's
    size: the test loss's (one per group with a p-value) and each task's (one per group and metric)."""
    families = {"test_loss": [r["vs_baseline"] for r in rows if r["vs_baseline"] is not None]}
    for task in sorted({t for r in rows for t in r["tasks"]}):
        families[task] = [
            v for r in rows if task in r["tasks"] for v in (r["tasks"][task]["vs_baseline"] or {}).values()
        ]
    sizes = {}
    for name, members in families.items():
        members = [v for v in members if not math.isnan(v["p"])]
        for v, p in zip(members, stats.holm([v["p"] for v in members])):
            v["p_holm"] = p
        sizes[name] = len(members)
    return sizes


def _row(g: Group, baseline: Group, margin: float | None, detect: float | None) -> dict:
    cells = g.losses_by_cell()
    mean = stats.mean_of(cells)
    finished = [r for r in g.runs if r.summary]
    return {
        "group": g.label,
        "values": g.values,
        "seeds": [r.seed for r in g.runs],
        "n_evaluated": len(cells),
        "test_loss_mean": mean["mean"],
        "test_loss_std": mean["sd"],
        "test_loss_ci95": [mean["low"], mean["high"]],
        "test_loss_design": mean["design"],
        "vs_baseline": None if g is baseline else versus(cells, baseline.losses_by_cell(), margin, detect),
        "tasks": task_rows(g, baseline),
        "tokens_per_s_mean": _mean([r.summary.get("tokens_per_s") for r in finished]),
        "wall_seconds_mean": _mean([r.summary.get("wall_seconds") for r in finished]),
        "status": {s: sum(r.status == s for r in g.runs) for s in sorted({r.status for r in g.runs})},
        "diverged_at": [r.summary.get("diverged_at_step") for r in g.runs if r.status == DIVERGED],
        "skipped_steps": {r.seed: r.skipped_steps for r in g.runs if r.skipped_steps},
        "decayed_norm_params": _decayed_norm_params(g.runs[0]),
        "noise_sources": crossed(g),
        "missing_evaluation": [str(r.path) for r in g.runs if r.evaluation is None and r.status == COMPLETED],
        "left_out": [
            {"path": str(r.path), "seed": r.seed, "reason": r.left_out_because()} for r in g.runs if not r.usable
        ],
        "runs": [
            {
                "path": str(r.path),
                "seed": r.seed,
                "status": r.status,
                "skipped_steps": r.skipped_steps,
                "test_loss": r.evaluation["loss"] if r.evaluation else None,
            }
            for r in g.runs
        ],
    }


def task_metrics(task: str, result: dict) -> list[str]:
    """The metrics of ``task`` that its result holds: those its registry entry declares
    (``gpt.evaluation.tasks``), or, for a task not registered (a results table's column), those the result
    names under ``metrics``."""
    declared = [m.name for m in TASKS[task].metrics] if task in TASKS else list(result.get("metrics") or {})
    return [m for m in declared if isinstance(result.get(m), (int, float))]


def metric_cells(runs: list[Run], task: str, metric: str) -> dict[tuple[int, int], float]:
    """A task's metric by (init seed, data seed), of the runs whose result has it."""
    return {r.cell: r.tasks[task][metric] for r in runs if isinstance(r.tasks[task].get(metric), (int, float))}


def task_rows(g: Group, baseline: Group) -> dict:
    """Each task the group's runs were evaluated on (HellaSwag): every metric's mean over seeds with its interval
    and, beside the baseline, its difference over seeds (each run's metric, paired by seed: the same models as the
    test loss). With one run each, also the item-level statement about those two checkpoints."""
    out = {}
    for task in sorted({t for r in g.runs for t in r.tasks}):
        runs, base = g.task_runs(task), baseline.task_runs(task)
        if not runs:
            continue
        metrics = task_metrics(task, runs[0].tasks[task])
        row = {
            "n_seeds": len(runs),
            "n_items": runs[0].tasks[task].get("n_items"),
            "metrics": {},
            "vs_baseline": None,
            "two_checkpoints": None,
        }
        for metric in metrics:
            m = stats.mean_of(metric_cells(runs, task, metric))
            row["metrics"][metric] = {
                "mean": m["mean"],
                "sd": m["sd"],
                "ci95": [m["low"], m["high"]],
                "design": m["design"],
            }
        if g is not baseline and base:
            row["vs_baseline"] = {
                metric: versus(metric_cells(runs, task, metric), metric_cells(base, task, metric), None, None)
                for metric in metrics
            }
            if len(runs) == len(base) == 1 and "answers" in runs[0].tasks[task] and "answers" in base[0].tasks[task]:
                a, b = runs[0], base[0]
                row["two_checkpoints"] = {
                    "this": str(a.path),
                    "baseline": str(b.path),
                    **{metric: items_paired(a.tasks[task], b.tasks[task], metric) for metric in metrics},
                }
        out[task] = row
    return out


def items_paired(result: dict, base: dict, metric: str) -> dict:
    """Two checkpoints' accuracies on the same items: the difference paired over items with its t interval, and
    McNemar's exact test on the items exactly one of the two got right. A statement about these two models (this
    initialisation, this data order), not about their norm types: ``task_rows`` compares those over seeds."""
    labels = result["labels"]
    if base["labels"] != labels:
        return {"method": "not paired: the runs answered different items", "diff": math.nan}

    def right(x):  # (items,): 1 where the answer is the label
        return np.array([a == lab for a, lab in zip(x["answers"][metric], labels)], dtype=float)

    a, b = right(result), right(base)
    est = stats.mean_of({(k, k): float(d) for k, d in enumerate(a - b)})
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    return {
        "method": "paired over items",
        "diff": est["mean"],
        "low": est["low"],
        "high": est["high"],
        "n": est["n"],
        "mcnemar": {"only_this": only_a, "only_baseline": only_b, "p": stats.mcnemar(only_a, only_b)},
    }


def _decayed_norm_params(run: Run) -> int | None:
    """How many norm-layer parameters AdamW's weight decay pulls toward 0 (None: the run has no summary
    with its parameter counts). Only optim.decay_norms_and_biases decays them (gpt.training.optimizer)."""
    total, outside = run.summary.get("n_params"), run.summary.get("n_params_outside_norms")
    if total is None or outside is None:
        return None
    decays = run.config.get("optim.decay_norms_and_biases") and run.config.get("optim.weight_decay")
    return total - outside if decays else 0


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return float(np.mean(xs)) if xs else math.nan
