"""Compare runs that differ in the norm and nothing else: group them, put numbers on the noise.

A comparison is only worth its table if its groups differ in the norm alone. Every run is
seen through its *computation*: its config with its fingerprint over it (``gpt.run.fingerprint``:
the precision actually used, compile, TF32, device, world size, torch and CUDA, the code,
the data's identity). Runs are grouped by ``model.norm_type``; seeds (``train.seed``,
``model.init_seed``) are the repeats. Any other key on which the runs do not all agree is
refused, in one line naming each key with its values and runs, unless the user names it:
``--vary KEY`` makes it an axis of the table (a group per value), ``--allow-differ KEY``
accepts it and says so in the report. How a run is named, logged and published (``run.*``,
``log.*``, ``hub.*``) never counts. Statistics use completed, evaluated runs only (whatever
``--which`` chooses); every other run is listed with the reason it was left out.

Each group gets the mean and standard deviation of its test loss and its difference to
the baseline group (``--baseline``, else ``handrolled_layernorm``, else the first norm type
in the write-up's order) with a 95% interval: **paired by seed** on the seeds both groups
share (the same seed gives the same initial weights for everything but the norm, so the
paired difference removes most of the initialisation noise), otherwise Welch's unpaired
interval. From the paired differences come the exact power numbers (seeds needed, the
smallest resolvable difference) and, with an equivalence margin, a TOST verdict; from a
group whose initialisation and data-order seeds are crossed, the variance components
(``gpt.analysis.stats``).

Only run directories are read (through ``gpt.run.directory``): the config, metrics, summary
(with the fingerprints) and the evaluation result of the chosen checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpt.analysis import stats
from gpt.analysis.charts import comparison_charts
from gpt.analysis.report import markdown
from gpt.common.errors import UserError
from gpt.config import NORM_TYPES, flatten
from gpt.evaluation import hellaswag
from gpt.run.directory import COMPARISON_FILE, COMPLETED, DIVERGED, RunDir, read_eval_result
from gpt.run.fingerprint import computation, informational, shown

AXIS = "model.norm_type"  # what a comparison compares
SEED_KEYS = ("train.seed", "model.init_seed")  # the repeats within a group
# How a run is named, logged, published and stored: nothing it computes (prefetch reads the same batches,
# tested bit for bit). Validation (train.eval_every) stays compared: it decides the best checkpoint.
NOT_COMPARED = ("run.", "log.", "hub.", "train.checkpoint_every", "train.keep_last", "train.prefetch")
DEFAULT_BASELINE = "handrolled_layernorm"  # the write-up's baseline


@dataclass
class Run:
    """One run directory, as the comparison sees it."""

    path: Path  # the run directory
    config: dict  # its resolved config, flattened: "model.norm_type" -> value
    status: str  # completed, diverged, interrupted or unfinished (gpt.run.directory)
    summary: dict  # its summary.json ({} while it has none)
    metrics: list[dict]  # its metrics.jsonl records
    evaluation: dict | None  # the evaluation result of the chosen checkpoint; None: not evaluated
    view: dict = field(default_factory=dict)  # what decides its numbers: config and fingerprint (gpt.run.fingerprint)
    tasks: dict = field(default_factory=dict)  # other tasks' results of the chosen checkpoint: {"hellaswag": ...}

    @property
    def data_seed(self) -> int:
        return self.config["train.seed"]

    @property
    def init_seed(self) -> int:
        init = self.config.get("model.init_seed")
        return self.data_seed if init is None else init

    @property
    def seed(self) -> str:
        """``"3"`` when the initial weights and the data order share seed 3, else ``"init/data"``."""
        return str(self.data_seed) if self.init_seed == self.data_seed else f"{self.init_seed}/{self.data_seed}"

    @property
    def usable(self) -> bool:
        """Whether its test loss enters the statistics: completed and evaluated."""
        return self.status == COMPLETED and self.evaluation is not None

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite gradient (the summary's count; 0 when it has none)."""
        return self.summary.get("nonfinite_steps") or 0

    @property
    def fingerprinted(self) -> bool:
        return bool(self.summary.get("segments"))

    def left_out_because(self) -> str:
        if self.status == DIVERGED:
            return f"diverged at step {self.summary.get('diverged_at_step')}"
        if self.status != COMPLETED:
            return self.status
        return "not evaluated"


