"""PNG charts of a run's metrics: loss, learning rate, gradient norm (against tokens)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)):
            xs.append(r["tokens"] / 1e6)
            ys.append(v)
    return xs, ys


def plot_run(records: list[dict], out_dir: Path, title: str) -> list[Path]:
    """Write loss.png, lr.png and grad_norm.png into ``out_dir`` from metrics records."""
    out_dir = Path(out_dir)
    charts = [
        ("loss.png", [("train_loss", "train"), ("val_loss", "validation")], "cross-entropy loss", False),
        ("lr.png", [("lr", "learning rate")], "learning rate", False),
        ("grad_norm.png", [("grad_norm", "gradient norm (before clipping)")], "gradient norm", True),
    ]
    written = []
    for name, series, ylabel, log_y in charts:
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
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        written.append(out_dir / name)
    return written
