"""On a CUDA GPU: mixed precision, the fast path, exact resume, NCCL DDP, no waiting between log steps, and
one compiled GPT-2 small row in the time the GPU check's plan gives it.

Marked ``cuda`` and skipped, with the reason, where torch sees no GPU. ``scripts/gpu_check.sh``
runs them on a GPU machine: with pytest (``pytest -m cuda``), or, where the machine has no
pytest, as a script (``python tests/speed/test_cuda.py [NAME ...]``: the tests whose names hold a
NAME, or all), each test in its own temporary folder.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: synthetic.py, when run as a script
from synthetic import ROOT, no_sync_between_log_steps, write_token_set, write_train_yaml

from gpt.config import ModelConfig, load_config
from gpt.model.gpt import GPT
from gpt.run.directory import find_checkpoint
from gpt.speed.gpu_check import check_stages
from gpt.speed.mfu import peak_tflops
from gpt.training.loop import Trainer, train

try:
    import pytest
except ImportError:  # a GPU machine without pytest: run this file as a script
    pytest = None

NO_GPU = "needs a CUDA GPU (scripts/gpu_check.sh runs these on one)"
if pytest is not None:
    pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
# what the tests compare against: the plain fp32 step, nothing of the fast path
PLAIN = ["train.precision=fp32", "train.compile=false", "train.tf32=false", "train.prefetch=false"]


class Skipped(Exception):
    """A test that cannot run on this machine (the script runner's pytest.skip)."""


def skip(reason: str):
    if pytest is not None:
        pytest.skip(reason)
    raise Skipped(reason)


def cuda_yaml(tmp_path: Path, name: str = "run") -> Path:
    tokens = tmp_path / "tokens"
    if not tokens.is_dir():
        write_token_set(tokens)
    return write_train_yaml(tmp_path, tokens, name, device="cuda")


def run(tmp_path, name, *overrides, steps=8):
    """Train ``name`` for ``steps`` steps; its per-step losses and summary."""
    cfg = load_config(
        cuda_yaml(tmp_path, name),
        [f"train.steps={steps}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}", *overrides],
    )
    summary = train(cfg)
    assert summary["status"] == "completed", summary
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss_last"] for r in records], summary


def close(a, b, rel):
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b)) and len(a) == len(b)


def test_mixed_precision_trains_on_the_gpu(tmp_path):
    for precision in ("bf16", "fp16"):
        losses, summary = run(tmp_path, precision, f"train.precision={precision}", "train.compile=false", steps=20)
        assert summary["precision"] == precision and summary["nonfinite_steps"] == 0
        assert losses[-1] < losses[0] - 1.0, (precision, losses)
        assert "cpu" not in summary["device"].lower() and summary["peak_cuda_allocated_bytes"] > 0
        assert "peak_rss_bytes" not in summary


def test_every_fast_path_option_computes_the_same_function_on_the_gpu(tmp_path):
    plain, _ = run(tmp_path, "plain", *PLAIN)
    for name, option, rel in [
        ("prefetch", "train.prefetch=true", 0.0),  # pinned, read ahead: the same batches
        ("tf32", "train.tf32=true", 1e-2),
        ("padded", "model.vocab_pad_multiple=96", 1e-4),
        ("bf16", "train.precision=bf16", 3e-2),
        ("compiled", "train.compile=true", 1e-3),
    ]:
        losses, summary = run(tmp_path, name, *PLAIN, option)
        assert close(losses, plain, rel), (name, losses, plain)
    # compiled; its first step timed apart (how long it took depends on inductor's warm disk caches)
    assert summary["compile"] is True and summary["first_step_seconds"] > 0


def test_the_default_fast_path_on_the_gpu(tmp_path):
    losses, summary = run(tmp_path, "auto", "train.precision=auto")  # compile: null, tf32, prefetch: defaults
    assert (summary["precision"], summary["compile"]) == ("bf16" if torch.cuda.is_bf16_supported() else "fp32", True)
    assert losses[-1] < losses[0]


def test_flash_attention_takes_the_bf16_step():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = load_config(ROOT / "configs" / "tiny.yaml").model  # head size 32
    model = GPT(cfg).cuda()
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.context_length), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(idx, idx)  # raises if the flash kernel cannot take this call
    loss.backward()
    assert torch.isfinite(loss)


