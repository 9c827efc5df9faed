"""setup_cloud.sh and the other shell scripts: shellcheck-clean; a dry run on this (GPU-less) machine."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPTS = [ROOT / "setup_cloud.sh", *sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    out = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dry_run_without_a_gpu_prints_the_cpu_path_and_no_token():
    env = {
        **os.environ,
        "HF_TOKEN": "hf_FAKEsetupToken42",
        "WANDB_API_KEY": "FAKEwandbKey42",
        "PATH": "/usr/bin:/bin",
    }  # no nvidia-smi
    out = subprocess.run(
        ["bash", str(ROOT / "setup_cloud.sh"), "--dry-run", "--data", "fineweb-edu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert (
        lines[0] == "setup_cloud: no NVIDIA GPU here (nvidia-smi missing or no driver): setting up the CPU environment"
    )
    assert lines[1] == "would run: bash scripts/setup.sh"
    assert lines[2].startswith("would run: .venv/bin/python -c import os; from huggingface_hub import login")
    assert lines[3].startswith("would run: .venv/bin/python -c import os, wandb; wandb.login(")
    assert lines[4] == (
        "would run: .venv/bin/python scripts/prepare_data.py fineweb-edu --max-tokens 3.5B --out data/fineweb-edu"
    )
    assert lines[5].startswith("train:  .venv/bin/python train.py configs/tiny.yaml")
    assert "FAKE" not in out.stdout + out.stderr  # the tokens are read inside Python, never printed


def test_a_wrong_argument_is_one_line():
    out = subprocess.run(
        ["bash", str(ROOT / "setup_cloud.sh"), "--data", "nonsense", "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert out.returncode == 2 and out.stdout == ""  # before anything is done
    assert out.stderr == "setup_cloud: --data nonsense: use fineweb-edu, fineweb, or a Hub repo USER/NAME\n"
