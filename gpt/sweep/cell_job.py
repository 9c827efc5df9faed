"""What runs inside a sweep's SLURM jobs (``gpt.sweep.slurm`` writes them): one cell, or the comparison.

A cell job trains its run (``--resume auto``: a requeued job continues from the newest checkpoint) and
evaluates it, each in a child process group, and records what happened in the sweep's ``events/``:

- ``USR1`` (asked for before the time limit, ``--signal=B:USR1@S``): the trainer is told to stop (SIGTERM:
  it finishes its step, checkpoints and exits "interrupted"), then the job requeues itself;
- ``TERM`` (``scancel``, a preemption, ``scontrol requeue``): the trainer is stopped the same way and the
  job ends; SLURM requeues a preempted job itself, a cancelled one waits for the sweep to be resubmitted;
- any other end without a result (a config the trainer refuses, a crash) is a failure: recorded with the
  error's line, never requeued, and named by the comparison.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading

from gpt.common.errors import UserError, shortened
from gpt.common.files import read_json
from gpt.run.directory import COMPARISON_FILE, FINISHED
from gpt.sweep import controller
from gpt.sweep.launch import compare_grid, evaluate_command, launcher, train_command
from gpt.sweep.slurm import SlurmOptions, SweepFolder, has_result, submit_sweep
from gpt.sweep.spec import SweepSpec

# torch's shared rendezvous store never tells a node that replaces a lost one where to meet (it would wait forever)
RENDEZVOUS_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"


def job_nodes() -> int:
    return int(os.environ.get("SLURM_NNODES", "1"))


def on_each_node(nodes: int) -> list[str]:
    """``srun`` one task on each of this job's nodes."""
    return ["srun", "--kill-on-bad-exit=1", f"--ntasks={nodes}", "--ntasks-per-node=1"]


@functools.cache
def rendezvous() -> str:
    """Where this job's nodes meet: the first node (where the job's batch script, this process, runs) at a port
    free there now. Not a fixed port: two cells that share a node would meet each other's nodes at it."""
    with socket.socket() as s:
        s.bind(("", 0))
        return f"{controller.head_node()}:{s.getsockname()[1]}"