@dataclass
class Group:
    """Runs that compute the same thing but for their seeds: one norm type (and one value of each --vary key)."""

    label: str  # the norm type, then ", key=value" for each --vary key
    values: dict  # the values that define the group: model.norm_type and the --vary keys
    runs: list[Run] = field(default_factory=list)  # one per seed

    def losses_by_seed(self) -> dict[str, float]:
        """Test loss by seed, of the runs that enter the statistics."""
        return {r.seed: r.evaluation["loss"] for r in self.runs if r.usable}


def load_run(
    path: Path,
    which: str = "final",
    split: str = "test",
    precision: str = "fp32",
    tokens: int | None = None,
    offset: int | None = None,
) -> Run:
    """A run directory and the evaluation of its checkpoint ``which`` on ``split`` in ``precision``: over the
    run's configured test range, or, given ``tokens``, over [offset, offset + tokens) (``offset`` defaulting to
    the run's data.test_offset), as ``evaluate.py --tokens / --offset`` kept it."""
    path = Path(path)
    run = RunDir(path)
    if not run.config_file.is_file() or not run.metrics_file.is_file():
        raise UserError(f"{path}: not a run directory (needs {run.config_file.name} and {run.metrics_file.name})")
    try:
        ckpt = run.checkpoint(which)  # only a completed run has a final one
    except UserError:
        ckpt = None
    config, summary = flatten(run.read_config()), run.summary() or {}
    start = config.get("data.test_offset", 0) if offset is None else offset
    span = None if tokens is None else (start, start + tokens)
    evaluation = read_eval_result(ckpt, split, precision, span) if ckpt is not None else None
    tasks = {hellaswag.RESULT: read_eval_result(ckpt, hellaswag.RESULT, precision)} if ckpt is not None else {}
    view = computation(config, summary.get("segments"))
    return Run(
        path, config, run.status(), summary, run.metrics(), evaluation, view, {k: v for k, v in tasks.items() if v}
    )


def _named(key: str, names) -> bool:
    """Whether ``key`` is one of ``names`` or lies under one (``data.train`` names ``data.train.sha256``)."""
    return any(key == n or key.startswith(n + ".") for n in names)


def _compared_keys(runs: list[Run]) -> list[str]:
    return sorted(
        k
        for k in {k for r in runs for k in r.view}
        if not k.startswith(NOT_COMPARED) and k != AXIS and k not in SEED_KEYS
    )


NOT_RECORDED = "not recorded"  # a key a run has no value for (a run from before fingerprints)


def _by_value(runs: list[Run], key: str) -> dict[str, list[Run]]:
    """The runs by their value of ``key``, as it is shown (gpt.run.fingerprint.shown)."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(shown(r.view[key]) if key in r.view else NOT_RECORDED, []).append(r)
    return out


def _listed(by_value: dict, describe=str) -> str:
    """``value (run, run); value (run)``: each value with the runs that hold it."""
    return "; ".join(f"{describe(v)} ({', '.join(r.path.name for r in rs)})" for v, rs in by_value.items())


def check_names(runs: list[Run], vary: list[str], allow_differ: list[str]) -> None:
    """Refuse a --vary or --allow-differ KEY that names nothing these runs record."""
    keys = _compared_keys(runs)
    for flag, names in (("--vary", vary), ("--allow-differ", allow_differ)):
        for name in names:
            if not any(_named(k, [name]) for k in keys):
                raise UserError(
                    f"{flag} {name}: no such key in these runs' configs or fingerprints; keys are "
                    "dotted like optim.lr, train.precision, hardware.name, data.train.sha256 (a prefix "
                    "such as data.train names every key under it)"
                )


def check_only_the_norm_differs(runs: list[Run], vary: list[str], allow_differ: list[str]) -> dict[str, list]:
    """Refuse runs that differ in anything but the norm type, the seeds and the keys the user named; return
    the keys allowed to differ that do, each with its values (as shown) and their runs."""
    differing, allowed = [], {}
    for key in _compared_keys(runs):
        if _named(key, vary):
            continue
        by_value = _by_value(runs, key)
        if len(by_value) > 1:
            if _named(key, allow_differ):
                allowed[key] = [{"value": v, "runs": [r.path.name for r in rs]} for v, rs in by_value.items()]
            else:
                differing.append(f"{key}: {_listed(by_value)}")
    if differing:
        raise UserError(
            "these runs differ in more than the norm and the seeds, so a difference between them "
            f"would not be the norm's: {' | '.join(differing)}; compare runs that differ only in "
            "model.norm_type and seeds, or name each key: --vary KEY (an axis of the table) or "
            "--allow-differ KEY (accepted, and said in the report)"
        )
    return allowed


def group_runs(runs: list[Run], vary: list[str] = ()) -> list[Group]:
    """Groups by norm type and the --vary keys, in the write-up's order of norm types."""
    groups: dict[str, Group] = {}
    varied = [k for k in _compared_keys(runs) if _named(k, vary)]
    for r in runs:
        values = {AXIS: r.config[AXIS], **{k: r.view.get(k) for k in varied}}
        label = ", ".join([str(r.config[AXIS]), *(f"{k}={v}" for k, v in values.items() if k != AXIS)])
        groups.setdefault(label, Group(label, values)).runs.append(r)
    for g in groups.values():
        seeds = [r.seed for r in g.runs]
        if len(seeds) != len(set(seeds)):
            raise UserError(
                f"group {g.label!r} has two runs with the same seed and config: "
                + ", ".join(str(r.path) for r in g.runs)
            )

    def order(g: Group):
        norm = g.values[AXIS]
        return (NORM_TYPES.index(norm) if norm in NORM_TYPES else len(NORM_TYPES), g.label)

    return sorted(groups.values(), key=order)


