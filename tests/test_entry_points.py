"""The command-line entry points: train.py's config handling and the demo."""

import math
import subprocess
import sys

import pytest

from gpt.config import load_config

from conftest import CONFIGS, ROOT


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_train_reports_the_gpt2_small_model():
    out = run("train.py", CONFIGS / "gpt2-small-pytorch-layernorm.yaml", "--set", "model.n_layers=1", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "norm pytorch_layernorm" in out.stdout
    # one block less than 12: 163,009,536 - 11 * 7,085,568
    assert f"parameters: {163_009_536 - 11 * 7_085_568:,} (" in out.stdout
    assert "98,304 tokens per optimizer step" in out.stdout


def test_train_config_error_is_one_line_and_exit_2():
    out = run("train.py", CONFIGS / "tiny.yaml", "--set", "model.norm_type=layer_norm")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: --set: model.norm_type: 'layer_norm' is not one of: handrolled_layernorm")
    assert out.stderr.count("\n") == 1


def test_print_config_reloads_to_the_same_config(tmp_path):
    out = run("train.py", CONFIGS / "gpt2-small-dyt.yaml", "--set", "optim.grad_clip=1.0", "--print-config")
    assert out.returncode == 0, out.stderr
    (tmp_path / "resolved.yaml").write_text(out.stdout)
    expected = load_config(CONFIGS / "gpt2-small-dyt.yaml", ["optim.grad_clip=1.0"])
    assert load_config(tmp_path / "resolved.yaml") == expected


def test_help_config_lists_every_section():
    out = run("train.py", "--help-config")
    assert out.returncode == 0
    assert "norm_eps: 1e-05  # a number; eps of every norm" in out.stdout


@pytest.mark.slow
def test_demo_trains_every_norm_type(tmp_path):
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(f"extends: {CONFIGS / 'tiny.yaml'}\nmodel: {{vocab_size: 97, context_length: 16, d_model: 32}}\n")
    out = run(ROOT / "scripts" / "demo.py", "--config", cfg, "--steps", "30", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[2:]}
    assert list(rows) == ["handrolled_layernorm", "pytorch_layernorm", "handrolled_rmsnorm", "pytorch_rmsnorm",
                          "no_norm", "dyt", "handrolled_layernorm_fast"]
    for norm_type, (_, params, first, last, _) in rows.items():
        # it learns the repeated random sequences: below the loss of a uniform guess, ln(97)
        assert float(last) < min(float(first) - 0.2, math.log(97) - 0.15), norm_type
    # same weights, same function: hand-rolled and PyTorch LayerNorm start from the same loss
    assert rows["handrolled_layernorm"][2] == rows["pytorch_layernorm"][2] == rows["handrolled_layernorm_fast"][2]
    assert rows["handrolled_rmsnorm"][2] == rows["pytorch_rmsnorm"][2]
