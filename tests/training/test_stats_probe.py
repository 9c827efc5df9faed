"""log.stats_every: what each norm does inside the model, measured without changing the run, each statistic
checked against a hand computation, and the early warning of a run that runs away."""

import contextlib
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS
from safetensors.torch import load_file

from gpt.common.errors import UserError
from gpt.config import load_config
from gpt.model.gpt import GPT, Context
from gpt.run.directory import RunDir, find_checkpoint
from gpt.speed.overheads import stats_step_cost
from gpt.training import inside
from gpt.training.inside import EarlyWarning, StatsProbe
from gpt.training.loop import train


def run(train_yaml, name, *overrides):
    cfg = load_config(train_yaml(name), ["log.progress=false", *overrides])
    return train(cfg), RunDir(cfg.run_dir)


def test_stats_on_or_off_train_the_same_bits_and_measure_only_on_stats_steps(train_yaml, monkeypatch):
    forwards, measured = [], []
    forward, measure = GPT.forward, StatsProbe.measure
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: forwards.append(1) or forward(self, *a, **k))
    monkeypatch.setattr(StatsProbe, "measure", lambda self, *a: measured.append(1) or measure(self, *a))
    _, off = run(train_yaml, "stats-off", "log.stats_every=0", "model.norm_type=dyt", "train.eval_every=100")
    calls_off = len(forwards)
    forwards.clear()
    _, on = run(train_yaml, "stats-on", "log.stats_every=3", "model.norm_type=dyt", "train.eval_every=100")
    # 20 steps of 2 micro-batches, one validation at the end; stats steps 3, 6, ..., 18: one forward more each
    assert (len(measured), len(forwards) - calls_off) == (6, 6)
    strip = [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in off.metrics()]
    assert strip == [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in on.metrics()]
    a, b = (load_file(str(find_checkpoint(r.path) / "model.safetensors")) for r in (off, on))
    assert all(a[k].equal(b[k]) for k in a)
    assert not off.stats_file.exists()
    assert [r["step"] for r in on.stats()] == [3, 6, 9, 12, 15, 18]


@pytest.mark.slow
def test_a_resumed_run_keeps_its_stats_up_to_the_checkpoint(train_yaml):
    _, whole = run(train_yaml, "whole", "log.stats_every=2")
    cfg = load_config(train_yaml("cut"), ["log.progress=false", "log.stats_every=2"])
    train(cfg)
    cut = RunDir(cfg.run_dir)
    lines = cut.stats_file.read_text().splitlines()
    cut.stats_file.write_text("\n".join(lines[:7]) + '\n{"step": 1')  # as if killed at step 14, mid-line
    ckpts = cut.checkpoints
    (ckpts / "latest").write_text("step-00000010\n")
    shutil.rmtree(ckpts / "step-00000020")
    train(cfg, resume=str(ckpts / "step-00000010"))
    assert [r["step"] for r in cut.stats()] == [r["step"] for r in whole.stats()]
    assert cut.stats()[-1]["resid_rms"] == whole.stats()[-1]["resid_rms"]


@pytest.fixture
def stepped(tiny_model_cfg):
    """A small DyT model after one backward pass, the probe's measurement of it, and the batch."""
    torch.manual_seed(0)
    model = GPT(tiny_model_cfg(norm_type="dyt", n_layers=3, context_length=8, vocab_size=50), seed=1)
    x = torch.randint(0, 50, (3, 8))
    model(x, torch.randint(0, 50, (3, 8)))[1].backward()
    probe = StatsProbe(every=1)
    probe.measure(model, x, contextlib.nullcontext, None)
    return model, x, probe


def test_residual_norm_outputs_and_gains_equal_a_hand_forward(stepped):
    model, x, probe = stepped
    record = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in probe.pending.items()}
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    with torch.no_grad():
        h = model.wte(x) + model.wpe(torch.arange(8))
        for i, block in enumerate(model.blocks):
            assert record["resid_rms"][i] == pytest.approx(rms(h), rel=1e-6)
            a = block.ln_1.weight * torch.tanh(block.ln_1.alpha * h) + block.ln_1.bias  # DyT, by its formula
            assert record["ln_1_rms"][i] == pytest.approx(rms(a), rel=1e-6)
            assert record["ln_1_max"][i] == pytest.approx(a.abs().max().item(), rel=1e-6)
            saturated = ((block.ln_1.alpha * h).abs() > 2).float().mean().item()
            assert record["ln_1_saturated"][i] == pytest.approx(saturated)
            assert record["ln_1_alpha"][i] == pytest.approx(block.ln_1.alpha.item())
            w = block.ln_2.weight
            assert record["ln_2_gain_mean"][i] == pytest.approx(w.mean().item(), rel=1e-6)
            assert record["ln_2_gain_std"][i] == pytest.approx(w.std(correction=0).item(), rel=1e-5, abs=1e-9)
            h = block(h, ctx=Context())
        assert record["resid_rms"][-1] == pytest.approx(rms(h), rel=1e-6)
        logits = model.lm_head(model.ln_f(h))
        assert record["logits_max"] == pytest.approx(logits.max().item(), rel=1e-6)


