"""The local SLURM cluster of tests/sweep/local_slurm.py works as the sweep's SLURM tests need it to."""

import os
import time
from pathlib import Path

import pytest
from sweep.local_slurm import LocalSlurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.serial]  # one cluster, its CPUs: alone


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_wrap_job_writes_its_output(slurm_cluster, tmp_path):
    out = tmp_path / "out.txt"
    jobid = slurm_cluster.submit("-o", str(out), "--wrap", "echo hello from $SLURM_JOB_ID")
    slurm_cluster.wait_until(lambda: slurm_cluster.job(jobid)["JobState"] == "COMPLETED", 20, f"job {jobid} to end")
    assert read(out).strip() == f"hello from {jobid}"
    assert slurm_cluster.job(jobid)["ExitCode"] == "0:0"


def test_two_one_cpu_jobs_run_side_by_side(slurm_cluster, tmp_path):
    assert slurm_cluster.cpus >= 2, "the node needs two CPUs"
    jobs = [
        slurm_cluster.submit("-n1", "-c1", "-D", str(tmp_path), "--wrap", f"date +%s.%N > start{i}; sleep 4")
        for i in range(2)
    ]
    slurm_cluster.wait_until(
        lambda: all(slurm_cluster.job(j)["JobState"] == "RUNNING" for j in jobs), 15, "both jobs RUNNING at once"
    )
    slurm_cluster.wait_until(lambda: all((tmp_path / f"start{i}").exists() for i in range(2)), 10, "start files")
    slurm_cluster.wait_until(lambda: not set(jobs) & set(slurm_cluster.queue()), 20, "both jobs to end")
    starts = [float(read(tmp_path / f"start{i}")) for i in range(2)]
    assert abs(starts[0] - starts[1]) < 3, starts


def test_array_runs_the_listed_tasks(slurm_cluster, tmp_path):
    jobid = slurm_cluster.submit(
        "--array=0,2", "-D", str(tmp_path), "-o", "task-%a.out", "--wrap", "echo $SLURM_ARRAY_TASK_ID"
    )
    slurm_cluster.wait_until(
        lambda: (
            all(j["JobState"] == "COMPLETED" for j in slurm_cluster.jobs(jobid)) and len(slurm_cluster.jobs(jobid)) == 2
        ),
        20,
        f"array {jobid} to end",
    )
    assert sorted(p.name for p in tmp_path.glob("task-*.out")) == ["task-0.out", "task-2.out"]
    assert [read(tmp_path / f"task-{i}.out").strip() for i in (0, 2)] == ["0", "2"]


REQUEUE_SCRIPT = """#!/bin/bash
echo "start ${SLURM_RESTART_COUNT:-0}" >> log
if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then echo second >> log; exit 0; fi
trap 'echo usr1 >> log; scontrol requeue $SLURM_JOB_ID; exit 0' USR1
echo ready >> log
for i in $(seq 300); do sleep 0.1; done
echo unsignalled >> log
"""


def test_usr1_trap_requeues_and_release_restarts(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(REQUEUE_SCRIPT)
    log = tmp_path / "log"
    jobid = slurm_cluster.submit("-D", str(tmp_path), "-o", "slurm.out", str(script))
    slurm_cluster.wait_until(lambda: "ready" in read(log), 20, "the script to set its trap")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", jobid)
    slurm_cluster.wait_until(lambda: slurm_cluster.job(jobid)["JobState"] == "PENDING", 20, "the requeue")
    assert read(log).splitlines()[:3] == ["start 0", "ready", "usr1"]
    assert slurm_cluster.job(jobid)["Restarts"] == "1"
    slurm_cluster.release(jobid)
    slurm_cluster.wait_until(lambda: slurm_cluster.job(jobid)["JobState"] == "COMPLETED", 20, "the second run")
    assert read(log).splitlines() == ["start 0", "ready", "usr1", "start 1", "second"]
    assert slurm_cluster.job(jobid)["Restarts"] == "1"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_stop_leaves_nothing_it_started(slurm_installed, tmp_path):
    started = time.monotonic()
    cluster = LocalSlurm.start(tmp_path / "cluster")
    startup = time.monotonic() - started
    try:
        pids = {name: p.pid for name, p in cluster.procs.items()}
        assert sorted(pids) == ["munged", "slurmctld", "slurmd"]
        jobid = cluster.submit("-D", str(tmp_path), "--wrap", "sleep 60")  # still running when the cluster stops
        cluster.wait_until(lambda: cluster.job(jobid)["JobState"] == "RUNNING", 20, "the job to run")
        ours = set(cluster.leftover_pids())
        assert set(pids.values()) <= ours and len(ours) > 3  # the daemons, slurmstepd and the job's processes
    finally:
        cluster.stop()
    cluster.stop()  # idempotent
    assert not [pid for pid in ours if alive(pid)]
    assert cluster.leftover_pids() == []
    assert startup < 30
    assert os.getpid() not in ours


SIGNAL_COUNTER = """#!/bin/bash
trap 'echo usr1 >> signals-$SLURM_ARRAY_TASK_ID' USR1
echo ready >> signals-$SLURM_ARRAY_TASK_ID
for i in $(seq 300); do sleep 0.1; done
"""


def test_signal_reaches_an_array_task_once_while_others_wait(slurm_cluster, tmp_path):
    """SLURM 22.05 answers 'try again later' to a signal for an array task whose siblings still wait (after
    delivering it), and scancel would resend it every few seconds: ``signal`` sends it once, in about a second."""
    script = tmp_path / "job.sh"
    script.write_text(SIGNAL_COUNTER)
    tasks = slurm_cluster.cpus + 1  # one more than the node runs at once, so one waits
    jobid = slurm_cluster.submit(f"--array=0-{tasks - 1}", "-D", str(tmp_path), "-o", "/dev/null", str(script))
    first = tmp_path / "signals-0"
    slurm_cluster.wait_until(lambda: "ready" in read(first), 20, "task 0 to start")
    assert any(j.endswith("]") or j == f"{jobid}_{tasks - 1}" for j in slurm_cluster.queue())  # a task waits
    started = time.monotonic()
    slurm_cluster.signal(f"{jobid}_0", "USR1")
    assert time.monotonic() - started < 5
    time.sleep(7)  # past scancel's first retry
    assert read(first).splitlines() == ["ready", "usr1"]
    slurm_cluster.run("scancel", jobid)
    slurm_cluster.wait_idle(30)
