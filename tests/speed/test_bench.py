"""The benchmark: FLOPs and MFU arithmetic, its rows, the micro-batch search."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT

from gpt.config import ModelConfig, load_config
from gpt.model.gpt import GPT
from gpt.model.norms import NORM_TYPES
from gpt.run.distributed import Dist
from gpt.speed.mfu import mfu, peak_tflops, percentile, step_stats
from gpt.speed.micro_batch import fits_in_memory, largest_fitting, micro_batch_plan
from gpt.speed.timing import with_ratios

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
NORMS = ["handrolled_layernorm", "pytorch_rmsnorm"]
STEP_FIELDS = {
    "mode",
    "config",
    "norm_type",
    "compile",
    "precision",
    "device",
    "world_size",
    "micro_batch",
    "global_batch",
    "tokens_per_step",
    "steps",
    "warmup",
    "data",
    "tokens_per_s",
    "ms_per_step",
    "ms_p10",
    "ms_p90",
    "flops_per_token",
    "mfu",
    "peak_tflops",
    "peak_rss_bytes",  # on the CPU (the resident set); on a GPU, peak_cuda_allocated_bytes (tests/speed/test_cuda.py)
    "first_step_s",
    "compile_s",
    "time_vs_handrolled_layernorm",
    "run_tokens",
    "run_hours",
}


def test_flops_per_token_of_gpt2_small_by_hand():
    # 12 blocks of qkv (768 x 2304), proj (768 x 768), fc (768 x 3072), proj (3072 x 768), and the
    # head (768 x 50257); the embeddings are lookups. Attention: 12 x 12 x 1024 x 768.
    per_block = 768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768
    by_hand = 6 * (12 * per_block + 768 * 50257) + 12 * 12 * 1024 * 768
    assert by_hand == 854_438_400  # the "about 0.85 GFLOP"
    with torch.device("meta"):  # the count reads the shapes only: no weights drawn (seconds for GPT-2 small)
        model = GPT(load_config(CONFIGS / "gpt2-small.yaml").model, seed=None)
    assert model.flops_per_token() == by_hand


def test_flops_per_token_leaves_out_biases_and_vocabulary_padding():
    cfg = dict(vocab_size=100, context_length=8, d_model=16, n_layers=1, n_heads=2, qkv_bias=True)
    by_hand = 6 * (16 * 48 + 16 * 16 + 16 * 64 + 64 * 16 + 16 * 100) + 12 * 1 * 8 * 16
    assert GPT(ModelConfig(**cfg)).flops_per_token() == by_hand
    assert GPT(ModelConfig(**cfg, vocab_pad_multiple=64)).flops_per_token() == by_hand


def test_mfu_uses_the_named_chip_or_none():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops("NVIDIA GeForce RTX 4090") is None  # never another chip's peak
    assert peak_tflops("cpu") is None
    # 500k tokens/s of 0.854 GFLOP on one H100 SXM: 43%
    assert mfu(854_438_400, 500_000, 989.4) == pytest.approx(0.4318, abs=1e-4)
    assert mfu(854_438_400, 8 * 500_000, 989.4, n_devices=8) == pytest.approx(0.4318, abs=1e-4)
    assert mfu(854_438_400, 500_000, None) is None


def test_step_statistics():
    assert percentile([4.0, 1.0, 3.0, 2.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 10) == pytest.approx(1.1)
    assert step_stats([0.010, 0.012, 0.011]) == pytest.approx({"ms_per_step": 11.0, "ms_p10": 10.2, "ms_p90": 11.8})


def test_ratios_are_to_hand_rolled_layernorm_of_the_same_compile_setting():
    rows = with_ratios(
        [
            {"norm_type": n, "compile": c, "ms_per_step": ms}
            for n, c, ms in [
                ("handrolled_layernorm", False, 100.0),
                ("pytorch_layernorm", False, 90.0),
                ("handrolled_layernorm", True, 50.0),
                ("pytorch_layernorm", True, 49.0),
                ("dyt", None, 1.0),
            ]
        ]
    )
    assert [r["time_vs_handrolled_layernorm"] for r in rows] == [1.0, 0.9, 1.0, 0.98, None]


@pytest.mark.slow
def test_bench_json_rows_hold_every_field(cli):
    # tiny.yaml with a vocabulary of 2,048: its 50,257-wide head took seconds a step; a step still takes long
    # enough (~0.1 s) that the machine's noise leaves the mean and the median step times close
    smaller = ["model.vocab_size=2048"]
    args = ["--json", "--data", "synthetic", "--steps", "3", "--warmup", "1", "--set", *smaller]
    out = cli(ROOT / "scripts" / "bench.py", CONFIGS / "tiny.yaml", *args, "--norm-types", *NORMS)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["norm_type"] for r in rows] == NORMS
    for r in rows:
        assert set(r) == STEP_FIELDS
        assert r["tokens_per_s"] == pytest.approx(1024 / (r["ms_per_step"] / 1e3), rel=0.5)
        assert r["ms_p10"] <= r["ms_per_step"] <= r["ms_p90"]
        assert (r["flops_per_token"], r["tokens_per_step"], r["compile"], r["precision"]) == (
            GPT(load_config(CONFIGS / "tiny.yaml", smaller).model).flops_per_token(),
            8 * 128,
            False,
            "fp32",
        )
        assert r["mfu"] is None and r["peak_tflops"] is None  # a CPU has no bf16 peak in the table
        assert r["compile_s"] is None and r["first_step_s"] > 0 and r["peak_rss_bytes"] > 50 * 2**20
        # the whole run of tiny.yaml (200 steps of 8 x 128 tokens) at this row's measured speed
        assert r["run_tokens"] == 200 * 8 * 128 and r["run_hours"] == r["run_tokens"] / r["tokens_per_s"] / 3600
    assert rows[0]["time_vs_handrolled_layernorm"] == 1.0
    assert rows[1]["time_vs_handrolled_layernorm"] == pytest.approx(rows[1]["ms_per_step"] / rows[0]["ms_per_step"])


def test_bench_with_a_peak_gives_mfu_and_the_table(train_yaml, cli):
    args = ["--data", "ready", "--steps", "2", "--warmup", "1", "--norm-types", "handrolled_layernorm"]
    out = cli("bench", train_yaml(), *args, "--peak-tflops", "0.001")
    assert out.returncode == 0, out.stderr[-3000:]
    header, columns, row = out.stdout.splitlines()
    assert "(0.001 TFLOP/s bf16 peak), fp32, 256 tokens/step (micro-batch 4), ready data" in header
    assert columns.split()[:4] == ["norm_type", "compile", "tokens/s", "ms/step"]
    assert row.split()[0] == "handrolled_layernorm" and row.split()[7].endswith("%")  # MFU, given a peak
    # the memory column says what it measured; h/run is the config's whole run at this speed
    cfg = load_config(train_yaml())
    assert "RSS GiB: the process's peak resident set (CPU: " in header
    assert f"h/run: hours a whole run of {cfg.train.steps * 256:,} tokens takes at this speed" in header
    assert columns.split()[7:9] == ["RSS", "GiB"] and columns.split()[11] == "h/run"
    assert float(row.split()[8]) > 0.05 and float(row.split()[10]) >= 0


def test_norms_only_rows(cli):
    # one timing window a norm (each at least 20 ms of passes): the rows' fields are what is checked
    out = cli("bench", "--norms-only", "--shape", "2", "16", "32", "--steps", "1", "--warmup", "1", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["norm_type"] for r in rows] == list(NORM_TYPES)  # every registered one, in the registry's order
    assert all(r["mode"] == "norm" and r["shape"] == [2, 16, 32] and r["precision"] == "fp32" for r in rows)
    assert rows[0]["time_vs_handrolled_layernorm"] == 1.0


def test_a_norm_row_times_windows_of_many_passes_and_divides_by_their_number(monkeypatch):
    # a stand-in norm whose pass takes exactly 1 ms of a fake clock: the calibration doubles to 8 passes (>= a
    # quarter of the 20 ms window), so each window holds 20 passes, and the time given is one pass's
    from types import SimpleNamespace

    from gpt.speed import timing as benchmark

    clock, passes = [0.0], []

    class OneMillisecond(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            clock[0] += 1e-3
            passes.append(1)
            return x * self.scale

    monkeypatch.setattr(benchmark, "make_norm", lambda cfg: OneMillisecond())
    monkeypatch.setattr(benchmark, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    seconds = benchmark.time_norm("dyt", (2, 4, 8), torch.device("cpu"), "fp32", False, 3, 2)
    assert seconds == pytest.approx([1e-3] * 3)
    assert len(passes) == 2 + (1 + 2 + 4 + 8) + 3 * 20  # warm-up, calibration, three windows of 20


def test_rows_are_kept_as_they_come_and_a_failing_row_does_not_end_the_run(tmp_path, monkeypatch):
    from gpt.speed import timing as benchmark
    from gpt.speed.rows import append_to, table

    real = benchmark.time_norm

    def time_norm(norm_type, *args):
        if norm_type == "pytorch_layernorm":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return real(norm_type, *args)

    monkeypatch.setattr(benchmark, "time_norm", time_norm)
    path = tmp_path / "rows.jsonl"
    seen = []

    def emit(row):
        append_to(path)(row)
        seen.append(len(path.read_text().splitlines()))  # on disk the moment it is measured

    rows = benchmark.norm_rows(
        ["handrolled_layernorm", "pytorch_layernorm", "dyt"],
        [False],
        shape=(2, 8, 16),
        device=torch.device("cpu"),
        precision="fp32",
        steps=2,
        warmup=1,
        emit=emit,
    )
    assert seen == [1, 2, 3] and [json.loads(x)["norm_type"] for x in path.read_text().splitlines()] == [
        "handrolled_layernorm",
        "pytorch_layernorm",
        "dyt",
    ]
    assert rows[1]["error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "ms_per_step" in rows[2] and rows[1]["time_vs_handrolled_layernorm"] is None
    assert "pytorch_layernorm                off  failed: OutOfMemoryError: CUDA out of memory." in table(rows)


def test_bench_mistakes_are_one_line(train_yaml, cli):
    for args, message in [
        (["--steps", "0", str(train_yaml())], "--steps 0 --warmup 3: both must be >= 1"),
        (["--warmup", "0", str(train_yaml())], "--steps 10 --warmup 0: both must be >= 1"),  # the first step compiles
        ([], "give a CONFIG to time its training steps, or --norms-only"),
        ([str(train_yaml()), "--set", "model.n_heads=3"], "model.n_heads: 3 does not divide"),
    ]:
        out = cli("bench", *args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


# ------------------------------------------------------------------ the largest micro-batch


@pytest.mark.parametrize("limit,threshold", [(96, 37), (96, 96), (96, 0), (96, 1), (5, 64), (1, 1)])
def test_the_search_finds_the_largest_that_fits(limit, threshold):
    probes = []

    def fits(m):
        probes.append(m)
        return m <= threshold

    assert largest_fitting(fits, limit) == min(threshold, limit)
    assert len(probes) <= 2 * limit.bit_length() + 1 and max(probes) <= limit


def test_the_plan_divides_the_global_batch():
    cfg = load_config(CONFIGS / "gpt2-small.yaml")  # global batch 96
    assert micro_batch_plan(cfg, 40) == [
        "  1 GPU: train.micro_batch_size 32, accumulation 3 (global batch 96 = 1 x 32 x 3)",
        "  2 GPUs: train.micro_batch_size 24, accumulation 2 (global batch 96 = 2 x 24 x 2)",
        "  4 GPUs: train.micro_batch_size 24, accumulation 1 (global batch 96 = 4 x 24 x 1)",
        "  8 GPUs: train.micro_batch_size 12, accumulation 1 (global batch 96 = 8 x 12 x 1)",
    ]


def test_the_memory_probe_runs_real_steps(train_yaml):
    cfg = load_config(train_yaml())
    assert fits_in_memory(cfg, Dist(), 3) is True  # on the CPU nothing runs out: the probe's steps run


def test_find_micro_batch_without_a_gpu_is_one_line(train_yaml, cli):
    out = cli(ROOT / "train.py", train_yaml(), "--find-micro-batch")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr == (
        "error: --find-micro-batch measures GPU memory, and no CUDA GPU is visible here; run it on "
        "the kind of machine you will train on\n"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, gpu_check.sh runs its stages")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**ENV, "PYTHON": sys.executable},
        timeout=120,
    )
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == (
        f"gpu_check: no CUDA GPU is visible to {sys.executable} (torch {torch.__version__}); "
        "run it on a machine with one\n"
    )
    assert not (tmp_path / "out").exists()


def test_generation_rows_time_the_cache_against_none(train_yaml):
    from gpt.speed.timing import generation_rows

    cfg = load_config(train_yaml("gen"), ["model.context_length=64"])
    rows = generation_rows(
        cfg, ["pytorch_rmsnorm"], prompt_tokens=8, new_tokens=24, device=torch.device("cpu"), repeats=1
    )
    assert [(r["norm_type"], r["cache"]) for r in rows] == [("pytorch_rmsnorm", False), ("pytorch_rmsnorm", True)]
    assert rows[1]["same_tokens"] is True and rows[1]["speedup"] == rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    assert "tokens" not in rows[0] and rows[0]["tokens_per_s"] > 0


def test_generate_refuses_a_context_too_short_before_building(capsys):
    from gpt.commands.bench import main

    assert main([str(CONFIGS / "tiny.yaml"), "--generate"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --prompt-tokens 32 + --new-tokens 256 exceed model.context_length=128: past it the cache gives "
        "way to a sliding window; --set model.context_length=288 (or more)\n"
    )


@pytest.mark.slow
def test_tokens_per_s_leaves_the_warmup_steps_out(cli, monkeypatch):
    # a timer that says the warmup step took 9 s and each timed step 0.25 s: tokens/s is a step's tokens / 0.25
    from gpt.speed import timing

    class FixedTimer:
        def __init__(self, device):
            self.steps = 0

        def mark(self):
            self.steps += 1

        def seconds(self):
            return [9.0] + [0.25] * (self.steps - 1)

    monkeypatch.setattr(timing, "StepTimer", FixedTimer)
    args = ["--json", "--data", "synthetic", "--steps", "3", "--warmup", "1", "--set", "model.vocab_size=2048"]
    out = cli(ROOT / "scripts" / "bench.py", CONFIGS / "tiny.yaml", *args, "--norm-types", "pytorch_layernorm")
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["first_step_s"] == 9.0 and row["ms_per_step"] == 250.0
    assert row["tokens_per_s"] == row["tokens_per_step"] / 0.25
