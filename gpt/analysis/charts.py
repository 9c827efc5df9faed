"""Every chart the harness draws, as PNG files. The per-step charts are declared once, in
``gpt.run.directory.CHARTS`` (file, metrics keys, label, scale), and drawn under the same file name for a
run (its own curves, drawn at its end and every few minutes by the ``RunCharts`` hook) and for a comparison
(every run's curves coloured by group); a comparison adds the test loss by group with its intervals and, where it chose
each norm type's learning rate on validation, the validation loss against the rate (``LR_CHART``). A run that
logs stats.jsonl (``gpt.analysis.inside``) also gets what each norm does inside the model (``INSIDE_CHARTS``),
and a comparison of such runs one sheet of it by group (``INSIDE_SHEET``)."""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from gpt.analysis.inside import Stats, group_curves, group_profiles, load_stats  # noqa: E402
from gpt.common.errors import os_reason  # noqa: E402
from gpt.common.files import replacing  # noqa: E402
from gpt.run.directory import CHARTS, Chart, RunDir  # noqa: E402
from gpt.training.hooks import RunHooks  # noqa: E402

TEST_LOSS_CHART = "test_loss.png"  # a comparison's own chart: the held-out loss of each group
LR_CHART = "lr_sensitivity.png"  # a comparison that chose rates on validation: val loss against the rate
# A run's charts of its stats.jsonl, each of one per-block key, and their titles.
INSIDE_CHARTS = {
    "resid_rms": ("inside_resid_rms.png", "RMS of the residual stream entering each block"),
    "attn_logit_max": ("inside_attn_logit_max.png", "attention logit max (q.k/sqrt(head_dim), over heads)"),
    "update_ratio": ("inside_update_ratio.png", "update ratio ||W_after - W_before|| / ||W_before||"),
}
INTERACTION_CHART = "interaction.png"  # a crossed comparison's: each norm type's effect per level, side by side
SPEEDUP_CHART = "speedup.png"  # a comparison's effective speedup: loss against compute and against GPU time
INSIDE_SHEET = "inside.png"  # a comparison's: the three by group, mean over seeds with a min-max band


