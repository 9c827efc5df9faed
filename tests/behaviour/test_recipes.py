"""docs/extending.md's recipes are executable: each step is a code block under a comment that says where it goes
(``<!-- recipe NAME: PATH, WHERE -->``) or a block of commands (``<!-- recipe NAME: run -->``). The slow test
performs every recipe, exactly as written, in a copy of the package, runs each one's commands there, then the
fast tests: a recipe that misses a place (a registry, a table, a list, a test row) fails it. The fast
tests hold the page to what can be performed: every anchor names one line of today's files."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT
from recipes import WHERE, Step, anchored, perform, recipe_steps

# what docs/extending.md walks, each at least one edit and a run
RECIPES = ("norm", "task", "metric", "option", "architecture")
PAGE = ROOT / "docs" / "extending.md"


def copy_of_the_package(to: Path) -> Path:
    """The checkout's files (what git tracks, and new files it does not ignore) and its .git, at ``to``; its
    .venv linked, not copied."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    shutil.copytree(ROOT / ".git", to / ".git", symlinks=True)
    (to / ".venv").symlink_to(ROOT / ".venv")
    return to


def environment(root: Path) -> dict:
    """The copy's own package first on every Python's path (the checkout's is installed editable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    return {**env, "PYTHONPATH": str(root), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled"}  # fmt: skip


def run(command: str, root: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=root, env=environment(root), capture_output=True, text=True, timeout=timeout
    )


def test_each_recipe_has_edits_and_commands_and_every_anchor_names_one_line():
    steps = recipe_steps(PAGE)
    assert sorted({s.recipe for s in steps}) == sorted(RECIPES)
    for name in RECIPES:
        mine = [s for s in steps if s.recipe == name]
        assert [s for s in mine if s.where == "run"] and [s for s in mine if s.where != "run"], name
    for step in steps:
        how = step.where.partition(", ")[2]
        if step.where == "run":
            assert all(line.startswith(".venv/bin/") for line in step.body.splitlines() if line.strip()), step
        elif how == "as a new file":
            assert not (ROOT / step.path).exists(), step
        elif how != "at its end":
            assert WHERE.fullmatch(how), f"{step}: say as a new file, at its end, or before / after / replacing"
            anchored(step, (ROOT / step.path).read_text().splitlines())


def test_a_step_goes_where_it_says(tmp_path):
    (tmp_path / "f.py").write_text("a = 1\nb = 2\n")
    perform(Step("x", "f.py, after the line `a = 1`", "c = 3\n"), tmp_path)
    perform(Step("x", "f.py, before the line `a = 1`", "z = 0\n"), tmp_path)
    perform(Step("x", "f.py, replacing the line `b = 2`", "b = 20\n"), tmp_path)
    perform(Step("x", "f.py, at its end", "d = 4\n"), tmp_path)
    perform(Step("x", "g.py, as a new file", "e = 5\n"), tmp_path)
    assert (tmp_path / "f.py").read_text() == "z = 0\na = 1\nc = 3\nb = 20\nd = 4\n"
    assert (tmp_path / "g.py").read_text() == "e = 5\n"
    with pytest.raises(AssertionError, match="the anchor is on 0 lines of f.py, not one"):
        perform(Step("x", "f.py, after the line `nowhere`", "y\n"), tmp_path)


def perform_recipes(root: Path, leave_out: Step | None = None) -> list[str]:
    """Every step of the page at ``root`` but ``leave_out``, in order; what each recipe's commands said when one
    failed (none: all passed)."""
    failures = []
    for step in recipe_steps(root / "docs" / "extending.md"):
        if step == leave_out:
            continue
        if step.where != "run":
            perform(step, root)
            continue
        for command in filter(str.strip, step.body.splitlines()):
            done = run(command, root)
            if done.returncode != 0:
                failures.append(f"{step}: {command}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
    return failures


@pytest.mark.slow
@pytest.mark.serial
def test_every_recipe_performed_as_written_passes_its_commands_and_the_fast_tests(tmp_path):
    """All five recipes in one copy of the package, then the fast tier there on both cores (serial: alone)."""
    copy = copy_of_the_package(tmp_path / "copy")
    assert run(".venv/bin/python -c 'import gpt; print(gpt.__file__)'", copy).stdout.startswith(str(copy))
    assert perform_recipes(copy) == []
    fast = ".venv/bin/python -m pytest -q -m 'not slow' -n 2 -p no:cacheprovider"
    done = run(f"{fast} --ignore=tests/behaviour/test_recipes.py", copy, timeout=1200)  # its anchors: done now
    assert done.returncode == 0, done.stdout[-5000:]
    # what the recipes added is there and used: a norm, a task, a metric and an option of the copy
    script = 'import sys, gpt.config as c; print("scalenorm" in c.NORM_TYPES, "torch" in sys.modules)'
    torch_free = f".venv/bin/python -c '{script}'"
    assert run(torch_free, copy).stdout.split() == ["True", "False"]  # a config choice before torch loads
    assert "--top5-tokens" in run(".venv/bin/python evaluate.py --help", copy).stdout
    relu2 = ".venv/bin/python train.py configs/tiny.yaml --set model.activation=relu2 --dry-run"
    assert "norm handrolled_layernorm (ReLU^2 MLP)" in run(relu2, copy).stdout  # the spec's words, in the summary
