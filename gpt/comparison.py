"""Compare runs: group them by what differs in their configs, put numbers on the noise.

Runs are grouped by every config value that differs between them, except what names or
seeds a run (``run.*``, ``train.seed``, ``model.init_seed``, ``log.*``, ``hub.*``):
normally that leaves the norm type. Within a group the seeds are the repeats; a run's
seed is the pair (initial-weights seed, data-order seed), shown as one number when the
two are equal. Statistics use completed, evaluated runs only (whatever ``--which``
chooses); every other run is listed with the reason it was left out.

Each group gets the mean and standard deviation of its test loss and its difference to
a baseline group with a 95% interval: **paired by seed** on the seeds both groups share
(the same seed gives the same initial weights for everything but the norm, so the
paired difference removes most of the initialisation noise), otherwise Welch's unpaired
interval. From the paired differences come the seeds-needed numbers and, with an
equivalence margin, a TOST verdict (``gpt.stats``).

Only run directories are read (through ``gpt.rundir``): the config, metrics, summary
and the evaluation result of the chosen checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpt import stats
from gpt.config import flatten
from gpt.errors import UserError
from gpt.rundir import COMPLETED, DIVERGED, RunDir, read_eval_result

IGNORED_PREFIXES = ("run.", "log.", "hub.", "train.seed", "model.init_seed")


@dataclass
class Run:
    """One run directory, as the comparison sees it."""

    path: Path  # the run directory
    config: dict  # its resolved config, flattened: "model.norm_type" -> value
    status: str  # completed, diverged, interrupted or unfinished (gpt.rundir)
    summary: dict  # its summary.json ({} while it has none)
    metrics: list[dict]  # its metrics.jsonl records
    evaluation: dict | None  # the evaluation result of the chosen checkpoint; None: not evaluated

    @property
    def seed(self) -> str:
        """``"3"`` when the initial weights and the data order share seed 3, else ``"init/data"``."""
        data = self.config["train.seed"]
        init = self.config.get("model.init_seed")
        return str(data) if init is None or init == data else f"{init}/{data}"

    @property
    def usable(self) -> bool:
        """Whether its test loss enters the statistics: completed and evaluated."""
        return self.status == COMPLETED and self.evaluation is not None

    def left_out_because(self) -> str:
        if self.status == DIVERGED:
            return f"diverged at step {self.summary.get('diverged_at_step')}"
        if self.status != COMPLETED:
            return self.status
        return "not evaluated"


@dataclass
class Group:
    """Runs whose configs agree on everything but their names and seeds."""

    label: str  # the norm type, or "key=value, ..." of the values that define the group
    values: dict  # the config values that define the group
    runs: list[Run] = field(default_factory=list)  # one per seed

    def losses_by_seed(self) -> dict[str, float]:
        """Test loss by seed, of the runs that enter the statistics."""
        return {r.seed: r.evaluation["loss"] for r in self.runs if r.usable}


def load_run(path: Path, which: str = "final", split: str = "test", precision: str = "fp32") -> Run:
    """A run directory and the evaluation of its checkpoint ``which`` on ``split`` in ``precision``."""
    path = Path(path)
    run = RunDir(path)
    if not run.config_file.is_file() or not run.metrics_file.is_file():
        raise UserError(f"{path}: not a run directory (needs {run.config_file.name} and {run.metrics_file.name})")
    try:
        ckpt = run.checkpoint(which)  # only a completed run has a final one
    except UserError:
        ckpt = None
    evaluation = read_eval_result(ckpt, split, precision) if ckpt is not None else None
    return Run(path, flatten(run.read_config()), run.status(), run.summary() or {}, run.metrics(), evaluation)


def group_runs(runs: list[Run]) -> list[Group]:
    keys = sorted({k for r in runs for k in r.config})
    differing = [k for k in keys if not k.startswith(IGNORED_PREFIXES)
                 and len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]
    groups: dict[str, Group] = {}
    for r in runs:
        values = {k: r.config.get(k) for k in differing}
        if list(values) in (["model.norm_type"], []):  # the usual case, and a single group
            label = str(r.config["model.norm_type"])
        else:
            label = ", ".join(f"{k}={v}" for k, v in values.items())
        groups.setdefault(label, Group(label, values)).runs.append(r)
    for g in groups.values():
        seeds = [r.seed for r in g.runs]
        if len(seeds) != len(set(seeds)):
            raise UserError(f"group {g.label!r} has two runs with the same seed and config: "
                            + ", ".join(str(r.path) for r in g.runs))
    return list(groups.values())


def _refuse_mixed(what: str, by_key: dict, describe, fix: str) -> None:
    if len(by_key) > 1:
        described = "; ".join(f"{describe(k)} ({', '.join(r.path.name for r in v)})" for k, v in by_key.items())
        raise UserError(f"these runs {what}, so their losses are not comparable: {described}; {fix}")


def check_comparable(runs: list[Run]) -> None:
    """Refuse test losses measured on different tokens or tokenizations, and runs that planned
    different training lengths (steps, or tokens per step)."""
    ranges, budgets = {}, {}
    for r in runs:
        if r.evaluation is not None:
            e = r.evaluation
            ranges.setdefault((e["split"], e["offset"], e["n_tokens"], e["tokenizer"], e["data_dir"]), []).append(r)
        if r.summary.get("total_steps") is not None:
            per_step = r.config["train.global_batch_size"] * r.config["model.context_length"]
            budgets.setdefault((r.summary["total_steps"], r.summary["total_steps"] * per_step), []).append(r)
    _refuse_mixed("were evaluated on different test tokens", ranges,
                  lambda k: f"{k[0]} [{k[1]:,}, {k[1] + k[2]:,}) tokenizer {k[3]} in {k[4]}",
                  "re-evaluate them on one range")
    _refuse_mixed("trained for different lengths", budgets, lambda k: f"{k[0]:,} steps = {k[1]:,} tokens",
                  "train every run for the same train.steps or train.tokens (train.tokens_per_param counts the "
                  "parameters outside the norm layers, the same for every norm type)")


def difference(group: Group, baseline: Group) -> dict:
    """group - baseline test loss. Paired on the seeds both share when there are at least two (or when no
    unpaired interval is possible anyway); otherwise Welch's unpaired interval over all their runs."""
    a, b = group.losses_by_seed(), baseline.losses_by_seed()
    if not a or not b:
        return {"method": None, "diff": math.nan, "low": math.nan, "high": math.nan, "n": 0, "sd": math.nan,
                "unpaired": []}
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
    return {"resolvable_diff": stats.resolvable_difference(versus["sd"], versus["n"]),
            "seeds_needed": stats.seeds_needed(versus["diff"], versus["sd"]),
            "equivalence": stats.equivalence(diffs, margin) if margin is not None else None}