def test_norm_precision_under_cuda_autocast_is_the_same_for_both_kinds():
    # CUDA autocast runs layer_norm / rms_norm in fp32; the hand-rolled norms compute in their input's dtype, so a
    # bf16 input (QK-norm's q and k, peri's sublayer outputs) is upcast by default (model.norm_compute_dtype
    # float32): both kinds then compute the same function within fp32 rounding (on the CPU, under CUDA autocast's
    # policy imitated: tests/model/test_norm_precision.py); with "input" the hand-rolled statistics are bf16's
    from gpt.model.gpt import normed
    from gpt.model.norms import make_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (3 * torch.randn(8, 128, 64, device="cuda", generator=g) + 1).bfloat16()  # what a matmul writes
    for ours, theirs in (("handrolled_layernorm", "pytorch_layernorm"), ("handrolled_rmsnorm", "pytorch_rmsnorm")):
        cfg = {"norm_type": ours, "d_model": 64, "norm_eps": 1e-5}
        a, b = make_norm(cfg).cuda(), make_norm({**cfg, "norm_type": theirs}).cuda()
        with torch.no_grad():
            a.weight.add_(0.3 * torch.randn(64, device="cuda", generator=g))
            b.load_state_dict(a.state_dict())
            exact = a.double()(x.double()).float()
            a.float()
            with torch.autocast("cuda", torch.bfloat16):
                assert b(x).dtype == torch.float32  # autocast's fp32 list: PyTorch's norm upcasts itself
                hand, fused = a(x.float()), b(x.float())  # what normed computes, before its cast back
                hand_bf16 = a(x)  # norm_compute_dtype input: the statistics in bf16
                upcast = [normed(n, x, upcast=True) for n in (a, b)]
        scale = exact.abs().max()
        assert (hand - fused).abs().max() < 2e-6 * scale, (ours, (hand - fused).abs().max())
        assert (hand_bf16.float() - exact).abs().max() > 100 * (hand - exact).abs().max(), ours
        assert (upcast[0] != upcast[1]).float().mean() < 0.01, ours
    # a model with peri-norm and QK-norm, the same weights: its logits as close as in fp32 by default
    base = dict(vocab_size=97, context_length=16, d_model=64, n_layers=2, n_heads=4, norm_placement="peri")
    idx = torch.randint(0, 97, (4, 16), device="cuda", generator=g)
    for dtype, bound in (("float32", 0.01), ("input", None)):
        kw = dict(base, qk_norm="head", norm_compute_dtype=dtype)
        hand = GPT(ModelConfig(**kw, norm_type="handrolled_layernorm", qk_norm_type="handrolled_rmsnorm"), seed=1)
        fused = GPT(ModelConfig(**kw, norm_type="pytorch_layernorm", qk_norm_type="pytorch_rmsnorm"), seed=1)
        fused.load_state_dict(hand.state_dict())
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            a, b = (m.cuda().eval()(idx)[0].float() for m in (hand, fused))
        share = (a != b).float().mean().item()
        assert share < bound if bound else share > 0.05, (dtype, share)


