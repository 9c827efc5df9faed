"""The command-line entry points: train.py's config handling, mistakes caught before the heavy imports, and the
demo."""

import json
import pkgutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import CONFIGS, ROOT

import gpt.commands
from gpt.config import ConfigError, config_from_dict, config_to_dict, load_config


def run(*args, cwd=ROOT):
    """A front door in a process of its own: what a user types."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_train_reports_the_gpt2_small_model(cli):
    out = cli(
        ROOT / "train.py", CONFIGS / "gpt2-small-pytorch-layernorm.yaml", "--set", "model.n_layers=1", "--dry-run"
    )
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


HEAVY = ("torch", "matplotlib", "transformers")
# Commands that still load torch before they check their arguments, and why: not called below (each would only
# add an import of torch to the process)
LOADS_TORCH_FIRST = {
    "evaluate": "its options come from the task registry, whose tasks import torch (gpt.evaluation.tasks)"
}
MISTAKES = """
import contextlib, importlib, io, json, pkgutil, sys
import gpt.commands
heavy, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for module in pkgutil.iter_modules(gpt.commands.__path__):
    importlib.import_module(f"gpt.commands.{module.name}")
ran = [["(imports)", None, "", [m for m in heavy if m in sys.modules]]]
for name, argv in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(f"gpt.commands.{name}").main(argv)
        except SystemExit as e:  # argparse's usage error
            code = e.code
    ran.append([name, code, err.getvalue(), [m for m in heavy if m in sys.modules]])
