"""scripts/compare.py on synthetic run directories with known numbers."""

import json
import math
import subprocess
import sys

import matplotlib.image
import pytest

from gpt.comparison import compare
from gpt.config import config_from_dict, dump_config
from gpt.errors import UserError

from conftest import ROOT

T_975_2DF = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (tables)

BASE = {"hr": [3.600, 3.590, 3.610], "pt": [3.570, 3.575, 3.580]}


def make_run(root, name, norm_type, seed, loss=None, status="completed", split="test", offset=0, n_tokens=1000,
             tokenizer="gpt2", diverged_at=None, init_seed=None, total_steps=None):
    run = root / name
    cfg = config_from_dict({"run": {"name": name}, "train": {"steps": 100, "seed": seed},
                            "model": {"norm_type": norm_type, "init_seed": init_seed}})
    ckpt = run / "checkpoints" / "step-00000100"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "tokens": s * 1000, "train_loss": 5 - s / 50 + seed / 100, "grad_norm": 1.0 + s / 100,
                    **({"val_loss": 5 - s / 60} if s % 50 == 0 else {})}) + "\n" for s in range(1, 101)))
    (run / "summary.json").write_text(json.dumps({"status": status, "tokens_per_s": 1000.0 + seed, "wall_seconds": 60.0,
                                                  "diverged_at_step": diverged_at, "total_steps": total_steps}))
    (ckpt / "model.safetensors").write_bytes(b"")
    (run / "checkpoints" / "latest").write_text(ckpt.name + "\n")
    (run / "checkpoints" / "best").write_text(ckpt.name + "\n")
    if loss is not None:
        (ckpt / "eval-test-fp32.json").write_text(json.dumps({
            "loss": loss, "split": split, "offset": offset, "n_tokens": n_tokens, "tokenizer": tokenizer,
            "data_dir": "data/x", "precision": "fp32"}))
    return run


@pytest.fixture
def runs(tmp_path):
    paths = [make_run(tmp_path, f"hr-s{s}", "handrolled_layernorm", s, BASE["hr"][s]) for s in range(3)]
    paths += [make_run(tmp_path, f"pt-s{s}", "pytorch_layernorm", s, BASE["pt"][s]) for s in range(3)]
    paths += [make_run(tmp_path, f"rms-s{s}", "pytorch_rmsnorm", s, loss) for s, loss in ((3, 3.58), (4, 3.60))]
    paths += [make_run(tmp_path, "none-s0", "no_norm", 0, status="diverged", diverged_at=530)]
    return paths


def test_means_stds_and_paired_interval(runs, tmp_path):
    result = compare(runs, tmp_path / "out")
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
    assert v["diff"] == pytest.approx(-0.025) and v["low"] == pytest.approx(mean - half) \
        and v["high"] == pytest.approx(mean + half)
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


