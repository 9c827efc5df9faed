"""Compare runs: group them by what differs in their configs, put numbers on the noise.

Runs are grouped by every config value that differs between them, except what names or
seeds a run (``run.*``, ``train.seed``, ``model.init_seed``, ``log.*``, ``hub.*``):
normally that leaves the norm type. Within a group the seeds are the repeats. Each group
gets the mean and standard deviation of its test loss and its difference to a baseline
group with a 95% interval: **paired by seed** when both groups have the same seeds (the
same seed gives the same initial weights for everything but the norm, so the paired
difference removes most of the initialisation noise), otherwise Welch's unpaired interval.

Only run directories are read (through ``gpt.rundir``): the config, metrics, summary
and the evaluation result of the chosen checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats

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
    def seed(self) -> int:
        return self.config["train.seed"]


@dataclass
class Group:
    """Runs whose configs agree on everything but their names and seeds."""

    label: str  # the norm type, or "key=value, ..." of the values that define the group
    values: dict  # the config values that define the group
    runs: list[Run] = field(default_factory=list)  # one per seed

    def losses_by_seed(self) -> dict[int, float]:
        return {r.seed: r.evaluation["loss"] for r in self.runs if r.evaluation is not None}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


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
    return Run(path, _flatten(run.read_config()), run.status(), run.summary() or {}, run.metrics(), evaluation)


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


def check_comparable(runs: list[Run]) -> None:
    """Refuse to compare test losses measured on different tokens or tokenizations."""
    keys = {}
    for r in runs:
        if r.evaluation is not None:
            e = r.evaluation
            keys.setdefault((e["split"], e["offset"], e["n_tokens"], e["tokenizer"], e["data_dir"]), []).append(r)
    if len(keys) > 1:
        described = "; ".join(f"{k[0]} [{k[1]:,}, {k[1] + k[2]:,}) tokenizer {k[3]} in {k[4]} "
                              f"({', '.join(r.path.name for r in v)})" for k, v in keys.items())
        raise UserError(f"these runs were evaluated on different test tokens, so their losses are not "
                        f"comparable: {described}; re-evaluate them on one range")


def mean_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, sample standard deviation, half-width of the t interval); nan where n < 2."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(np.mean(xs))
    if n < 2:
        return mean, math.nan, math.nan
    sd = float(np.std(xs, ddof=1))
    return mean, sd, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def difference(group: Group, baseline: Group, level: float = 0.95) -> dict:
    """group - baseline test loss: paired by seed when the seeds match, else Welch."""
    a, b = group.losses_by_seed(), baseline.losses_by_seed()
    if not a or not b:
        return {"method": None, "diff": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    if set(a) == set(b):
        diffs = [a[s] - b[s] for s in sorted(a)]
        mean, _, half = mean_interval(diffs, level)
        return {"method": "paired", "diff": mean, "low": mean - half, "high": mean + half, "n": len(diffs)}
    xa, xb = list(a.values()), list(b.values())
    diff = float(np.mean(xa) - np.mean(xb))
    if len(xa) < 2 or len(xb) < 2:
        return {"method": "welch", "diff": diff, "low": math.nan, "high": math.nan, "n": min(len(xa), len(xb))}
    va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1)) if se > 0 else 1.0
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"method": "welch", "diff": diff, "low": diff - half, "high": diff + half, "n": min(len(xa), len(xb))}


def summarise(groups: list[Group], baseline_label: str) -> dict:
    baseline = next(g for g in groups if g.label == baseline_label)
    rows = []
    for g in groups:
        losses = [r.evaluation["loss"] for r in g.runs if r.evaluation is not None]
        mean, sd, half = mean_interval(losses)
        finished = [r for r in g.runs if r.summary]
        rows.append({
            "group": g.label, "values": g.values, "seeds": sorted(r.seed for r in g.runs),
            "n_evaluated": len(losses), "test_loss_mean": mean, "test_loss_std": sd,
            "test_loss_ci95": [mean - half, mean + half],
            "vs_baseline": difference(g, baseline) if g is not baseline else None,
            "tokens_per_s_mean": _mean([r.summary.get("tokens_per_s") for r in finished]),
            "wall_seconds_mean": _mean([r.summary.get("wall_seconds") for r in finished]),
            "status": {s: sum(r.status == s for r in g.runs) for s in sorted({r.status for r in g.runs})},
            "diverged_at": [r.summary.get("diverged_at_step") for r in g.runs if r.status == DIVERGED],
            "missing_evaluation": [str(r.path) for r in g.runs if r.evaluation is None and r.status == COMPLETED],
            "runs": [{"path": str(r.path), "seed": r.seed, "status": r.status,
                      "test_loss": r.evaluation["loss"] if r.evaluation else None} for r in g.runs],
        })
    test = next((r.evaluation for g in groups for r in g.runs if r.evaluation), None)
    return {"baseline": baseline_label, "groups": rows,
            "test_range": None if test is None else {k: test[k] for k in ("data_dir", "split", "offset", "n_tokens",
                                                                          "tokenizer", "precision")}}


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return float(np.mean(xs)) if xs else math.nan


def _fmt(x, spec=".4f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(result: dict) -> str:
    lines = [f"# Comparison (baseline: {result['baseline']})", ""]
    if result["test_range"]:
        t = result["test_range"]
        lines += [f"Test loss: mean cross-entropy over {t['split']} tokens [{t['offset']:,}, "
                  f"{t['offset'] + t['n_tokens']:,}) of {t['data_dir']} ({t['tokenizer']}), {t['precision']}.", ""]
    lines += ["| group | seeds | test loss mean | std | vs baseline (95% CI) | tokens/s | wall s | status |",
              "|---|---|---|---|---|---|---|---|"]
    for g in result["groups"]:
        v = g["vs_baseline"]
        if v is None:
            versus = "baseline"
        elif v["method"] is None:
            versus = "n/a"
        else:
            versus = f"{v['diff']:+.6f} [{_fmt(v['low'], '+.6f')}, {_fmt(v['high'], '+.6f')}] {v['method']}"
        status = ", ".join(f"{n} {s}" for s, n in g["status"].items())
        if g["diverged_at"]:
            status += f" (diverged at step {', '.join(str(s) for s in g['diverged_at'])})"
        if g["missing_evaluation"]:
            status += f"; {len(g['missing_evaluation'])} not evaluated"
        lines.append(f"| {g['group']} | {len(g['seeds'])} ({', '.join(map(str, g['seeds']))}) | "
                     f"{_fmt(g['test_loss_mean'], '.6f')} | {_fmt(g['test_loss_std'], '.6f')} | {versus} | "
                     f"{_fmt(g['tokens_per_s_mean'], ',.0f')} | {_fmt(g['wall_seconds_mean'], ',.0f')} | {status} |")
    missing = [p for g in result["groups"] for p in g["missing_evaluation"]]
    lines += ["", "Intervals: t distribution; 'paired' pairs runs by seed (same initial weights outside the norm), "
              "'welch' is unpaired. n/a: fewer than two seeds."]
    if missing:
        lines += ["", "Not evaluated (run `python evaluate.py` on them): " + ", ".join(missing)]
    return "\n".join(lines) + "\n"


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
            split: str = "test", precision: str = "fp32") -> dict:
    """Write comparison.md, comparison.json and the plots into ``out``; return the result."""
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
    result = summarise(groups, baseline)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(markdown(result))
    (out / "comparison.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    result["plots"] = [str(p) for p in plot(groups, result, out)]
    return result
