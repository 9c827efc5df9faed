"""The command-line entry points: train.py's config handling and the demo."""

import subprocess
import sys

import pytest
import yaml
from conftest import CONFIGS, ROOT

from gpt.config import ConfigError, config_from_dict, config_to_dict, load_config


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


def test_help_config_is_yaml_that_loads_to_the_defaults(tmp_path):
    out = run("train.py", "--help-config")
    assert out.returncode == 0, out.stderr
    assert "  norm_eps: 1.0e-05  # a number; eps of every norm" in out.stdout
    assert "  init_seed: null  # an integer or null;" in out.stdout and "None" not in out.stdout
    printed = yaml.safe_load(out.stdout)
    defaults = config_to_dict(config_from_dict({"run": {"name": "x"}, "train": {"steps": 1}}))
    for section, keys in defaults.items():  # every key printed, with its default's value and type
        for key, value in keys.items():
            shown = printed[section][key]
            if (section, key) not in (("run", "name"), ("train", "steps")):
                assert shown == value and type(shown) is type(value), (section, key)
    assert printed["run"]["name"] is None and printed["train"]["steps"] is None
    # pasted into a file with the required keys filled in, it loads to the defaults
    (tmp_path / "all.yaml").write_text(out.stdout)
    assert load_config(tmp_path / "all.yaml", ["run.name=x", "train.steps=1"]) == config_from_dict(
        {"run": {"name": "x"}, "train": {"steps": 1}}
    )
    # left as printed, the required name stops the load in one line
    with pytest.raises(ConfigError, match=r"all.yaml: run.name: missing required value"):
        load_config(tmp_path / "all.yaml", ["train.steps=1"])


@pytest.mark.slow
def test_demo_runs_the_whole_path(train_yaml, tmp_path):
    cfg = train_yaml("demo")
    cfg.write_text(
        cfg.read_text().replace("steps: 20", "steps: 4").replace("data: {path:", "data: {test_tokens: 2048, path:")
    )
    out = run(
        ROOT / "scripts" / "demo.py",
        "--config",
        cfg,
        "--norm-types",
        "handrolled_layernorm",
        "pytorch_rmsnorm",
        "--runs-dir",
        tmp_path / "runs",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert table[1].startswith("| handrolled_layernorm | 1 (0) | ") and "| baseline |" in table[1]
    assert table[2].startswith("| pytorch_rmsnorm | 1 (0) | ") and "1 completed" in table[2]
    for name in ("comparison.md", "test_loss.png", "train_loss.png"):
        assert (tmp_path / "runs" / "demo-comparison" / name).is_file()
    assert "demo wall time:" in out.stdout


def test_demo_runs_the_write_up_pair_with_three_seeds(tmp_path):
    from gpt.analysis.experiment import plan
    from gpt.commands.demo import pair_seeds
    from gpt.model.norms import NORM_TYPES

    everything = list(NORM_TYPES)
    cells = plan(CONFIGS / "demo.yaml", everything, [0], tmp_path, seeds_for=pair_seeds(everything, [0, 1, 2]))
    seeds = {}
    for c in cells:
        seeds.setdefault(c.norm_type, []).append(c.seed)
    assert seeds == {n: [0, 1, 2] if n in ("handrolled_layernorm", "pytorch_layernorm") else [0] for n in NORM_TYPES}
    assert len(cells) == 11 and pair_seeds(["handrolled_layernorm", "dyt"], [0, 1, 2]) is None
