"""The SLURM controller as a sweep uses it, and nothing else: submit a script (``sbatch``), read a job's state
(``scontrol show job``; ``sacct`` needs the accounting database many clusters have and a small one
lacks), move a pending job's dependency, requeue a job from inside it.

Every call is one line of error when SLURM is missing or refuses, naming the command and its answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpt.common.errors import UserError, clipped

# States in which a job will still run (or is running): a sweep leaves such a cell alone.
ACTIVE = frozenset(
    [
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
    ]
)


def require(*commands: str) -> None:
    """Refuse, in one line, to go on where a SLURM command is missing (before anything is written)."""
    for name in commands:
        if shutil.which(name) is None:
            raise UserError(
                f"{name}: not found; --launcher slurm runs on a SLURM cluster's login node (where sbatch "
                "and scontrol are on PATH), or use --launcher local"
            )


TIMEOUT = 30  # seconds a SLURM command may take: a controller that does not answer is said, not waited for
UNKNOWN_JOB = "Invalid job id specified"  # scontrol's answer for a job the controller does not know


def _answer(done: subprocess.CompletedProcess) -> str:
    return clipped((done.stderr or done.stdout).strip().replace("\n", " ")) or f"exit status {done.returncode}"


def _slurm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    require(args[0])
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{' '.join(args[:2])}: no answer in {TIMEOUT} s; is the SLURM controller (slurmctld) up? nothing was "
            "submitted or changed: run the sweep command again when it answers"
        ) from None
    if check and done.returncode != 0:
        raise UserError(f"{' '.join(args[:2])} failed: {_answer(done)}")
    return done


def submit(script: Path, dependency: str | None = None) -> str:
    """Submit ``script`` with ``sbatch``; returns the job id (for an array, the array's id)."""
    extra = [f"--dependency={dependency}"] if dependency else []
    out = _slurm("sbatch", "--parsable", *extra, str(script)).stdout.strip()
    return out.split(";")[0]  # --parsable prints "jobid[;cluster]"


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields of ``job_id`` (``123`` or an array task ``123_4``); {} for a job the
    controller does not know (never submitted, a pending array task cancelled, or a record expired:
    MinJobAge). An array task still pending is one line of the array's, its ``ArrayTaskId`` a range. A controller
    that cannot answer is a UserError, never read as "no such job" (that would submit the job a second time)."""
    array, _, task = job_id.partition("_")
    done = _slurm("scontrol", "show", "job", "--oneliner", array, check=False)
    if done.returncode != 0 and UNKNOWN_JOB in (done.stderr + done.stdout):
        return {}
    if done.returncode != 0:  # not "no such job": the controller could not say (down, restarting, refused)
        raise UserError(
            f"scontrol show job {array} failed: {_answer(done)}; the SLURM controller could not say what became of "
            "the sweep's jobs, so nothing was submitted or changed: run the command again when it answers"
        )
    for line in done.stdout.splitlines():
        fields = dict(word.partition("=")[::2] for word in line.split() if "=" in word)
        if not task or task in task_ids(fields.get("ArrayTaskId", "")):
            return fields
    return {}


def task_ids(spec: str) -> set[str]:
    """The task ids of an ``ArrayTaskId`` such as ``4``, ``0-1,3`` or ``0-7%2`` (at most 2 at once)."""
    ids = set()
    for part in spec.split("%")[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            ids.update(str(i) for i in range(int(first), int(last or first) + 1))
    return ids


def state(job_id: str | None) -> str | None:
    """A job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED`` ...), None if unknown."""
    return job_info(job_id).get("JobState") if job_id else None


def set_dependency(job_id: str, dependency: str) -> None:
    """Replace a pending job's dependency (the comparison waits for a resubmitted cell too)."""
    _slurm("scontrol", "update", f"JobId={job_id}", f"Dependency={dependency}")


def requeue_self() -> None:
    """Requeue the job this process runs in (its time limit is near): it runs again from the start of its
    script, which resumes the run from its checkpoint."""
    _slurm("scontrol", "requeue", os.environ["SLURM_JOB_ID"])


def head_node() -> str:
    """The first node of this job (where a multi-node run meets)."""
    return _slurm("scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]).stdout.split()[0]


def this_job() -> dict:
    """Who this process is in SLURM's eyes: its job id (``123_4`` for an array task), how often it was
    requeued and where it runs ({} outside a job)."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return {}
    array = env.get("SLURM_ARRAY_JOB_ID")
    return {
        "job": f"{array}_{env['SLURM_ARRAY_TASK_ID']}" if array else env["SLURM_JOB_ID"],
        "job_id": env["SLURM_JOB_ID"],
        "restarts": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "nodes": env.get("SLURM_JOB_NODELIST", ""),
    }
