"""sweep.py --token-fractions and compare.py --ladder: the baseline trained to several fractions of its token budget
at one size, and each norm type's effective speedup read off its curve (gpt.analysis.speedup), checked against a
direct computation from the runs' own summary.json and test losses; bits per byte against the decoded test tokens;
the refusals (devices mixed, a throughput spread, a ladder that is not the baseline's)."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from analysis.test_compare import render_only
from conftest import CONFIGS
from scipy import stats as scipy_stats

from gpt.analysis.table import compare
from gpt.commands.compare import main as compare_main
from gpt.commands.prepare_data import main as prepare_main
from gpt.commands.sweep import main as sweep_main
from gpt.common.errors import UserError
from gpt.data.folders import open_split
from gpt.data.tokenizer import BYTES_EOT_TOKEN, bytes_encoding
from gpt.run.directory import RunDir, read_eval_result

pytestmark = pytest.mark.xdist_group("token_ladder")  # the ladder is trained once: on one pytest-xdist worker

NORMS, SEEDS, FRACTIONS = ["handrolled_layernorm", "pytorch_layernorm", "no_norm"], [0, 1], [0.5, 2.0]
TOKENS_PER_PARAM = 2


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """The CPU ladder's smallest size (1x16) on the byte-level Shakespeare set: 3 norm types x 2 seeds at the budget
    (2 tokens per parameter) and the baseline's 0.5x and 2x, swept and compared (about 20 s)."""
    folder = tmp_path_factory.mktemp("token-ladder")
    data = folder / "shakespeare-bytes"
    assert prepare_main(["shakespeare", "--tokenizer", "bytes", "--out", str(data), "--quiet"]) == 0
    sets = [f"data.path={data}", "data.val_tokens=4096", "data.test_tokens=8192", "log.progress=false",
            f"train.tokens_per_param={TOKENS_PER_PARAM}", "train.eval_every=100000", "train.checkpoint_every=100000",
            "model.size=1x16"]  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        render_only(monkeypatch, "speedup.png")
        argv = [str(CONFIGS / "ladder.yaml"), "--norm-types", *NORMS, "--seeds", *map(str, SEEDS),
                "--token-fractions", *map(str, FRACTIONS), "--runs-dir", str(folder / "runs"),
                *(a for s in sets for a in ("--set", s))]  # fmt: skip
        assert sweep_main(argv) == 0
    torch.set_num_threads(threads)
    out = folder / "runs" / "ladder-comparison"
    return {"folder": folder, "data": data, "runs": folder / "runs", "out": out,
            "result": json.loads((out / "comparison.json").read_text())}  # fmt: skip


def run_dir(ladder, norm, seed, fraction=None):
    part = "" if fraction is None else f"-t{fraction:g}"
    return ladder["runs"] / f"ladder-{norm.replace('_', '-')}{part}-s{seed}"


def own(path) -> dict:
    """A run's numbers from its own files: its tokens, FLOPs, tokens/s and test loss."""
    summary = json.loads((path / "summary.json").read_text())
    config = RunDir(path).read_config()
    tokens = summary["total_steps"] * config["train"]["global_batch_size"] * config["model"]["context_length"]
    loss = read_eval_result(RunDir(path).checkpoint("final"), "test", "fp32")["loss"]
    return {"tokens": tokens, "flops": tokens * summary["flops_per_token"], "tps": summary["tokens_per_s"],
            "loss": loss}  # fmt: skip


def direct_log_es(x: np.ndarray, means: np.ndarray, target: float, x_variant: float) -> float:
    """log ES by the log-log line of the baseline's mean losses (numpy's polyfit, not the module's code)."""
    slope, intercept = np.polyfit(np.log(x), np.log(means), 1)
    return (math.log(target) - intercept) / slope - math.log(x_variant)


@pytest.mark.slow
def test_the_ladder_trains_the_baseline_at_each_fraction_of_its_budget(ladder):
    budget = own(run_dir(ladder, NORMS[0], 0))["tokens"]
    for fraction in FRACTIONS:
        for seed in SEEDS:
            config = RunDir(run_dir(ladder, NORMS[0], seed, fraction)).read_config()
            assert config["train"]["tokens_per_param"] == pytest.approx(fraction * TOKENS_PER_PARAM)
            assert config["model"]["norm_type"] == NORMS[0] and config["train"]["seed"] == seed
            assert own(run_dir(ladder, NORMS[0], seed, fraction))["tokens"] == pytest.approx(
                fraction * budget, rel=0.05
            )
    assert not list(ladder["runs"].glob("ladder-no-norm-t*"))  # the ladder is the baseline's alone
    groups = [g["group"] for g in ladder["result"]["groups"]]
    assert groups == NORMS and all(g["n_evaluated"] == 2 for g in ladder["result"]["groups"])