def job_launcher(nproc: int) -> list[str]:
    """``launch.launcher`` on this job's nodes: on several, one torchrun per node under ``srun``, meeting at
    the first node (c10d rendezvous keyed by the job id)."""
    nodes = job_nodes()
    if nodes == 1:
        return launcher(nproc)
    return [
        *on_each_node(nodes),
        *("env", RENDEZVOUS_ENV),
        *(sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={nproc}"),
        f"--rdzv-id={os.environ['SLURM_JOB_ID']}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous()}",
        "-m",
    ]


def preflight_command() -> list[str] | None:
    """On several nodes, what runs before the training: the nodes meet at the rendezvous the training will use
    (``preflight --nodes``), or the cell fails with the one line naming the node that cannot and why."""
    nodes = job_nodes()
    if nodes == 1:
        return None
    return [
        *on_each_node(nodes),
        sys.executable,
        "-m",
        "gpt.commands.preflight",
        f"--nodes={nodes}",
        f"--rendezvous={rendezvous()}",
    ]


class Child:
    """The job's one child process group (training, then evaluation), told to stop on USR1 or TERM."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.requeue = self.stop = False
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        first = not self.told_to_stop  # a repeated signal (scancel retries) is not a second, hurrying SIGTERM
        self.requeue = self.requeue or signum == signal.SIGUSR1
        self.stop = self.stop or signum == signal.SIGTERM
        if first and self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the trainer's own stop: finish the step, checkpoint, exit

    def run(self, command: list[str]) -> tuple[int, str | None]:
        """Run ``command``; its exit status and the line it ended on (its ``error:`` line, else its last)."""
        self.proc = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=die_with(os.getpid())
        )
        last: list[str] = []
        reader = threading.Thread(target=_copy_lines, args=(self.proc.stderr, last), daemon=True)
        reader.start()
        code = self.proc.wait()
        reader.join(timeout=10)
        errors = [line for line in last if line.startswith("error:")]
        return code, (errors or last or [None])[-1]

    @property
    def told_to_stop(self) -> bool:
        return self.requeue or self.stop


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def die_with(parent: int):
    """What the job's child runs before its command (Linux): SIGTERM to itself when the job's process dies. The
    child has a session of its own (so that a signal to the job is the job's to pass on), so a job process
    killed with -9 (``scancel -s KILL``, a hard time limit, the OOM killer) would leave it training outside
    SLURM, holding the run's lock; with this it checkpoints and stops within seconds, as on any SIGTERM."""
    if not sys.platform.startswith("linux"):
        return None

    def child() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the job died before prctl: the signal would never come
            os.kill(os.getpid(), signal.SIGTERM)

    return child


def _copy_lines(stream, last: list[str]) -> None:
    """Pass a child's stderr on to the job's log, keeping its non-empty lines' last few."""
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.strip():
            last.append(line.strip())
            del last[:-20]


def run_cell_job(spec: SweepSpec, index: int, folder: SweepFolder) -> int:
    """Train and evaluate the sweep's cell ``index`` inside its job; the job's exit status (0 for a result or a
    requeue)."""
    cell, nproc, child = spec.cells()[index], spec.nproc, Child()
    folder.record({"event": "start", **controller.this_job(), "status": cell.run.status()}, cell.name)
    code, error = 0, None
    if cell.run.status() not in FINISHED:
        if preflight := preflight_command():  # several nodes: they must meet first
            code, error = child.run(preflight)
        if code == 0 and not child.told_to_stop:
            code, error = child.run(train_command(spec.config, cell, nproc, job_launcher(nproc)))
    if cell.run.status() in FINISHED and not has_result(cell) and not child.told_to_stop:
        code, error = child.run(evaluate_command(cell, nproc))
    if has_result(cell):
        folder.record({"event": "end", "outcome": "done", "status": cell.run.status()}, cell.name)
        return 0
    if child.requeue:
        folder.record({"event": "end", "outcome": "requeued", "status": cell.run.status()}, cell.name)
        controller.requeue_self()
        return 0
    if child.stop:
        folder.record({"event": "end", "outcome": "stopped", "status": cell.run.status()}, cell.name)
        return 128 + signal.SIGTERM
    error = error or f"exit status {code}"
    folder.record({"event": "end", "outcome": "failed", "exit": code, "error": error}, cell.name)
    print(f"{cell.name}: failed, not requeued: {error}", file=sys.stderr)
    return 1


def compare_sweep(spec: SweepSpec, folder: SweepFolder, options: SlurmOptions | None = None) -> dict:
    """The comparison of every cell with a run folder; the cells whose job failed (or never left one) are
    named in it with their error, and so are those cancelled or killed before they finished, whatever their
    position. A two-stage sweep's first comparison is the selection: it chooses the rates
    and, where a chosen rate's confirmation cells have no job yet, submits them and the final comparison
    (``options``: the cells' SLURM options); the final comparison is of the confirmation cells alone."""
    if not spec.confirm_seeds:
        return _compare_cells(spec.grid_cells(), folder, spec.comparison, spec.compare_options())
    jobs = folder.jobs()["cells"]
    confirmation = spec.confirmation_cells()
    if not confirmation or any(c.name not in jobs and not has_result(c) for c in confirmation):
        result = _compare_cells(spec.grid_cells(), folder, spec.selection_comparison, spec.compare_options())
        confirmation = spec.confirmation_cells(spec.chosen_rates(result["selection"]))
        if any(c.name not in jobs and not has_result(c) for c in confirmation):
            submit_sweep(spec, folder, options or SlurmOptions())
            return result
    selection = read_json(spec.selection_comparison / COMPARISON_FILE, "the sweep's selection")["selection"]
    return _compare_cells(confirmation, folder, spec.comparison, spec.confirmation_options(selection))


def _compare_cells(cells: list, folder: SweepFolder, out, options: dict) -> dict:
    failed = {}
    for cell in cells:
        ends = [e for e in folder.events(cell.name) if e["event"] == "end"]
        if ends and ends[-1]["outcome"] == "failed":
            failed[cell.name] = ends[-1].get("error") or "failed"
        elif not (cell.run.config_file.is_file() and cell.run.metrics_file.is_file()):
            failed[cell.name] = f"no run in {cell.run.path} (its job never trained it)"
        elif (status := cell.run.status()) not in FINISHED:  # compared as it stands, and named: it has no result
            failed[cell.name] = (
                f"{status}, not finished (its job was cancelled, killed or ran out of time); run the sweep command "
                "again to resume it"
            )
    present = [c.run.path for c in cells if c.run.config_file.is_file() and c.run.metrics_file.is_file()]
    if not present:  # nothing to compare: say why each cell has nothing
        raise UserError(f"no cell has a run to compare: {shortened([f'{c}: {e}' for c, e in failed.items()])}")
    return compare_grid(present, out, failed=failed, **options)