def choose_baseline(groups: list[Group], baseline: str | None) -> tuple[str, str]:
    """The baseline group's label and why it is the baseline: named by --baseline, else handrolled_layernorm,
    else the first norm type in the write-up's order when one group has it; never an accident of order."""
    labels = [g.label for g in groups]
    if baseline is not None:
        if baseline not in labels:
            raise UserError(f"--baseline {baseline!r} is not a group; groups: {', '.join(labels)}")
        return baseline, "--baseline"
    if DEFAULT_BASELINE in labels:
        return DEFAULT_BASELINE, f"the default, {DEFAULT_BASELINE}, the write-up's baseline"
    first = [g for g in groups if g.values[AXIS] == groups[0].values[AXIS]]
    if len(first) > 1:
        raise UserError(
            f"no default baseline among groups that differ in more than the norm: give --baseline, "
            f"one of: {', '.join(labels)}"
        )
    return labels[0], (
        f"the first norm type of these runs in the write-up's order ({', '.join(NORM_TYPES)}); --baseline names another"
    )


def _refuse_mixed(what: str, by_key: dict, describe, fix: str) -> None:
    if len(by_key) > 1:
        raise UserError(f"these runs {what}, so their losses are not comparable: {_listed(by_key, describe)}; {fix}")


def tokens_evaluated(evaluation: dict) -> str:
    """What the evaluated tokens were: the split's sha256 (or sampled sha256), or, for a result written before
    evaluations were fingerprinted, the token set's folder."""
    test = (evaluation.get("fingerprint") or {}).get("test") or {}
    if test.get("sha256"):
        return f"sha256 {test['sha256'][:12]}"
    if test.get("sampled_sha256"):
        return f"sampled sha256 {test['sampled_sha256'][:12]}"
    return f"in {evaluation['data_dir']}"


def check_comparable(runs: list[Run]) -> None:
    """Refuse test losses measured on different tokens or tokenizations, and runs that planned
    different training lengths (steps, or tokens per step)."""
    ranges, budgets = {}, {}
    for r in runs:
        if r.evaluation is not None:
            e = r.evaluation
            ranges.setdefault((e["split"], e["offset"], e["n_tokens"], e["tokenizer"], tokens_evaluated(e)), []).append(
                r
            )
        if r.summary.get("total_steps") is not None:
            per_step = r.config["train.global_batch_size"] * r.config["model.context_length"]
            budgets.setdefault((r.summary["total_steps"], r.summary["total_steps"] * per_step), []).append(r)
    _refuse_mixed(
        "were evaluated on different test tokens",
        ranges,
        lambda k: f"{k[0]} [{k[1]:,}, {k[1] + k[2]:,}) tokenizer {k[3]} {k[4]}",
        "re-evaluate them on one range of one token set",
    )
    _refuse_mixed(
        "trained for different lengths",
        budgets,
        lambda k: f"{k[0]:,} steps = {k[1]:,} tokens",
        "train every run for the same train.steps or train.tokens (train.tokens_per_param counts the "
        "parameters outside the norm layers, the same for every norm type)",
    )


