"""scripts/compare.py on synthetic run directories with known numbers."""

import copy
import csv
import functools
import json
import math
import re

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
import scipy.stats
from conftest import ROOT

from gpt.analysis import charts
from gpt.analysis.table import compare
from gpt.common.errors import UserError
from gpt.config import config_from_dict, dump_config

T_975_2DF = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (tables)

BASE = {"hr": [3.600, 3.590, 3.610], "pt": [3.570, 3.575, 3.580]}

SEGMENT = {  # a training segment's fingerprint as gpt.run.fingerprint.take writes it: 8 x A100 in bf16
    "from_step": 0,
    "started": "2026-12-01T00:00:00Z",
    "host": "node-1",
    "train": {"precision": "bf16", "compile": True, "tf32": True, "micro_batch_size": 12, "grad_accum": 1},
    "hardware": {"device": "cuda", "name": "NVIDIA A100-SXM4-40GB", "world_size": 8},
    "software": {"torch": "2.11.0+cu128", "cuda": "12.8", "python": "3.12.3", "numpy": "2.2.0"},
    "code": {"version": "0.1.0", "source": "c" * 64, "commit": "d" * 40, "dirty": False},
    "data": {
        "dir": "data/fineweb",
        "tokenizer": "gpt2",
        "train": {
            "file": "train.bin",
            "tokens": 10**9,
            "sha256": "a" * 64,
            "sampled_sha256": "b" * 64,
            "range": [0, 10**9 - 1023],
        },
        "val": {
            "file": "val.bin",
            "tokens": 10**7,
            "sha256": "e" * 64,
            "sampled_sha256": "f" * 64,
            "range": [0, 4_194_304],
        },
    },
}


def segment(**flat):
    """SEGMENT with some flat keys replaced: segment(**{"train.precision": "fp32"})."""
    out = copy.deepcopy(SEGMENT)
    for key, value in flat.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node[part]
        node[last] = value
    return out


def render_only(monkeypatch, *files):
    """From now on every chart is drawn as ever but only those named ``files`` are rendered into PNGs; the others
    are written empty (rendering is most of a chart's second): for tests of which charts are drawn, not of their
    pixels (test_outputs_are_written renders each of a comparison's)."""
    real = charts.save_figure

    def save(fig, path):
        if path.name in files:
            return real(fig, path)
        plt.close(fig)
        path.write_bytes(b"")
        return path

    monkeypatch.setattr(charts, "save_figure", save)


@functools.cache
def config_text(sections: str) -> str:
    """config.yaml of the sections (JSON): the same few configs serve hundreds of made-up runs."""
    return dump_config(config_from_dict(json.loads(sections)))


def make_run(
    root,
    name,
    norm_type,
    seed,
    loss=None,
    status="completed",
    split="test",
    offset=0,
    n_tokens=1000,
    tokenizer="gpt2",
    diverged_at=None,
    init_seed=None,
    total_steps=None,
    segments="default",
    config=None,
    summary=None,
    test_sha256="9" * 64,
):
    run = root / name
    sections = {
        "run": {"name": name},
        "train": {"steps": 100, "seed": seed},
        "model": {"norm_type": norm_type, "init_seed": init_seed},
    }
    for section, values in (config or {}).items():
        sections[section] = {**sections.get(section, {}), **values}
    ckpt = run / "checkpoints" / "step-00000100"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text(config_text(json.dumps(sections, sort_keys=True)))
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "step": s,
                    "tokens": s * 1000,
                    "train_loss": 5 - s / 50 + seed / 100,
                    "grad_norm": 1.0 + s / 100,
                    **({"val_loss": 5 - s / 60} if s % 50 == 0 else {}),
                }
            )
            + "\n"
            for s in range(1, 101)
        )
    )
    (run / "summary.json").write_text(
        json.dumps(
            {
                "status": status,
                "tokens_per_s": 1000.0 + seed,
                "wall_seconds": 60.0,
                "diverged_at_step": diverged_at,
                "total_steps": total_steps,
                "segments": [SEGMENT] if segments == "default" else segments,
                **(summary or {}),
            }
        )
    )
    (ckpt / "model.safetensors").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text(ckpt.name + "\n")
    (run / "checkpoints" / "best").write_text(ckpt.name + "\n")
    if loss is not None:
        (ckpt / "eval-test-fp32.json").write_text(
            json.dumps(
                {
                    "loss": loss,
                    "split": split,
                    "offset": offset,
                    "n_tokens": n_tokens,
                    "targets_scored": n_tokens - 40,
                    "tokenizer": tokenizer,
                    "data_dir": "data/x",
                    "precision": "fp32",
                    "fingerprint": {
                        "precision": "fp32",
                        "test": {
                            "file": "test.bin",
                            "tokens": 10**7,
                            "sha256": test_sha256,
                            "sampled_sha256": "8" * 64,
                        },
                    },
                }
            )
        )
    return run


@pytest.fixture
def runs(tmp_path):
    paths = [make_run(tmp_path, f"hr-s{s}", "handrolled_layernorm", s, BASE["hr"][s]) for s in range(3)]
    paths += [make_run(tmp_path, f"pt-s{s}", "pytorch_layernorm", s, BASE["pt"][s]) for s in range(3)]
    paths += [make_run(tmp_path, f"rms-s{s}", "pytorch_rmsnorm", s, loss) for s, loss in ((3, 3.58), (4, 3.60))]
    paths += [make_run(tmp_path, "none-s0", "no_norm", 0, status="diverged", diverged_at=530)]
    return paths


def test_means_stds_and_paired_interval(runs, tmp_path):
    result = compare(runs, tmp_path / "out", plots=False)
    rows = {r["group"]: r for r in result["groups"]}
    assert result["baseline"] == "handrolled_layernorm"
    assert rows["handrolled_layernorm"]["test_loss_mean"] == pytest.approx(3.6)
    assert rows["handrolled_layernorm"]["test_loss_std"] == pytest.approx(0.01)
    assert rows["pytorch_layernorm"]["test_loss_mean"] == pytest.approx(3.575)
    assert rows["pytorch_layernorm"]["test_loss_std"] == pytest.approx(0.005)
    # paired by seed: differences -0.03, -0.015, -0.03
    diffs = [p - h for p, h in zip(BASE["pt"], BASE["hr"])]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = T_975_2DF * sd / math.sqrt(3)
    v = rows["pytorch_layernorm"]["vs_baseline"]
    assert v["method"] == "paired" and v["n"] == 3
    assert (
        v["diff"] == pytest.approx(-0.025)
        and v["low"] == pytest.approx(mean - half)
        and v["high"] == pytest.approx(mean + half)
    )
    assert v["high"] < 0  # beyond noise in this made-up example
    # different seeds: Welch
    w = rows["pytorch_rmsnorm"]["vs_baseline"]
    assert w["method"] == "welch" and w["diff"] == pytest.approx(3.59 - 3.6)
    assert w["low"] < w["diff"] < w["high"]
    # the diverged run is reported as such, with its step, not dropped
    none = rows["no_norm"]
    assert none["status"] == {"diverged": 1} and none["diverged_at"] == [530]
    assert none["n_evaluated"] == 0 and math.isnan(none["test_loss_mean"]) and none["missing_evaluation"] == []
    assert rows["handrolled_layernorm"]["tokens_per_s_mean"] == pytest.approx(1001.0)


