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

Each group gets the mean of its test loss with an interval and its difference to the baseline group
(``--baseline``, else ``handrolled_layernorm``, else the first norm type in the write-up's order),
**paired by seed** on the seeds both groups share (the same seed gives the same initial weights for
everything but the norm, so the paired difference removes most of the initialisation noise),
otherwise Welch's unpaired interval. A seed is the pair (initialisation seed, data-order seed); the
design the shared seeds form decides the model behind every interval (``gpt.analysis.stats``:
independent seeds, crossed seeds, one seed held fixed), and the report says which each row used.
Each comparison has a p-value and, with more than one group against the baseline, a Holm-adjusted
one for the family; a prospective plan (``--detect``, the equivalence margin by default) and, with
a margin, a TOST verdict follow the same model. With ``select_on="val"`` the learning rate (``optim.lr``) is an
axis chosen on validation loss per norm type (``gpt.analysis.selection``): only the chosen rates' groups are
compared, against the baseline norm type at its own chosen rate. Every evaluation task that declares metrics
(``gpt.evaluation.tasks``: HellaSwag, ...) and that a run's checkpoint was evaluated on is compared
over seeds the same way; item-level tests (a task that keeps every item's answers) are statements
about two named checkpoints only. A group whose initialisation and data-order seeds are crossed gets its
variance components.

The evaluations are part of the experiment: their fingerprints (precision path, batch size,
device, torch and CUDA, the code) are compared like the training runs', so results computed by
different evaluators are refused unless ``--allow-differ`` names the key.

Only run directories are read (through ``gpt.run.directory``): the config, metrics, summary
(with the fingerprints), the evaluation results of the chosen checkpoint and, where a run logged them,
its stats of what each norm does inside the model (``gpt.analysis.inside``); or, with ``results``,
a table of results from anywhere (``gpt.analysis.results``), which every comparison also writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpt.analysis import results as results_table
from gpt.analysis import stats
from gpt.analysis.charts import INSIDE_SHEET, comparison_charts
from gpt.analysis.inside import Stats, load_stats
from gpt.analysis.report import markdown
from gpt.analysis.selection import LR_KEY, check_select_on, optimism, select_rates
from gpt.common.errors import UserError
from gpt.common.files import write_atomically, write_json
from gpt.config import NORM_TYPES, flatten
from gpt.evaluation.tasks import TASKS, compared_tasks
from gpt.run.directory import COMPARISON_FILE, COMPLETED, DIVERGED, RunDir, read_eval_result
from gpt.run.fingerprint import EVALUATION_INFORMATIONAL, computation, informational, shown

AXIS = "model.norm_type"  # what a comparison compares
SEED_KEYS = ("train.seed", "model.init_seed")  # the repeats within a group
# How a run is named, logged, published and stored: nothing it computes (prefetch reads the same batches,
# tested bit for bit). Validation (train.eval_every) stays compared: it decides the best checkpoint.
NOT_COMPARED = ("run.", "log.", "hub.", "train.checkpoint_every", "train.keep_last", "train.prefetch")
# ... except how often the loss is logged where a loss ceiling is set: divergence is checked on logged steps.
LOGGED_DIVERGENCE = "log.log_every"
DEFAULT_BASELINE = "handrolled_layernorm"  # the write-up's baseline
RESULTS_CSV = "runs.csv"  # every comparison's runs as a table (``gpt.analysis.results``), beside comparison.json


@dataclass
class Run:
    """One run directory (or one row of a results table), as the comparison sees it."""

    path: Path  # the run directory (a results table's row: "FILE.csv:LINE")
    config: dict  # its resolved config, flattened: "model.norm_type" -> value
    status: str  # completed, diverged, interrupted or unfinished (gpt.run.directory)
    summary: dict  # its summary.json ({} while it has none)
    metrics: list[dict]  # its metrics.jsonl records
    evaluation: dict | None  # the evaluation result of the chosen checkpoint; None: not evaluated
    view: dict = field(default_factory=dict)  # what decides its numbers: config, fingerprints (gpt.run.fingerprint)
    tasks: dict = field(default_factory=dict)  # other tasks' results of the chosen checkpoint: {"hellaswag": ...}

    @property
    def data_seed(self) -> int:
        return self.config["train.seed"]

    @property
    def init_seed(self) -> int:
        init = self.config.get("model.init_seed")
        return self.data_seed if init is None else init

    @property
    def cell(self) -> tuple[int, int]:
        """(initialisation seed, data-order seed): where the run sits in its group's design."""
        return self.init_seed, self.data_seed

    @property
    def seed(self) -> str:
        """``"3"`` when the initial weights and the data order share seed 3, else ``"init/data"``."""
        return seed_label(self.cell)

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
            step = self.summary.get("diverged_at_step")
            return "diverged" if step is None else f"diverged at step {step}"
        if self.status != COMPLETED:
            return self.status
        return "not evaluated"


def seed_label(cell: tuple[int, int]) -> str:
    init, data = cell
    return str(data) if init == data else f"{init}/{data}"


@dataclass
class Group:
    """Runs that compute the same thing but for their seeds: one norm type (and one value of each --vary key)."""

    label: str  # the norm type, then ", key=value" for each --vary key
    values: dict  # the values that define the group: model.norm_type and the --vary keys
    runs: list[Run] = field(default_factory=list)  # one per seed

    def losses_by_cell(self) -> dict[tuple[int, int], float]:
        """Test loss by (init seed, data seed), of the runs that enter the statistics."""
        return {r.cell: r.evaluation["loss"] for r in self.runs if r.usable}

    def task_runs(self, task: str) -> list[Run]:
        """The completed runs that have a result of ``task``."""
        return [r for r in self.runs if r.status == COMPLETED and task in r.tasks]


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
    tasks = {t.name: t.result(ckpt, precision) for t in compared_tasks()} if ckpt is not None else {}
    tasks = {k: v for k, v in tasks.items() if v}
    view = {**computation(config, summary.get("segments")), **evaluation_view(evaluation, tasks)}
    return Run(path, config, run.status(), summary, run.metrics(), evaluation, view, tasks)


def evaluation_view(evaluation: dict | None, tasks: dict) -> dict:
    """The compared keys of a run's evaluations, flat: the test loss's fingerprint under ``evaluation.``, each
    task's under ``<task>.evaluation.`` (``hellaswag.evaluation.code.source``). What cannot change a number
    (``gpt.run.fingerprint.EVALUATION_INFORMATIONAL``) is left out; the test tokens are checked on their own
    (``check_comparable``)."""
    out = {}
    for prefix, result in (("evaluation", evaluation), *((f"{t}.evaluation", r) for t, r in sorted(tasks.items()))):
        if result is None:
            continue
        recorded = flatten(result.get("fingerprint") or {})
        if "batch_size" not in recorded and result.get("batch_size") is not None:  # a result from before
            recorded["batch_size"] = result["batch_size"]
        out.update({f"{prefix}.{k}": v for k, v in recorded.items() if not k.startswith(EVALUATION_INFORMATIONAL)})
    return out


def _named(key: str, names) -> bool:
    """Whether ``key`` is one of ``names`` or lies under one (``data.train`` names ``data.train.sha256``)."""
    return any(key == n or key.startswith(n + ".") for n in names)


def _compared_keys(runs: list[Run]) -> list[str]:
    ceiling = any(r.config.get("train.loss_ceiling") is not None for r in runs)
    return sorted(
        k
        for k in {k for r in runs for k in r.view}
        if (not k.startswith(NOT_COMPARED) or (ceiling and k == LOGGED_DIVERGENCE)) and k != AXIS and k not in SEED_KEYS
    )


NOT_RECORDED = "not recorded"  # a key a run has no value for (a run from before fingerprints)


def _evaluated(r: Run, key: str) -> bool:
    """Whether ``r`` has the evaluation an evaluation key is about: only those evaluations are compared (a run
    not evaluated, or not on that task, has nothing to disagree with)."""
    if key.startswith("evaluation."):
        return r.evaluation is not None
    task, _, rest = key.partition(".")
    return task in r.tasks if rest.startswith("evaluation.") else True


def _by_value(runs: list[Run], key: str) -> dict[str, list[Run]]:
    """The runs by their value of ``key``, as it is shown (gpt.run.fingerprint.shown)."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        if not _evaluated(r, key):
            continue
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
    return {"init_seeds": inits, "data_seeds": datas, "missing": [], **stats.variance_components(values)}


def shared_by_all(runs: list[Run]) -> dict:
    """The computation keys on which every run agrees (flat); the recorded-only ones (code commit, ...) where
    they agree too; and, where the runs' commits or uncommitted changes differ, which do (``code.commits``:
    each commit with its runs; ``code.dirty_runs``: the runs with uncommitted changes)."""
    shared = {}
    for key in _compared_keys(runs):
        by_value = _by_value(runs, key)
        if len(by_value) == 1 and NOT_RECORDED not in by_value:
            shared[key] = next(iter(by_value.values()))[0].view[key]  # of a run that has it (not all were evaluated)
    notes = [informational(r.summary.get("segments")) for r in runs]
    for key in sorted({k for n in notes for k in n}):
        values = {json.dumps(n.get(key), sort_keys=True) for n in notes}
        if len(values) == 1:
            shared[key] = notes[0][key]
    commits: dict[str, list[str]] = {}
    for r, n in zip(runs, notes):
        for commit in n.get("code.commit") if isinstance(n.get("code.commit"), list) else [n.get("code.commit")]:
            commits.setdefault(commit or "not a git checkout", []).append(r.path.name)
    if len(commits) > 1:
        shared["code.commits"] = commits
    dirty = [r.path.name for r, n in zip(runs, notes) if n.get("code.dirty") is True or n.get("code.dirty") == [True]]
    if dirty and "code.dirty" not in shared:
        shared["code.dirty_runs"] = dirty
    test = {tokens_evaluated(r.evaluation) for r in runs if r.evaluation is not None}
    if len(test) == 1:
        shared["evaluation.test"] = test.pop()
    steps = {r.summary.get("total_steps") for r in runs} - {None}
    if len(steps) == 1:
        shared["total_steps"] = steps.pop()
    return shared


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
            for k in ("data_dir", "split", "offset", "n_tokens", "targets_scored", "tokenizer", "precision")
        },
    }


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


def json_safe(value):
    """``value`` with every NaN or infinity replaced by None, so that it is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def runs_from_results(path: Path) -> list[Run]:
    """A results table's rows as runs (``gpt.analysis.results.read_results``): each row a completed run of its
    group at its seeds, its test loss its evaluation, its other metrics tasks."""
    runs = []
    for row in results_table.read_results(path):
        tasks = {task: {"metrics": dict.fromkeys(values), **values} for task, values in row["tasks"].items()}
        runs.append(
            Run(
                Path(f"{Path(path).name}:{row['line']}"),
                {AXIS: row["group"], "train.seed": row["data_seed"], "model.init_seed": row["init_seed"]},
                row["status"],
                {},
                [],
                None if row["test_loss"] is None else {"loss": row["test_loss"]},
                tasks=tasks,
            )
        )
    return runs


def results_rows(groups: list[Group]) -> list[dict]:
    """Every run of the comparison as a results table's row (``gpt.analysis.results.write_results``)."""
    return [
        {
            "group": g.label,
            "init_seed": r.init_seed,
            "data_seed": r.data_seed,
            "status": r.status,
            "test_loss": r.evaluation["loss"] if r.evaluation is not None else None,
            "tasks": {t: {m: r.tasks[t][m] for m in task_metrics(t, r.tasks[t])} for t in sorted(r.tasks)},
        }
        for g in groups
        for r in g.runs
    ]


def inside_of(groups: list[Group], out: Path) -> tuple[dict, list[tuple[str, list[Stats]]]]:
    """Which runs logged what each norm does inside the model (``gpt.analysis.inside``) and where the sheet of
    it by group goes (None: no run did); and each group's label with its runs' stats, every group in order so
    that its colour is the one of the other charts."""
    loaded = [(g.label, [(r.path.name, load_stats(r.path)) for r in g.runs]) for g in groups]
    named = [(name, s is not None) for _, runs in loaded for name, s in runs]
    with_stats = [name for name, has in named if has]
    summary = {
        "plot": str(out / INSIDE_SHEET) if with_stats else None,
        "with_stats": with_stats,
        "without_stats": [name for name, has in named if not has],
    }
    return summary, [(label, [s for _, s in runs if s is not None]) for label, runs in loaded]


def load_runs(paths: list[Path], results: Path | None, vary: list[str], allow_differ: list[str], **load) -> list[Run]:
    """The runs to compare: the rows of a results table, or the run directories ``paths`` (``load``: ``load_run``'s
    keywords)."""
    if results is not None:
        if paths:
            raise UserError("give run directories or --results FILE.csv, not both")
        if vary or allow_differ:
            raise UserError("--vary and --allow-differ read run directories; a results table has groups already")
        runs = runs_from_results(results)
    else:
        runs = [load_run(p, **load) for p in paths]
    if not runs:
        raise UserError("no runs to compare")
    return runs


def choose_selected(groups: list[Group], selection: dict, baseline: str | None) -> tuple[list[Group], str, str]:
    """The group of each norm type's rate chosen on validation (``gpt.analysis.selection``), the baseline among
    them and why: ``baseline`` names a norm type (compared at its chosen rate) or a chosen group; by default
    ``choose_baseline``'s rule over the norm types."""
    chosen = {f["family"]: f["chosen"] for f in selection["families"] if f["chosen"] is not None}
    by_label = {g.label: g for g in groups}
    compared = [by_label[label] for label in chosen.values()]
    if not compared:
        raise UserError(
            "--select-on val: no learning rate of any norm type has every run completed with a validation loss: "
            + "; ".join(f"{rate['group']}: {rate['reason']}" for f in selection["families"] for rate in f["rates"])
        )
    if baseline in chosen.values():
        return compared, baseline, "--baseline"
    if baseline is not None and baseline not in chosen:
        raise UserError(
            f"--baseline {baseline!r}: with --select-on val name a norm type, compared at its learning rate chosen "
            f"on validation; one of: {', '.join(chosen)}"
        )
    families = [
        Group(name, {k: v for k, v in by_label[label].values.items() if k != LR_KEY}) for name, label in chosen.items()
    ]
    name, why = choose_baseline(families, baseline)
    return compared, chosen[name], why if baseline is not None else f"{why}, at its learning rate chosen on validation"


def compared_groups(
    groups: list[Group], baseline: str | None, select_on: str | None
) -> tuple[list[Group], str, str, dict | None]:
    """The groups whose test losses are compared, the baseline's label, why it is the baseline, and the selection
    of learning rates made on ``select_on`` (None: every group, no selection)."""
    if select_on is None:
        return (groups, *choose_baseline(groups, baseline), None)
    selection = select_rates(groups, AXIS)
    selection["optimism"] = optimism(selection, groups)  # the chosen rates' test losses share the choice's runs
    return (*choose_selected(groups, selection, baseline), selection)


def check_margins(equivalence_margin: float | None, detect: float | None) -> None:
    """Refuse a margin or a difference to detect that is not a positive loss difference."""
    for flag, value in (("--equivalence-margin", equivalence_margin), ("--detect", detect)):
        if value is not None and not value > 0:
            raise UserError(f"{flag} {value} must be > 0 (a loss difference, e.g. 0.01)")


def compare(
    paths: list[Path],
    out: Path,
    baseline: str | None = None,
    *,
    which: str = "final",
    split: str = "test",
    precision: str = "fp32",
    equivalence_margin: float | None = None,
    detect: float | None = None,
    vary: list[str] = (),
    allow_differ: list[str] = (),
    tokens: int | None = None,
    offset: int | None = None,
    results: Path | None = None,
    failed: dict[str, str] | None = None,
    select_on: str | None = None,
    confirmation: dict | None = None,
    plots: bool = True,
) -> dict:
    """Write comparison.md, comparison.json, runs.csv and (if ``plots``) the charts into ``out``; return the
    result. Runs that differ in more than the norm and the seeds are refused before anything is written,
    unless each differing key is named in ``vary`` (a group per value) or ``allow_differ`` (accepted, and said
    in the report). ``results``: a results table (CSV) to compare instead of run directories. ``failed``: runs
    that ended without a result, each with its error (a sweep's failed cells), named in the report.
    ``select_on="val"``: each norm type's optim.lr chosen on validation loss (``gpt.analysis.selection``), test
    losses compared at it; ``confirmation``: fresh seeds at rates chosen on other runs (its record, for the report)."""
    check_margins(equivalence_margin, detect)
    check_select_on(select_on, results is not None)
    vary = [*vary, LR_KEY] if select_on is not None and not _named(LR_KEY, vary) else list(vary)
    load = {"which": which, "split": split, "precision": precision, "tokens": tokens, "offset": offset}
    runs = load_runs(paths, results, vary, allow_differ, **load)
    check_names(runs, vary, allow_differ)
    if results is None:  # a results table holds test losses, not what they were measured on
        check_comparable(runs)
    allowed = check_only_the_norm_differs(runs, vary, allow_differ)
    groups = group_runs(runs, vary)
    groups, baseline, why, selection = compared_groups(groups, baseline, select_on)
    result = {
        **summarise(groups, baseline, equivalence_margin, detect),
        "baseline_rule": why,
        "source": str(results) if results is not None else None,
        "shared": shared_by_all(runs) if results is None else {},
        "allowed_to_differ": allowed,
        "varied": vary,
        "selection": selection,
        "confirmation": confirmation,
        "without_fingerprint": [r.path.name for r in runs if not r.fingerprinted] if results is None else [],
        "failed": [{"run": name, "error": error} for name, error in (failed or {}).items()],
    }
    out = Path(out)
    result["inside"], inside = inside_of(groups if results is None else [], out)  # a table's rows have no folders
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "comparison.md", markdown(result))
    write_json(out / COMPARISON_FILE, json_safe(result), default=str, allow_nan=False)  # NaN -> null: standard JSON
    results_table.write_results(results_rows(groups), out / RESULTS_CSV)
    curves = [(g.label, [r.metrics for r in g.runs]) for g in groups]
    drawn = comparison_charts(curves, result["groups"], out, inside, selection) if plots else []
    result["plots"] = [str(p) for p in drawn]
    return result