@pytest.mark.slow
def test_the_effective_speedup_equals_a_direct_computation_from_the_runs(ladder):
    s = ladder["result"]["effective_speedup"]
    assert s["route"] == "token ladder" and s["form"] == "power" and s["baseline"] == NORMS[0]
    rungs = [[own(run_dir(ladder, NORMS[0], k, f)) for k in SEEDS] for f in (0.5, None, 2.0)]
    x = np.array([r[0]["flops"] for r in rungs])
    base = np.array([[r[i]["loss"] for r in rungs] for i in range(len(SEEDS))])  # (seeds, rungs)
    assert [r["flops"] for r in s["rungs"]] == pytest.approx(x.tolist(), rel=1e-12)
    own_es = math.exp(direct_log_es(x, base.mean(0), base[:, 1].mean(), x[1]))  # the budget off its own curve
    assert s["lack_of_fit"] == {"handrolled_layernorm (the budget)": pytest.approx(own_es, rel=1e-9)}
    for norm in NORMS[1:]:
        runs = [own(run_dir(ladder, norm, k)) for k in SEEDS]
        var = np.array([r["loss"] for r in runs])
        got = s["norms"][norm]["compute"]
        # anchored: both losses read off the curve, the variant's and the baseline's own at the budget
        log_es = direct_log_es(x, base.mean(0), var.mean(), x[1]) - direct_log_es(
            x, base.mean(0), base[:, 1].mean(), x[1]
        )
        assert math.log(got["es"]) == pytest.approx(log_es, abs=1e-9)
        # the interval: each seed's first-order combination of its losses (gradient by central differences)
        values = np.append(base.mean(0), var.mean())

        def f(v):
            return direct_log_es(x, v[:-1], v[-1], x[1]) - direct_log_es(x, v[:-1], v[1], x[1])

        grad = np.array([(f(values + h) - f(values - h)) / 2e-6 for h in np.eye(len(values)) * 1e-6])
        q = np.column_stack([base, var]) @ grad
        half = scipy_stats.t.ppf(0.975, len(SEEDS) - 1) * q.std(ddof=1) / math.sqrt(len(SEEDS))
        assert math.log(got["low"]) == pytest.approx(log_es - half, abs=1e-5)
        assert math.log(got["high"]) == pytest.approx(log_es + half, abs=1e-5)
        assert norm in s["norms"][norm]["verdict"] and "compute" in s["norms"][norm]["verdict"]


@pytest.mark.slow
def test_the_section_and_the_chart_are_written(ladder):
    md = (ladder["out"] / "comparison.md").read_text()
    ratio = own(run_dir(ladder, NORMS[0], 0, 0.5))["tokens"] / own(run_dir(ladder, NORMS[0], 0))["tokens"]
    assert "## Effective speedup" in md and f"| handrolled_layernorm at {ratio:.3g}x | " in md
    for norm in NORMS[1:]:
        assert f"- {norm} reaches its test loss with" in md
    assert (ladder["out"] / "speedup.png").stat().st_size > 10_000


@pytest.mark.slow
def test_bits_per_byte_equals_the_loss_over_the_decoded_test_bytes(ladder):
    t = ladder["result"]["test_range"]
    tokens = open_split(ladder["data"], "test").read(t["offset"] + 1, t["targets_scored"]).astype(np.int64)
    text = bytes_encoding().decode_bytes([int(i) for i in tokens if i != BYTES_EOT_TOKEN])
    assert t["bytes_scored"] == len(text)
    for g in ladder["result"]["groups"]:
        for r in g["runs"]:
            assert r["bits_per_byte"] == pytest.approx(r["test_loss"] * t["targets_scored"] / (len(text) * math.log(2)))
        evaluation = read_eval_result(RunDir(Path(g["runs"][0]["path"])).checkpoint("final"), "test", "fp32")
        assert evaluation["bits_per_byte"] == pytest.approx(g["runs"][0]["bits_per_byte"], rel=1e-12)
    assert "Bits per byte = nats per token x" in (ladder["out"] / "comparison.md").read_text()


