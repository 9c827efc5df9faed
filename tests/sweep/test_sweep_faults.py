"""A sweep's mistakes and an unlucky cluster, each one line before anything is trained or submitted: a rate axis
with one rate, a --status that finds no sweep, a jobs.json of the wrong shape, a controller that cannot answer
(never read as "no such job", which would submit a job twice), and a trainer that cannot outlive its job."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import sized_grid_yaml

from gpt.sweep import controller


@pytest.fixture
def grid(train_yaml):
    return sized_grid_yaml(train_yaml("faults"), steps=6, checkpoint_every=6, eval_every=6)


def fake_slurm(tmp_path, scontrol: str, sbatch: str = 'touch "$(dirname "$0")/sbatch-called"; echo 99') -> dict:
    """A PATH whose scontrol and sbatch are the given shell lines (sbatch, by default, leaves a mark)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("scontrol", scontrol), ("sbatch", sbatch)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


DOWN = 'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1'
UNKNOWN = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'


def one_line(done, code=2):
    assert (done.returncode, done.stderr.count("\n"), "Traceback" in done.stderr) == (code, 1, False), done.stderr
    return done.stderr.removeprefix("error: ").rstrip("\n")


def test_one_rate_is_refused_before_anything_is_trained(grid, tmp_path, cli):
    for extra in ([], ["--dry-run"], ["--launcher", "slurm", "--dry-run"]):
        done = cli("sweep", grid, "--norm-types", "dyt", "--lrs", "1e-3", "--runs-dir", tmp_path / "r", *extra)
        assert one_line(done) == (
            "--lrs 1e-3: one rate leaves nothing to choose; give two or more, or train at one rate with "
            "--set optim.lr=0.001 instead of --lrs"
        )
        assert not (tmp_path / "r").exists()


def test_status_that_finds_no_sweep_says_so(grid, tmp_path, cli):
    base = ["sweep", grid, "--norm-types", "dyt", "--status"]
    assert one_line(cli(*base, "--runs-dir", tmp_path / "nowhere")) == (
        f"--runs-dir {tmp_path / 'nowhere'}: no such folder; give the sweep's --runs-dir (default: runs)"
    )
    (tmp_path / "file").write_text("x")
    assert "file: not a folder" in one_line(cli(*base, "--runs-dir", tmp_path / "file"))
    (tmp_path / "empty").mkdir()
    assert one_line(cli(*base, "--runs-dir", tmp_path / "empty")).startswith(
        f"{tmp_path / 'empty'}: no cell of this sweep has started there and it has no SLURM record (faults-slurm)"
    )


@pytest.mark.parametrize(
    "record", ["{}", '{"cells": {"faults-dyt-s0": 5}, "compare": null}', '{"cells": [], "compare": 3}']
)
def test_a_jobs_record_of_the_wrong_shape_is_one_line(grid, tmp_path, cli, record):
    jobs = tmp_path / "runs" / "faults-slurm" / "jobs.json"
    jobs.parent.mkdir(parents=True)
    jobs.write_text(record)
    message = one_line(cli("sweep", grid, "--norm-types", "dyt", "--status", cwd=tmp_path))
    assert message.startswith(f"{jobs.absolute()}: not a record of the sweep's jobs (expected ")
    assert message.endswith("delete it to resubmit every unfinished cell (finished ones are still skipped)")
    assert jobs.read_text() == record


def test_a_controller_that_cannot_answer_is_never_read_as_no_such_job(grid, tmp_path, cli):
    """A resubmission during a controller hiccup once submitted a pending cell and the comparison a second time."""
    folder = tmp_path / "runs" / "faults-slurm"
    folder.mkdir(parents=True)
    record = json.dumps({"cells": {"faults-dyt-s0": "12_0"}, "compare": "13"})
    (folder / "jobs.json").write_text(record)
    sweep = ["sweep", grid, "--norm-types", "dyt"]
    down = fake_slurm(tmp_path, DOWN)
    for args in (["--launcher", "slurm"], ["--status"]):
        assert one_line(cli(*sweep, *args, env=down, cwd=tmp_path)) == (
            "scontrol show job 12 failed: slurm_load_jobs error: Unable to contact slurm controller (connect "
            "failure); the SLURM controller could not say what became of the sweep's jobs, so nothing was "
            "submitted or changed: run the command again when it answers"
        )
    assert (folder / "jobs.json").read_text() == record and not (tmp_path / "bin" / "sbatch-called").exists()
    # "no such job" is still that: the cell's job is gone, and --status says it was never run to a result
    done = cli(*sweep, "--status", env=fake_slurm(tmp_path, UNKNOWN), cwd=tmp_path)
    assert done.returncode == 0 and "faults-dyt-s0" in done.stdout and "not submitted" in done.stdout