def test_attention_logits_equal_q_dot_k_computed_by_hand(stepped):
    model, x, probe = stepped
    heads, C = model.cfg.n_heads, model.cfg.d_model
    hs = C // heads
    with torch.no_grad():
        h = model.wte(x) + model.wpe(torch.arange(8))
        for i, block in enumerate(model.blocks):
            qkv = block.attn.qkv(block.ln_1(h))[: inside.ATTENTION_SEQUENCES]
            values = []
            for b in range(qkv.shape[0]):
                for head in range(heads):
                    q = qkv[b, :, head * hs : (head + 1) * hs]
                    k = qkv[b, :, C + head * hs : C + (head + 1) * hs]
                    values += [float(q[t] @ k[s]) / math.sqrt(hs) for t in range(8) for s in range(t + 1)]
            assert probe.pending["attn_logit_max"][i].item() == pytest.approx(max(values), rel=1e-5)
            assert probe.pending["attn_logit_mean"][i].item() == pytest.approx(sum(values) / len(values), abs=1e-6)
            h = block(h, ctx=Context())


def test_gradient_norms_and_update_ratios_equal_two_copies_of_the_weights(stepped):
    model, x, probe = stepped
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.optim.AdamW(model.parameters(), lr=0.05).step()
    probe.after_update(model)
    record = probe.take(step=1, tokens=24)
    after = dict(model.named_parameters())
    for i in range(3):
        names = [n for n in before if n.startswith(f"blocks.{i}.")]
        grad = math.sqrt(sum(grads[n].pow(2).sum().item() for n in names if n in grads))
        delta = math.sqrt(sum((after[n].detach() - before[n]).pow(2).sum().item() for n in names))
        weight = math.sqrt(sum(before[n].pow(2).sum().item() for n in names))
        assert record["grad_norm"][i] == pytest.approx(grad, rel=1e-5)
        assert record["update_ratio"][i] == pytest.approx(delta / weight, rel=1e-5)
    head = (after["lm_head.weight"].detach() - before["lm_head.weight"]).norm() / before["lm_head.weight"].norm()
    assert record["head_update_ratio"] == pytest.approx(head.item(), rel=1e-5)
    # per tensor: each norm tensor's own ratio (DyT: weight, bias, alpha), the largest tensor's per block
    ratio = {n: ((after[n].detach() - before[n]).norm() / before[n].norm()).item() for n in before}
    for i in range(3):
        for norm in ("ln_1", "ln_2"):
            for param in ("weight", "alpha"):
                key, name = f"{norm}_{param}_update_ratio", f"blocks.{i}.{norm}.{param}"
                assert record[key][i] == pytest.approx(ratio[name], rel=1e-5)
            assert record[f"{norm}_bias_update_ratio"][i] is None  # zeros before the update: no ratio
        block = [v for n, v in ratio.items() if n.startswith(f"blocks.{i}.") and math.isfinite(v)]
        assert record["update_ratio_max"][i] == pytest.approx(max(block), rel=1e-5)
        assert record["update_ratio_max"][i] > 2 * record["update_ratio"][i]  # the pooled ratio hides it
    assert record["ln_f_weight_update_ratio"] == pytest.approx(ratio["ln_f.weight"], rel=1e-5)
    assert record["ln_f_bias_update_ratio"] is None
    assert record["loss_scale"] is None and (record["step"], record["tokens"]) == (1, 24)


