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

import math
from pathlib import Path

from gpt.analysis import interaction, speedup
from gpt.analysis import results as results_table
from gpt.analysis.charts import (
    INSIDE_SHEET,
    INTERACTION_CHART,
    SPEEDUP_CHART,
    comparison_charts,
    plot_interaction,
    plot_speedup,
)
from gpt.analysis.comparable import (
    check_comparable,
    check_margins,
    check_names,
    check_only_the_norm_differs,
    named,
    shared_by_all,
)
from gpt.analysis.grouping import compared_groups, config_default, group_runs
from gpt.analysis.inside import Stats, load_stats
from gpt.analysis.report import markdown
from gpt.analysis.runs import Group, load_run, load_runs
from gpt.analysis.selection import LR_KEY, check_select_on
from gpt.analysis.summary import summarise, task_metrics
from gpt.common.errors import UserError
from gpt.common.files import write_atomically, write_json
from gpt.run.directory import COMPARISON_FILE

RESULTS_CSV = "runs.csv"  # every comparison's runs as a table (``gpt.analysis.results``), beside comparison.json


def json_safe(value):
    """``value`` with every NaN or infinity replaced by None, so that it is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


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


def effective_speedup(groups, baseline, ladder, load, throughput, form, irreducible, select_on, vary, allowed=()):
    """The token ladder's section (``gpt.analysis.speedup``), or None without a ladder; refused, in one line, beside
    a learning-rate selection or a --vary axis (the baseline's curve is one group's)."""
    if not ladder:
        if throughput is not None:
            raise UserError("--throughput times the norm types for the effective speedup: give the baseline's --ladder")
        return None
    if select_on is not None or vary:
        raise UserError(
            "--ladder with --select-on or --vary: the token ladder is one group's curve; compare those apart"
        )
    runs, missing = [], []
    for path in ladder:  # a ladder cell whose job never left a run (SLURM) is named, not fatal
        try:
            runs.append(load_run(path, **load))
        except UserError as e:
            missing.append(str(e))
    compile_ = next((r.summary.get("compile") for g in groups for r in g.runs if r.summary), None)
    bench = speedup.bench_rates(throughput, compile_) if throughput is not None else None
    fit = {"form": form, "irreducible": irreducible or 0.0, "bench": bench, "allow_differ": allowed}
    section = speedup.token_ladder(groups, baseline, runs, **fit)
    return {**section, "missing": missing}


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
    ladder: list[Path] = (),
    throughput: Path | None = None,
    form: str = "auto",
    irreducible: float | None = None,
    plots: bool = True,
    by: list[str] = (),
) -> dict:
    """Write comparison.md, comparison.json, runs.csv and (if ``plots``) the charts into ``out``; return the
    result. Runs that differ in more than the norm and the seeds are refused before anything is written,
    unless each differing key is named in ``vary`` (a group per value) or ``allow_differ`` (accepted, and said
    in the report). ``results``: a results table (CSV) to compare instead of run directories. ``failed``: runs
    that ended without a result, each with its error (a sweep's failed cells), named in the report.
    ``select_on="val"``: each norm type's optim.lr chosen on validation loss (``gpt.analysis.selection``), test
    losses compared at it; ``confirmation``: fresh seeds at rates chosen on other runs (its record, for the report).
    ``by``: factors crossed with the norm types (``gpt.analysis.interaction``: effects per level, interactions)."""
    check_margins(equivalence_margin, detect)
    vary = _axes(vary, select_on, by, results is not None)
    load = {"which": which, "split": split, "precision": precision, "tokens": tokens, "offset": offset}
    runs = load_runs(paths, results, vary, allow_differ, **load)
    check_names(runs, vary, allow_differ)
    if results is None:  # a results table holds test losses, not what they were measured on
        check_comparable(runs)
    allowed = check_only_the_norm_differs(runs, vary, allow_differ)
    groups, baseline, why, selection, crossed = _grouped(runs, vary, baseline, select_on, list(by))
    speedup = effective_speedup(groups, baseline, ladder, load, throughput, form, irreducible, select_on, vary,
                                allow_differ)  # fmt: skip
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
        "effective_speedup": speedup,
        "crossed": crossed,
    }
    result["inside"], inside = inside_of(groups if results is None else [], Path(out))  # a table's rows: no folders
    return write_comparison(result, groups, Path(out), inside, plots)


def _axes(vary: list[str], select_on: str | None, by: list[str], from_table: bool) -> list[str]:
    """The keys that form groups: ``vary``, the rate where it is chosen on validation, and the ``by`` factors."""
    check_select_on(select_on, from_table)
    if by and select_on is not None:
        raise UserError("--by with --select-on: compare the levels at the chosen rates (sweep.py --confirm-seeds)")
    vary = [*vary, LR_KEY] if select_on is not None and not named(LR_KEY, vary) else list(vary)
    return [*vary, *(k for k in by if not named(k, vary))]


def _grouped(runs: list, vary: list[str], baseline: str | None, select_on: str | None, by: list[str]) -> tuple:
    """The compared groups, the baseline's label, why, the rate selection (``compared_groups``) and the crossed
    section (None without ``by``), whose reference level holds the main table's default baseline."""
    groups = group_runs(runs, vary)
    crossed = interaction.crossed(groups, by, baseline, config_default) if by else None
    if by and baseline not in {g.label for g in groups}:  # a norm type, or none: at the reference level
        baseline = interaction.reference_group(crossed)
    return (*compared_groups(groups, baseline, select_on), crossed)


def write_comparison(result: dict, groups: list[Group], out: Path, inside: list, plots: bool) -> dict:
    """Write ``result`` into ``out``: comparison.md, comparison.json, runs.csv and (if ``plots``) the charts."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "comparison.md", markdown(result))
    write_json(out / COMPARISON_FILE, json_safe(result), default=str, allow_nan=False)  # NaN -> null: standard JSON
    results_table.write_results(results_rows(groups), out / RESULTS_CSV)
    curves = [(g.label, [r.metrics for r in g.runs]) for g in groups]
    drawn = comparison_charts(curves, result["groups"], out, inside, result["selection"]) if plots else []
    speedup = result["effective_speedup"]
    if plots and speedup and not speedup.get("not_computed"):
        drawn.append(plot_speedup(speedup, out / SPEEDUP_CHART))
    if plots and result.get("crossed"):
        drawn.append(plot_interaction(result["crossed"], out / INTERACTION_CHART))
    result["plots"] = [str(p) for p in drawn]
    return result