def difference(group: Group, baseline: Group) -> dict:
    """group - baseline test loss. Paired on the seeds both share when there are at least two (or when no
    unpaired interval is possible anyway); otherwise Welch's unpaired interval over all their runs."""
    a, b = group.losses_by_seed(), baseline.losses_by_seed()
    if not a or not b:
        return {
            "method": None,
            "diff": math.nan,
            "low": math.nan,
            "high": math.nan,
            "n": 0,
            "sd": math.nan,
            "unpaired": [],
        }
    shared = sorted(set(a) & set(b))
    unpaired = sorted(set(a) ^ set(b))
    if len(shared) >= 2 or (shared and min(len(a), len(b)) < 2):
        return {**stats.paired([a[s] - b[s] for s in shared]), "unpaired": unpaired}
    return {**stats.welch(list(a.values()), list(b.values())), "unpaired": unpaired}


def noise(versus: dict, diffs: list[float], margin: float | None) -> dict:
    """What the paired differences say about seeds: the smallest difference the current pairs resolve,
    the pairs needed to resolve the observed one, and (with a margin) equivalence."""
    if versus["method"] != "paired" or versus["n"] < 2:
        return {"resolvable_diff": math.nan, "seeds_needed": None, "equivalence": None}
    return {
        "resolvable_diff": stats.resolvable_difference(versus["sd"], versus["n"]),
        "seeds_needed": stats.seeds_needed(versus["diff"], versus["sd"]),
        "equivalence": stats.equivalence(diffs, margin) if margin is not None else None,
    }


def _versus(g: Group, baseline: Group, margin: float | None) -> dict | None:
    if g is baseline:
        return None
    v = difference(g, baseline)
    a, b = g.losses_by_seed(), baseline.losses_by_seed()
    diffs = [a[s] - b[s] for s in sorted(set(a) & set(b))]
    return {**v, **noise(v, diffs, margin)}


def crossed(group: Group) -> dict | None:
    """The variance components of a group whose initialisation and data-order seeds are crossed (every
    pair of at least 2 x 2 evaluated); the missing pairs of a design that is crossed but incomplete;
    None for a group whose seeds are not crossed (one data seed per initialisation, the usual case)."""
    cells = {(r.init_seed, r.data_seed): r.evaluation["loss"] for r in group.runs if r.usable}
    inits, datas = sorted({i for i, _ in cells}), sorted({j for _, j in cells})
    per_init = max((sum(i == k for k, _ in cells) for i in inits), default=0)
    per_data = max((sum(j == k for _, k in cells) for j in datas), default=0)
    if per_init < 2 or per_data < 2:
        return None
    missing = [f"{i}/{j}" for i in inits for j in datas if (i, j) not in cells]
    if missing:
        return {"init_seeds": inits, "data_seeds": datas, "missing": missing}
    table = np.array([[cells[i, j] for j in datas] for i in inits])
    return {"init_seeds": inits, "data_seeds": datas, "missing": [], **stats.variance_components(table)}


def shared_by_all(runs: list[Run]) -> dict:
    """The computation keys on which every run agrees (flat), and the recorded-only ones (code commit, ...)
    where they agree too."""
    shared = {}
    for key in _compared_keys(runs):
        by_value = _by_value(runs, key)
        if len(by_value) == 1 and NOT_RECORDED not in by_value:
            shared[key] = runs[0].view[key]
    notes = [informational(r.summary.get("segments")) for r in runs]
    for key in sorted({k for n in notes for k in n}):
        values = {json.dumps(n.get(key), sort_keys=True) for n in notes}
        if len(values) == 1:
            shared[key] = notes[0][key]
    test = {tokens_evaluated(r.evaluation) for r in runs if r.evaluation is not None}
    if len(test) == 1:
        shared["evaluation.test"] = test.pop()
    steps = {r.summary.get("total_steps") for r in runs} - {None}
    if len(steps) == 1:
        shared["total_steps"] = steps.pop()
    return shared


def summarise(groups: list[Group], baseline_label: str, margin: float | None = None) -> dict:
    baseline = next(g for g in groups if g.label == baseline_label)
    rows = [_row(g, baseline, margin) for g in groups]
    test = next((r.evaluation for g in groups for r in g.runs if r.evaluation), None)
    return {
        "baseline": baseline_label,
        "equivalence_margin": margin,
        "level": stats.LEVEL,
        "power": stats.POWER,
        "groups": rows,
        "test_range": None
        if test is None
        else {
            k: test.get(k)
            for k in ("data_dir", "split", "offset", "n_tokens", "targets_scored", "tokenizer", "precision")
        },
    }