def copies(ladder, tmp_path) -> tuple[list, list]:
    """Copies of the budget runs and of the ladder's, for a test that changes their records."""
    grid = [shutil.copytree(run_dir(ladder, n, k), tmp_path / run_dir(ladder, n, k).name) for n in NORMS for k in SEEDS]
    rungs = [shutil.copytree(run_dir(ladder, NORMS[0], k, f), tmp_path / run_dir(ladder, NORMS[0], k, f).name)
             for f in FRACTIONS for k in SEEDS]  # fmt: skip
    return grid, rungs


def rewrite_summary(path, **changes) -> None:
    summary = json.loads((path / "summary.json").read_text())
    for key, value in changes.items():
        if key == "hardware_name":
            for segment in summary["segments"]:
                segment["hardware"]["name"] = value
        else:
            summary[key] = value
    (path / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_time_matched_is_the_compute_matched_times_each_seed_s_throughput_ratio(ladder, tmp_path, capsys):
    grid, rungs = copies(ladder, tmp_path)
    rates = {"handrolled_layernorm": 1000.0, "pytorch_layernorm": 1100.0, "no_norm": 1250.0}
    for path in grid + rungs:
        norm = next(n for n in NORMS if path.name.startswith(f"ladder-{n.replace('_', '-')}-"))
        rewrite_summary(path, tokens_per_s=rates[norm] * (1.02 if path.name.endswith("s1") else 1.0))
    out = tmp_path / "cmp"
    assert compare_main([*map(str, grid), "--ladder", *map(str, rungs), "--out", str(out), "--no-plots"]) == 0
    s = json.loads((out / "comparison.json").read_text())["effective_speedup"]
    assert s["throughput"]["problem"] is None
    for norm in NORMS[1:]:
        c, t = s["norms"][norm]["compute"], s["norms"][norm]["time"]
        assert t["es"] == pytest.approx(c["es"] * rates[norm] / rates[NORMS[0]], rel=1e-9)
        assert "of the training time handrolled_layernorm needs for it (time-matched" in s["norms"][norm]["verdict"]
    # bench.py's rows instead of the runs' own: the ratio of its tokens/s, each norm type's median of three rounds
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"mode": "step", "norm_type": n, "tokens_per_s": (2000.0 + 100 * i) * drift,
                                         "compile": False, "device": "cpu", "world_size": 1}) + "\n"
                             for drift in (1.0, 1.3, 0.9) for i, n in enumerate(NORMS)))  # fmt: skip
    argv = [*map(str, grid), "--ladder", *map(str, rungs), "--out", str(out), "--no-plots", "--throughput", str(bench)]
    assert compare_main(argv) == 0
    s = json.loads((out / "comparison.json").read_text())["effective_speedup"]
    for i, norm in enumerate(NORMS[1:], 1):
        c, t = s["norms"][norm]["compute"], s["norms"][norm]["time"]
        assert t["es"] == pytest.approx(c["es"] * (2000 + 100 * i) / 2000, rel=1e-9)
    assert (
        s["throughput"]["source"].endswith(f"tokens/s, the median of 3 rounds), from {bench}")
        and "cpu x 1 (handrolled_layernorm 2,000, " in s["throughput"]["source"]
    )


@pytest.mark.slow
def test_runs_on_mixed_devices_or_a_shared_machine_get_no_time_matched_figure(ladder, tmp_path):
    grid, rungs = copies(ladder, tmp_path)
    for path in grid + rungs:
        rewrite_summary(path, tokens_per_s=1000.0)
    rewrite_summary(grid[-1], hardware_name="NVIDIA H100 80GB HBM3")
    out = tmp_path / "cmp"
    argv = [*map(str, grid), "--ladder", *map(str, rungs), "--out", str(out), "--no-plots"]
    assert compare_main([*argv, "--allow-differ", "hardware.name"]) == 0
    s = json.loads((out / "comparison.json").read_text())["effective_speedup"]
    problem = s["throughput"]["problem"]
    assert problem.startswith("time-matched effective speedup refused: the runs ran on different hardware")
    assert "NVIDIA H100" in problem and "bench.py" in problem
    assert all(v["time"] is None and v["compute"]["es"] > 0 for v in s["norms"].values())  # compute still printed
    rewrite_summary(
        grid[-1], hardware_name=json.loads((grid[0] / "summary.json").read_text())["segments"][0]["hardware"]["name"]
    )
    rewrite_summary(grid[0], tokens_per_s=1560.0)  # one run of the baseline on a loaded machine
    assert compare_main(argv) == 0
    problem = json.loads((out / "comparison.json").read_text())["effective_speedup"]["throughput"]["problem"]
    assert "1.56-fold apart" in problem and "shared with other work" in problem and "bench.py" in problem