def test_exact_resume_on_the_gpu(tmp_path):
    fast = ["train.precision=fp32", "train.compile=false", "train.checkpoint_every=10"]  # tf32, pinned prefetch on
    straight = load_config(cuda_yaml(tmp_path, "straight"), fast)
    train(straight)
    split = load_config(cuda_yaml(tmp_path, "split"), fast)
    split_first(split)
    train(split, resume="auto")
    a = load_file(str(find_checkpoint(tmp_path / "straight") / "model.safetensors"))
    b = load_file(str(find_checkpoint(tmp_path / "split") / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    la = [json.loads(x)["train_loss"] for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["train_loss"] for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert la == lb


def split_first(cfg) -> None:
    """Train the first 10 of the config's 20 steps and stop on SIGTERM, as a preempted run would."""
    import signal

    original = Trainer.train_step

    def train_step(self):
        out = original(self)
        if self.progress.step == 9:  # the 10th step is under way: ask for the stop it checkpoints on
            signal.raise_signal(signal.SIGTERM)
        return out

    Trainer.train_step = train_step
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert train(cfg)["status"] == "interrupted"
    finally:
        Trainer.train_step = original
        for sig, handler in handlers.items():  # a stopped run keeps counting signals: give pytest its own back
            signal.signal(sig, handler)


def test_no_step_waits_for_the_gpu_between_log_steps(tmp_path):
    # Every CUDA synchronisation outside the named log / validation / checkpoint work raises.
    with no_sync_between_log_steps():
        for precision in ("bf16", "fp16"):
            run(
                tmp_path,
                precision,
                f"train.precision={precision}",
                "train.compile=false",
                "log.log_every=5",
                "log.stats_every=4",  # a stats step measures without waiting: it reads back in read_stats
                "optim.grad_clip=1.0",
                steps=12,
            )


def test_nccl_ddp_on_two_gpus_equals_one_process(tmp_path):
    if torch.cuda.device_count() < 2:
        skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    results = {}
    for name, launcher in [
        ("one", [sys.executable, str(ROOT / "train.py")]),
        (
            "two",
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(ROOT / "train.py"),
            ],
        ),
    ]:
        out = subprocess.run(
            [
                *launcher,
                str(cuda_yaml(tmp_path, name)),
                "--set",
                "train.steps=12",
                *[a for o in PLAIN for a in ("--set", o)],
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        losses = [json.loads(x)["train_loss"] for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        results[name] = losses, load_file(str(find_checkpoint(tmp_path / name) / "model.safetensors"))
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2
    (la, wa), (lb, wb) = results["one"], results["two"]
    assert close(lb, la, 1e-5)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5


def test_find_micro_batch_on_the_gpu(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), str(cuda_yaml(tmp_path)), "--find-micro-batch"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "largest micro-batch that fits on " in out.stdout
    assert ": 8 sequences of 32 tokens (the search stops at train.global_batch_size)" in out.stdout
    assert "  1 GPU: train.micro_batch_size 8, accumulation 1" in out.stdout


def test_bench_on_the_gpu(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench.py"),
            str(cuda_yaml(tmp_path)),
            "--json",
            "--data",
            "synthetic",
            "--compile",
            "both",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--norm-types",
            "handrolled_layernorm",
            "pytorch_layernorm",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["norm_type"], r["compile"]) for r in rows] == [
        ("handrolled_layernorm", False),
        ("pytorch_layernorm", False),
        ("handrolled_layernorm", True),
        ("pytorch_layernorm", True),
    ]
    for r in rows:
        assert (r["mfu"] is None) == (peak_tflops(r["device"]) is None)
        assert r["peak_cuda_allocated_bytes"] > 0 and "peak_rss_bytes" not in r
        assert (r["compile_s"] is not None) == r["compile"]


def test_one_compiled_gpt2_small_row_lands_within_the_compiled_stages_minimum(tmp_path):
    # the GPU check's own compiled benchmark of one LayerNorm (--quick's compiled stage: the same command, one row)
    # in that stage's minimum, the plan's estimate of one row with a cold compile; run by the check, this test
    # inherits its compile cache, where the compiled stage left this graph
    stage = next(
        s
        for s in check_stages(tmp_path, Path(__file__), ROOT / "configs" / "gpt2-small.yaml", True, sys.executable)
        if s.name == "compiled"
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        stage.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=stage.min_s)
    except subprocess.TimeoutExpired:  # out of time: the benchmark and its compile workers end here
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    seconds = time.monotonic() - started
    rows_file = tmp_path / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.is_file() else []
    landed = [(r["norm_type"], r["compile"], r.get("error")) for r in rows]
    assert landed == [("pytorch_layernorm", True, None)], (
        f"no compiled row within the compiled stage's {stage.min_s:.0f} s ({seconds:.0f} s): {landed}\n{output[-3000:]}"
    )
    assert rows[0]["compile_s"] > 0 and rows[0]["steps"] > 0, rows[0]


def test_evaluation_after_tf32_training_computes_the_bits_of_a_fresh_evaluate(tmp_path):
    # a single-process sweep evaluates each cell right after training it, in a process the trainer set to TF32
    from gpt.evaluation.held_out import EvalOptions, evaluate_checkpoint
    from gpt.run.distributed import Dist

    _, summary = run(tmp_path, "tf32", "train.tf32=true", "train.compile=false", "train.precision=fp32")
    assert summary["segments"][0]["train"]["tf32"] is True  # trained with TF32 matmuls
    ckpt = find_checkpoint(tmp_path / "tf32")
    in_process = evaluate_checkpoint(
        ckpt, Dist(device=torch.device("cuda")), EvalOptions(show_progress=False), write=False
    )
    fresh = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            str(tmp_path / "tf32"),
            "--quiet",
            "--json",
            str(tmp_path / "e.json"),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    result = json.loads((tmp_path / "e.json").read_text())[0]
    assert result["loss"] == in_process["loss"]
    assert in_process["fingerprint"]["tf32"] is False and result["fingerprint"]["tf32"] is False
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the trainer's setting, restored after


def main(names: list[str]) -> int:
    """Run the tests here without pytest (those whose names hold one of ``names``; all without any), each
    in a fresh temporary folder; exit 1 if any failed."""
    if not torch.cuda.is_available():
        print(f"skipped: {NO_GPU}")
        return 0
    failed = 0
    chosen = [
        (n, f)
        for n, f in globals().items()
        if n.startswith("test_") and callable(f) and (not names or any(part in n for part in names))
    ]
    for name, fn in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                fn(Path(tmp)) if fn.__code__.co_argcount else fn()
                print(f"PASSED {name}", flush=True)
            except Skipped as e:
                print(f"SKIPPED {name}: {e}", flush=True)
            except Exception:
                failed += 1
                print(f"FAILED {name}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
