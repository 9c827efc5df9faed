"""What the README tells a user to type and the numbers it states: CI runs the same commands, the
VM quickstart's commands parse, and its cost table is the benchmark's formula."""

import re
import shlex

import pytest
from conftest import CONFIGS, ROOT

from gpt.analysis.mfu import train_hours
from gpt.commands import bench, compare, publish_sweep, sweep
from gpt.config import load_config
from gpt.model.gpt import GPT

README = (ROOT / "README.md").read_text()


def block_after(heading: str) -> list[str]:
    """The commands of the first code block after ``heading``, continuation lines joined, comments dropped."""
    text = README[README.index(heading) :]
    text = text[text.index("```bash\n") + len("```bash\n") :]
    block = text[: text.index("\n```")]
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]


def test_ci_runs_the_readme_test_command_and_then_the_slow_tests():
    test_command = next(c for c in block_after("## On any machine") if "pytest" in c)
    pytest_args = test_command[test_command.index("pytest") + 1 :]
    assert pytest_args == ["-m", "not slow"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [shlex.split(line) for line in ci if "pytest" in line]
    assert runs == [
        [".venv/bin/python", "-m", "pytest", *pytest_args],
        [".venv/bin/python", "-m", "pytest", "-m", "slow"],
    ]
    assert ".venv/bin/ruff check ." in ci and ".venv/bin/ruff format --check ." in ci  # the README's checks


def test_the_vm_quickstart_is_five_commands_that_parse():
    commands = block_after("## From a fresh 8-GPU VM")
    assert len(commands) == 5
    assert commands[0] == ["bash", "setup_cloud.sh", "--data", "fineweb"] and (ROOT / "setup_cloud.sh").is_file()
    parsers = {
        "scripts/bench.py": bench.parse_args,
        "scripts/sweep.py": lambda a: sweep.build_parser().parse_args(a),
        "scripts/compare.py": lambda a: compare.build_parser().parse_args(a),
        "scripts/publish_sweep.py": lambda a: publish_sweep.build_parser().parse_args(a),
    }
    parsed = {}
    for command in commands[1:]:
        script = next(a for a in command if a.startswith("scripts/"))
        assert (ROOT / script).is_file()
        parsed[script] = parsers[script](command[command.index(script) + 1 :])
    assert commands[1][:2] == [".venv/bin/torchrun", "--nproc_per_node=8"] and parsed["scripts/sweep.py"].nproc == 8
    assert parsed["scripts/bench.py"].norm_types == parsed["scripts/sweep.py"].norm_types
    assert len(parsed["scripts/sweep.py"].norm_types) * len(parsed["scripts/sweep.py"].seeds) == 12
    # the comparison is the one folder publish_sweep finds beside the runs
    assert str(parsed["scripts/compare.py"].out) == "runs/gpt2-small-comparison"


def test_the_cost_table_is_the_benchmark_formula():
    cfg = load_config(CONFIGS / "gpt2-small.yaml")
    model = GPT(cfg.model)
    steps = cfg.total_steps(model.num_params(norms=False))
    tokens, flops = steps * cfg.tokens_per_step, model.flops_per_token()
    assert f"A run is {steps:,} steps of {cfg.tokens_per_step:,} tokens ({tokens:,} tokens)" in README
    assert f"{flops:,} model FLOPs per token" in README
    per_gpu_hour = 40 / (8 * 2.5)  # the write-up's $40 for 8 GPUs x 2.5 h
    assert f"priced at ${per_gpu_hour:.2f} per GPU-hour" in README
    write_up = train_hours(tokens, flops, 312.0, 8, 1.0) / 2.5  # the MFU its 2h30m on 8 A100s implies
    rows = re.findall(r"^\| (\d+(?:\.\d+)?)%.*?\| ([\d.]+) \| \$(\d+) \| ([\d.]+) h, \$(\d+) \|$", README, re.M)
    assert [float(r[0]) for r in rows] == [round(100 * write_up, 1), 30, 40]
    for (_, hours, cost, hours_12, cost_12), mfu in zip(rows, (write_up, 0.30, 0.40)):
        h = train_hours(tokens, flops, 312.0, 8, mfu)
        assert (hours, cost, hours_12, cost_12) == (
            f"{h:.2f}",
            f"{h * 8 * per_gpu_hour:.0f}",
            f"{12 * h:.1f}",
            f"{12 * h * 8 * per_gpu_hour:.0f}",
        )
    assert train_hours(tokens, flops, 989.4, 8, 0.4) == pytest.approx(
        train_hours(tokens, flops, 312.0, 8, 0.4) / 3, rel=0.06
    )