def test_outputs_are_written(runs, tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), *map(str, runs), "--out", str(out),
                          "--baseline", "pytorch_layernorm"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    md = (out / "comparison.md").read_text()
    assert "| no_norm | 1 (0) | n/a | n/a | n/a |" in md and "1 diverged (diverged at step 530)" in md
    assert "| pytorch_layernorm | 3 (0, 1, 2) | 3.575000 | 0.005000 | baseline |" in md
    assert "| handrolled_layernorm | 3 (0, 1, 2) | 3.600000 | 0.010000 | +0.025000 [" in md and "paired" in md
    assert md in res.stdout
    data = json.loads((out / "comparison.json").read_text())
    assert data["baseline"] == "pytorch_layernorm" and len(data["groups"]) == 4
    for name in ("train_loss.png", "val_loss.png", "grad_norm.png", "test_loss.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert matplotlib.image.imread(png).shape[2] in (3, 4)  # decodes as an image


def test_missing_evaluation_is_reported(tmp_path):
    a = make_run(tmp_path, "a", "dyt", 0, 3.7)
    b = make_run(tmp_path, "b", "dyt", 1)
    c = make_run(tmp_path, "c", "pytorch_rmsnorm", 0, 3.6)
    result = compare([a, b, c], tmp_path / "out", baseline="dyt")
    dyt = next(g for g in result["groups"] if g["group"] == "dyt")
    assert dyt["missing_evaluation"] == [str(b)] and dyt["n_evaluated"] == 1
    assert f"Not evaluated (run `python evaluate.py` on them): {b}" in (tmp_path / "out" / "comparison.md").read_text()


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
        result = compare(runs, tmp_path / which, which=which, equivalence_margin=0.05)
        row = next(g for g in result["groups"] if g["group"] == "pytorch_layernorm")
        assert row["n_evaluated"] == 4 and row["test_loss_mean"] == pytest.approx(sum(pt.values()) / 4), which
        assert [(x["seed"], x["reason"]) for x in row["left_out"]] == [
            ("3", "diverged at step 77"), ("5", "interrupted"), ("6", "not evaluated")], which
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
    assert "| pytorch_layernorm | 3; unpaired seeds: 3, 4 | " in md
    strict_json((tmp_path / "best" / "comparison.json").read_text())


def test_seeds_needed_and_equivalence_match_a_hand_computation(tmp_path):
    from scipy import stats as st

    from gpt import stats

    diffs = [-0.030, -0.015, -0.030, -0.020, -0.025]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    mde = (st.t.ppf(0.975, n - 1) + st.t.ppf(0.80, n - 1)) * se
    assert stats.resolvable_difference(sd, n) == pytest.approx(mde)
    # the fewest pairs m with (t(0.975, m-1) + t(0.8, m-1)) * sd / sqrt(m) <= |mean|
    m = next(m for m in range(2, 1000) if (st.t.ppf(0.975, m - 1) + st.t.ppf(0.8, m - 1)) * sd / math.sqrt(m)
             <= abs(mean))
    assert stats.seeds_needed(mean, sd) == m == 3
    assert stats.seeds_needed(mean / 10, sd) > m and stats.seeds_needed(0.0, sd) is None
    for margin, verdict in ((0.04, True), (0.025, False)):
        p = max(st.t.sf((mean + margin) / se, n - 1), st.t.cdf((mean - margin) / se, n - 1))
        eq = stats.equivalence(diffs, margin)
        assert eq["p"] == pytest.approx(p) and eq["equivalent"] is verdict and bool(p < 0.05) is verdict
    # the same numbers through compare, on runs whose losses give these differences
    base = [3.6, 3.61, 3.59, 3.605, 3.595]
    runs = [make_run(tmp_path, f"a{s}", "handrolled_layernorm", s, loss) for s, loss in enumerate(base)]
    runs += [make_run(tmp_path, f"b{s}", "pytorch_rmsnorm", s, loss + d)
             for s, (loss, d) in enumerate(zip(base, diffs))]
    v = compare(runs, tmp_path / "out", equivalence_margin=0.04)["groups"][1]["vs_baseline"]
    assert v["resolvable_diff"] == pytest.approx(mde) and v["seeds_needed"] == 3
    assert v["equivalence"]["equivalent"] is True
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert f"| pytorch_rmsnorm | 5 | {sd:.6f} | {mde:.6f} | 3 | yes (p = " in md


def test_a_seed_is_the_initial_weights_and_the_data_order(tmp_path):
    # an init-seed sweep at a fixed data seed: three distinct seeds, not duplicates
    a = [make_run(tmp_path, f"a{i}", "handrolled_layernorm", 0, 3.60 + i / 100, init_seed=i) for i in range(3)]
    b = [make_run(tmp_path, f"b{i}", "pytorch_layernorm", 0, 3.58 + i / 100, init_seed=i) for i in range(3)]
    other = make_run(tmp_path, "b-other", "pytorch_layernorm", 1, 3.5, init_seed=0)  # same weights, other data
    result = compare([*a, *b, other], tmp_path / "out")
    row = result["groups"][1]
    assert row["seeds"] == ["0", "1/0", "2/0", "0/1"]
    v = row["vs_baseline"]
    assert (v["method"], v["n"], v["unpaired"]) == ("paired", 3, ["0/1"])
    assert v["diff"] == pytest.approx(-0.02) and v["sd"] == pytest.approx(0.0, abs=1e-12)


def test_runs_of_different_lengths_are_refused(tmp_path):
    a = make_run(tmp_path, "a", "handrolled_layernorm", 0, 3.6, total_steps=33_165)
    b = make_run(tmp_path, "b", "pytorch_rmsnorm", 0, 3.6, total_steps=33_161)
    c = make_run(tmp_path, "c", "pytorch_layernorm", 0, 3.6, total_steps=33_165)
    with pytest.raises(UserError, match=r"these runs trained for different lengths, so their losses are not "
                                        r"comparable: 33,165 steps = 3,260,252,160 tokens \(a, c\); 33,161 steps = "
                                        r"3,259,858,944 tokens \(b\); train every run"):
        compare([a, b, c], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert compare([a, c], tmp_path / "out")["groups"][1]["n_evaluated"] == 1


def test_comparison_json_is_standard_json(runs, tmp_path):
    compare(runs, tmp_path / "out")  # one-seed and diverged groups: NaN means, missing intervals
    data = strict_json((tmp_path / "out" / "comparison.json").read_text())
    none = next(g for g in data["groups"] if g["group"] == "no_norm")
    assert none["test_loss_mean"] is None and none["vs_baseline"]["diff"] is None