def _versus(g: Group, baseline: Group, margin: float | None) -> dict | None:
    if g is baseline:
        return None
    v = difference(g, baseline)
    a, b = g.losses_by_seed(), baseline.losses_by_seed()
    diffs = [a[s] - b[s] for s in sorted(set(a) & set(b))]
    return {**v, **noise(v, diffs, margin)}


def summarise(groups: list[Group], baseline_label: str, margin: float | None = None) -> dict:
    baseline = next(g for g in groups if g.label == baseline_label)
    rows = []
    for g in groups:
        losses = list(g.losses_by_seed().values())
        mean, sd, half = stats.mean_interval(losses)
        finished = [r for r in g.runs if r.summary]
        rows.append({
            "group": g.label, "values": g.values, "seeds": [r.seed for r in g.runs],
            "n_evaluated": len(losses), "test_loss_mean": mean, "test_loss_std": sd,
            "test_loss_ci95": [mean - half, mean + half],
            "vs_baseline": _versus(g, baseline, margin),
            "tokens_per_s_mean": _mean([r.summary.get("tokens_per_s") for r in finished]),
            "wall_seconds_mean": _mean([r.summary.get("wall_seconds") for r in finished]),
            "status": {s: sum(r.status == s for r in g.runs) for s in sorted({r.status for r in g.runs})},
            "diverged_at": [r.summary.get("diverged_at_step") for r in g.runs if r.status == DIVERGED],
            "missing_evaluation": [str(r.path) for r in g.runs if r.evaluation is None and r.status == COMPLETED],
            "left_out": [{"path": str(r.path), "seed": r.seed, "reason": r.left_out_because()}
                         for r in g.runs if not r.usable],
            "runs": [{"path": str(r.path), "seed": r.seed, "status": r.status,
                      "test_loss": r.evaluation["loss"] if r.evaluation else None} for r in g.runs],
        })
    test = next((r.evaluation for g in groups for r in g.runs if r.evaluation), None)
    return {"baseline": baseline_label, "equivalence_margin": margin, "level": stats.LEVEL, "power": stats.POWER,
            "groups": rows,
            "test_range": None if test is None else {k: test[k] for k in ("data_dir", "split", "offset", "n_tokens",
                                                                          "tokenizer", "precision")}}


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return float(np.mean(xs)) if xs else math.nan