def save_figure(fig, path: Path) -> Path:
    """Lay ``fig`` out and write it to ``path`` whole (``gpt.common.files.replacing``), then close it. A title
    in a script the font lacks (a run named in Cyrillic, say) draws boxes, not a warning per character."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from")
            fig.tight_layout()
            with replacing(path) as tmp:
                fig.savefig(tmp)
    finally:
        plt.close(fig)
    return path


def _points(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(tokens in millions, value) of every record holding a finite ``key``."""
    pts = [
        (r["tokens"] / 1e6, r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    return [x for x, _ in pts], [y for _, y in pts]


def _style(i: int) -> dict:
    """A chart's first series solid, the others (sparser: validation) dashed with their points marked."""
    return {"ls": "-", "marker": None} if i == 0 else {"ls": "--", "marker": "o", "ms": 3}


def _axes(ax, chart: Chart, title: str, drawn: list[float]) -> None:
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel(chart.label)
    if chart.log_scale and any(y > 0 for y in drawn):
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)


def plot_run(records: list[dict], folder: Path, title: str) -> list[Path]:
    """Draw a run's charts (``gpt.run.directory.CHARTS``) from its metrics records into ``folder``."""
    written = []
    for chart in CHARTS:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        drawn = []
        for i, (key, label) in enumerate(chart.series):
            xs, ys = _points(records, key)
            ax.plot(xs, ys, label=label, **_style(i))
            drawn += ys
        _axes(ax, chart, title, drawn)
        if len(chart.series) > 1:
            ax.legend()
        written.append(save_figure(fig, folder / chart.file))
    return written


class RunCharts(RunHooks):
    """Draws a run's charts at its end, however it ends, and redraws them after a checkpoint once
    ``every_s`` seconds have passed since the run started or they were last drawn: a long run's charts
    follow it, a short run (seconds) draws once. They are derived from metrics.jsonl, so a failure to
    draw them (a full disk) is a line in the run's last words, never a stop."""

    EVERY_S = 300.0  # drawing takes a second or two, a GPT-2 small checkpoint comes every few minutes

    def __init__(self, title: str, every_s: float = EVERY_S):
        self.title, self.every_s = title, every_s
        self.run: RunDir | None = None
        self.drawn_at = 0.0

    def started(self, run_path: Path) -> None:
        self.run = RunDir(run_path)
        self.drawn_at = time.monotonic()

    def draw(self) -> str | None:
        self.drawn_at = time.monotonic()
        try:
            plot_run(self.run.metrics(), self.run.path, self.title)
        except OSError as e:
            return f"charts not drawn: {os_reason(e)}"
        try:  # a damaged stats.jsonl, like a full disk, is said, never a stop
            stats = load_stats(self.run.path)
            if stats is not None:
                plot_inside(stats, self.run.path, self.title)
        except (OSError, ValueError) as e:
            return f"inside charts not drawn: {os_reason(e)}"
        return None

    def checkpoint_saved(self, ckpt: Path) -> None:
        if time.monotonic() - self.drawn_at >= self.every_s:
            self.draw()  # a chart not drawn now is drawn at the end, or said then

    def finished(self, status: str, final: Path | None, summary: dict, stop) -> str | None:
        return self.draw()


def comparison_charts(
    curves: list[tuple[str, list[list[dict]]]],
    rows: list[dict],
    out: Path,
    inside: list[tuple[str, list[Stats]]] = (),
    selection: dict | None = None,
) -> list[Path]:
    """Every run's curves of each chart in ``CHARTS`` (those any run logged), coloured by group, the test
    loss by group, where any run logged stats ``INSIDE_SHEET`` and, with a ``selection`` of learning rates
    (``gpt.analysis.selection``), ``LR_CHART``; returns the files. ``curves``: each group's label and its runs'
    metrics records; ``rows``: the comparison's groups; ``inside``: each group's label and its runs' stats
    (``gpt.analysis.inside.Stats``)."""
    logged = {k for _, runs in curves for metrics in runs for m in metrics for k in m}
    drawn = [c for c in CHARTS if logged & {key for key, _ in c.series}]  # a results table has no curves
    written = [_plot_curves(curves, chart, out) for chart in drawn]
    sheet = [plot_inside_comparison(inside, out / INSIDE_SHEET)] if any(runs for _, runs in inside) else []
    rates = [plot_lr_sensitivity(selection, out / LR_CHART)] if selection else []
    return [*written, _plot_test_loss(rows, out / TEST_LOSS_CHART), *rates, *sheet]


def plot_lr_sensitivity(selection: dict, path: Path) -> Path:
    """The learning-rate sensitivity curve: each norm type's final validation loss against the rate (log x), a
    line through its means over seeds with bars from its lowest to its highest seed and a dot per seed, the rate
    chosen ringed. A rate that could not be chosen (a run diverged or did not finish) is not drawn; the legend
    names it. Colours follow the comparison's other charts (norm types with a chosen rate first, in order)."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    families = sorted(selection["families"], key=lambda f: f["chosen"] is None)  # stable: the table's order
    for i, family in enumerate(families):
        colour = plt.get_cmap("tab10")(i % 10)
        drawn = [r for r in family["rates"] if r["eligible"]]
        left = ", ".join(f"{r['value']:g}" for r in family["rates"] if not r["eligible"])
        xs, means = [r["value"] for r in drawn], [r["val_loss_mean"] for r in drawn]
        bars = [
            [m - r["val_loss_min"] for m, r in zip(means, drawn)],
            [r["val_loss_max"] - m for m, r in zip(means, drawn)],
        ]
        label = family["family"] + (f" ({left}: not eligible, not drawn)" if left else "")
        ax.errorbar(xs, means, yerr=bars, color=colour, marker="o", ms=5, capsize=4, label=label)
        for r in drawn:
            seeds = [run["val_loss"] for run in r["runs"]]
            ax.plot([r["value"]] * len(seeds), seeds, ".", color=colour, alpha=0.5, ms=4)
            if r["chosen"]:
                ax.plot(r["value"], r["val_loss_mean"], "o", ms=15, mfc="none", mec=colour, mew=2)
    ax.plot([], [], "o", ms=12, mfc="none", mec="grey", mew=2, label="chosen: lowest mean validation loss")
    ax.set_xscale("log")
    rates = sorted({r["value"] for f in families for r in f["rates"]})
    ax.set_xticks(rates, [f"{v:g}" for v in rates])
    ax.minorticks_off()
    ax.set_xlabel(f"learning rate ({selection['key']}, log scale)")
    ax.set_ylabel("final validation loss")
    ax.set_title(
        "validation loss against learning rate: mean over seeds, bars from lowest to highest seed", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _plot_curves(curves: list[tuple[str, list[list[dict]]]], chart: Chart, out: Path) -> Path:
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    drawn = []
    for g, (label, runs) in enumerate(curves):
        for j, metrics in enumerate(runs):
            for i, (key, _) in enumerate(chart.series):
                xs, ys = _points(metrics, key)
                first = j == 0 and i == 0
                name = f"{label} (1 seed)" if len(runs) == 1 else label
                ax.plot(xs, ys, color=colours(g % 10), alpha=0.8, lw=1.2, label=name if first else None, **_style(i))
                drawn += ys
    if len(chart.series) > 1:  # which line is which series: grey samples of each style
        for i, (_, name) in enumerate(chart.series):
            ax.plot([], [], color="grey", label=name, **_style(i))
    _axes(ax, chart, f"{chart.label} by group (one line per run)", drawn)
    ax.legend(fontsize=8)
    return save_figure(fig, out / chart.file)


def _plot_test_loss(rows: list[dict], path: Path) -> Path:
    """Left: each group's mean test loss and its 95% interval; right: its difference to the baseline with the
    interval the table gives (paired where the seeds pair), which is what decides: two groups' own intervals
    may overlap while their paired difference excludes 0. Points with error bars on axes that span them
    (a bar on an axis not starting at zero would exaggerate). One seed: a hollow point, no interval."""
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 1.6 + 0.55 * len(rows)), dpi=100, sharey=True, gridspec_kw={"width_ratios": [1, 1]}
    )
    ys = list(range(len(rows)))[::-1]  # the table's order, top to bottom
    means = [(r["test_loss_mean"], *r["test_loss_ci95"]) for r in rows]
    diffs = [(v["diff"], v["low"], v["high"]) if (v := r["vs_baseline"]) else (0.0, 0.0, 0.0) for r in rows]
    _points_with_intervals(left, ys, means)
    _points_with_intervals(right, ys, diffs)
    right.axvline(0, color="grey", lw=1)
    for y, r in zip(ys, rows):
        if r["vs_baseline"] is None:
            right.annotate("baseline", (0, y), xytext=(6, 6), textcoords="offset points", fontsize=8)
    left.set_yticks(ys, [_test_loss_label(r) for r in rows], fontsize=8)
    left.set_ylim(-0.6, len(rows) - 0.4)
    left.set_xlabel("test loss: mean over seeds, 95% interval")
    right.set_xlabel("difference to the baseline, 95% interval (as the table)")
    fig.suptitle("held-out test loss by group (hollow: one seed, no interval)")
    return save_figure(fig, path)


def _points_with_intervals(ax, ys: list[int], values: list[tuple[float, float, float]]) -> None:
    """(estimate, low, high) per row as a point with error bars, hollow where there is no interval; the axis
    spans every point and interval with a margin."""
    colours = plt.get_cmap("tab10")
    for i, (y, (mid, low, high)) in enumerate(zip(ys, values)):
        if math.isnan(mid):
            continue
        if math.isnan(low):
            ax.plot(mid, y, "o", mfc="white", mec=colours(i % 10), mew=1.5, ms=8)
        else:
            ax.errorbar(mid, y, xerr=[[mid - low], [high - mid]], fmt="o", color=colours(i % 10), ms=7, capsize=5)
    finite = [v for row in values for v in row if not math.isnan(v)]
    if finite:
        pad = max(max(finite) - min(finite), 1e-3) * 0.15
        ax.set_xlim(min(finite) - pad, max(finite) + pad)
    ax.grid(axis="x", alpha=0.3)


def plot_interaction(section: dict, path: Path) -> Path:
    """A crossed comparison (``gpt.analysis.interaction``): per norm type (rows), its difference to the baseline
    norm type at each level (one colour each, side by side) with the 95% interval; where the effects' intervals sit
    apart the interaction may still be small: its own interval is the table's."""
    rows, levels = section["rows"], section["levels"]
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.7 * len(rows) * max(1, len(levels) / 2)), dpi=100)
    colours = plt.get_cmap("tab10")
    step = 0.4 / (len(levels) - 1)  # a norm type's levels within +-0.2 of its tick
    finite = []
    for j, level in enumerate(levels):
        for i, row in enumerate(rows):
            e = row["effects"][j]
            y = len(rows) - 1 - i + 0.2 - j * step
            if e["diff"] is None or math.isnan(e["diff"]):
                continue
            finite += [v for v in (e["diff"], e["low"], e["high"]) if v is not None and not math.isnan(v)]
            if e["low"] is None or math.isnan(e["low"]):
                ax.plot(e["diff"], y, "o", mfc="white", mec=colours(j % 10), ms=7)
            else:
                err = [[e["diff"] - e["low"]], [e["high"] - e["diff"]]]
                ax.errorbar(e["diff"], y, xerr=err, fmt="o", color=colours(j % 10), ms=6, capsize=4)
        ax.plot([], [], "o", color=colours(j % 10), label=level)
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(range(len(rows))[::-1], [r["norm"] for r in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    if finite:
        pad = max(max(finite) - min(finite), 1e-3) * 0.15
        ax.set_xlim(min(finite) - pad, max(finite) + pad)
    ax.set_xlabel(f"test loss minus {section['baseline']}'s at the same level, 95% interval")
    ax.legend(title=" x ".join(section["by"]), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("each norm type's effect within every level")
    return save_figure(fig, path)


def _test_loss_label(row: dict) -> str:
    """A group's tick: its name, its mean and how many seeds it stands on."""
    mean, n = row["test_loss_mean"], row["n_evaluated"]
    if math.isnan(mean):
        return f"{row['group']}\nn/a (not evaluated)"
    return f"{row['group']}\n{mean:.4f}, {n} seed{'s' if n != 1 else ''}"


def plot_speedup(section: dict, path: Path) -> Path:
    """The effective speedup (``gpt.analysis.speedup``): test loss against training FLOPs (left) and against GPU
    seconds (right, where time-matched is computed), log x. The baseline's runs (each seed, and the mean) with its
    fitted curve (dashed beyond its runs); each norm type's mean at its own cost, and the horizontal gap to the cost
    the baseline needs for that loss (the arrow: ES = where it points / where it starts)."""
    panels = [("compute", "training FLOPs")] + ([("time", "training seconds (at steady-state tokens/s)")] if
                                                 section["curve"]["time"] else [])  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), dpi=100, squeeze=False)
    for ax, (name, label) in zip(axes[0], panels):
        _speedup_panel(ax, section, name, label)
    return save_figure(fig, path)


def _speedup_panel(ax, section: dict, name: str, label: str) -> None:
    """One panel of ``plot_speedup``: ``name`` (compute or time) on the x axis, ``label`` its words."""
    colours = plt.get_cmap("tab10")
    curve, rungs = section["curve"][name], section["rungs"]
    xs = np.array(curve["x"], float)
    for x, r in zip(xs, rungs):
        ax.plot([x] * len(r["losses"]), list(r["losses"].values()), ".", color=colours(0), alpha=0.45, ms=5)
    ax.plot(xs, [np.mean(list(r["losses"].values())) for r in rungs], "o", color=colours(0),
            label=f"{section['baseline']} (baseline)")  # fmt: skip
    needed = [v[name]["needed"] * 1.0 for v in section["norms"].values() if v[name] and v[name]["crosses"]]
    wide = np.geomspace(min([xs.min(), *needed]), max([xs.max(), *needed]), 200)
    fitted = curve["E"] + curve["A"] * wide ** -curve["alpha"]
    inside = (wide >= xs.min() * (1 - 1e-9)) & (wide <= xs.max() * (1 + 1e-9))
    ax.plot(wide[inside], fitted[inside], "-", color=colours(0), lw=1.2)
    ax.plot(wide, np.where(inside, np.nan, fitted), "--", color=colours(0), lw=1)
    for i, (norm, v) in enumerate(section["norms"].items(), 1):
        es = v[name]
        if es is None:
            continue
        x = es["x_variant"]
        ax.plot([x], [v["loss_mean"]], "D", color=colours(i % 10), label=f"{norm}: ES {es['es']:.2f}x")
        if es["crosses"]:
            ax.annotate("", xy=(es["needed"], v["loss_mean"]), xytext=(x, v["loss_mean"]),
                        arrowprops={"arrowstyle": "->", "color": colours(i % 10)})  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)
    ax.set_ylabel("test loss (nats per token)")
    ax.set_title(f"{name}-matched: {section['route']}, {section['formula']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_scaling(result: dict, path: Path) -> Path:
    """A comparison across sizes (``gpt.analysis.across_sizes``). Left: test loss against N (log x), a colour per
    norm type: every seed's loss (small points), the mean, the fitted curve (dashed beyond the sizes fitted, to
    the predicted point and its interval). Right: each norm type's paired difference to the baseline at each size
    with its 95% interval, and the fitted trend line."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    colours = plt.get_cmap("tab10")
    for i, (norm, n) in enumerate(result["norms"].items()):
        colour, pts = colours(i % 10), n["points"]
        xs = [p["n_params"] for p in pts]
        for p in pts:
            left.plot(
                [p["n_params"]] * len(p["losses"]), list(p["losses"].values()), ".", color=colour, alpha=0.45, ms=5
            )
        left.plot(xs, [p["mean"] for p in pts], "o", color=colour, ms=6, label=norm)
        fit, pred = n["fit_n_params"], n["fit_n_params"].get("predicted")
        if "alpha" in fit:
            top = max(xs + ([pred["at"]] if pred else []))
            grid = np.geomspace(min(xs), top, 200)
            curve = fit["E"] + fit["A"] * grid ** -fit["alpha"]["mean"]
            inside = grid <= max(xs) * (1 + 1e-9)
            left.plot(grid[inside], curve[inside], "-", color=colour, lw=1.2)
            left.plot(grid[~inside], curve[~inside], "--", color=colour, lw=1.2)
            if pred and math.isfinite(pred["low"]):
                bar = [[pred["mean"] - pred["low"]], [pred["high"] - pred["mean"]]]
                left.errorbar(pred["at"], pred["mean"], yerr=bar, fmt="s", mfc="white", color=colour, capsize=4)
        gaps = [p for p in pts if p["gap"] is not None]
        if n["trend"] is None or not gaps:
            continue
        gx = np.array([p["n_params"] for p in gaps], float)
        mid = np.array([p["gap"]["diff"] for p in gaps])
        low = np.array([p["gap"]["low"] if p["gap"]["low"] is not None else np.nan for p in gaps], float)
        high = np.array([p["gap"]["high"] if p["gap"]["high"] is not None else np.nan for p in gaps], float)
        err = np.nan_to_num(np.stack([mid - low, high - mid]))
        right.errorbar(gx, mid, yerr=err, fmt="o", color=colour, capsize=4, label=f"{norm} - {result['baseline']}")
        t = n["trend"]
        if "mean" in t:
            line = t["gap_at_center"] + t["mean"] * (np.log10(gx) - t["center_log10_n"])
            right.plot(gx, line, "-", color=colour, lw=1, alpha=0.8)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # a decade or two: the minor labels would overlap
        ax.set_xlabel("N: parameters outside the norm layers")
        ax.grid(alpha=0.3)
    right.axhline(0, color="grey", lw=1)
    sized = [s for s in result["sizes"] if s["n_params"]]
    right.set_xticks([s["n_params"] for s in sized], [f"{s['size']}\n{s['n_params']:,}" for s in sized], fontsize=8)
    left.set_ylabel("test loss")
    left.set_title("test loss by size: seeds, mean, fit (dashed: extrapolated)")
    right.set_ylabel(f"paired difference to {result['baseline']}")
    right.set_title("the gap by size, 95% intervals, trend against log N")
    for ax in (left, right):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return save_figure(fig, path)


# ------------------------------------------------------------------ inside the model (gpt.analysis.inside)


def _positive(values: np.ndarray) -> np.ndarray:
    """``values`` with what a log axis cannot show (0, negative, inf) as nan: a gap, not a clipped spike."""
    values = np.asarray(values, dtype=float)
    return np.where(np.isfinite(values) & (values > 0), values, np.nan)


def _block_ticks(ax, rows: int, ln_f: bool, axis: str = "y") -> None:
    """Block indices at most about 12 ticks apart; with ``ln_f``, the last row is the final norm's input."""
    blocks = rows - ln_f
    ticks = list(range(0, blocks, max(1, math.ceil(blocks / 12))))
    labels = [str(t) for t in ticks] + (["ln_f"] if ln_f else [])
    getattr(ax, f"set_{axis}ticks")([*ticks, blocks] if ln_f else ticks, labels)


def _heat_map(fig, ax, stats: Stats, key: str) -> None:
    """Block (y) by step (x); the residual RMS on a log colour scale. Non-finite cells are left blank."""
    values = stats.per_block(key)
    log = key == "resid_rms" and bool(np.isfinite(_positive(values)).any())
    shown = _positive(values) if log else np.where(np.isfinite(values), values, np.nan)
    norm = LogNorm(np.nanmin(shown), np.nanmax(shown)) if log else None
    cells = np.ma.masked_invalid(shown.T)
    mesh = ax.pcolormesh(stats.steps, np.arange(shown.shape[1]), cells, shading="nearest", norm=norm, cmap="viridis")
    fig.colorbar(mesh, ax=ax)
    _block_ticks(ax, shown.shape[1], ln_f=key == "resid_rms")
    ax.set_ylabel("block (input of)" if key == "resid_rms" else "block")


def _update_ratios(fig, ax, stats: Stats) -> None:
    """A curve per block, coloured by depth, and the embedding and head dashed; log y."""
    ratios, cmap = stats.per_block("update_ratio"), plt.get_cmap("viridis")
    last = max(ratios.shape[1] - 1, 1)
    for b in range(ratios.shape[1]):
        ax.plot(stats.steps, _positive(ratios[:, b]), color=cmap(b / last), lw=1)
    for key, name, colour in (("embed_update_ratio", "embedding", "black"), ("head_update_ratio", "head", "red")):
        if key in stats.keys:
            ax.plot(stats.steps, _positive(stats.scalar(key)), ls="--", color=colour, label=name)
    fig.colorbar(plt.cm.ScalarMappable(Normalize(0, last), cmap), ax=ax, label="block")
    if np.isfinite(_positive(ratios)).any():
        ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_ylabel("update ratio")


def plot_inside(stats: Stats, folder: Path, title: str) -> list[Path]:
    """Draw a run's ``INSIDE_CHARTS`` (those its stats hold) from its stats into ``folder``; returns the files."""
    written = []
    for key, (file, label) in INSIDE_CHARTS.items():
        if key not in stats.keys:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        if key == "update_ratio":
            _update_ratios(fig, ax, stats)
        else:
            _heat_map(fig, ax, stats, key)
        ax.set_xlabel("step")
        ax.set_title(f"{title}\n{label}", fontsize=10)
        written.append(save_figure(fig, folder / file))
    return written


def plot_inside_comparison(groups: list[tuple[str, list[Stats]]], path: Path) -> Path:
    """One sheet, by group (each group's label and its runs' stats; a group's colour is its place, as in the
    other comparison charts): (a) the residual RMS entering each block at each run's last stats step,
    (b) the attention-logit max over blocks and (c) the update ratio's mean over blocks, against the step.
    Each line is the mean over the group's runs, its band their min to max."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), dpi=100)
    place = {label: i for i, (label, _) in enumerate(groups)}
    seeds = {label: len(runs) for label, runs in groups}
    panels = (
        (group_profiles(groups), "blocks", "(a) residual RMS at the last stats step", "block (input of)", True),
        (group_curves(groups, "attn_logit_max", "max"), "steps", "(b) attention logit max over blocks", "step", False),
        (group_curves(groups, "update_ratio", "mean"), "steps", "(c) update ratio, mean over blocks", "step", True),
    )
    for ax, (lines, x, title, xlabel, log) in zip(axes, panels):
        for line in lines:
            colour = plt.get_cmap("tab10")(place[line["group"]] % 10)
            mean, low, high = (_positive(line[k]) if log else line[k] for k in ("mean", "low", "high"))
            ax.plot(line[x], mean, color=colour, lw=1.5, label=f"{line['group']} ({seeds[line['group']]} runs)")
            ax.fill_between(line[x], low, high, color=colour, alpha=0.2, lw=0)
        if log and any(np.isfinite(_positive(line["mean"])).any() for line in lines):
            ax.set_yscale("log")
        if x == "blocks" and lines:
            _block_ticks(ax, max(len(line["mean"]) for line in lines), ln_f=True, axis="x")
        ax.set(title=title, xlabel=xlabel)
        ax.grid(alpha=0.3)
    labelled = [ax for ax in axes if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[0].legend(fontsize=8)
    fig.suptitle("inside the model by group: mean over seeds, band from min to max")
    return save_figure(fig, path)