def _row(g: Group, baseline: Group, margin: float | None) -> dict:
    losses = list(g.losses_by_seed().values())
    mean, sd, half = stats.mean_interval(losses)
    finished = [r for r in g.runs if r.summary]
    return {
        "group": g.label,
        "values": g.values,
        "seeds": [r.seed for r in g.runs],
        "n_evaluated": len(losses),
        "test_loss_mean": mean,
        "test_loss_std": sd,
        "test_loss_ci95": [mean - half, mean + half],
        "vs_baseline": _versus(g, baseline, margin),
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


def task_rows(g: Group, baseline: Group) -> dict:
    """Each task the group's runs were evaluated on (HellaSwag): every metric's mean over seeds with its t
    interval, and, beside the baseline, the paired difference over items (every model answers the same items)."""
    out = {}
    for task in sorted({t for r in g.runs for t in r.tasks}):
        results = [r.tasks[task] for r in g.runs if r.status == COMPLETED and task in r.tasks]
        base = [r.tasks[task] for r in baseline.runs if r.status == COMPLETED and task in r.tasks]
        if not results:
            continue
        row = {"n_seeds": len(results), "n_items": results[0]["n_items"], "metrics": {}, "vs_baseline": None}
        for metric in hellaswag.METRICS:
            mean, sd, half = stats.mean_interval([x[metric] for x in results])
            row["metrics"][metric] = {"mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}
        if g is not baseline and base:
            row["vs_baseline"] = {metric: items_paired(results, base, metric) for metric in hellaswag.METRICS}
        out[task] = row
    return out


def items_paired(results: list[dict], base: list[dict], metric: str) -> dict:
    """The accuracy difference to the baseline, paired over items: per item, the fraction of this group's seeds
    that answered right minus the baseline's; its mean and t interval over items. With one seed each, also
    McNemar's exact test on the items exactly one of the two got right."""
    labels = results[0]["labels"]
    if any(x["labels"] != labels for x in results + base):
        return {"method": "not paired: the runs answered different items", "diff": math.nan}

    def right(xs):  # (seeds, items): 1 where the answer is the label
        return np.array([[a == lab for a, lab in zip(x["answers"][metric], labels)] for x in xs], dtype=float)

    a, b = right(results), right(base)
    out = {**stats.paired(list(a.mean(0) - b.mean(0))), "method": "paired over items", "mcnemar": None}
    if len(results) == len(base) == 1:
        only_a, only_b = int(((a[0] == 1) & (b[0] == 0)).sum()), int(((a[0] == 0) & (b[0] == 1)).sum())
        out["mcnemar"] = {"only_this": only_a, "only_baseline": only_b, "p": stats.mcnemar(only_a, only_b)}
    return out


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


def json_safe(value):
    """``value`` with every NaN or infinity replaced by None, so that it is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def compare(
    paths: list[Path],
    out: Path,
    baseline: str | None = None,
    *,
    which: str = "final",
    split: str = "test",
    precision: str = "fp32",
    equivalence_margin: float | None = None,
    vary: list[str] = (),
    allow_differ: list[str] = (),
    tokens: int | None = None,
    offset: int | None = None,
) -> dict:
    """Write comparison.md, comparison.json and the plots into ``out``; return the result. Runs that differ
    in more than the norm and the seeds are refused before anything is written, unless each differing key
    is named in ``vary`` (a group per value) or ``allow_differ`` (accepted, and said in the report)."""
    if equivalence_margin is not None and not equivalence_margin > 0:
        raise UserError(f"--equivalence-margin {equivalence_margin} must be > 0 (a loss difference, e.g. 0.01)")
    runs = [load_run(p, which, split, precision, tokens, offset) for p in paths]
    if not runs:
        raise UserError("no runs to compare")
    check_names(runs, vary, allow_differ)
    check_comparable(runs)
    allowed = check_only_the_norm_differs(runs, vary, allow_differ)
    groups = group_runs(runs, vary)
    baseline, why = choose_baseline(groups, baseline)
    result = {
        **summarise(groups, baseline, equivalence_margin),
        "baseline_rule": why,
        "shared": shared_by_all(runs),
        "allowed_to_differ": allowed,
        "varied": list(vary),
        "without_fingerprint": [r.path.name for r in runs if not r.fingerprinted],
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(markdown(result))
    text = json.dumps(json_safe(result), indent=2, default=str, allow_nan=False)  # NaN -> null: standard JSON
    (out / COMPARISON_FILE).write_text(text + "\n")
    curves = [(g.label, [r.metrics for r in g.runs]) for g in groups]
    result["plots"] = [str(p) for p in comparison_charts(curves, result["groups"], out)]
    return result
