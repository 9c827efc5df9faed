"""A real one-node SLURM cluster on this machine, for tests: munged, slurmctld and slurmd as child processes.

``LocalSlurm.start(root)`` writes a MUNGE key and a slurm.conf under ``root``, starts the three daemons in the
foreground (so their PIDs are ours), waits until ``sinfo`` reports the node idle and returns the cluster; ``stop()``
cancels its jobs and ends every process it started, and nothing else. Commands reach it through ``.env``
(``SLURM_CONF`` points at the written slurm.conf, whose ``AuthInfo=socket=`` names our munged's socket).

Needs root (slurmd launches the jobs) and Debian's ``slurm-wlm`` and ``munge`` (tests/sweep/conftest.py installs
them where it can, and skips with the reason where it cannot).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from run.netns import Nodes

# Where Debian puts the daemons; a non-root PATH often lacks the sbin folders.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sinfo", "squeue", "sbatch", "scontrol", "scancel")
START_TIMEOUT = 30.0
STOP_GRACE = 5.0


def which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def missing_binaries() -> list[str]:
    """The daemons and commands the cluster needs that are not installed."""
    return [name for name in (*DAEMONS, *COMMANDS) if which(name) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_name() -> str:
    """This machine's short host name, added to /etc/hosts (as 127.0.0.1) when it does not resolve and we are root."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
    except OSError:
        if os.geteuid() != 0:
            raise RuntimeError(f"host name {name!r} does not resolve; add '127.0.0.1 {name}' to /etc/hosts") from None
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"\n127.0.0.1 {name}\n")
    return name


