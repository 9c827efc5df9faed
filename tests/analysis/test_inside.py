"""What each norm does inside the model, read back from stats.jsonl files written by hand: the reader, a run's
charts, and a comparison's sheet with the numbers it draws."""

import json
import math
from types import SimpleNamespace

import matplotlib.image
import numpy as np
import pytest
from analysis.test_compare import make_run, render_only

from gpt.analysis import charts
from gpt.analysis.charts import INSIDE_CHARTS, INSIDE_SHEET, RunCharts, plot_inside
from gpt.analysis.inside import Stats, group_curves, group_profiles, load_stats
from gpt.analysis.table import compare
from gpt.common.errors import UserError
from gpt.run.directory import RunDir

PNG = b"\x89PNG\r\n\x1a\n"


def record(step: int, n_blocks: int = 3, scale: float = 1.0, dyt: bool = False) -> dict:
    """A stats record as the trainer writes it, its numbers made from ``step`` and ``scale``."""
    blocks = np.arange(n_blocks, dtype=float)
    out = {
        "step": step,
        "tokens": step * 1000,
        "resid_rms": list(scale * (1 + np.arange(n_blocks + 1)) * (1 + step / 10)),
        "ln_1_rms": list(1 + blocks),
        "ln_1_max": list(5 + blocks),
        "ln_2_rms": list(1 + blocks),
        "ln_2_max": list(6 + blocks),
        "ln_f_rms": 1.0,
        "ln_f_max": 7.0,
        "attn_logit_max": list(scale * (3 + blocks) + step),
        "attn_logit_mean": list(0.1 * blocks),
        "grad_norm": list(0.5 + blocks),
        "update_ratio": list(scale * 1e-3 * (1 + blocks) / step),
        "embed_grad_norm": 0.2,
        "embed_update_ratio": 1e-4,
        "head_grad_norm": 0.3,
        "head_update_ratio": 2e-4,
        "logits_max": 12.0,
        "loss_scale": None,
    }
    if dyt:
        out.update({"ln_1_alpha": [0.5] * n_blocks, "ln_1_saturated": [0.01] * n_blocks, "ln_f_alpha": 0.5})
    return out


def write_stats(run, records, tail: str = "") -> None:
    run.mkdir(parents=True, exist_ok=True)
    RunDir(run).stats_file.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_the_reader_gives_arrays_by_step_and_block(tmp_path):
    run = tmp_path / "run"
    old = {k: v for k, v in record(10).items() if not k.startswith("attn_logit")}  # a line from before they were
    nan = {**record(20, dyt=True), "logits_max": "inf", "ln_f_alpha": "nan"}
    nan["resid_rms"][2] = "nan"
    write_stats(run, [old, nan, record(30)], tail='{"step": 40, "tokens": 40000, "resid_rms": [1.0, ')  # a kill
    s = load_stats(run)
    assert s.steps.tolist() == [10, 20, 30] and s.steps.dtype == np.int64
    assert s.tokens.tolist() == [10_000, 20_000, 30_000]
    assert s.n_blocks == 3 and s.dropped == [4]
    assert {"resid_rms", "attn_logit_max", "loss_scale", "ln_1_alpha"} <= set(s.keys) and "step" not in s.keys

    rms = s.per_block("resid_rms")
    assert rms.shape == (3, 4)  # L + 1: the last column enters ln_f
    assert np.allclose(rms[0], [2, 4, 6, 8]) and math.isnan(rms[1, 2]) and np.isfinite(rms[1, [0, 1, 3]]).all()
    logits = s.per_block("attn_logit_max")
    assert logits.shape == (3, 3) and np.isnan(logits[0]).all() and np.allclose(logits[2], [33, 34, 35])
    assert s.scalar("logits_max").tolist()[:2] == [12.0, math.inf]
    assert np.isnan(s.scalar("loss_scale")).all()  # null outside fp16
    alpha = s.scalar("ln_f_alpha")  # DyT keys: nan where a record has none, and "nan" read as nan
    assert np.isnan(alpha).all() and s.per_block("ln_1_alpha")[1].tolist() == [0.5] * 3

    with pytest.raises(UserError, match="'logits_max' is one number; use scalar"):
        s.per_block("logits_max")
    with pytest.raises(UserError, match="no 'ln_2_gain_mean' in these stats; keys: "):
        s.per_block("ln_2_gain_mean")