def test_early_warning_says_a_statistic_once_names_block_and_step_and_stops_only_when_asked():
    warn = EarlyWarning(growth=10, window=3, stop_on=[])
    assert warn.check({"step": 1, "resid_rms": [1.0, 2.0], "attn_logit_max": [3.0]}) == []  # the first stats step
    said = warn.check({"step": 2, "resid_rms": [1.0, 25.0], "attn_logit_max": [3.0]})  # warmup or not: said
    assert said == ["early warning: resid_rms of the final norm's input grew 12.5x since step 1 (2 -> 25) at step 2"]
    assert warn.check({"step": 3, "resid_rms": [1.0, 990.0], "attn_logit_max": [3.0]}) == []  # said once
    assert warn.stop is None
    assert warn.check({"step": 4, "resid_rms": [1.0, 9.0], "grad_norm": [math.inf]}) == [
        "early warning: grad_norm of block 0 is inf at step 4"
    ]
    # growth against the smallest of the last 3 stats steps: 1.5x a step is 57x over ten steps, and no warning
    slow = EarlyWarning(growth=10, window=3)
    assert [line for i in range(11) for line in slow.check({"step": i, "resid_rms": [1.5**i]})] == []
    # ... but 12x the window's smallest is, whichever of its steps that was; and the window moves on
    dip = EarlyWarning(growth=10, window=3)
    for step, v in ((1, 5.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.0)):
        assert dip.check({"step": step, "attn_logit_max": [v]}) == []
    assert dip.check({"step": 6, "attn_logit_max": [15.0]}) == []  # 15x step 2's 1.0, which has left the window
    assert dip.check({"step": 7, "attn_logit_max": [-60.0]}) == [  # a blown-up run's logits: by magnitude
        "early warning: attn_logit_max of block 0 grew 12.0x since its floor 5 (5 -> 60) at step 7"
    ]  # growth from attention's first logits (~1-3 at initialisation) is measured from 5
    stopper = EarlyWarning(growth=10, window=5, stop_on=["attn_logit_max"])
    stopper.check({"step": 1, "resid_rms": [1.0], "attn_logit_max": [6.0, 6.0]})
    stopper.check({"step": 2, "resid_rms": [30.0], "attn_logit_max": [6.0, 66.0]})
    assert stopper.stop.startswith("early warning: attn_logit_max of block 1 grew 11.0x since step 1")
    assert stopper.stop.endswith("at step 2 (train.stop_on: attn_logit_max)")


@pytest.mark.slow
def test_no_norm_at_a_high_rate_warns_before_it_diverges_where_layernorm_does_not(train_yaml):
    high = ["model.n_layers=4", "optim.lr=0.1", "optim.min_lr=0.01", "optim.grad_clip=null", "train.steps=60"]
    high += ["train.checkpoint_every=60", "train.eval_every=60", "log.stats_every=2", "log.stats_warn_growth=20"]
    summary, runaway = run(train_yaml, "no-norm", "model.norm_type=no_norm", *high)
    assert summary["status"] == "diverged"
    first = summary["early_warnings"][0]
    step = int(first.rsplit("at step ", 1)[1])
    assert " of block " in first and step < summary["diverged_at_step"], summary["early_warnings"]
    stats = [r for r in runaway.stats() if all(math.isfinite(v) for v in r["resid_rms"])]
    last = stats[-1]["resid_rms"]
    assert last == sorted(last) and last[-1] > 100 * stats[0]["resid_rms"][-1]  # up the blocks, over the steps
    summary, steady = run(train_yaml, "layernorm", "model.norm_type=pytorch_layernorm", *high)
    assert (summary["status"], summary["early_warnings"]) == ("completed", [])
    assert len(steady.stats()) == 30


def test_stop_on_stops_the_run_as_diverged_naming_the_warning(train_yaml):
    args = ["model.norm_type=no_norm", "optim.lr=0.2", "optim.min_lr=0.02", "optim.grad_clip=null"]
    args += ["log.stats_every=2", "train.stop_on=[resid_rms]", "train.steps=20"]
    summary, _ = run(train_yaml, "stopper", *args)
    assert summary["status"] == "diverged" and summary["diverged_at_step"] % 2 == 0
    assert summary["stop_reason"].startswith("early warning: resid_rms of ")
    assert summary["stop_reason"].endswith("(train.stop_on: resid_rms)")


def test_stop_on_names_what_it_can_stop_on(train_yaml):
    from gpt.config import ConfigError

    with pytest.raises(
        ConfigError, match="train.stop_on: 'loss' is not a statistic it can stop on .allowed: resid_rms"
    ):
        load_config(train_yaml("bad"), ["train.stop_on=[loss]"])