print(json.dumps(ran))
"""


def test_every_command_refuses_a_mistake_before_it_imports_torch(tmp_path):
    # one process, every command module imported, then each command's main given a mistake in its arguments or
    # config: status 2 and one line (argparse's usage above it), with torch, matplotlib and transformers not loaded
    missing = str(tmp_path / "missing.yaml")
    cases = [
        ("train", [missing], f"error: {missing}: no such config file"),
        ("train", [CONFIGS / "tiny.yaml", "--set", "model.nrom_type=dyt"], "error: --set: model.nrom_type: unknown"),
        ("bench", [CONFIGS / "tiny.yaml", "--set", "model.n_heads=3"], "model.n_heads: 3 does not divide"),
        ("compare", ["runs/x", "--precision", "fp64"], "error: argument --precision: invalid choice: 'fp64'"),
        ("demo", ["--config", missing], f"error: {missing}: no such config file"),
        ("generate", ["runs/x", "--max-new-tokens", "0"], "error: --max-new-tokens and --num-samples must be >= 1"),
        ("gpu_check", ["out", "--tests", "t.py", "--config", missing, "--budget-s", "10"], "error: --budget-s 10: "),
        ("preflight", ["--device", "tpu"], "error: argument --device: invalid choice: 'tpu'"),
        ("prepare_data", ["shakespeare", "--tokenizer", "gpt5", "--out", "x"], "error: unknown tokenizer 'gpt5'"),
        ("publish_sweep", ["runs"], "error: the following arguments are required: --namespace"),
        ("push_to_hub", ["runs/x", "--repo", "no slash"], "error: --repo: 'no slash' is not a Hub repository name"),
        ("push_to_hub", ["runs/x", "--repo", "me/x"], "error: runs/x: not a run directory or checkpoint"),
        ("sweep", [missing, "--status"], f"error: {missing}: no such config file"),
    ]
    commands = {m.name for m in pkgutil.iter_modules(gpt.commands.__path__)} - {"cli"}
    assert {name for name, _, _ in cases} | set(LOADS_TORCH_FIRST) == commands  # a new command gets its mistake here
    argv = json.dumps([(name, [str(a) for a in args]) for name, args, _ in cases])
    out = run("-c", MISTAKES, json.dumps(HEAVY), argv, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ran = json.loads(out.stdout)
    assert ran[0] == ["(imports)", None, "", []]  # importing a command loads none of them
    for (name, code, err, loaded), (_, args, message) in zip(ran[1:], cases, strict=True):
        lines = err.splitlines()
        assert code == 2 and message in err and [line for line in lines if "error:" in line] == lines[-1:], (name, err)
        assert len(lines) == 1 or lines[0].startswith("usage: "), (name, err)
        assert loaded == [], f"{name} {' '.join(map(str, args))} loaded {loaded}"


@pytest.mark.slow
def test_demo_runs_the_whole_path(train_yaml, tmp_path, cli):
    cfg = train_yaml("demo")
    cfg.write_text(
        cfg.read_text().replace("steps: 20", "steps: 4").replace("data: {path:", "data: {test_tokens: 2048, path:")
    )
    out = cli(
        ROOT / "scripts" / "demo.py",
        "--config",
        cfg,
        "--norm-types",
        "handrolled_layernorm",
        "pytorch_rmsnorm",
        "--seeds",
        "0",
        "--runs-dir",
        tmp_path / "runs",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert table[1].startswith("| handrolled_layernorm | 1 (0) | ") and "| baseline |" in table[1]
    assert table[2].startswith("| pytorch_rmsnorm | 1 (0) | ") and "1 completed" in table[2]
    for name in ("comparison.md", "test_loss.png", "loss.png", "speedup.png"):
        assert (tmp_path / "runs" / "demo-comparison" / name).is_file()
    assert (tmp_path / "runs" / "demo-handrolled-layernorm-t0.5-s0" / "summary.json").is_file()
    assert "- pytorch_rmsnorm reaches its test loss with" in out.stdout
    assert "demo wall time:" in out.stdout


def test_the_demo_design_gives_every_group_three_seeds(tmp_path):
    from gpt.commands.demo import NORM_TYPES, SEEDS, TOKENIZER
    from gpt.data.tokenizer import get_tokenizer
    from gpt.sweep.cells import lay_out

    cfg = load_config(CONFIGS / "demo.yaml")
    assert cfg.model.vocab_size == get_tokenizer(TOKENIZER).n_vocab == 257  # bytes: 256 ids and <|endoftext|>
    cells = lay_out(CONFIGS / "demo.yaml", list(NORM_TYPES), list(SEEDS), tmp_path)
    seeds = {}
    for c in cells:
        seeds.setdefault(c.norm_type, []).append(c.seed)
    assert seeds == {"handrolled_layernorm": [0, 1, 2], "pytorch_layernorm": [0, 1, 2], "no_norm": [0, 1, 2]}


def cross_entropies(data, n_test: int) -> tuple[float, float]:
    """The unigram and bigram predictors' cross-entropy on a token set's first ``n_test`` test tokens, counted
    on its train split (add-one smoothing): the loss a model reaches by counting bytes and byte pairs."""
    train = np.fromfile(data / "train.bin", dtype=np.uint16).astype(np.int64)
    test = np.fromfile(data / "test.bin", dtype=np.uint16)[:n_test].astype(np.int64)
    v = int(max(train.max(), test.max())) + 1
    unigram = np.bincount(train, minlength=v) + 1.0
    pairs = np.bincount(train[:-1] * v + train[1:], minlength=v * v).reshape(v, v) + 1.0
    uni = -np.log(unigram[test] / unigram.sum()).mean()
    bi = -np.log(pairs[test[:-1], test[1:]] / pairs[test[:-1]].sum(axis=1)).mean()
    return float(uni), float(bi)


@pytest.mark.slow
def test_the_demo_resolves_a_difference_and_the_pairs_equivalence(tmp_path):
    """The demo as a newcomer runs it (about 9 minutes on 2 CPU cores), on its own design: its models are
    far past the unigram and bigram predictors, no_norm's paired 95% interval against hand-rolled LayerNorm
    excludes 0, and PyTorch's LayerNorm is equivalent to the hand-rolled one within +-0.01 nats."""
    out = subprocess.run(
        [sys.executable, ROOT / "scripts" / "demo.py", "--runs-dir", tmp_path / "runs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "runs" / "demo-comparison" / "comparison.json").read_text())
    rows = {r["group"]: r for r in result["groups"]}
    assert list(rows) == ["handrolled_layernorm", "pytorch_layernorm", "no_norm"]
    assert all(r["n_evaluated"] == 3 for r in rows.values())
    unigram, bigram = cross_entropies(tmp_path / "data" / "shakespeare-bytes", 65_536)
    assert unigram > 3.2 and bigram > 2.4
    assert all(r["test_loss_mean"] < bigram - 0.3 for r in rows.values())
    no_norm = rows["no_norm"]["vs_baseline"]
    assert no_norm["method"] == "paired" and no_norm["high"] < 0  # resolved: no_norm learns faster at this size
    pair = rows["pytorch_layernorm"]["vs_baseline"]
    assert pair["equivalence"]["margin"] == 0.01 and pair["equivalence"]["equivalent"] is True
    assert "| no_norm | 3 (0, 1, 2) | " in out.stdout and "| yes (p = " in out.stdout
    # the effective speedup: the baseline's token ladder (0.5x, 1x, 2x), timed side by side by bench.py
    s = result["effective_speedup"]
    assert s["route"] == "token ladder" and [len(r["losses"]) for r in s["rungs"]] == [3, 3, 3]
    assert s["throughput"]["problem"] is None and s["throughput"]["source"].endswith("demo-bench.jsonl")
    for norm in ("pytorch_layernorm", "no_norm"):
        v = s["norms"][norm]
        assert v["time"]["es"] > 0 and v["compute"]["es"] > 0 and "(time-matched effective speedup" in v["verdict"]
    assert s["norms"]["no_norm"]["compute"]["es"] > 1  # lower loss at the same compute: cheaper
    assert "## Effective speedup" in out.stdout and "Bits per byte = nats per token x" in out.stdout