def node_hardware() -> tuple[int, int]:
    """(CPUs, RealMemory in MB) as ``slurmd -C`` reports them, else os.cpu_count() and 1000 MB a CPU."""
    cpus, memory = os.cpu_count() or 1, 0
    try:
        line = subprocess.run([which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        line = ""
    if m := re.search(r"\bCPUs=(\d+)", line):
        cpus = int(m.group(1))
    if m := re.search(r"\bRealMemory=(\d+)", line):
        memory = int(m.group(1))
    return cpus, memory or 1000 * cpus


def _die_with_parent() -> None:
    """In the forked child before exec: SIGTERM when the process that started it ends (Linux prctl PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def parse_fields(line: str) -> dict[str, str]:
    """``scontrol show -o`` output: space-separated Key=Value pairs whose values may hold spaces."""
    keys = list(re.finditer(r"(?:^|\s)([A-Za-z][\w/:]*)=", line))
    out = {}
    for m, nxt in zip(keys, [*keys[1:], None]):
        out[m.group(1)] = line[m.end() : nxt.start() if nxt else len(line)].strip()
    return out


@dataclass
class LocalSlurm:
    root: Path
    conf: Path  # the written slurm.conf
    env: dict[str, str]  # os.environ (minus any SLURM_*/SBATCH_* of an enclosing job) plus SLURM_CONF
    node: str  # the first node's name: the controller's and the batch scripts' host
    cpus: int  # each node's
    nodes: Nodes | None = None  # on several nodes (tests/run/netns.py), else this machine's one
    logs: dict[str, Path] = field(default_factory=dict)  # daemon name -> its log file
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # daemon name -> its process
    socket_dir: Path | None = None  # munged's socket folder, in /tmp; removed by stop()

    # ---- starting and stopping ----

    @classmethod
    def start(cls, root: Path, cpus: int | None = None, nodes: Nodes | None = None) -> LocalSlurm:
        """The cluster on this machine (one node), or on ``nodes``: a slurmd in each node's namespace under the
        node's name, slurmctld on the first; the commands then run on the first node, as a user's on a login node."""
        root = Path(root).resolve()
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)} (apt-get install -y slurm-wlm munge)")
        names = [nodes.name(i) for i in range(nodes.count)] if nodes else [node_name()]
        node = names[0]
        hw_cpus, memory = node_hardware()
        cpus = cpus or hw_cpus
        mem_per_cpu = max(1, min(1000, memory // cpus))

        etc, state, spool, run, log = (root / d for d in ("etc", "state", "spool", "run", "log"))
        for d in (etc, state, *(spool / f"slurmd-{name}" for name in names), run, log):
            d.mkdir(parents=True, exist_ok=True)
        # munged refuses a key readable by others, and a socket in a folder not reachable by all: every folder
        # above the socket must be world-executable (pytest's tmp folders are 0700) and its path under 108 bytes.
        # So the key, seed and pid live in a 0700 folder under root, the socket in a 0755 one of our own in /tmp.
        munge_private = root / "munge"
        munge_private.mkdir(mode=0o700, exist_ok=True)
        os.chmod(munge_private, 0o700)
        sock_dir = Path(tempfile.mkdtemp(prefix="local-slurm-munge-", dir="/tmp" if os.path.isdir("/tmp") else None))
        os.chmod(sock_dir, 0o755)
        munge_socket = sock_dir / "munge.socket.2"
        key = munge_private / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)

        conf = etc / "slurm.conf"
        conf.write_text(
            "\n".join(
                [
                    "ClusterName=local",
                    f"SlurmctldHost={node}",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "SlurmUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={munge_socket}",
                    f"StateSaveLocation={state}",
                    f"SlurmdSpoolDir={spool}/slurmd-%n",
                    f"SlurmctldPidFile={run}/slurmctld.pid",
                    f"SlurmdPidFile={run}/slurmd-%n.pid",
                    f"SlurmctldLogFile={log}/slurmctld.log",
                    f"SlurmdLogFile={log}/slurmd-%n.log",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    # pgid: linuxproc leaks the children of a script that traps signals; task/none: no cgroups
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    # one CPU and DefMemPerCPU MB a job by default, so 1-CPU jobs run side by side
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU_Memory",
                    f"DefMemPerCPU={mem_per_cpu}",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=2,bf_interval=1",
                    "KillWait=5",
                    "MinJobAge=3600",  # finished jobs stay in `scontrol show job` (no accounting, so no sacct)
                    "ReturnToService=2",
                    "JobRequeue=1",
                    "InactiveLimit=0",
                    "SlurmdTimeout=300",
                    *(f"NodeName={name} CPUs={cpus} RealMemory={mem_per_cpu * cpus} State=UNKNOWN" for name in names),
                    "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        env["SLURM_CONF"] = str(conf)
        env["PATH"] = SEARCH_PATH
        cluster = cls(root=root, conf=conf, env=env, node=node, cpus=cpus, nodes=nodes, socket_dir=sock_dir)
        cluster.logs = {
            "munged": log / "munged.stdout",  # in the foreground munged logs to stderr, not its --log-file
            "slurmctld": log / "slurmctld.log",
            **{cluster.slurmd(i): log / f"slurmd-{name}.log" for i, name in enumerate(names)},
        }
        try:
            cluster._spawn(
                "munged",
                [
                    which("munged"),
                    "--foreground",
                    f"--socket={munge_socket}",
                    f"--key-file={key}",
                    f"--log-file={cluster.logs['munged']}",
                    f"--pid-file={munge_private / 'munged.pid'}",
                    f"--seed-file={munge_private / 'munged.seed'}",
                ],
            )
            cluster.wait_until(munge_socket.exists, 10, "munged's socket", check_alive=True)
            cluster._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(conf)])
            for i, name in enumerate(names):
                cluster._spawn(cluster.slurmd(i), [which("slurmd"), "-D", "-f", str(conf), "-N", name], node=i)
            cluster.wait_until(
                lambda: cluster._sinfo_states() == ["idle"] * len(names),
                START_TIMEOUT,
                f"node(s) {', '.join(names)} idle in sinfo",
                check_alive=True,
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def slurmd(self, i: int) -> str:
        """The name the slurmd of node i goes by here (in ``procs`` and ``logs``)."""
        return "slurmd" if self.nodes is None else f"slurmd-{self.nodes.name(i)}"

    def on_node(self, argv: list, node: int = 0, init: bool = False) -> list[str]:
        """``argv`` as it runs on node ``node`` (the first: the controller's), on this machine if there is one;
        ``init``: under a PID 1 that reaps orphans (``Nodes.command``)."""
        argv = [str(a) for a in argv]
        return argv if self.nodes is None else self.nodes.command(node, argv, init=init)

    def _spawn(self, name: str, argv: list, node: int = 0) -> None:
        argv = self.on_node(argv, node, init=True)  # a daemon is no init: its jobs' orphans are reaped by one
        out = open(self.root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 (closed by the child's end)
        try:
            self.procs[name] = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our Ctrl-C does not reach them; stop() does
                preexec_fn=_die_with_parent,  # nor do they outlive a killed pytest
            )
        finally:
            out.close()

    def _sinfo_states(self) -> list[str]:
        """Each node's state as sinfo says it (none while the controller does not answer)."""
        try:
            proc = subprocess.run(
                self.on_node(["sinfo", "-h", "-N", "-o", "%t"]),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            return []
        return proc.stdout.split() if proc.returncode == 0 else []

    def stop(self) -> None:
        """Cancel the jobs, then end the daemons and any job process they left (SIGTERM, then SIGKILL). Idempotent."""
        if not self.procs:
            return
        alive = {name: p for name, p in self.procs.items() if p.poll() is None}
        if {"slurmctld", "munged", self.slurmd(0)} <= alive.keys():
            try:
                jobs = self.queue()
                if jobs:
                    subprocess.run(
                        self.on_node(["scancel", "--full", *jobs]), env=self.env, capture_output=True, timeout=10
                    )
                    self.wait_until(lambda: not self.queue(), 15, "cancelled jobs to leave the queue")
            except (subprocess.SubprocessError, TimeoutError, OSError):
                pass  # the daemons are ended anyway; leftovers are swept below
        slurmds = [name for name in self.procs if name.startswith("slurmd")]
        for name in (*slurmds, "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # its group: on a node, the wrappers ignore SIGTERM
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(STOP_GRACE)
        for pid in self.leftover_pids():  # slurmstepd and job processes, re-parented away from slurmd
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.procs.clear()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        """Processes of this cluster (daemons, slurmstepd, jobs): those whose environment holds our SLURM_CONF."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            if marker in environ.split(b"\0"):
                pids.append(int(entry.name))
        return pids

    def __enter__(self) -> LocalSlurm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what tests use ----

    def run(self, *args: str, timeout: float = 30, env: dict[str, str] | None = None) -> str:
        """Run a SLURM command (``run("squeue", "-h")``) against this cluster (in ``env``, else ``.env``);
        check=True; its stdout."""
        proc = subprocess.run(self.on_node(args), env=env or self.env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc.stdout

    def submit(self, *args: str, env: dict[str, str] | None = None) -> str:
        """``sbatch --parsable ARGS`` (in ``env``, which the job inherits): the new job's id."""
        return self.run("sbatch", "--parsable", *args, env=env).strip().split(";")[0]

    def queue(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running, completing); a pending array shows as ``N_[0,2]``."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def jobs(self, jobid: str | int) -> list[dict[str, str]]:
        """``scontrol show job -o JOBID`` parsed, one dict a job (an array's id gives one a task)."""
        return [parse_fields(line) for line in self.run("scontrol", "show", "job", "-o", str(jobid)).splitlines()]

    def job(self, jobid: str | int) -> dict[str, str]:
        """``scontrol show job -o JOBID`` parsed: JobState, Restarts, ExitCode, BatchHost... (strings)."""
        return self.jobs(jobid)[0]

    def state(self, jobid: str | int) -> str:
        return self.job(jobid)["JobState"]

    def wait_until(
        self, predicate: Callable[[], object], timeout: float = 30, what: str = "", check_alive: bool = False
    ):
        """Poll ``predicate`` every 0.2 s until it is truthy (returned) or ``timeout`` s pass (TimeoutError naming
        ``what``, the queue and the log files)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            dead = [n for n, p in self.procs.items() if p.poll() is not None] if check_alive else []
            if dead or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        reason = f"{', '.join(dead)} exited" if dead else f"timed out after {timeout:g} s"
        logs = "\n".join(f"--- {name}: {path}\n{tail(path)}" for name, path in self.all_logs().items())
        raise TimeoutError(f"waiting for {what or predicate}: {reason}\n{self._queue_text()}\n{logs}")

    def all_logs(self) -> dict[str, Path]:
        """The daemons' log files (their captured stdout/stderr where the log file is missing or empty)."""
        out = {}
        for name, path in self.logs.items():
            stdout = self.root / "log" / f"{name}.stdout"
            if stdout != path and not (path.exists() and path.stat().st_size) and stdout.exists():
                path = stdout  # a daemon that ended before it opened its log file said why here
            out[name] = path
        return out

    def _queue_text(self) -> str:
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return "squeue: no slurmctld running"
        try:
            return "squeue:\n" + self.run("squeue", "-o", "%i %T %r %N", timeout=5)
        except (subprocess.SubprocessError, OSError) as e:
            return f"squeue failed: {e}"

    def signal(self, jobid: str | int, sig: str = "USR1", batch: bool = True, timeout: float = 30) -> None:
        """``scancel --signal=SIG --batch JOBID``, the signal sent once, to a RUNNING job or array task.

        SLURM 22.05 signals an array task (``N_0``) while other tasks of its array still wait, yet answers "Job can not
        be altered now, try again later", and scancel then sends the signal again every 5-14 s until the task ends
        (and hangs meanwhile). So scancel runs verbose and is stopped at its first "retrying": the task had its signal.
        """
        state = self.job(jobid)["JobState"]
        if state != "RUNNING":
            raise RuntimeError(f"job {jobid} is {state}, not RUNNING: SLURM would not signal it")
        argv = ["scancel", "-v", f"--signal={sig}", *(["--batch"] if batch else []), str(jobid)]
        proc = subprocess.Popen(
            self.on_node(argv),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        lines = []
        try:
            for line in proc.stdout:  # scancel prints a line at least every 5-14 s, or ends
                lines.append(line)
                if "transitional state, retrying" in line:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{' '.join(argv)}: no answer in {timeout:g} s:\n{''.join(lines)}")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, "".join(lines))

    def release(self, jobid: str | int) -> None:
        """Let a requeued job (held back ~120 s by its BeginTime) start within seconds."""
        # not now: a job started again in the second its requeue revoked its credential is killed ("Job credential
        # revoked") and ends FAILED
        self.run("scontrol", "update", f"jobid={jobid}", "StartTime=now+2")

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until the queue is empty."""
        self.wait_until(lambda: not self.queue(), timeout, "an empty queue")
