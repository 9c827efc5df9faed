"""Every chart the harness draws, as PNG files: a run's own (loss, learning rate, gradient norm against
tokens, redrawn at each checkpoint by the ``RunCharts`` hook) and a comparison's (every run's curves
coloured by group, and the test loss by group)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from gpt.common.errors import os_reason  # noqa: E402
from gpt.common.files import replacing  # noqa: E402
from gpt.run.directory import RunDir  # noqa: E402
from gpt.training.hooks import RunHooks  # noqa: E402


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


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)):
            xs.append(r["tokens"] / 1e6)
            ys.append(v)
    return xs, ys


def plot_run(records: list[dict], files: dict[str, Path], title: str) -> list[Path]:
    """Draw a run's charts from its metrics records into ``files`` (``RunDir.charts``: loss, lr, grad_norm)."""
    charts = [
        (files["loss"], [("train_loss", "train"), ("val_loss", "validation")], "cross-entropy loss", False),
        (files["lr"], [("lr", "learning rate")], "learning rate", False),
        (files["grad_norm"], [("grad_norm", "gradient norm (before clipping)")], "gradient norm", True),
    ]
    written = []
    for path, series, ylabel, log_y in charts:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        for key, label in series:
            xs, ys = _series(records, key)
            ax.plot(xs, ys, marker="o" if key == "val_loss" else None, markersize=3, label=label)
        ax.set_xlabel("tokens (millions)")
        ax.set_ylabel(ylabel)
        if log_y and any(y > 0 for y in _series(records, series[0][0])[1]):
            ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
        written.append(save_figure(fig, path))
    return written


class RunCharts(RunHooks):
    """Redraws a run's charts after every checkpoint and at its end. They are derived from metrics.jsonl,
    so a failure to draw them (a full disk) is a line in the run's last words, never a stop."""

    def __init__(self, title: str):
        self.title = title
        self.run: RunDir | None = None

    def started(self, run_path: Path) -> None:
        self.run = RunDir(run_path)

    def draw(self) -> str | None:
        try:
            plot_run(self.run.metrics(), self.run.charts, self.title)
        except OSError as e:
            return f"charts not drawn: {os_reason(e)}"
        return None

    def checkpoint_saved(self, ckpt: Path) -> None:
        self.draw()  # a chart not drawn now is drawn at the end, or said then

    def finished(self, status: str, final: Path | None, summary: dict, stop) -> str | None:
        return self.draw()


# A comparison's curves, each drawn into <key>.png of the comparison's folder: (metrics key, label, log scale)
CURVES = (
    ("train_loss", "training loss", False),
    ("val_loss", "validation loss", False),
    ("grad_norm", "gradient norm (before clipping)", True),
)


def comparison_charts(curves: list[tuple[str, list[list[dict]]]], rows: list[dict], out: Path) -> list[Path]:
    """The curves of every run, coloured by group, and the test-loss bar chart; returns the files.
    ``curves``: each group's label and its runs' metrics records; ``rows``: the comparison's groups."""
    colours = plt.get_cmap("tab10")
    drawn = [c for c in CURVES if any(c[0] in m for _, runs in curves for metrics in runs for m in metrics)]
    written = [_plot_curve(colours, curves, curve, out) for curve in drawn]  # a results table has no curves
    return [*written, _plot_test_loss(colours, rows, out / "test_loss.png")]


def _plot_curve(colours, curves: list[tuple[str, list[list[dict]]]], curve: tuple, out: Path) -> Path:
    key, ylabel, log_y = curve
    name = f"{key}.png"
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for i, (label, runs) in enumerate(curves):
        for j, metrics in enumerate(runs):
            pts = [
                (m["tokens"] / 1e6, m[key])
                for m in metrics
                if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])
            ]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(
                    xs,
                    ys,
                    color=colours(i % 10),
                    alpha=0.8,
                    lw=1.2,
                    marker="o" if key == "val_loss" else None,
                    ms=3,
                    label=label if j == 0 else None,
                )
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{ylabel} by group (one line per run)")
    return save_figure(fig, out / name)


def _plot_test_loss(colours, rows: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    means = [r["test_loss_mean"] for r in rows]
    errs = [
        (r["test_loss_ci95"][1] - r["test_loss_mean"]) if not math.isnan(r["test_loss_ci95"][1]) else 0 for r in rows
    ]
    ax.bar(
        range(len(rows)),
        [0 if math.isnan(m) else m for m in means],
        yerr=errs,
        capsize=5,
        color=[colours(i % 10) for i in range(len(rows))],
    )
    finite = [m for m in means if not math.isnan(m)]
    if finite:
        span = max(finite) - min(finite)
        ax.set_ylim(min(finite) - max(span, 0.05) * 1.5, max(finite) + max(span, 0.05) * 1.5)
    bottom = ax.get_ylim()[0]
    for i, m in enumerate(means):  # no test loss (diverged, not evaluated): say so at the axis
        ax.text(
            i,
            bottom if math.isnan(m) else m,
            "n/a" if math.isnan(m) else f"{m:.4f}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(rows)), [r["group"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test loss (mean over seeds, 95% CI)")
    ax.set_title("held-out test loss by group")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)
