"""The local SLURM cluster (tests/sweep/local_slurm.py) as fixtures: packages installed where missing, else a
skip. tests/conftest.py imports them (a conftest.py here would shadow that one's ``from conftest import``)."""

import os
import shutil
import subprocess

import pytest
from sweep.local_slurm import LocalSlurm, missing_binaries

INSTALL = "apt-get install -y slurm-wlm munge"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def ensure_slurm_installed() -> str | None:
    """None when slurm-wlm and munge are (or now are) installed, else the one-line reason they are not."""
    missing = missing_binaries()
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"{', '.join(missing)} not installed and not root to install them: run `sudo {INSTALL}`"
    if shutil.which("apt-get") is None:
        return f"{', '.join(missing)} not installed and no apt-get to install them (Debian/Ubuntu: `{INSTALL}`)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    tried = []
    for argv in (INSTALL.split(), ["apt-get", "update"], INSTALL.split()):
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"`{INSTALL}` failed ({e}); slurm-wlm and munge are needed"
        tried.append(proc)
        if argv[1] == "install" and proc.returncode == 0:
            break
    missing = missing_binaries()
    if missing:
        return f"`{INSTALL}` did not install {', '.join(missing)}: {_last_line(tried[-1].stderr or tried[-1].stdout)}"
    return None


@pytest.fixture(scope="session")
def slurm_installed():
    """slurm-wlm and munge present (installed here with apt-get where missing and root), else the test is skipped."""
    reason = ensure_slurm_installed()
    if reason is None and os.geteuid() != 0:
        reason = "a local SLURM cluster needs root (slurmd launches the jobs); run the tests as root"
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(slurm_installed, tmp_path_factory):
    """A started one-node LocalSlurm for the session; stopped at its end, whatever happened."""
    cluster = LocalSlurm.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


def meanwhile(argv: list, cwd, env: dict, then) -> None:
    """``argv`` (a local sweep, say) in the background in ``cwd``, its output in ``cwd/local.out``, while ``then()``
    runs; then it must end with status 0 (killed if ``then`` raises)."""
    with open(cwd / "local.out", "w") as out:
        local = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        then()
        assert local.wait(timeout=600) == 0, (cwd / "local.out").read_text()
    finally:
        if local.poll() is None:
            local.kill()
            local.wait()