def test_outputs_are_written(runs, tmp_path, cli):
    out = tmp_path / "out"
    res = cli(ROOT / "scripts" / "compare.py", *runs, "--out", out, "--baseline", "pytorch_layernorm")
    assert res.returncode == 0, res.stderr
    md = (out / "comparison.md").read_text()
    assert "| no_norm | 1 (0) | n/a | n/a | n/a |" in md and "1 diverged (diverged at step 530)" in md
    assert "| pytorch_layernorm | 3 (0, 1, 2) | 3.575000 | n/a | 0.005000 | baseline |" in md
    assert "| handrolled_layernorm | 3 (0, 1, 2) | 3.600000 | n/a | 0.010000 | +0.025000 [" in md and "paired" in md
    assert md in res.stdout
    assert "Test loss: mean cross-entropy of the 960 tokens scored (each predicted from those before it) in test " in md
    data = json.loads((out / "comparison.json").read_text())
    assert data["baseline"] == "pytorch_layernorm" and len(data["groups"]) == 4
    # the charts of CHARTS whose keys the runs logged (these log no lr), under a run's names, and the test loss
    assert sorted(p.name for p in out.glob("*.png")) == ["grad_norm.png", "loss.png", "test_loss.png"]
    for name in ("loss.png", "grad_norm.png", "test_loss.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert matplotlib.image.imread(png).shape[2] in (3, 4)  # decodes as an image


def test_missing_evaluation_is_reported(tmp_path):
    a = make_run(tmp_path, "a", "dyt", 0, 3.7)
    b = make_run(tmp_path, "b", "dyt", 1)
    c = make_run(tmp_path, "c", "pytorch_rmsnorm", 0, 3.6)
    result = compare([a, b, c], tmp_path / "out", baseline="dyt", plots=False)
    dyt = next(g for g in result["groups"] if g["group"] == "dyt")
    assert dyt["missing_evaluation"] == [str(b)] and dyt["n_evaluated"] == 1
    assert f"Not evaluated (run `python evaluate.py` on them): {b}" in (tmp_path / "out" / "comparison.md").read_text()
    # first in the list, as a sweep's cancelled or failed cell 0 is: the same comparison (once a KeyError)
    first = compare([b, a, c], tmp_path / "out-b-first", baseline="dyt", plots=False)
    assert first["shared"] == result["shared"] and any(k.startswith("evaluation.") for k in first["shared"])
    assert [g["test_loss_mean"] for g in first["groups"]] == [g["test_loss_mean"] for g in result["groups"]]


def test_incomparable_runs_are_refused(tmp_path):
    a = make_run(tmp_path, "a", "dyt", 0, 3.7)
    b = make_run(tmp_path, "b", "pytorch_rmsnorm", 0, 3.6, offset=50_000_000)
    with pytest.raises(UserError, match="evaluated on different test tokens, so their losses are not comparable"):
        compare([a, b], tmp_path / "out")
    c = make_run(tmp_path, "c", "pytorch_rmsnorm", 1, 3.6, tokenizer="cl100k_base")
    with pytest.raises(UserError, match="tokenizer cl100k_base"):
        compare([a, c], tmp_path / "out")
    with pytest.raises(UserError, match=f"{tmp_path / 'nope'}: not a run directory"):
        compare([a, tmp_path / "nope"], tmp_path / "out")
    with pytest.raises(UserError, match=r"--baseline 'layernorm' is not a group; groups: dyt"):
        compare([a], tmp_path / "out", baseline="layernorm")


# ----------------------------------------------------- validity: what enters the statistics


def strict_json(text):
    def refuse(constant):
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_dropped_runs_and_pairing_on_shared_seeds(tmp_path):
    hr = {0: 3.600, 1: 3.590, 2: 3.610, 3: 3.605}
    pt = {0: 3.570, 1: 3.575, 2: 3.580, 4: 3.585}
    runs = [make_run(tmp_path, f"hr-s{s}", "handrolled_layernorm", s, loss) for s, loss in hr.items()]
    runs += [make_run(tmp_path, f"pt-s{s}", "pytorch_layernorm", s, loss) for s, loss in pt.items()]
    # seed 3 of pytorch_layernorm diverged; its best checkpoint was evaluated all the same
    runs.append(make_run(tmp_path, "pt-s3", "pytorch_layernorm", 3, 3.0, status="diverged", diverged_at=77))
    runs.append(make_run(tmp_path, "pt-s5", "pytorch_layernorm", 5, 3.5, status="interrupted"))
    runs.append(make_run(tmp_path, "pt-s6", "pytorch_layernorm", 6))  # completed, never evaluated
    for which in ("final", "best", "latest"):
        result = compare(runs, tmp_path / which, which=which, equivalence_margin=0.05, plots=False)
        row = next(g for g in result["groups"] if g["group"] == "pytorch_layernorm")
        assert row["n_evaluated"] == 4 and row["test_loss_mean"] == pytest.approx(sum(pt.values()) / 4), which
        assert [(x["seed"], x["reason"]) for x in row["left_out"]] == [
            ("3", "diverged at step 77"),
            ("5", "interrupted"),
            ("6", "not evaluated"),
        ], which
        v = row["vs_baseline"]
        diffs = [pt[s] - hr[s] for s in (0, 1, 2)]  # the shared seeds; 3 and 4 have no partner
        mean = sum(diffs) / 3
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
        half = T_975_2DF * sd / math.sqrt(3)
        assert (v["method"], v["n"], v["unpaired"]) == ("paired", 3, ["3", "4"])
        assert v["diff"] == pytest.approx(mean) and v["sd"] == pytest.approx(sd)
        assert (v["low"], v["high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    md = (tmp_path / "best" / "comparison.md").read_text()
    assert "| pytorch_layernorm | 7 (0, 1, 2, 4, 3, 5, 6) | 3.577500 | " in md and "paired, 3 pairs |" in md
    assert f"- pytorch_layernorm, seed 3 ({tmp_path / 'pt-s3'}): diverged at step 77" in md
    assert "| pytorch_layernorm | independent seeds; unpaired seeds: 3, 4 | " in md
    strict_json((tmp_path / "best" / "comparison.json").read_text())


def paired_power(delta, sd, n):
    """The power of the two-sided paired t test at 5% with n pairs, straight from scipy's noncentral t."""
    from scipy import stats as st

    c, ncp = st.t.ppf(0.975, n - 1), delta * math.sqrt(n) / sd
    lower = st.nct.cdf(-c, n - 1, ncp)  # nan far in the tail at 1 df: P(T < -c) = P(-T > c), -T ~ nct(-ncp) there
    return st.nct.sf(c, n - 1, ncp) + (lower if np.isfinite(lower) else st.nct.sf(c, n - 1, -ncp))


def test_pairs_needed_and_resolvable_difference_are_exact_power():
    from scipy import stats as st

    from gpt.analysis import stats

    for sd, n in ((0.01, 2), (0.01, 3), (0.01, 4), (0.004, 7)):
        delta = stats.resolvable_difference(sd / math.sqrt(n), n - 1)
        assert paired_power(delta, sd, n) == pytest.approx(0.80, abs=1e-6), (sd, n)
        shortcut = (st.t.ppf(0.975, n - 1) + st.t.ppf(0.80, n - 1)) * sd / math.sqrt(n)
        assert delta > shortcut and paired_power(shortcut, sd, n) < 0.80  # the shortcut overstates the power
    shortcut_power = [
        paired_power((st.t.ppf(0.975, n - 1) + st.t.ppf(0.80, n - 1)) * 0.01 / math.sqrt(n), 0.01, n) for n in (2, 3, 4)
    ]
    assert [round(p, 2) for p in shortcut_power] == [0.73, 0.77, 0.78]
    for diff, sd in ((0.02, 0.002), (0.025, 0.008), (0.01, 0.006), (-0.024, 0.00652), (0.003, 0.01)):
        k = stats.pairs_needed(diff, sd)
        assert paired_power(abs(diff), sd, k) >= 0.80, (diff, sd, k)
        assert k == 2 or paired_power(abs(diff), sd, k - 1) < 0.80, (diff, sd, k)
    assert stats.pairs_needed(0.02, 0.002) == 3 and paired_power(0.02, 0.002, 2) < 0.80
    assert stats.pairs_needed(0.0, 0.01) is None and stats.pairs_needed(1e-6, 0.01) is None  # > 10,000 pairs
    assert stats.resolvable_difference(0.0, 3) == 0.0 and stats.pairs_needed(0.01, 0.0) == 2


def test_the_plan_is_prospective_at_an_upper_bound_of_the_noise(tmp_path):
    from scipy import stats as st

    from gpt.analysis import stats

    diffs = [-0.030, -0.015, -0.030, -0.020, -0.025]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    for margin, verdict in ((0.04, True), (0.025, False)):
        p = max(st.t.sf((mean + margin) / se, n - 1), st.t.cdf((mean - margin) / se, n - 1))
        eq = stats.equivalence(stats.mean_of({(i, i): d for i, d in enumerate(diffs)}), margin)
        assert eq["p"] == pytest.approx(p) and eq["equivalent"] is verdict and bool(p < 0.05) is verdict
    # the same numbers through compare, on runs whose losses give these differences
    base = [3.6, 3.61, 3.59, 3.605, 3.595]
    runs = [make_run(tmp_path, f"a{s}", "handrolled_layernorm", s, loss) for s, loss in enumerate(base)]
    runs += [
        make_run(tmp_path, f"b{s}", "pytorch_rmsnorm", s, loss + d) for s, (loss, d) in enumerate(zip(base, diffs))
    ]
    result = compare(runs, tmp_path / "out", equivalence_margin=0.04, plots=False)
    v = result["groups"][1]["vs_baseline"]
    assert v["sd"] == pytest.approx(sd) and v["p"] == pytest.approx(2 * st.t.sf(abs(mean) / se, n - 1))
    # the plan: the sd at its one-sided 80% upper confidence bound (chi-square), never the point estimate
    upper = sd * math.sqrt((n - 1) / st.chi2.ppf(0.20, n - 1))
    plan = v["plan"]
    assert plan["sd_upper"] == pytest.approx(upper) and plan["detect"] == 0.04  # the margin by default
    assert paired_power(plan["resolvable"], upper, n) == pytest.approx(0.8, abs=1e-6)
    k = plan["pairs_needed"]
    assert paired_power(0.04, upper, k) >= 0.8 > paired_power(0.04, upper, k - 1)
    assert v["equivalence"]["equivalent"] is True
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        f"| pytorch_rmsnorm | independent seeds | {v['p']:.3g} | {v['p_holm']:.3g} | yes (p = "
        f"{v['equivalence']['p']:.3g}) | {upper:.6f} | {plan['resolvable']:.6f} | {k} |"
    ) in md
    assert "| group | design | p | Holm p (1 in the family) | equivalent within +-0.04 (TOST p) |" in md
    assert "pairs to detect 0.04 |" in md and "A total, not how many more" in md
    # --detect names the difference to plan for
    named = compare(runs, tmp_path / "out2", detect=0.01, plots=False)["groups"][1]["vs_baseline"]["plan"]
    assert named["detect"] == 0.01 and named["pairs_needed"] == stats.pairs_needed(0.01, upper)
    with pytest.raises(UserError, match=r"--detect -1.0 must be > 0"):
        compare(runs, tmp_path / "out3", detect=-1.0)


def test_identical_differences_are_said_to_have_no_spread(tmp_path):
    # two implementations of one function: every paired difference exactly equal
    runs = [make_run(tmp_path, f"a{s}", "handrolled_layernorm", s, 3.6 + s / 100) for s in range(3)]
    runs += [make_run(tmp_path, f"b{s}", "pytorch_layernorm", s, 3.6 + s / 100) for s in range(3)]
    result = compare(runs, tmp_path / "out", equivalence_margin=0.01, plots=False)
    v = result["groups"][1]["vs_baseline"]
    assert v["no_spread"] and v["diff"] == 0 and math.isnan(v["low"]) and math.isnan(v["p"])
    assert v["equivalence"]["equivalent"] is None and v["plan"]["no_spread"] and v["plan"]["pairs_needed"] is None
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| +0.000000, no spread (3 equal differences) paired, 3 pairs |" in md
    assert "n/a: no spread to test" in md and "n/a: every paired difference is +0.000000, no noise to plan for" in md
    assert "(p = 0)" not in md and "[+0.000000, +0.000000]" not in md  # neither certainty nor a width of 0
    data = strict_json((tmp_path / "out" / "comparison.json").read_text())
    assert data["groups"][1]["vs_baseline"]["low"] is None


def test_a_seed_is_the_initial_weights_and_the_data_order(tmp_path):
    # an init-seed sweep at a fixed data seed: three distinct seeds, not duplicates
    a = [make_run(tmp_path, f"a{i}", "handrolled_layernorm", 0, 3.60 + i / 100, init_seed=i) for i in range(3)]
    b = [make_run(tmp_path, f"b{i}", "pytorch_layernorm", 0, 3.58 + i / 100, init_seed=i) for i in range(3)]
    other = make_run(tmp_path, "b-other", "pytorch_layernorm", 1, 3.5, init_seed=0)  # same weights, other data
    result = compare([*a, *b, other], tmp_path / "out", plots=False)
    row = result["groups"][1]
    assert row["seeds"] == ["0", "1/0", "2/0", "0/1"]
    v = row["vs_baseline"]
    assert (v["method"], v["n"], v["unpaired"]) == ("paired", 3, ["0/1"])
    assert v["diff"] == pytest.approx(-0.02) and v["sd"] == pytest.approx(0.0, abs=1e-12)


def test_runs_of_different_lengths_are_refused(tmp_path):
    a = make_run(tmp_path, "a", "handrolled_layernorm", 0, 3.6, total_steps=33_165)
    b = make_run(tmp_path, "b", "pytorch_rmsnorm", 0, 3.6, total_steps=33_161)
    c = make_run(tmp_path, "c", "pytorch_layernorm", 0, 3.6, total_steps=33_165)
    with pytest.raises(
        UserError,
        match=r"these runs trained for different lengths, so their losses are not "
        r"comparable: 33,165 steps = 3,260,252,160 tokens \(a, c\); 33,161 steps = "
        r"3,259,858,944 tokens \(b\); train every run",
    ):
        compare([a, b, c], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert compare([a, c], tmp_path / "out", plots=False)["groups"][1]["n_evaluated"] == 1


def test_comparison_json_is_standard_json(runs, tmp_path):
    compare(runs, tmp_path / "out", plots=False)  # one-seed and diverged groups: NaN means, missing intervals
    data = strict_json((tmp_path / "out" / "comparison.json").read_text())
    none = next(g for g in data["groups"] if g["group"] == "no_norm")
    assert none["test_loss_mean"] is None and none["vs_baseline"]["diff"] is None


# ------------------------------------------- only the norm may differ: configs and fingerprints


def pair(tmp_path, hr_segment=None, pt_segment=None, hr_config=None, pt_config=None, seeds=(0, 1, 2)):
    """Three seeds each of hand-rolled and PyTorch LayerNorm; the pt runs may carry another fingerprint or config."""
    runs = [
        make_run(
            tmp_path,
            f"hr-s{s}",
            "handrolled_layernorm",
            s,
            BASE["hr"][s],
            segments=[hr_segment or SEGMENT],
            config=hr_config,
        )
        for s in seeds
    ]
    runs += [
        make_run(
            tmp_path,
            f"pt-s{s}",
            "pytorch_layernorm",
            s,
            BASE["pt"][s],
            segments=[pt_segment or SEGMENT],
            config=pt_config,
        )
        for s in seeds
    ]
    return runs


def test_precisions_are_not_pooled(tmp_path):
    # hand-rolled LayerNorm in fp32 (V100s: auto gave fp32) against PyTorch LayerNorm in bf16 (A100s)
    runs = pair(tmp_path, hr_segment=segment(**{"train.precision": "fp32"}))
    with pytest.raises(
        UserError,
        match=r"these runs differ in more than the norm and the seeds, so a difference "
        r"between them would not be the norm's: train\.precision: fp32 \(hr-s0, "
        r"hr-s1, hr-s2\); bf16 \(pt-s0, pt-s1, pt-s2\); .*--vary KEY",
    ):
        compare(runs, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    result = compare(runs, tmp_path / "out", vary=["train.precision"], plots=False)
    assert [g["group"] for g in result["groups"]] == [
        "handrolled_layernorm, train.precision=fp32",
        "pytorch_layernorm, train.precision=bf16",
    ]
    assert result["baseline"] == "handrolled_layernorm, train.precision=fp32"
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "- varied (--vary, one group per value): train.precision" in md


def test_config_resolved_by_the_fingerprint_is_compared_as_used(tmp_path):
    # precision: auto (hr) and precision: bf16 (pt) computed the same thing on these GPUs: not a difference
    runs = pair(tmp_path, hr_config={"train": {"precision": "auto"}}, pt_config={"train": {"precision": "bf16"}})
    result = compare(runs, tmp_path / "out", plots=False)
    assert result["shared"]["train.precision"] == "bf16" and len(result["groups"]) == 2


def test_bookkeeping_settings_are_not_a_difference(tmp_path):
    # how often checkpoints are written and kept, and reading ahead, change no number; validation does (best)
    runs = pair(
        tmp_path,
        pt_config={
            "train": {"checkpoint_every": 5, "keep_last": 9, "prefetch": False},
            "log": {"log_every": 1},
            "hub": {"private": False},
        },
    )
    assert len(compare(runs, tmp_path / "out", plots=False)["groups"]) == 2
    other = pair(tmp_path / "eval", pt_config={"train": {"eval_every": 7}})
    with pytest.raises(UserError, match=r"train\.eval_every: 500 \(hr-s0, hr-s1, hr-s2\); 7 \(pt-s0"):
        compare(other, tmp_path / "out")


def test_runs_on_different_token_contents_are_refused(tmp_path):
    other = segment(**{"data.train.sha256": "1" * 64, "data.train.sampled_sha256": "2" * 64})
    runs = pair(tmp_path, pt_segment=other)
    with pytest.raises(
        UserError,
        match=r"data\.train\.sampled_sha256: bbbbbbbbbbbb\.\.\. \(hr-s0, hr-s1, hr-s2\); "
        r"222222222222\.\.\. \(pt-s0, pt-s1, pt-s2\) \| data\.train\.sha256: "
        r"aaaaaaaaaaaa\.\.\. \(hr-s0",
    ):
        compare(runs, tmp_path / "out")
    # the data's folder is where the tokens are, not what they are: another path to the same tokens is fine
    moved = segment(**{"data.dir": "/mnt/other/fineweb"})
    same = pair(tmp_path / "moved", pt_segment=moved, pt_config={"data": {"path": "/mnt/other/fineweb"}})
    assert len(compare(same, tmp_path / "out", plots=False)["groups"]) == 2
    # test losses on different test-token contents are refused too
    a = make_run(tmp_path / "t", "a", "handrolled_layernorm", 0, 3.6)
    b = make_run(tmp_path / "t", "b", "pytorch_layernorm", 0, 3.6, test_sha256="7" * 64)
    with pytest.raises(
        UserError,
        match=r"evaluated on different test tokens.*sha256 999999999999 \(a\); test .* "
        r"sha256 777777777777 \(b\)",
    ):
        compare([a, b], tmp_path / "out")


def test_groups_that_differ_in_another_setting_are_refused(tmp_path):
    runs = pair(tmp_path, pt_config={"optim": {"lr": 2e-3}})
    with pytest.raises(
        UserError,
        match=r"would not be the norm's: optim\.lr: 0\.0014 \(hr-s0, hr-s1, hr-s2\); "
        r"0\.002 \(pt-s0, pt-s1, pt-s2\); compare runs",
    ):
        compare(runs, tmp_path / "out")
    # an lr sweep of both norms is a deliberate axis; with two groups per norm, the baseline must be named
    runs += [
        make_run(tmp_path, f"hr2-s{s}", "handrolled_layernorm", s, BASE["hr"][s] + 0.01, config={"optim": {"lr": 2e-3}})
        for s in range(3)
    ]
    with pytest.raises(
        UserError,
        match=r"no default baseline .*give --baseline, one of: handrolled_layernorm, "
        r"optim\.lr=0\.0014, handrolled_layernorm, optim\.lr=0\.002, "
        r"pytorch_layernorm, optim\.lr=0\.002",
    ):
        compare(runs, tmp_path / "out", vary=["optim.lr"])
    result = compare(
        runs, tmp_path / "out", vary=["optim.lr"], baseline="handrolled_layernorm, optim.lr=0.002", plots=False
    )
    rows = {g["group"]: g for g in result["groups"]}
    assert rows["pytorch_layernorm, optim.lr=0.002"]["vs_baseline"]["diff"] == pytest.approx(-0.035)
    assert result["baseline_rule"] == "--baseline"
    with pytest.raises(UserError, match=r"--vary optim\.lrr: no such key in these runs' configs or fingerprints"):
        compare(runs, tmp_path / "out", vary=["optim.lrr"])


def test_runs_within_a_group_that_differ_are_refused_unless_allowed(tmp_path):
    runs = pair(tmp_path)
    runs.append(
        make_run(
            tmp_path,
            "hr-s3",
            "handrolled_layernorm",
            3,
            3.6,
            segments=[segment(**{"hardware.name": "Tesla V100-SXM2-32GB"})],
        )
    )
    with pytest.raises(
        UserError,
        match=r"hardware\.name: NVIDIA A100-SXM4-40GB \(hr-s0, hr-s1, hr-s2, pt-s0, "
        r"pt-s1, pt-s2\); Tesla V100-SXM2-32GB \(hr-s3\)",
    ):
        compare(runs, tmp_path / "out")
    result = compare(runs, tmp_path / "out", allow_differ=["hardware"], plots=False)
    assert list(result["allowed_to_differ"]) == ["hardware.name"]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        "- **allowed to differ** (--allow-differ): hardware.name: NVIDIA A100-SXM4-40GB (hr-s0, hr-s1, hr-s2, "
        "pt-s0, pt-s1, pt-s2); Tesla V100-SXM2-32GB (hr-s3)"
    ) in md


def test_a_resumed_run_is_compared_on_every_segment(tmp_path):
    # seed 2 of pt was resumed on 4 GPUs (same global batch): its world size is [8, 4], not the others' 8
    resumed = [SEGMENT, segment(**{"from_step": 50, "hardware.world_size": 4, "train.grad_accum": 2})]
    runs = pair(tmp_path)
    (tmp_path / "pt-s2" / "summary.json").write_text(
        json.dumps({**json.loads((tmp_path / "pt-s2" / "summary.json").read_text()), "segments": resumed})
    )
    with pytest.raises(
        UserError,
        match=r"hardware\.world_size: 8 \(hr-s0, hr-s1, hr-s2, pt-s0, pt-s1\); \[8, 4\] "
        r"\(pt-s2\)",
    ):
        compare(runs, tmp_path / "out")


def test_the_baseline_is_never_an_accident_of_order(tmp_path):
    rms = [make_run(tmp_path, f"rms-s{s}", "pytorch_rmsnorm", s, 3.58 + s / 100) for s in range(2)]
    pt = [make_run(tmp_path, f"pt-s{s}", "pytorch_layernorm", s, 3.57 + s / 100) for s in range(2)]
    for order in (rms + pt, pt + rms):
        result = compare(order, tmp_path / "out", plots=False)
        assert result["baseline"] == "pytorch_layernorm"  # first in the write-up's order, whatever the order given
        assert [g["group"] for g in result["groups"]] == ["pytorch_layernorm", "pytorch_rmsnorm"]
    assert (
        "the first norm type of these runs in the write-up's order" in (tmp_path / "out" / "comparison.md").read_text()
    )


def test_the_report_says_what_every_run_shares(runs, tmp_path):
    result = compare(runs, tmp_path / "out", plots=False)
    assert result["shared"]["train.precision"] == "bf16" and result["shared"]["data.train.sha256"] == "a" * 64
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "Baseline: the default, handrolled_layernorm, the write-up's baseline." in md
    assert "- precision as used: bf16; compile on; TF32 on" in md
    assert (
        "- hardware: 8 x NVIDIA A100-SXM4-40GB (cuda), micro-batch 12, gradient accumulation 1; torch 2.11.0+cu128, "
        "CUDA 12.8" in md
    )
    assert "- code: gpt-norm-harness 0.1.0, commit dddddddddd; source sha256 cccccccccccc" in md
    assert (
        "- data: tokenizer gpt2; train sha256 aaaaaaaaaaaa (1,000,000,000 tokens); val sha256 eeeeeeeeeeee "
        "(10,000,000 tokens); test sha256 999999999999"
    ) in md
    assert "- weight decay 0.1 on every parameter, **norm parameters included**" in md
    without = compare(runs, tmp_path / "out2", which="best", plots=False)  # no n_params in these summaries
    assert without["shared"]["optim.decay_norms_and_biases"] is True


def test_decayed_norm_parameters_per_group(tmp_path):
    counts = {
        "handrolled_layernorm": (163_047_936, 163_009_536),
        "pytorch_rmsnorm": (163_028_736, 163_009_536),
        "no_norm": (163_009_536, 163_009_536),
    }
    runs = [
        make_run(tmp_path, f"{n}-s0", n, 0, 3.6, summary={"n_params": t, "n_params_outside_norms": o})
        for n, (t, o) in counts.items()
    ]
    compare(runs, tmp_path / "out", plots=False)
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "decayed norm parameters: handrolled_layernorm 38,400, pytorch_rmsnorm 19,200, no_norm 0" in md
    off = [
        make_run(
            tmp_path / "off",
            f"{n}-s0",
            n,
            0,
            3.6,
            config={"optim": {"decay_norms_and_biases": False}},
            summary={"n_params": t, "n_params_outside_norms": o},
        )
        for n, (t, o) in counts.items()
    ]
    compare(off, tmp_path / "out", plots=False)
    assert (
        "- weight decay 0.1 on weight matrices only: no norm parameter is decayed"
        in (tmp_path / "out" / "comparison.md").read_text()
    )


def test_skipped_steps_are_shown_and_flagged(tmp_path):
    runs = pair(tmp_path)
    summary = json.loads((tmp_path / "pt-s2" / "summary.json").read_text())
    (tmp_path / "pt-s2" / "summary.json").write_text(json.dumps({**summary, "nonfinite_steps": 17}))
    result = compare(runs, tmp_path / "out", plots=False)
    rows = {g["group"]: g for g in result["groups"]}
    assert (
        rows["pytorch_layernorm"]["skipped_steps"] == {"2": 17} and rows["handrolled_layernorm"]["skipped_steps"] == {}
    )
    assert [r["skipped_steps"] for r in rows["pytorch_layernorm"]["runs"]] == [0, 0, 17]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| skipped steps | status |" in md
    assert "| **seed 2: 17** | 3 completed |" in md and "| 0 | 3 completed |" in md


def test_runs_without_a_fingerprint_are_compared_on_their_configs_and_named(tmp_path):
    runs = [make_run(tmp_path, f"old-s{s}", "pytorch_layernorm", s, 3.57, segments=None) for s in range(2)]
    runs += [make_run(tmp_path, f"hr-s{s}", "handrolled_layernorm", s, 3.6, segments=None) for s in range(2)]
    result = compare(runs, tmp_path / "out", plots=False)
    assert result["without_fingerprint"] == ["old-s0", "old-s1", "hr-s0", "hr-s1"]
    assert (
        "- no fingerprint (trained before fingerprints were recorded"
        in (tmp_path / "out" / "comparison.md").read_text()
    )
    new = make_run(tmp_path, "new-s2", "pytorch_layernorm", 2, 3.57)
    with pytest.raises(UserError, match=r"train\.precision: auto \(old-s0, old-s1, hr-s0, hr-s1\); bf16 \(new-s2\)"):
        compare([*runs, new], tmp_path / "out")


# ------------------------------------------------------------ where the noise comes from


def crossed_losses():
    """Test losses with known parts: 3.6 + init effect + data effect + interaction, 3 x 4 seeds."""
    init, data = np.array([0.010, -0.004, -0.006]), np.array([0.002, -0.001, 0.003, -0.004])
    rest = np.array(
        [[0.0010, -0.0005, 0.0002, -0.0007], [-0.0004, 0.0008, -0.0001, -0.0003], [-0.0006, -0.0003, -0.0001, 0.0010]]
    )
    return 3.6 + init[:, None] + data[None, :] + rest


def test_variance_components_match_a_hand_computation():
    from scipy import stats as st

    from gpt.analysis import variance

    y = crossed_losses()
    n_i, n_j = y.shape
    grand = sum(sum(row) for row in y) / (n_i * n_j)
    rows = [sum(y[i]) / n_j for i in range(n_i)]
    cols = [sum(y[i][j] for i in range(n_i)) / n_i for j in range(n_j)]
    ms_init = n_j * sum((r - grand) ** 2 for r in rows) / (n_i - 1)
    ms_data = n_i * sum((c - grand) ** 2 for c in cols) / (n_j - 1)
    ms_res = sum((y[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(n_i) for j in range(n_j)) / (
        (n_i - 1) * (n_j - 1)
    )
    v = variance.variance_components(y)
    c = v["components"]
    assert (v["n_init"], v["n_data"], v["mean"]) == (3, 4, pytest.approx(grand))
    assert c["init"]["variance"] == pytest.approx((ms_init - ms_res) / n_j)
    assert c["data"]["variance"] == pytest.approx((ms_data - ms_res) / n_i)
    assert c["residual"]["variance"] == pytest.approx(ms_res)
    assert (c["init"]["df"], c["data"]["df"], c["residual"]["df"]) == (2, 3, 6)
    total = c["init"]["variance"] + c["data"]["variance"] + c["residual"]["variance"]
    assert sum(x["share"] for x in c.values()) == pytest.approx(1.0) and v["total_variance"] == pytest.approx(total)
    assert c["residual"]["low"] == pytest.approx(6 * ms_res / st.chi2.ppf(0.975, 6))
    assert c["residual"]["high"] == pytest.approx(6 * ms_res / st.chi2.ppf(0.025, 6))
    for part in ("init", "data"):
        assert 0 <= c[part]["low"] < c[part]["variance"] < c[part]["high"]
    # the initial weights dominate this made-up design, the interaction is small
    assert c["init"]["share"] > 0.7 and c["residual"]["share"] < 0.05
    # a negative estimate is reported as 0, its raw value kept
    flat = np.array([[1.0, 2.0], [2.0, 1.0]])  # no row or column effect, all interaction
    z = variance.variance_components(flat)["components"]
    assert z["init"]["variance"] == 0.0 and z["init"]["estimate"] < 0 and z["residual"]["share"] == 1.0


def test_variance_component_intervals_cover_at_their_level():
    from gpt.analysis import variance

    # 1,500 grids of 3 x 4, each drawn as its 3 init effects, 4 data effects and 12 remainders (a row of draws),
    # through variance_components' vectorised twin (tests/analysis/test_intervals.py: they agree grid by grid)
    truth = {"init": 1.0, "data": 0.25, "residual": 0.5}
    n = 1500
    z = np.random.default_rng(7).standard_normal((n, 19))
    y = z[:, :3, None] + 0.5 * z[:, None, 3:7] + math.sqrt(0.5) * z[:, 7:].reshape(n, 3, 4)
    c = variance.variance_components_many(y, draws=0)["components"]  # the shares' intervals: test_intervals.py
    hits = {k: np.mean((c[k]["low"] <= truth[k]) & (truth[k] <= c[k]["high"])) for k in truth}
    assert all(0.93 <= h <= 0.975 for h in hits.values()), hits


def crossed_by_hand(d):
    """The two-way random-effects interval for the mean of a crossed grid d[i][j], loop by loop: V = MS_init +
    MS_data - MS_rest on Satterthwaite's df, floored at the cells' variance on I J - 1 df."""
    from scipy import stats as st

    n_i, n_j = len(d), len(d[0])
    grand = sum(map(sum, d)) / (n_i * n_j)
    rows = [sum(r) / n_j for r in d]
    cols = [sum(d[i][j] for i in range(n_i)) / n_i for j in range(n_j)]
    ms_a = n_j * sum((r - grand) ** 2 for r in rows) / (n_i - 1)
    ms_b = n_i * sum((c - grand) ** 2 for c in cols) / (n_j - 1)
    df_e = (n_i - 1) * (n_j - 1)
    ms_e = sum((d[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(n_i) for j in range(n_j)) / df_e
    cells = sum((x - grand) ** 2 for r in d for x in r) / (n_i * n_j - 1)
    v = ms_a + ms_b - ms_e
    if v > cells:
        df = v**2 / (ms_a**2 / (n_i - 1) + ms_b**2 / (n_j - 1) + ms_e**2 / df_e)
    else:
        v, df = cells, n_i * n_j - 1
    half = st.t.ppf(0.975, df) * math.sqrt(v / (n_i * n_j))
    one = ms_a / n_j + ms_b / n_i + ms_e * (1 - 1 / n_i - 1 / n_j)  # var of one difference from fresh seeds
    return grand, grand - half, grand + half, df, (ms_a, ms_b, ms_e), one


def test_compare_analyses_a_crossed_design_with_the_two_way_model(tmp_path):
    y = crossed_losses()
    # the difference itself depends on the seeds: an init effect, a data effect and a remainder
    d = -0.02 + np.array([0.004, -0.001, -0.003])[:, None] + np.array([0.002, 0.0, -0.001, -0.001])[None, :]
    d = d + np.array([[1, -2, 0, 1], [-1, 1, 2, -2], [0, 1, -2, 1]]) * 4e-4
    runs = [
        make_run(tmp_path, f"hr-i{i}-d{j}", "handrolled_layernorm", j, float(y[i, j]), init_seed=i)
        for i in range(3)
        for j in range(4)
    ]
    runs += [
        make_run(tmp_path, f"pt-i{i}-d{j}", "pytorch_layernorm", j, float(y[i, j]) + float(d[i, j]), init_seed=i)
        for i in range(3)
        for j in range(4)
    ]
    result = compare(runs, tmp_path / "out", equivalence_margin=0.05, plots=False)
    from scipy import stats as st

    from gpt.analysis import variance

    hr = result["groups"][0]["noise_sources"]
    expected = variance.variance_components(y)
    assert (hr["init_seeds"], hr["data_seeds"], hr["missing"]) == ([0, 1, 2], [0, 1, 2, 3], [])
    assert hr["components"]["init"]["variance"] == pytest.approx(expected["components"]["init"]["variance"])
    v = result["groups"][1]["vs_baseline"]
    diffs = [[float(y[i, j]) + float(d[i, j]) - float(y[i, j]) for j in range(4)] for i in range(3)]
    mean, low, high, df, (ms_a, ms_b, ms_e), one = crossed_by_hand(diffs)
    assert (v["method"], v["design"], v["init_seeds"], v["data_seeds"]) == (
        "crossed",
        "crossed seeds",
        [0, 1, 2],
        [0, 1, 2, 3],
    )
    assert (v["diff"], v["low"], v["high"], v["df"]) == (
        pytest.approx(mean),
        pytest.approx(low),
        pytest.approx(high),
        pytest.approx(df),
    )
    assert v["df"] < 11  # not 12 cells as 12 independent pairs
    cells_as_pairs = st.t.ppf(0.975, 11) * np.std(diffs, ddof=1) / math.sqrt(12)
    assert high - mean > 1.5 * cells_as_pairs  # the seed effects on the difference: an honest width
    # the plan and TOST follow the same model; the noise of one difference is the components' sum
    assert v["sd"] == pytest.approx(math.sqrt(one))
    terms = [(1 / 4, ms_a, 2), (1 / 3, ms_b, 3), (1 - 1 / 3 - 1 / 4, ms_e, 6)]
    gw = one + math.sqrt(sum(((k / st.chi2.ppf(0.2, k) - 1) * c * m) ** 2 for c, m, k in terms))
    assert v["plan"]["sd_upper"] == pytest.approx(math.sqrt(gw))
    se = (high - mean) / st.t.ppf(0.975, df)
    p_tost = max(st.t.sf((mean + 0.05) / se, df), st.t.cdf((mean - 0.05) / se, df))
    assert v["equivalence"]["p"] == pytest.approx(p_tost)
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert f"| {_signed(mean)} [{_signed(low)}, {_signed(high)}] crossed 3x4 |" in md
    assert "| pytorch_layernorm | crossed seeds | " in md
    assert "- crossed seeds: every init seed with every data seed: two-way random-effects model" in md
    assert "## Where the noise comes from (crossed initialisation x data-order seeds)" in md
    assert "handrolled_layernorm: 3 initialisation seeds x 4 data-order seeds, test loss mean 3.600000" in md
    c = expected["components"]["init"]
    low_s, high_s = c["share_interval"]
    assert (
        f"| initial weights (model.init_seed) | {c['sd']:.3g} | {c['variance']:.3g} | [{c['low']:.3g}, "
        f"{c['high']:.3g}] | {c['share'] * 100:.0f}% | [{low_s * 100:.0f}%, {high_s * 100:.0f}%] |"
    ) in md
    assert "| interaction and run-to-run nondeterminism |" in md and "Ting et al. (1990)" in md
    # the group's own mean is a crossed estimate too: 12 runs, but 3 and 4 seeds
    row = result["groups"][0]
    g_mean, g_low, g_high, *_ = crossed_by_hand(y.tolist())
    assert row["test_loss_design"] == "crossed seeds" and row["test_loss_ci95"] == [
        pytest.approx(g_low),
        pytest.approx(g_high),
    ]
    # a seed pair missing (it diverged): named, no split, and no interval from a broken grid
    (tmp_path / "hr-i2-d3" / "summary.json").write_text(
        json.dumps({"status": "diverged", "diverged_at_step": 9, "segments": [SEGMENT]})
    )
    broken = compare(runs, tmp_path / "out", plots=False)["groups"][1]["vs_baseline"]
    assert broken["design"] == "incomplete grid" and broken["missing"] == [(2, 3)] and math.isnan(broken["low"])
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        "handrolled_layernorm: 3 initialisation seeds x 4 data-order seeds, incomplete: no evaluated run for "
        "init/data 2/3" in md
    )
    assert "| n/a: incomplete grid, missing init/data 2/3 |" in md


def _signed(x):
    return format(x, "+.6f")


def hellaswag_result(labels, answers: dict) -> dict:
    """An eval-hellaswag-fp32.json as evaluate.py --task hellaswag keeps it."""
    metrics = {m: sum(a == lab for a, lab in zip(answers[m], labels)) / len(labels) for m in answers}
    return {
        "split": "hellaswag",
        "precision": "fp32",
        "n_items": len(labels),
        "metrics": dict.fromkeys(answers, "..."),
        "labels": labels,
        "answers": answers,
        **metrics,
    }


def test_hellaswag_is_compared_over_seeds_and_item_tests_name_two_checkpoints(tmp_path):
    rng = np.random.default_rng(0)
    labels = [int(x) for x in rng.integers(0, 4, 60)]
    metrics = ("acc", "acc_norm", "acc_token_mean")
    right = {}  # (group, seed, metric) -> per-item 0/1
    paths = []
    for group, p_right in (("pytorch_layernorm", 0.30), ("pytorch_rmsnorm", 0.45), ("dyt", 0.35)):
        for seed in (0, 1, 2):
            answers = {}
            for m in metrics:
                hit = rng.random(60) < p_right
                answers[m] = [lab if h else (lab + 1) % 4 for lab, h in zip(labels, hit)]
                right[group, seed, m] = hit.astype(float)
            path = make_run(tmp_path, f"{group}-s{seed}", group, seed, loss=3.0 + seed / 100)
            ckpt = path / "checkpoints" / "step-00000100"
            (ckpt / "eval-hellaswag-fp32.json").write_text(json.dumps(hellaswag_result(labels, answers)))
            paths.append(path)
    result = compare(paths, tmp_path / "out", "pytorch_layernorm", plots=False)
    rms = next(g for g in result["groups"] if g["group"] == "pytorch_rmsnorm")["tasks"]["hellaswag"]
    t = scipy.stats.t.ppf(0.975, 2)
    p_values = []
    for m in metrics:
        accs = [right["pytorch_rmsnorm", s, m].mean() for s in (0, 1, 2)]
        mean, sd = np.mean(accs), np.std(accs, ddof=1)
        got = rms["metrics"][m]
        assert math.isclose(got["mean"], mean) and math.isclose(got["ci95"][1], mean + t * sd / math.sqrt(3))
        # against the baseline: each run's accuracy paired by seed, a t interval over the 3 seeds (not the items)
        d = [accs[s] - right["pytorch_layernorm", s, m].mean() for s in (0, 1, 2)]
        half = t * np.std(d, ddof=1) / math.sqrt(3)
        v = rms["vs_baseline"][m]
        assert (v["method"], v["n"], v["design"]) == ("paired", 3, "independent seeds")
        assert math.isclose(v["diff"], np.mean(d)) and math.isclose(v["low"], np.mean(d) - half)
        p_values.append(v["p"])
    assert rms["two_checkpoints"] is None  # three seeds each: no item-level test of the norm types
    # Holm over the task's family: 2 groups x 3 metrics
    assert result["families"]["hellaswag"] == 6
    dyt = next(g for g in result["groups"] if g["group"] == "dyt")["tasks"]["hellaswag"]["vs_baseline"]
    family = p_values + [dyt[m]["p"] for m in metrics]
    order = np.argsort(family)
    holm = np.maximum.accumulate([min(1, (6 - k) * family[i]) for k, i in enumerate(order)])
    for k, i in enumerate(order):
        got = (rms["vs_baseline"] if i < 3 else dyt)[metrics[i % 3]]["p_holm"]
        assert got == pytest.approx(holm[k])
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "## HellaSwag (60 items)" in md and "| group | seeds | acc | acc_norm | acc_token_mean |" in md
    assert f"| pytorch_rmsnorm | 3 | {rms['metrics']['acc']['mean']:.4f} [" in md
    assert "Against pytorch_layernorm, over seeds: each run's metric, paired by seed" in md
    assert "family of 6 comparisons" in md and "McNemar" not in md

    # one run each: the items say something about these two checkpoints, worded so
    single = compare([paths[0], paths[3]], tmp_path / "out1", "pytorch_layernorm", plots=False)
    task = next(g for g in single["groups"] if g["group"] == "pytorch_rmsnorm")["tasks"]["hellaswag"]
    assert task["vs_baseline"]["acc"]["method"] == "paired" and math.isnan(task["vs_baseline"]["acc"]["low"])
    c = task["two_checkpoints"]
    assert (c["this"], c["baseline"]) == (str(paths[3]), str(paths[0]))
    a, b = right["pytorch_rmsnorm", 0, "acc"], right["pytorch_layernorm", 0, "acc"]
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    p = scipy.stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert c["acc"]["mcnemar"] == {"only_this": only_a, "only_baseline": only_b, "p": p}
    half = scipy.stats.t.ppf(0.975, 59) * np.std(a - b, ddof=1) / math.sqrt(60)
    assert math.isclose(c["acc"]["diff"], (a - b).mean()) and math.isclose(c["acc"]["high"], (a - b).mean() + half)
    md = (tmp_path / "out1" / "comparison.md").read_text()
    assert "Two checkpoints, item by item (a statement about these two trained models" in md
    assert f"McNemar p = {p:.3g} ({only_a} vs {only_b})" in md and f"| {paths[3]} | {paths[0]} |" in md


def test_a_results_table_gives_the_numbers_its_run_folders_give(tmp_path, cli, monkeypatch):
    render_only(monkeypatch)  # which charts a table gets, not their pixels
    from gpt.analysis.results import read_results

    y = crossed_losses()
    runs = [
        make_run(tmp_path, f"hr-i{i}-d{j}", "handrolled_layernorm", j, float(y[i, j]), init_seed=i)
        for i in range(3)
        for j in range(4)
    ]
    runs += [
        make_run(tmp_path, f"pt-i{i}-d{j}", "pytorch_layernorm", j, float(y[i, j]) - 0.01 + (i - j) * 1e-3, init_seed=i)
        for i in range(3)
        for j in range(4)
    ]
    runs += [make_run(tmp_path, f"rms-s{s}", "pytorch_rmsnorm", s, 3.59 + s / 100) for s in range(3)]
    runs.append(make_run(tmp_path, "none-s0", "no_norm", 0, status="diverged", diverged_at=9))
    labels = [0, 1, 2, 3] * 5
    for k, path in enumerate(runs[:4] + runs[12:16]):  # HellaSwag for some runs only
        answers = {m: [(lab + (k + i) % 2) % 4 for i, lab in enumerate(labels)] for m in ("acc", "acc_norm")}
        (path / "checkpoints" / "step-00000100" / "eval-hellaswag-fp32.json").write_text(
            json.dumps(hellaswag_result(labels, answers))
        )
    folders = compare(runs, tmp_path / "from-runs", equivalence_margin=0.02, plots=False)
    table = tmp_path / "from-runs" / "runs.csv"
    header = table.read_text().splitlines()[0]
    assert header == "group,init_seed,data_seed,status,test_loss,hellaswag.acc,hellaswag.acc_norm"
    assert len(read_results(table)) == len(runs)
    out = cli(
        ROOT / "scripts" / "compare.py", "--results", table, "--out", tmp_path / "t", "--equivalence-margin", "0.02"
    )
    assert out.returncode == 0, out.stderr
    from_table = json.loads((tmp_path / "t" / "comparison.json").read_text())
    expected = strict_json((tmp_path / "from-runs" / "comparison.json").read_text())

    def numbers(result):
        keep = ("test_loss_mean", "test_loss_std", "test_loss_ci95", "test_loss_design", "n_evaluated", "seeds")
        rows = {}
        for g in result["groups"]:
            v = g["vs_baseline"] or {}
            rows[g["group"]] = (
                {k: g[k] for k in keep},
                {k: v.get(k) for k in ("diff", "low", "high", "p", "p_holm", "df", "design", "plan", "equivalence")},
                {t: (x["metrics"], x["vs_baseline"]) for t, x in g["tasks"].items()},
                [x["seed"] for x in g["left_out"]],  # a table keeps the status, not the step it diverged at
                g["noise_sources"],
            )
        return rows, result["families"]

    a, b = numbers(from_table), numbers(expected)
    for group in b[0]:
        for x, y in zip(a[0][group], b[0][group]):
            assert x == y, (group, x, y)
    assert a == b
    assert folders["groups"][1]["vs_baseline"]["design"] == "crossed seeds"
    assert from_table["source"] == str(table) and from_table["shared"] == {}
    md = (tmp_path / "t" / "comparison.md").read_text()
    assert f"Results from the table {table} (`compare.py --results`)" in md and "What every run shares" not in md
    assert sorted(p.name for p in (tmp_path / "t").glob("*.png")) == ["test_loss.png"]  # a table has no curves


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("group,seed,test_loss\na,0,3.5\n", r"no column init_seed, data_seed; a results table has the columns"),
        ("group,init_seed,data_seed,test_loss\na,0,0,three\n", r"x\.csv:2: test_loss is 'three', not a finite number"),
        ("group,init_seed,data_seed,test_loss\na,0,0,nan\n", r"x\.csv:2: test_loss is 'nan', not a finite number"),
        ("group,init_seed,data_seed,test_loss\na,0.5,0,3\n", r"x\.csv:2: init_seed is '0\.5', not an integer seed"),
        (
            "group,init_seed,data_seed,test_loss\na,0,0,3\na,0,0,3.1\n",
            r"x\.csv:3: group 'a' has init_seed 0 and data_seed 0 already on line 2; one row per run",
        ),
        ("group,init_seed,data_seed,test_loss\n", r"no rows under its header"),
        ("group,init_seed,data_seed,test_loss\na,0,0,3,4\n", r"x\.csv:2: more values than columns"),
        ("group,init_seed,data_seed,test_loss\na,0,0,-0.1\n", r"x\.csv:2: test_loss is -0\.1, below 0; a cross-ent"),
        ('group,init_seed,data_seed,test_loss\n"two\nlines",0,0,3\n', r"x\.csv:2: the group 'two\\nlines' has a line"),
        # a field past the csv module's 128 KiB limit, a value of 100,000 characters: one short line each
        ("group,init_seed,data_seed,test_loss\na,0,0," + "9" * 140_000 + "\n", r"^--results .*x\.csv: not a CSV tab"),
        ("group,init_seed,data_seed,test_loss\na,0,0," + "x" * 100_000 + "\n", r"x\.csv:2: test_loss is 100,000 char"),
    ],
)
def test_a_bad_results_table_is_one_line(tmp_path, text, message):
    (tmp_path / "x.csv").write_text(text)
    with pytest.raises(UserError, match=message) as refused:
        compare([], tmp_path / "out", results=tmp_path / "x.csv")
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400  # one line, short, whatever the input
    assert not (tmp_path / "out").exists()


def test_a_results_table_is_bounded_like_every_other_input(tmp_path, monkeypatch):
    """100,000 rows read (the size of a large study's table); past MAX_BYTES or MAX_ROWS, one line before reading."""
    from gpt.analysis import results

    rows = "".join(f"g{i % 3},{i},{i},{3 + (i % 7) / 100}\n" for i in range(100_000))
    table = tmp_path / "big.csv"
    table.write_text("group,init_seed,data_seed,test_loss\n" + rows)
    read = results.read_results(table)
    assert len(read) == 100_000 and read[-1]["test_loss"] == 3 + (99_999 % 7) / 100
    monkeypatch.setattr(results, "MAX_BYTES", 1_000)
    with pytest.raises(UserError, match=r"big\.csv: [\d,]+ bytes, more than a results table may hold \(1,000\)"):
        results.read_results(table)
    monkeypatch.setattr(results, "MAX_BYTES", 2**30)
    monkeypatch.setattr(results, "MAX_ROWS", 10)
    with pytest.raises(UserError, match=r"big\.csv: more than 10 rows; a results table has one row per run"):
        results.read_results(table)


def test_results_and_run_folders_do_not_mix(tmp_path, cli):
    (tmp_path / "x.csv").write_text("group,init_seed,data_seed,test_loss\na,0,0,3\n")
    run = make_run(tmp_path, "a", "dyt", 0, 3.7)
    with pytest.raises(UserError, match="give run directories or --results FILE.csv, not both"):
        compare([run], tmp_path / "out", results=tmp_path / "x.csv")
    out = cli(ROOT / "scripts" / "compare.py")
    assert out.returncode == 2 and "give the run directories to compare, or --results FILE.csv" in out.stderr


def test_commits_and_uncommitted_changes_are_said_when_runs_differ_in_them(tmp_path):
    other = segment(**{"code.commit": "e" * 40})  # the same source from another commit
    runs = pair(tmp_path, pt_segment=other)
    compare(runs, tmp_path / "out", plots=False)
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        "- code: gpt-norm-harness 0.1.0, commits dddddddddd (hr-s0, hr-s1, hr-s2); eeeeeeeeee (pt-s0, pt-s1, pt-s2) "
        "(the same source); source sha256 cccccccccccc" in md
    )
    assert "not a git checkout" not in md
    dirty = pair(tmp_path / "dirty", pt_segment=segment(**{"code.dirty": True}))
    compare(dirty, tmp_path / "out", plots=False)
    assert (
        "commit dddddddddd; uncommitted changes in pt-s0, pt-s1, pt-s2; source sha256"
        in (tmp_path / "out" / "comparison.md").read_text()
    )


def test_log_every_is_compared_where_a_loss_ceiling_decides_divergence(tmp_path):
    logged = pair(tmp_path, pt_config={"log": {"log_every": 1}})
    assert len(compare(logged, tmp_path / "out", plots=False)["groups"]) == 2  # no ceiling: logging changes nothing
    ceiling = {"train": {"loss_ceiling": 12.0}}
    runs = pair(tmp_path / "c", hr_config=ceiling, pt_config={"log": {"log_every": 1}, "train": {"loss_ceiling": 12.0}})
    with pytest.raises(UserError, match=r"log\.log_every: 10 \(hr-s0, hr-s1, hr-s2\); 1 \(pt-s0, pt-s1, pt-s2\)"):
        compare(runs, tmp_path / "out")


def test_an_offset_without_its_range_is_one_line(tmp_path, cli):
    # a range evaluate.py kept is named by its first token and its length: --offset alone names none
    run = make_run(tmp_path, "a", "dyt", 0, 3.7)
    out = cli(ROOT / "scripts" / "compare.py", run, "--out", tmp_path / "out", "--offset", "0")
    assert out.returncode == 2 and "--offset needs --tokens" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


def test_a_users_text_is_escaped_in_markdown_and_round_trips_in_csv(tmp_path, cli):
    """Group names carry config values, a user's text: in comparison.md no raw HTML, no '|' that shifts a
    column, no line break that ends a row; in runs.csv the same names, exactly."""
    names = ["<script>alert(1)</script>", "A|B", "two\nlines"]
    runs = [
        make_run(tmp_path, f"r{i}-{seed}", "dyt", seed, 3.5 + i / 10 + seed / 100, config={"data": {"train_split": n}})
        for i, n in enumerate(names)
        for seed in (0, 1)
    ]
    # a mistake that quotes the names is one line still (no default baseline here: they differ in more than the norm)
    done = cli("compare", *runs, "--vary", "data.train_split", "--out", tmp_path / "refused")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "data.train_split=two\\nlines" in done.stderr
    baseline = f"dyt, data.train_split={names[0]}"
    result = compare(runs, tmp_path / "out", baseline, vary=["data.train_split"], plots=False)
    labels = [g["group"] for g in result["groups"]]
    assert labels == [f"dyt, data.train_split={n}" for n in names]
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "data.train_split=two\\nlines" in md and "A\\|B" in md
    header = next(line for line in md.splitlines() if line.startswith("| group | seeds |"))
    rows = [line for line in md.splitlines() if line.startswith("| dyt, ")][:3]
    cells = [len(re.split(r"(?<!\\)\|", line)) for line in [header, *rows]]
    assert len(set(cells)) == 1, cells  # every row has the header's columns
    with open(tmp_path / "out" / "runs.csv", newline="") as f:
        assert sorted({row["group"] for row in csv.DictReader(f)}) == sorted(labels)
