"""Installed non-editable (`pip install .`) in a fresh virtual environment, the commands run from another
working directory on a config given by path: nothing depends on where the checkout is."""

import json
import os
import shutil
import site
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(*args, cwd):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=ENV, timeout=600)


@pytest.fixture
def venv(tmp_path):
    """A fresh venv with this package installed into it from a copy of the sources (the checkout stays
    untouched by the build). Its dependencies are this environment's: a .pth line puts their folders on
    sys.path, which does not run the .pth files inside them, so this checkout's editable install of
    gpt stays out."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "gpt", src / "gpt", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site_packages = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site_packages / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    out = run(
        env / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--quiet",
        src,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    shutil.rmtree(src)  # nothing may still read the sources
    return env, site_packages


def test_commands_run_from_anywhere(venv, train_yaml, tmp_path):
    env, site_packages = venv
    python = env / "bin" / "python"
    work = tmp_path / "elsewhere"
    work.mkdir()
    # where the module is found (its import, torch and all, is the console script's below)
    find = "import importlib.util; print(importlib.util.find_spec('gpt.training.loop').origin)"
    where = run(python, "-c", find, cwd=work)
    assert where.stdout.strip() == str(site_packages / "gpt" / "training" / "loop.py"), where.stderr
    # what an export ships beside the weights is installed too: the wrapper and the model's own files
    assert (site_packages / "gpt" / "publish" / "hub_code" / "modeling_gpt_norm.py").is_file()
    assert (site_packages / "gpt" / "model" / "gpt.py").is_file()

    config = train_yaml("installed")  # a config given by path, outside the working directory
    out = run(env / "bin" / "gpt-train", config, "--set", "train.steps=6", cwd=work)  # the console script
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "installed" / "summary.json").read_text())["status"] == "completed"

    out = run(python, "-m", "gpt.commands.evaluate", tmp_path / "installed", "--quiet", cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "installed" in out.stdout and "test" in out.stdout
    assert list((tmp_path / "installed" / "checkpoints").glob("step-*/eval-test-fp32.json"))

    # the sweep launches its cells under torchrun as modules: no path into a checkout
    out = run(
        python,
        "-m",
        "gpt.commands.sweep",
        config,
        "--norm-types",
        "pytorch_rmsnorm",
        "--nproc",
        "2",
        "--set",
        "train.steps=4",
        "--set",
        "data.test_tokens=2048",
        cwd=work,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cell = work / "runs" / "installed-pytorch-rmsnorm-s0"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert "| pytorch_rmsnorm | 1 (0) |" in out.stdout
    assert (work / "runs" / "installed-comparison" / "comparison.md").is_file()