def test_a_resumed_run_reads_as_the_trajectory_that_went_on(tmp_path):
    run = tmp_path / "run"
    write_stats(run, [record(10), record(20), record(30, scale=9), record(20, scale=2), record(30, scale=2)])
    s = load_stats(run)
    assert s.steps.tolist() == [10, 20, 30]
    assert s.per_block("resid_rms")[1:, 0].tolist() == pytest.approx([2 * 3.0, 2 * 4.0])


def test_a_run_without_stats_has_none(tmp_path):
    assert load_stats(tmp_path) is None
    write_stats(tmp_path / "torn", [], tail='{"step": 1, "res')
    assert load_stats(tmp_path / "torn") is None


def assert_png(path) -> None:
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000
    assert matplotlib.image.imread(path).shape[2] in (3, 4)


def test_a_runs_charts_are_drawn_and_the_hook_draws_them(tmp_path, monkeypatch):
    render_only(monkeypatch, *(file for file, _ in INSIDE_CHARTS.values()))  # the run's loss charts: not looked at
    run = tmp_path / "run"
    diverged = record(40)
    diverged.update(resid_rms=["nan", "inf", 0.0, -1.0], attn_logit_max=["nan"] * 3, update_ratio=["inf"] * 3)
    write_stats(run, [record(s) for s in range(10, 40, 10)] + [diverged])
    written = plot_inside(load_stats(run), run, "a run")
    assert [p.name for p in written] == [file for file, _ in INSIDE_CHARTS.values()]
    for path in written:
        assert_png(path)
    for path in written:
        path.unlink()
    hook = RunCharts("a run")
    hook.started(make_run(tmp_path, "made", "dyt", 0, 3.6))
    write_stats(hook.run.path, [record(10)])  # one step, still drawn
    assert hook.draw() is None
    for file, _ in INSIDE_CHARTS.values():
        assert_png(hook.run.path / file)


def test_the_hook_draws_at_the_end_and_after_a_checkpoint_once_every_s_have_passed(tmp_path, monkeypatch):
    now = [1000.0]  # the hook's clock, moved by hand
    monkeypatch.setattr(charts, "time", SimpleNamespace(monotonic=lambda: now[0]))
    drawn = []
    monkeypatch.setattr(charts, "plot_run", lambda records, folder, title: drawn.append(folder))
    run = make_run(tmp_path, "made", "dyt", 0, 3.6)
    ckpt = run / "checkpoints" / "step-00000100"
    hook = RunCharts("a run")
    assert hook.every_s == 300
    hook.started(run)
    hook.checkpoint_saved(ckpt)  # right after the start: nothing drawn
    now[0] += 299.5
    hook.checkpoint_saved(ckpt)
    assert drawn == []
    now[0] += 0.5  # 300 s since the start
    hook.checkpoint_saved(ckpt)
    assert drawn == [run]
    now[0] += 299.5  # 299.5 s since that draw
    hook.checkpoint_saved(ckpt)
    assert drawn == [run]
    assert hook.finished("completed", ckpt, {}, None) is None  # the end draws, however soon after the last
    assert drawn == [run, run]
    assert RunCharts("a run", every_s=60).every_s == 60
    every = RunCharts("a run", every_s=0)  # every checkpoint
    every.started(run)
    every.checkpoint_saved(ckpt)
    every.checkpoint_saved(ckpt)
    assert drawn == [run] * 4
    short = RunCharts("a run")  # a run of seconds: drawn once, at its end
    short.started(run)
    short.checkpoint_saved(ckpt)
    assert short.finished("diverged", None, {}, None) is None and drawn == [run] * 5