def test_cells_resubmitted_while_the_comparison_runs_get_a_comparison_after_them_and_it(grid, tmp_path, cli):
    """The job of a killed cell ends, its comparison starts (afterany) and compares without it; a resubmission
    in that window once left that comparison alone, so the resumed cell's result was never compared."""
    folder = tmp_path / "runs" / "faults-slurm"
    folder.mkdir(parents=True)
    (folder / "jobs.json").write_text(json.dumps({"cells": {"faults-dyt-s0": "12_0"}, "compare": "13"}))
    scontrol = (
        'case "$4" in 12) echo "JobId=12 ArrayJobId=12 ArrayTaskId=0 JobState=FAILED";; '
        '13) echo "JobId=13 JobState=RUNNING";; esac'
    )
    sbatch = 'echo "$@" >> "$(dirname "$0")/sbatch-calls"; echo $((20 + $(wc -l < "$(dirname "$0")/sbatch-calls")))'
    done = cli("sweep", grid, "--norm-types", "dyt", "--launcher", "slurm", env=fake_slurm(tmp_path, scontrol, sbatch),
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "faults-dyt-s0: resubmitted (job 12_0 failed)" in done.stdout
    assert "submitted comparison job 22 after 21, 13" in done.stdout
    calls = (tmp_path / "bin" / "sbatch-calls").read_text().splitlines()
    assert calls[1].startswith("--parsable --dependency=afterany:21:13 ")  # after the new cell and the running one
    assert json.loads((folder / "jobs.json").read_text()) == {"cells": {"faults-dyt-s0": "21_0"}, "compare": "22"}


def test_a_controller_that_does_not_answer_is_waited_for_a_bounded_time(grid, tmp_path, cli, monkeypatch):
    monkeypatch.setattr(controller, "TIMEOUT", 1)
    folder = tmp_path / "runs" / "faults-slurm"
    folder.mkdir(parents=True)
    (folder / "jobs.json").write_text(json.dumps({"cells": {"faults-dyt-s0": "12_0"}, "compare": None}))
    start = time.monotonic()
    done = cli("sweep", grid, "--norm-types", "dyt", "--status", env=fake_slurm(tmp_path, "sleep 20"), cwd=tmp_path)
    assert one_line(done) == (
        "scontrol show: no answer in 1 s; is the SLURM controller (slurmctld) up? nothing was submitted or "
        "changed: run the sweep command again when it answers"
    )
    assert time.monotonic() - start < 10


def test_the_comparison_job_names_every_cell_without_a_result_whatever_its_position(grid, tmp_path, monkeypatch):
    """Cell 0 cancelled mid-run (a partial run, 'interrupted'), cell 1 failed, cell 3 never trained: each is named
    with why and what to do, and every cell that has a run is compared (cell 0 among them, as it stands)."""
    from gpt.sweep import cell_job
    from gpt.sweep.slurm import SweepFolder
    from gpt.sweep.spec import SweepSpec

    spec = SweepSpec(grid, ["dyt", "pytorch_layernorm"], [0, 1], runs_dir=tmp_path / "runs")
    folder = SweepFolder.of(grid, spec.runs_dir)
    cells = spec.grid_cells()
    for cell, status in zip(cells[:3], ("interrupted", "completed", "completed")):
        cell.run.path.mkdir(parents=True)
        cell.run.config_file.write_text("run: {}\n")
        cell.run.metrics_file.write_text('{"step": 1, "train_loss": 5.0}\n')
        (cell.run.path / "summary.json").write_text(json.dumps({"status": status}))
    folder.record({"event": "end", "outcome": "failed", "exit": 1, "error": "error: out of memory"}, cells[1].name)
    compared = {}
    monkeypatch.setattr(
        cell_job, "compare_grid", lambda present, out, failed, **_: compared.update(present=present, failed=failed)
    )
    cell_job.compare_sweep(spec, folder)
    assert compared["present"] == [c.run.path for c in cells[:3]]
    assert compared["failed"] == {
        cells[0].name: "interrupted, not finished (its job was cancelled, killed or ran out of time); run the sweep "
        "command again to resume it",
        cells[1].name: "error: out of memory",
        cells[3].name: f"no run in {cells[3].run.path} (its job never trained it)",
    }


CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[2], "w").write("term"), sys.exit(0)))
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
"""
JOB = """
import sys
from gpt.sweep.cell_job import Child
Child().run([sys.executable, *sys.argv[1:]])
"""


@pytest.mark.slow
def test_a_jobs_child_dies_with_the_job(tmp_path):
    """The job's child (the trainer, in a session of its own) gets SIGTERM when the job's process is killed -9,
    as scancel -s KILL, a hard time limit or the OOM killer do; before, it trained on outside its job."""
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "job.py").write_text(JOB)
    pid_file, said = tmp_path / "child.pid", tmp_path / "said"
    job = subprocess.Popen([sys.executable, tmp_path / "job.py", tmp_path / "child.py", pid_file, said])
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 10
    while not (said.is_file() and said.read_text()) and time.monotonic() < deadline:  # created, then written
        time.sleep(0.05)
    assert said.read_text() == "term"  # told to stop, as the trainer is on SIGTERM: it checkpoints and exits
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)  # gone (or a zombie waiting for init)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