@pytest.mark.slow
def test_a_ladder_that_is_not_the_baseline_s_is_refused_in_one_line(ladder, tmp_path):
    grid = [run_dir(ladder, n, k) for n in NORMS for k in SEEDS]
    with pytest.raises(UserError, match=r"a token ladder is the baseline's \(handrolled_layernorm\) runs"):
        speedup_compare(grid, [run_dir(ladder, "no_norm", 0)], tmp_path)
    with pytest.raises(UserError, match="--throughput times the norm types for the effective speedup"):
        compare(grid, tmp_path / "c", throughput=tmp_path / "b.jsonl", plots=False)


def speedup_compare(grid, rungs, tmp_path):
    return compare(grid, tmp_path / "c", ladder=rungs, plots=False)


def test_fractions_that_cannot_make_a_ladder_are_refused_before_anything_runs(tmp_path, capsys):
    base = [str(CONFIGS / "ladder.yaml"), "--runs-dir", str(tmp_path), "--dry-run"]
    for extra, message in (
        (["--token-fractions", "1"], "--token-fractions 1 is the budget the grid trains already"),
        (["--token-fractions", "0.5", "0.50"], "names a fraction twice"),
        (["--token-fractions", "-1"], "a fraction of the token budget, > 0"),
        (["--token-fractions", "nan"], "a fraction of the token budget, > 0"),
        (["--token-fractions", "0.5", "--sizes", "1x16", "2x32"], "the size ladder is the curve already"),
        (["--token-fractions", "0.5", "--lrs", "1e-3", "2e-3"], "--token-fractions with --lrs"),
        (["--throughput", "bench.jsonl"], "--throughput times the norm types for the effective speedup: add --token"),
        (
            ["--token-fractions", "0.5", "--norm-types", "no_norm", "--baseline", "dyt"],
            "--baseline dyt: the token ladder",
        ),
    ):
        assert sweep_main(base + extra) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert not any(tmp_path.iterdir())


