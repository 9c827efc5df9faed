"""The fast path: every speed option computes the same function, and resolves as documented.

Each option is trained off and on from the same config; the per-step losses must agree
within the precision's tolerance. The GPU-only options (TF32, pinned memory, the CUDA
kernels) are in tests/speed/test_cuda.py.
"""

import json

import pytest
import torch
from conftest import write_train_yaml

import gpt.model.gpt
from gpt.config import load_config
from gpt.model.gpt import GPT
from gpt.model.loss import autocast_for
from gpt.run.fastpath import resolve
from gpt.training.loop import train
from gpt.training.monitors import Throughput


def losses(train_yaml, tmp_path, name, *overrides):
    cfg = load_config(train_yaml(name), ["train.steps=8", "train.eval_every=8", "train.checkpoint_every=8", *overrides])
    summary = train(cfg)
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    return [r["train_loss_last"] for r in records], summary


@pytest.fixture(scope="module")
def defaults(tmp_path_factory, token_set):
    """(losses, summary, run folder) of the run with every option at its default (fp32 on the CPU, prefetching,
    no vocabulary padding, the loss-only step, eager), trained once a module: what each option is compared to."""
    folder = tmp_path_factory.mktemp("defaults")
    return *losses(lambda name: write_train_yaml(folder, token_set, name), folder, "defaults"), folder / "defaults"


def test_the_fast_path_on_the_cpu_skips_the_gpu_only_options():
    t = load_config_train(precision="auto", compile=None)
    assert resolve(t, torch.device("cpu")) == type(resolve(t, torch.device("cpu")))(
        precision="fp32", compile=False, tf32=False, prefetch=True, pin_memory=False
    )