def test_the_comparison_draws_the_sheet_and_names_runs_without_stats(tmp_path, monkeypatch):
    render_only(monkeypatch, INSIDE_SHEET)
    runs = [
        make_run(tmp_path, f"{short}-s{s}", norm, s, 3.6 + s / 100)
        for short, norm in (("hr", "handrolled_layernorm"), ("dyt", "dyt"))
        for s in range(2)
    ]
    for run, scale in zip(runs[:3], (1.0, 1.2, 2.0)):  # dyt-s1 logged none
        write_stats(run, [record(s, scale=scale, dyt=run.name.startswith("dyt")) for s in (25, 50, 75, 100)])
    result = compare(runs, tmp_path / "out")
    sheet = tmp_path / "out" / INSIDE_SHEET
    assert result["inside"] == {
        "plot": str(sheet),
        "with_stats": ["hr-s0", "hr-s1", "dyt-s0"],
        "without_stats": ["dyt-s1"],
    }
    assert str(sheet) in result["plots"]
    assert_png(sheet)
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "Inside the model: inside.png (3 runs); without stats.jsonl: dyt-s1" in md
    assert json.loads((tmp_path / "out" / "comparison.json").read_text())["inside"] == result["inside"]


def test_a_comparison_without_stats_says_nothing_of_them(tmp_path, monkeypatch):
    render_only(monkeypatch)  # which charts, not their pixels: an inside.png would still be written, empty
    runs = [make_run(tmp_path, f"r{s}", "dyt", s, 3.6) for s in range(2)]
    result = compare(runs, tmp_path / "out")
    assert result["inside"]["plot"] is None and result["inside"]["without_stats"] == ["r0", "r1"]
    assert not (tmp_path / "out" / INSIDE_SHEET).exists()
    assert "Inside the model" not in (tmp_path / "out" / "comparison.md").read_text()


def stats_of(tmp_path, name, records) -> Stats:
    write_stats(tmp_path / name, records)
    return load_stats(tmp_path / name)


def test_the_sheets_numbers_are_the_group_means_and_ranges(tmp_path):
    rng = np.random.default_rng(0)
    runs = {}
    for name in ("a0", "a1", "b0", "b1"):
        records = [record(s) for s in (10, 20, 30)]
        for r in records:
            r["resid_rms"] = rng.uniform(0.5, 50, 5).tolist()  # 4 blocks and ln_f
            r["attn_logit_max"] = rng.uniform(1, 30, 4).tolist()
            r["update_ratio"] = rng.uniform(1e-4, 1e-2, 4).tolist()
        runs[name] = records
    runs["b1"][-1]["resid_rms"] = ["nan"] * 5  # diverged at its last stats step: its profile is the one before
    runs["b1"] = runs["b1"][:1] + runs["b1"][2:]  # and it missed step 20
    stats = {name: stats_of(tmp_path, name, records) for name, records in runs.items()}
    groups = [("a", [stats["a0"], stats["a1"]]), ("b", [stats["b0"], stats["b1"]]), ("none", [])]

    profiles = group_profiles(groups)
    assert [p["group"] for p in profiles] == ["a", "b"] and profiles[0]["blocks"].tolist() == [0, 1, 2, 3, 4]
    a = np.array([runs["a0"][-1]["resid_rms"], runs["a1"][-1]["resid_rms"]])
    b = np.array([runs["b0"][-1]["resid_rms"], runs["b1"][0]["resid_rms"]])
    for p, expected in zip(profiles, (a, b)):
        assert np.allclose(p["mean"], expected.mean(0)) and np.allclose(p["low"], expected.min(0))
        assert np.allclose(p["high"], expected.max(0))
    assert profiles[1]["steps"] == [30, 10]

    logits = {c["group"]: c for c in group_curves(groups, "attn_logit_max", "max")}
    per_run = {n: {r["step"]: max(r["attn_logit_max"]) for r in rs} for n, rs in runs.items()}
    assert logits["b"]["steps"].tolist() == [10, 20, 30]
    assert logits["b"]["mean"][1] == pytest.approx(per_run["b0"][20])  # only b0 logged step 20
    assert logits["b"]["mean"][2] == pytest.approx((per_run["b0"][30] + per_run["b1"][30]) / 2)
    ratios = {c["group"]: c for c in group_curves(groups, "update_ratio", "mean")}
    means = np.array([[np.mean(r["update_ratio"]) for r in runs[n]] for n in ("a0", "a1")])
    assert np.allclose(ratios["a"]["mean"], means.mean(0)) and np.allclose(ratios["a"]["high"], means.max(0))
