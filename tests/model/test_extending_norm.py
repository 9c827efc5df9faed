"""Adding a norm type is one registry entry: a ScaleNorm declared only in this file (as ``test_scalenorm``, so
that it never meets the ``scalenorm`` docs/extending.md's recipe adds) is a valid config choice, builds, trains,
exports and reloads, with no other file changed."""

import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import write_train_yaml
from safetensors.torch import load_file

from gpt.config import ConfigError, load_config
from gpt.model import norms
from gpt.model.gpt import GPT
from gpt.model.norms import EPS, NORM_TYPES, NormType, register_norm, unregister_norm
from gpt.publish.export import export_checkpoint
from gpt.publish.layouts import load_published
from gpt.run.checkpoints import checkpoint_config, load_weights
from gpt.run.directory import RunDir, find_checkpoint
from gpt.training.loop import train

IDS = [[0, 64, 65, 66, 7, 100, 200, 255], [3, 1, 4, 1, 5, 9, 2, 6]]


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar, 2019): ``weight * sqrt(d) * x / ||x||``, one learnable scalar weight."""

    def __init__(self, dim: int, eps: float = EPS.default):
        super().__init__()
        self.eps, self.scale = eps, math.sqrt(dim)
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.scale * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)


# The whole addition: this entry (in gpt/model/norms.py, a register_norm call after the others).
SCALENORM = NormType("test_scalenorm", ScaleNorm, "ScaleNorm: weight * sqrt(d) * x / ||x||, one scalar weight", (EPS,))


@pytest.fixture
def scalenorm():
    register_norm(SCALENORM)
    yield SCALENORM
    unregister_norm(SCALENORM.name)
    assert "test_scalenorm" not in norms.NORM_TYPES


def overrides(steps=4):
    return [f"train.steps={steps}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}"]


def test_a_norm_type_not_registered_is_refused(tmp_path, token_set):
    path = write_train_yaml(tmp_path, token_set, "scale")
    with pytest.raises(ConfigError, match="model.norm_type: 'test_scalenorm' is not one of: handrolled_layernorm, "):
        load_config(path, ["model.norm_type=test_scalenorm"])


def test_the_registry_entry_makes_it_a_config_choice_and_a_norm(scalenorm, tmp_path, token_set):
    assert (*NORM_TYPES, "test_scalenorm") == norms.NORM_TYPES and ScaleNorm in norms.NORM_MODULES
    cfg = load_config(write_train_yaml(tmp_path, token_set, "scale"), ["model.norm_type=test_scalenorm"])
    model = GPT(cfg.model, seed=0)
    assert isinstance(model.ln_f, ScaleNorm) and model.ln_f.eps == cfg.model.norm_eps
    # 2 blocks x 2 norms + the final one, one scalar each: known as norm parameters, left at their init
    names = model.norm_parameter_names()
    assert names == {"ln_f.weight"} | {f"blocks.{i}.{n}.weight" for i in (0, 1) for n in ("ln_1", "ln_2")}
    assert model.num_params() - model.num_params(norms=False) == 5
    assert all(p.item() == 1.0 for n, p in model.named_parameters() if n in names)


SHIPPED_LOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(torch.tensor(json.loads(sys.argv[2]))).logits
print(json.dumps({"class": type(model).__name__, "norm": type(model.gpt.ln_f).__name__, "logits": logits.tolist()}))
"""


def test_a_norm_registered_only_here_trains_exports_and_reloads(scalenorm, tmp_path, token_set):
    cfg = load_config(write_train_yaml(tmp_path, token_set, "scale"), ["model.norm_type=test_scalenorm", *overrides()])
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["norm_type"] == "test_scalenorm"
    losses = [r["train_loss"] for r in RunDir(cfg.run_dir).metrics() if "train_loss" in r]
    assert len(losses) == 4 and all(map(math.isfinite, losses)) and losses[-1] < losses[0]
    ckpt = find_checkpoint(cfg.run_dir)
    trained = load_file(str(ckpt / "model.safetensors"))
    assert all(trained[n].item() != 1.0 for n in ("ln_f.weight", "blocks.0.ln_1.weight"))  # the norm learned

    model = GPT(checkpoint_config(ckpt).model)
    load_weights(model, ckpt)
    with torch.no_grad():
        expected = model.eval()(torch.tensor(IDS))[0]

    folder = tmp_path / "export"
    files = export_checkpoint(ckpt, folder, "me/gpt-scalenorm")
    assert {"model.safetensors", "config.json", "norms.py", "modeling_gpt_norm.py"} <= set(files)
    config = json.loads((folder / "config.json").read_text())
    assert (config["norm_type"], config["norm_eps"]) == ("test_scalenorm", 1e-5)
    assert "test_scalenorm" in (folder / "README.md").read_text()

    loaded = load_published(folder)  # the package's own loader
    assert isinstance(loaded.ln_f, ScaleNorm)
    with torch.no_grad():
        torch.testing.assert_close(loaded(torch.tensor(IDS))[0], expected, rtol=0, atol=0)

    # transformers runs the shipped norms.py, the package's file verbatim: a norm declared only in this test
    # is not in it, so the file gets the entry as a contributor would write it there (class and registration)
    shipped = folder / "norms.py"
    assert shipped.read_bytes() == Path(norms.__file__).read_bytes()
    entry = f"register_norm(NormType({SCALENORM.name!r}, ScaleNorm, {SCALENORM.doc!r}, (EPS,)))\n"
    shipped.write_text(f"{shipped.read_text()}\n\nimport math\n\n\n{inspect.getsource(ScaleNorm)}\n\n{entry}")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", SHIPPED_LOAD, str(folder), json.dumps(IDS)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert (got["class"], got["norm"]) == ("GPTNormForCausalLM", "ScaleNorm")
    assert (torch.tensor(got["logits"]) - expected).abs().max().item() <= 1e-5