def _fmt(x, spec=".4f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _loss(x, sign: str = "") -> str:
    """A loss difference: 6 decimals, or 3 significant digits when that would show only zeros."""
    small = isinstance(x, float) and x != 0 and abs(x) < 5e-7
    return _fmt(x, f"{sign}.2e" if small else f"{sign}.6f")


def json_safe(value):
    """``value`` with every NaN or infinity replaced by None, so that it is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def markdown(result: dict) -> str:
    lines = [f"# Comparison (baseline: {result['baseline']})", ""]
    if result["test_range"]:
        t = result["test_range"]
        lines += [f"Test loss: mean cross-entropy over {t['split']} tokens [{t['offset']:,}, "
                  f"{t['offset'] + t['n_tokens']:,}) of {t['data_dir']} ({t['tokenizer']}), {t['precision']}.", ""]
    lines += _main_table(result["groups"])
    lines += ["", "Intervals: t distribution; 'paired' pairs runs by seed (same initial weights outside the norm), "
              "'welch' is unpaired. n/a: fewer than two seeds. Statistics use completed, evaluated runs only."]
    lines += _noise_table(result)
    left_out = [(g["group"], x) for g in result["groups"] for x in g["left_out"]]
    if left_out:
        lines += ["", "Left out of the statistics:"]
        lines += [f"- {group}, seed {x['seed']} ({x['path']}): {x['reason']}" for group, x in left_out]
    missing = [p for g in result["groups"] for p in g["missing_evaluation"]]
    if missing:
        lines += ["", "Not evaluated (run `python evaluate.py` on them): " + ", ".join(missing)]
    return "\n".join(lines) + "\n"


def _main_table(rows: list[dict]) -> list[str]:
    lines = ["| group | seeds | test loss mean | std | vs baseline (95% CI) | tokens/s | wall s | status |",
             "|---|---|---|---|---|---|---|---|"]
    for g in rows:
        v = g["vs_baseline"]
        if v is None:
            versus = "baseline"
        elif v["method"] is None:
            versus = "n/a"
        else:
            pairs = f", {v['n']} pair{'s' if v['n'] != 1 else ''}" if v["method"] == "paired" else ""
            versus = f"{_loss(v['diff'], '+')} [{_loss(v['low'], '+')}, {_loss(v['high'], '+')}] {v['method']}{pairs}"
        status = ", ".join(f"{n} {s}" for s, n in g["status"].items())
        if g["diverged_at"]:
            status += f" (diverged at step {', '.join(str(s) for s in g['diverged_at'])})"
        if g["missing_evaluation"]:
            status += f"; {len(g['missing_evaluation'])} not evaluated"
        lines.append(f"| {g['group']} | {len(g['seeds'])} ({', '.join(g['seeds'])}) | "
                     f"{_fmt(g['test_loss_mean'], '.6f')} | {_fmt(g['test_loss_std'], '.6f')} | {versus} | "
                     f"{_fmt(g['tokens_per_s_mean'], ',.0f')} | {_fmt(g['wall_seconds_mean'], ',.0f')} | {status} |")
    return lines


def _noise_table(result: dict) -> list[str]:
    margin = result["equivalence_margin"]
    level, power = round(result["level"] * 100), round(result["power"] * 100)
    verdict_head = f"equivalent within +-{margin:g} (TOST p)" if margin is not None else "equivalent"
    lines = ["", f"## Noise and seeds needed (paired differences vs {result['baseline']})", "",
             f"| group | pairs | sd of paired diff | smallest resolvable diff | seeds to resolve observed diff "
             f"| {verdict_head} |", "|---|---|---|---|---|---|"]
    for g in result["groups"]:
        v = g["vs_baseline"]
        if v is None:
            continue
        pairs = str(v["n"]) if v["method"] == "paired" else f"0 ({v['method'] or 'no runs'})"
        if v["unpaired"]:
            pairs += f"; unpaired seeds: {', '.join(v['unpaired'])}"
        lines.append(f"| {g['group']} | {pairs} | {_loss(v['sd'])} | {_loss(v['resolvable_diff'])} | "
                     f"{_seeds_needed_text(v)} | {_equivalence_text(v, margin)} |")
    lines += ["", "- pairs: seeds that both this group and the baseline completed and evaluated; "
              "each gives one difference d = loss - baseline loss.",
              "- sd of paired diff: the sample standard deviation of those differences (the seed-to-seed noise "
              "that pairing leaves).",
              f"- smallest resolvable diff: the true difference these pairs detect at {level}% confidence with "
              f"{power}% power: (t(0.975, n-1) + t(0.80, n-1)) * sd / sqrt(n).",
              f"- seeds to resolve observed diff: the fewest pairs whose smallest resolvable difference (same "
              f"{level}% / {power}%, the current sd taken as the truth) is at most the observed mean difference.",
              "- equivalent within +-margin (--equivalence-margin): two one-sided t tests at 5% each, i.e. the "
              "90% interval lies inside +-margin; 'not shown' means a difference of the margin is not ruled out."]
    return lines


def _seeds_needed_text(v: dict) -> str:
    if v["method"] != "paired" or v["n"] < 2:
        return "n/a (needs 2 pairs)"
    if not v["diff"]:
        return "n/a (no difference)"
    return str(v["seeds_needed"]) if v["seeds_needed"] is not None else f"> {stats.MAX_SEEDS:,}"


def _equivalence_text(v: dict, margin: float | None) -> str:
    if margin is None:
        return "give --equivalence-margin"
    eq = v["equivalence"]
    if eq is None or eq["equivalent"] is None:
        return "n/a (needs 2 pairs)"
    return f"{'yes' if eq['equivalent'] else 'not shown'} (p = {eq['p']:.3g})"


CURVES = (("train_loss", "training loss", "train_loss.png", False),  # (key, label, file, log scale)
          ("val_loss", "validation loss", "val_loss.png", False),
          ("grad_norm", "gradient norm (before clipping)", "grad_norm.png", True))


def plot(groups: list[Group], result: dict, out: Path) -> list[Path]:
    """The curves of every run, coloured by group, and the test-loss bar chart; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    written = [_plot_curve(plt, colours, groups, curve, out) for curve in CURVES]
    return [*written, _plot_test_loss(plt, colours, result["groups"], out / "test_loss.png")]


def _plot_curve(plt, colours, groups: list[Group], curve: tuple, out: Path) -> Path:
    key, ylabel, name, log_y = curve
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for i, g in enumerate(groups):
        for j, r in enumerate(g.runs):
            pts = [(m["tokens"] / 1e6, m[key]) for m in r.metrics if isinstance(m.get(key), (int, float))
                   and math.isfinite(m[key])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=colours(i % 10), alpha=0.8, lw=1.2,
                        marker="o" if key == "val_loss" else None, ms=3, label=g.label if j == 0 else None)
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{ylabel} by group (one line per run)")
    fig.tight_layout()
    fig.savefig(out / name)
    plt.close(fig)
    return out / name


def _plot_test_loss(plt, colours, rows: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    means = [r["test_loss_mean"] for r in rows]
    errs = [(r["test_loss_ci95"][1] - r["test_loss_mean"]) if not math.isnan(r["test_loss_ci95"][1]) else 0
            for r in rows]
    ax.bar(range(len(rows)), [0 if math.isnan(m) else m for m in means], yerr=errs, capsize=5,
           color=[colours(i % 10) for i in range(len(rows))])
    finite = [m for m in means if not math.isnan(m)]
    if finite:
        span = max(finite) - min(finite)
        ax.set_ylim(min(finite) - max(span, 0.05) * 1.5, max(finite) + max(span, 0.05) * 1.5)
    bottom = ax.get_ylim()[0]
    for i, m in enumerate(means):  # no test loss (diverged, not evaluated): say so at the axis
        ax.text(i, bottom if math.isnan(m) else m, "n/a" if math.isnan(m) else f"{m:.4f}", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [r["group"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test loss (mean over seeds, 95% CI)")
    ax.set_title("held-out test loss by group")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def compare(paths: list[Path], out: Path, baseline: str | None = None, *, which: str = "final",
            split: str = "test", precision: str = "fp32", equivalence_margin: float | None = None) -> dict:
    """Write comparison.md, comparison.json and the plots into ``out``; return the result."""
    if equivalence_margin is not None and not equivalence_margin > 0:
        raise UserError(f"--equivalence-margin {equivalence_margin} must be > 0 (a loss difference, e.g. 0.01)")
    runs = [load_run(p, which, split, precision) for p in paths]
    if not runs:
        raise UserError("no runs to compare")
    check_comparable(runs)
    groups = group_runs(runs)
    labels = [g.label for g in groups]
    if baseline is None:
        baseline = "handrolled_layernorm" if "handrolled_layernorm" in labels else labels[0]
    if baseline not in labels:
        raise UserError(f"--baseline {baseline!r} is not a group; groups: {', '.join(labels)}")
    result = summarise(groups, baseline, equivalence_margin)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(markdown(result))
    text = json.dumps(json_safe(result), indent=2, default=str, allow_nan=False)  # NaN -> null: standard JSON
    (out / "comparison.json").write_text(text + "\n")
    result["plots"] = [str(p) for p in plot(groups, result, out)]
    return result