@pytest.mark.parametrize("qk_norm", ["head", "full"])
def test_with_qk_norm_the_attention_logits_are_those_of_the_normalised_q_and_k_and_peri_norms_are_measured(
    tiny_model_cfg, qk_norm
):
    cfg = tiny_model_cfg(
        norm_type="handrolled_rmsnorm", norm_placement="peri", qk_norm=qk_norm, qk_norm_type="handrolled_rmsnorm",
        context_length=8,
    )  # fmt: skip
    model = GPT(cfg, seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # gains between 1 and 3, each its own: the q and k norms' gains show in the logits
        for name in sorted(model.norm_parameter_names()):
            model.get_parameter(name).mul_(1 + 2 * torch.rand(model.get_parameter(name).shape, generator=g))
    x = torch.randint(0, 97, (3, 8), generator=g)
    model(x, torch.randint(0, 97, (3, 8), generator=g))[1].backward()
    probe = StatsProbe(every=1)
    probe.measure(model, x, contextlib.nullcontext, None)
    record = probe.take(step=1, tokens=24)
    heads, hs, C = 4, 8, 32
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    with torch.no_grad():
        h = model.wte(x) + model.wpe(torch.arange(8))
        for i, block in enumerate(model.blocks):
            a = block.ln_1(h)
            qkv = block.attn.qkv(a)[: inside.ATTENTION_SEQUENCES]
            rmsn = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w[None]  # noqa: E731
            wq, wk = block.attn.q_norm.weight, block.attn.k_norm.weight
            qs, ks = qkv[..., :C], qkv[..., C : 2 * C]
            if qk_norm == "full":  # over the whole projection, before the heads are split
                qs, ks = torch.stack([rmsn(t, wq) for t in qs]), torch.stack([rmsn(t, wk) for t in ks])
            normed, raw = [], []
            for b in range(qkv.shape[0]):
                for head in range(heads):
                    q, k = qkv[b, :, head * hs : (head + 1) * hs], qkv[b, :, C + head * hs : C + (head + 1) * hs]
                    raw += [float(q[t] @ k[s]) / math.sqrt(hs) for t in range(8) for s in range(t + 1)]
                    q, k = qs[b, :, head * hs : (head + 1) * hs], ks[b, :, head * hs : (head + 1) * hs]
                    if qk_norm == "head":  # each head's own, one weight for all heads
                        q, k = rmsn(q, wq), rmsn(k, wk)
                    normed += [float(q[t] @ k[s]) / math.sqrt(hs) for t in range(8) for s in range(t + 1)]
            assert record["attn_logit_max"][i] == pytest.approx(max(normed), rel=1e-5)
            assert record["attn_logit_mean"][i] == pytest.approx(sum(normed) / len(normed), abs=1e-5)
            assert record["attn_logit_max"][i] != pytest.approx(max(raw), rel=1e-2)  # not the raw q.k
            out = block.ln_1_out(block.attn(a, ctx=Context()))  # peri-norm's output norms: measured as the input ones
            assert record["ln_1_out_rms"][i] == pytest.approx(rms(out), rel=1e-6)
            assert record["ln_1_out_max"][i] == pytest.approx(out.abs().max().item(), rel=1e-6)
            w = block.ln_2_out.weight
            assert record["ln_2_out_gain_mean"][i] == pytest.approx(w.mean().item(), rel=1e-6)
            assert record["ln_2_out_gain_std"][i] == pytest.approx(w.std(correction=0).item(), rel=1e-5)
            h = block(h, ctx=Context())
        assert record["resid_rms"][-1] == pytest.approx(rms(h), rel=1e-6)
    assert len(record["ln_2_out_rms"]) == len(record["ln_1_rms"]) == 2


def test_stop_on_that_could_never_fire_is_refused(train_yaml):
    """stop_on acts on the stats records: with log.stats_every 0, or more than the run's steps, there are none (a
    run at lr 3 once ended 'completed' with 9 of 10 steps skipped and a loss of 3e15)."""
    from gpt.config import ConfigError

    config = train_yaml("never")
    with pytest.raises(ConfigError) as refused:
        load_config(config, ["train.stop_on=[nonfinite]", "log.stats_every=0"])
    assert str(refused.value).endswith(
        "log.stats_every: train.stop_on acts on the statistics log.stats_every measures, and log.stats_every is 0 "
        "(off): set log.stats_every (e.g. 10) or drop train.stop_on"
    )
    with pytest.raises(ConfigError, match=r"log.stats_every 50 is more than the run's 20 steps: nothing is measured"):
        load_config(config, ["log.stats_every=50", "train.stop_on=[resid_rms]"])
    assert load_config(config, ["log.stats_every=20", "train.stop_on=[resid_rms]"]).train.stop_on == ["resid_rms"]
    # train.tokens_per_param: the steps are known once the model is counted; refused then, before a step
    cfg = load_config(config, ["train.steps=null", "train.tokens_per_param=0.1", "log.stats_every=1000",
                               "train.stop_on=[nonfinite]"])  # fmt: skip
    with pytest.raises(UserError) as refused:
        train(cfg)
    assert str(refused.value) == ("train.stop_on: log.stats_every 1000 is more than the run's 17 steps: nothing "
                                  "is measured, so train.stop_on never fires; set log.stats_every <= 17 or drop "
                                  "train.stop_on")  # fmt: skip
    assert not (cfg.run_dir / "checkpoints").exists() and not (cfg.run_dir / "metrics.jsonl").exists()


def test_a_stats_step_reads_the_device_once_and_groups_its_per_tensor_work(tiny_model_cfg):
    """The stats step's cost, counted on the CPU (``stats_step_cost``): one read from the device, each weight copied
    once, and the per-tensor work (gradient norms, weight copy, update ratios) in grouped ops, so that a tensor more
    in each block costs no kernel more. Before grouping, this 2-block model's probe ran 1,191 kernel ops and read
    the device 106 times, and each tensor more cost ~18 kernel ops."""
    kw = dict(norm_type="dyt", norm_placement="peri", qk_norm="head", qk_norm_type="dyt", n_layers=2)
    costs = {}
    for bias in (False, True):
        model = GPT(tiny_model_cfg(qkv_bias=bias, **kw), seed=1)
        costs[bias] = cost = stats_step_cost(model)
        assert cost["host_reads"] == 1
        alpha = 4  # ln_f's alpha, cloned so that the record holds its value before the update
        assert cost["bytes_copied"] == 4 * sum(p.numel() for p in model.parameters()) + alpha
        assert cost["kernel_ops"] < 80 + 40 * 2, cost  # the hooks': ~40 a DyT peri-norm QK-norm block
    assert costs[True]["tensors"] == costs[False]["tensors"] + 2  # the qkv bias of each block
    assert costs[True]["kernel_ops"] == costs[False]["kernel_ops"]

    class ReadsTwice(StatsProbe):  # the count sees a read the probe should not make
        def take(self, step, tokens):
            float(self.pending["grad_norm"][0])
            return super().take(step, tokens)

    assert stats_step_cost(GPT(tiny_model_cfg(), seed=1), ReadsTwice)["host_reads"] == 2


def test_gpt2_small_s_stats_step_counted_on_the_meta_device():
    """GPT-2 small's shape, nothing computed: its 137 tensors' 652 MB of float32 weights copied once (the exact
    update ratios need each tensor's change), one read, ~250 kernel ops (the probe before grouping: 2,985, and
    123 reads)."""
    cost = stats_step_cost(load_config(CONFIGS / "gpt2-small.yaml").model)
    assert (cost["tensors"], cost["host_reads"], cost["bytes_copied"]) == (137, 1, 4 * 163_045_632)
    assert cost["kernel_ops"] < 300, cost


def test_an_attention_without_scores_has_its_logits_not_measured_and_the_rest_is(tiny_model_cfg):
    """An option whose attention computes its dot product without ``Scores`` (a fused kernel of its own, say):
    the stats step records the attention logits as null (not measured) instead of failing, and measures the rest."""

    class Fused(torch.nn.Module):  # the same function, not the probe's place
        def forward(self, q, k):
            return q, k

    model = GPT(tiny_model_cfg(), seed=0)
    for block in model.blocks:
        block.attn.scores = Fused()
    idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    probe = StatsProbe(every=1)
    probe.measure(model, idx, contextlib.nullcontext, None)
    probe.after_update(model)
    record = probe.take(step=1, tokens=64)
    assert record["attn_logit_max"] is None and record["attn_logit_mean"] is None
    assert len(record["resid_rms"]) == 3 and len(record["ln_1_rms"]) == 2 and record["embed_grad_norm"] > 0
    assert EarlyWarning(10.0, 5).check(record) == []  # nothing to say of what was not measured
    # the run's charts read it as not measured (nan), the other statistics as measured
    from gpt.analysis.inside import Stats

    stats = Stats(Path("stats.jsonl"), [record])
    assert np.isnan(stats.per_block("attn_logit_max")).all() and stats.per_block("ln_1_rms").shape == (1, 2)