def test_the_plan_counts_the_ladder_and_its_compute(tmp_path, capsys):
    argv = [str(CONFIGS / "ladder.yaml"), "--runs-dir", str(tmp_path), "--norm-types", *NORMS, "--seeds", "0", "1", "2"]
    assert sweep_main([*argv, "--token-fractions", "0.5", "1", "2", "--plan"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert (
        head == "# plan: 9 cell(s), and the baseline's token ladder: 6 cell(s), 7.5 budget runs of compute; nothing run"
    )


@pytest.mark.slow
def test_a_throughput_file_that_is_not_bench_s_is_refused_in_one_line(ladder, tmp_path):
    grid = [run_dir(ladder, n, k) for n in NORMS for k in SEEDS]
    rungs = [run_dir(ladder, NORMS[0], k, f) for f in FRACTIONS for k in SEEDS]
    bad = tmp_path / "bench.jsonl"
    for text, message in (
        (None, r"--throughput .*bench.jsonl: not a bench.py JSON-lines file \(FileNotFoundError\)"),
        ("{not json\n", r"not a bench.py JSON-lines file \(JSONDecodeError\)"),
        ('{"mode": "norm", "tokens_per_s": 1}\n', "no training-step row with tokens/s in it"),
    ):
        if text is not None:
            bad.write_text(text)
        with pytest.raises(UserError, match=message):
            compare(grid, tmp_path / "c", ladder=rungs, throughput=bad, plots=False)
    assert not (tmp_path / "c").exists()  # refused before anything is written


@pytest.mark.slow
def test_a_ladder_run_that_never_ran_or_diverged_is_named_and_left_out(ladder, tmp_path):
    grid = [run_dir(ladder, n, k) for n in NORMS for k in SEEDS]
    rungs = [run_dir(ladder, NORMS[0], k, f) for f in FRACTIONS for k in SEEDS]
    diverged = shutil.copytree(rungs[0], tmp_path / rungs[0].name)
    rewrite_summary(diverged, status="diverged", diverged_at_step=3)
    result = compare(grid, tmp_path / "c", ladder=[diverged, *rungs[1:], tmp_path / "never-ran"], plots=False)
    s = result["effective_speedup"]
    assert len(s["missing"]) == 1 and "never-ran: not a run directory" in s["missing"][0]
    assert s["rungs"][0]["left_out"] == [f"{diverged.name} (diverged at step 3)"]
    assert (
        len(s["rungs"][0]["losses"]) == 1 and s["norms"]["no_norm"]["compute"]["log_method"] == "by size, Satterthwaite"
    )
    md = (tmp_path / "c" / "comparison.md").read_text()
    assert f"Left out of the baseline's curve: {diverged.name} (diverged at step 3); " in md and "never-ran" in md


def test_the_sweeps_command_line_round_trips_its_ladder_and_slurm_compares_it(tmp_path):
    from sweep.test_lr_axis import spec_of

    from gpt.sweep.launch import compare_command

    argv = [str(CONFIGS / "ladder.yaml"), "--norm-types", *NORMS, "--seeds", "0", "1", "--token-fractions", "0.5",
            "2", "--runs-dir", str(tmp_path), "--throughput", str(tmp_path / "bench.jsonl")]  # fmt: skip
    spec = spec_of(argv)
    words = spec.argv()
    assert words[words.index("--token-fractions") :][:3] == ["--token-fractions", "0.5", "2.0"]
    again = spec_of(words[3:])  # past "python -m gpt.commands.sweep"
    assert again == spec
    names = [c.name for c in spec.cells()]  # what a SLURM job array's task indexes
    assert names[6:] == [f"ladder-handrolled-layernorm-t{f}-s{k}" for f in ("0.5", "2") for k in (0, 1)]
    options = spec.compare_options()
    assert options["ladder"] == [tmp_path / n for n in names[6:]]
    words = compare_command(spec.grid_cells(), tmp_path / "out", options)
    assert words[words.index("--ladder") + 1 :][:4] == [str(tmp_path / n) for n in names[6:]]
    assert words[words.index("--throughput") + 1] == str(tmp_path / "bench.jsonl")


@pytest.mark.slow
def test_a_ladder_run_that_differs_in_another_key_is_refused_unless_the_key_is_allowed(ladder, tmp_path):
    import yaml

    grid = [run_dir(ladder, n, k) for n in NORMS for k in SEEDS]
    rungs = [run_dir(ladder, NORMS[0], k, f) for f in FRACTIONS for k in SEEDS]
    other = shutil.copytree(rungs[0], tmp_path / rungs[0].name)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["optim"]["weight_decay"] = 0.05
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=r"^--ladder: these runs differ in more than the length and the seeds.*weight"):
        compare(grid, tmp_path / "c", ladder=[other, *rungs[1:]], plots=False)
    result = compare(grid, tmp_path / "c", ladder=[other, *rungs[1:]], allow_differ=["optim.weight_decay"], plots=False)
    assert len(result["effective_speedup"]["rungs"]) == 3


@pytest.mark.slow
def test_a_bench_file_without_a_compared_norm_type_gives_no_time_matched_figure_and_says_which(ladder, tmp_path):
    grid = [run_dir(ladder, n, k) for n in NORMS for k in SEEDS]
    rungs = [run_dir(ladder, NORMS[0], k, f) for f in FRACTIONS for k in SEEDS]
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"mode": "step", "norm_type": "pytorch_layernorm", "tokens_per_s": 2000.0}) + "\n")
    s = compare(grid, tmp_path / "c", ladder=rungs, throughput=bench, plots=False)["effective_speedup"]
    assert s["throughput"]["problem"] == (
        f"time-matched effective speedup not computed: {bench} has no step row of handrolled_layernorm, no_norm; "
        "bench.py --norm-types names them"
    )
    assert all(v["time"] is None and v["compute"]["es"] > 0 for v in s["norms"].values())