def test_the_fast_path_on_a_gpu_turns_every_option_on(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    fast = resolve(load_config_train(precision="auto", compile=None), torch.device("cuda", 0))
    assert (fast.precision, fast.compile, fast.tf32, fast.prefetch, fast.pin_memory) == ("bf16", True, True, True, True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a V100: no bf16 arithmetic
    assert resolve(load_config_train(precision="auto"), torch.device("cuda", 0)).precision == "fp32"
    off = resolve(load_config_train(precision="fp16", compile=False, tf32=False, prefetch=False), torch.device("cuda"))
    assert (off.precision, off.compile, off.tf32, off.prefetch, off.pin_memory) == ("fp16", False, False, False, False)


def load_config_train(**train):
    from gpt.config import TrainConfig

    return TrainConfig(steps=1, **train)


def test_auto_precision_on_the_cpu_is_fp32_to_the_bit(train_yaml, tmp_path, defaults):
    fp32, _, _ = defaults
    auto, summary = losses(train_yaml, tmp_path, "auto", "train.precision=auto")
    assert auto == fp32 and summary["precision"] == "fp32" and summary["compile"] is False


def test_prefetching_reads_the_same_batches(train_yaml, tmp_path, defaults):
    on, summary, _ = defaults  # prefetch is on by default
    off, _ = losses(train_yaml, tmp_path, "in-step", "train.prefetch=false")
    assert on == off  # bit for bit: the same batches in the same order
    assert summary["first_step_seconds"] > 0


def test_a_padded_vocabulary_computes_the_same_function(train_yaml, tmp_path, defaults):
    unpadded, unpadded_summary, _ = defaults
    padded, summary = losses(train_yaml, tmp_path, "padded", "model.vocab_pad_multiple=96")  # 256 -> 288 rows
    assert padded == pytest.approx(unpadded, rel=1e-6)
    assert summary["n_params"] == unpadded_summary["n_params"]  # the padding rows are not counted


def plain_cross_entropy(logits, targets, reduction="mean"):
    """The loss as it was: F.cross_entropy on a float32 copy of the logits, which it keeps for backward."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)


@pytest.mark.parametrize("precision, rel", [("fp32", 1e-6), ("bf16", 1e-3)])
def test_the_loss_only_step_computes_the_losses_of_the_plain_one(
    train_yaml, tmp_path, monkeypatch, defaults, precision, rel
):
    # the step's memory savings (no logits returned, no float32 log-softmax kept): the same per-step losses
    lean = (  # fp32: the defaults' run
        defaults[0] if precision == "fp32" else losses(train_yaml, tmp_path, "lean", f"train.precision={precision}")[0]
    )
    monkeypatch.setattr(gpt.model.gpt, "cross_entropy", plain_cross_entropy)
    plain, _ = losses(train_yaml, tmp_path, "plain", f"train.precision={precision}")
    assert lean == pytest.approx(plain, rel=rel)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loss_keeps_no_float32_copy_of_the_logits_for_backward(tiny_model_cfg, monkeypatch, precision):
    # the vocabulary-wide tensors one training forward keeps for backward: the logits as they came (bf16
    # under autocast, 2 bytes a logit), where F.cross_entropy kept a float32 log-softmax (4 bytes a logit)
    def kept_for_backward() -> list[torch.dtype]:
        model = GPT(tiny_model_cfg(vocab_size=50257, d_model=64), seed=0)
        idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(0))
        kept: dict[int, torch.dtype] = {}  # by storage: two nodes may keep the same tensor

        def pack(t):
            if tuple(t.shape) == (2 * 16, 50257):  # (N, V): one per token and vocabulary entry
                kept[t.untyped_storage().data_ptr()] = t.dtype
            return t

        autocast = autocast_for(precision, torch.device("cpu"))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
            logits, loss = model(idx, idx, loss_only=True)
        assert logits is None  # nothing holds the logits but the backward pass
        loss.backward()
        return list(kept.values())

    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    assert kept_for_backward() == [dtype]
    monkeypatch.setattr(gpt.model.gpt, "cross_entropy", plain_cross_entropy)
    assert kept_for_backward() == [torch.float32]


def test_bf16_autocast_computes_the_same_function_within_bf16_tolerance(train_yaml, tmp_path, defaults):
    fp32, _, _ = defaults
    bf16, summary = losses(train_yaml, tmp_path, "bf16", "train.precision=bf16")
    assert summary["precision"] == "bf16"
    assert bf16 == pytest.approx(fp32, rel=2e-2)
    assert bf16 != fp32  # autocast did run in bf16


@pytest.mark.slow
def test_torch_compile_computes_the_same_function(train_yaml, tmp_path, capfd, defaults):
    eager, _, eager_run = defaults
    compiled, summary = losses(train_yaml, tmp_path, "compiled", "train.compile=true", "log.progress=true")
    assert compiled == pytest.approx(eager, rel=1e-4)
    val = [
        json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]
        for run in (eager_run, tmp_path / "compiled")
    ]
    assert val[1] == pytest.approx(val[0], rel=1e-4)  # validation's full batches compiled, the ragged one eager
    assert summary["compile"] is True and summary["first_step_seconds"] > 1.0  # it compiled
    err = capfd.readouterr().err
    assert f"torch.compile: the first step took {summary['first_step_seconds']:.1f} s (compiling)" in err


def test_the_first_step_counts_in_wall_time_but_in_no_rate():
    th = Throughput(step=0, total_steps=100, tokens_per_step=10)
    th.start -= 50.0  # a first step that compiled for 50 s
    th.restart(1)
    assert th.since_last_log(1) is None  # no step timed since the restart
    th._last = th._last.__class__(th._last.time - 2.0, th._last.step, th._last.paused)
    assert th.since_last_log(3) == pytest.approx(2 * 10 / 2.0, rel=1e-2)  # 2 steps in 2 s, not in 52
    assert th.seconds() >= 50.0


def test_validation_scores_its_full_batches_through_the_compiled_model(train_yaml, tmp_path, monkeypatch):
    # torch.compile stood in for by a wrapper that counts the batches it scores: validation's full batches
    # go through it (no DDP), the ragged last batch through the eager model, and the loss is the eager one's
    from gpt.evaluation.token_loss import evaluate_loss
    from gpt.run.distributed import Dist
    from gpt.training.loop import Trainer

    class Counted(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.batches = model, []

        def forward(self, idx, *args, **kw):
            self.batches.append(idx.shape[0])
            return self.model(idx, *args, **kw)

    monkeypatch.setattr(torch, "compile", Counted)
    trainer = Trainer(load_config(train_yaml(), ["train.compile=true"]), Dist())
    trainer.open_data(trainer.cfg.data.path)
    trainer.build()
    trainer.engine.prepare()
    record = {}
    trainer.validate(record)
    trainer.release()
    n_seq = trainer.val.n_sequences(trainer.cfg.model.context_length)
    batch = trainer.cfg.train.micro_batch_size
    assert n_seq % batch and trainer.engine.scorer.batches == [batch] * (n_seq // batch)  # the ragged one: eager
    eager = evaluate_loss(
        trainer.engine.model, trainer.val, Dist(), seq_len=trainer.cfg.model.context_length, batch_size=batch
    )
    assert record["val_loss"] == eager[0]


def test_tf32_is_set_through_one_api_and_compile_never_autotunes(train_yaml, monkeypatch):
    # TF32 goes through set_float32_matmul_precision, which keeps torch's legacy readers (allow_tf32,
    # get_float32_matmul_precision) usable: set through fp32_precision alone they raise, and inductor's bmm
    # autotuning calls them. The trainer compiles in the default mode besides.
    from gpt.run.distributed import Dist
    from gpt.run.fastpath import apply_tf32, fp32_precision, ieee_fp32, set_fp32_precision
    from gpt.training.loop import Trainer

    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    trainer = Trainer(load_config(train_yaml(), ["train.compile=true"]), Dist())
    trainer.open_reader(trainer.cfg.data.path)
    trainer.build()
    trainer.engine.prepare()
    trainer.release()
    assert calls == [{}, {}]  # the step's and validation's torch.compile(model): default mode, no max-autotune
    matmul, before = torch.backends.cuda.matmul, fp32_precision()
    try:
        apply_tf32(True)
        assert matmul.fp32_precision == "tf32"
        assert matmul.allow_tf32 is True and torch.get_float32_matmul_precision() == "high"  # readable, not raising
        with ieee_fp32():  # an evaluation inside a training process
            assert matmul.fp32_precision == "ieee" and matmul.allow_tf32 is False
        assert matmul.fp32_precision == "tf32" and torch.get_float32_matmul_precision() == "high"
        apply_tf32(False)
        assert matmul.fp32_precision == "ieee" and matmul.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        set_fp32_precision(before)
