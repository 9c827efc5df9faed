"""optim.name muon: torch.optim.Muon on the blocks' matrices, AdamW on the rest. One step equals a direct
computation with the two torch optimizers on the same split; a run resumes bitwise; the split is recorded."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from ddp import same, weights

from gpt.config import ConfigError, OptimConfig, load_config
from gpt.model.gpt import GPT
from gpt.training.loop import train
from gpt.training.optimizer import make_optimizer, muon_split, set_lr, step_unless_nonfinite

MUON = OptimConfig(name="muon", lr=1e-2, muon_lr=0.05, weight_decay=0.1, decay_norms_and_biases=False)


def loss_grads(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, model.cfg.vocab_size, (4, 16), generator=g)
    model.zero_grad(set_to_none=True)
    model(x, x.roll(-1, dims=1))[1].backward()


@pytest.mark.parametrize("shape", [dict(), dict(qkv_bias=True, tie_weights=True), dict(block="modern")])
def test_the_split_is_the_blocks_matrices(tiny_model_cfg, shape):
    model = GPT(tiny_model_cfg(**shape))
    muon, adamw = muon_split(model)
    per_block = ["attn.qkv.weight", "attn.proj.weight", *(["mlp.gate.weight"] if shape.get("block") else []),
                 "mlp.fc.weight", "mlp.proj.weight"]  # fmt: skip
    assert muon == [f"blocks.{i}.{n}" for i in range(model.cfg.n_layers) for n in per_block]
    assert set(adamw) == {n for n, _ in model.named_parameters()} - set(muon)
    assert "wte.weight" in adamw and all(("ln_" in n or n.endswith(".bias")) for n in adamw if "blocks." in n)


def test_one_step_equals_torch_muon_and_adamw_on_the_same_split(tiny_model_cfg):
    torch.manual_seed(0)
    ours, ref = GPT(tiny_model_cfg(), seed=1), GPT(tiny_model_cfg(), seed=1)
    opt = make_optimizer(ours, MUON)
    named = dict(ref.named_parameters())
    muon_names, adamw_names = muon_split(ref)
    muon = torch.optim.Muon([named[n] for n in muon_names], lr=0.05 * 0.5, weight_decay=0.1, momentum=0.95)
    adamw = torch.optim.AdamW(
        [{"params": [named[n] for n in adamw_names if named[n].dim() >= 2], "weight_decay": 0.1},
         {"params": [named[n] for n in adamw_names if named[n].dim() < 2], "weight_decay": 0.0}],
        lr=1e-2 * 0.5, betas=(0.9, 0.999), eps=1e-8, fused=True,
    )  # fmt: skip
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for step in range(2):  # the second step reads the momentum the first left
        set_lr(opt, 1e-2 * 0.5)  # the schedule at half the peak: Muon's rate at half its own
        loss_grads(ours, step), loss_grads(ref, step)
        assert step_unless_nonfinite(opt, scaler, torch.tensor(1.0)).item() is False
        muon.step(), adamw.step()
    assert [g["lr"] for g in opt.muon.param_groups] == [0.025]
    assert same(ours.state_dict(), ref.state_dict())
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    loss_grads(ours, 5)
    assert step_unless_nonfinite(opt, scaler, torch.tensor(float("nan"))).item() is True
    assert same(before, ours.state_dict())  # a non-finite gradient moves neither half


def test_muon_is_refused_with_fp16_in_one_line(train_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(train_yaml(), ["optim.name=muon", "train.precision=fp16"])
    assert "grad scaler steps torch optimizers only" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_muon_run_resumes_bitwise_and_records_its_split(train_yaml, tmp_path):
    straight = load_config(train_yaml("straight"), ["optim.name=muon"])
    train(straight)
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step-00000020")
    (resumed_dir / "checkpoints" / "latest").write_text("step-00000010\n")
    (resumed_dir / "checkpoints" / "best").unlink()
    train(load_config(train_yaml("resumed"), ["optim.name=muon"]), resume="auto")
    assert same(weights(tmp_path / "straight", 20), weights(resumed_dir, 20))
    summary = json.loads((resumed_dir / "summary.json").read_text())
    split = summary["optimizer"]
    assert split["name"] == "muon" and split["muon"]["tensors"] == 8  # 2 blocks x qkv, proj, fc, proj
    assert split["muon"]["weights"] == 2 * 12 * 32 * 32
