"""N "nodes" on this machine, for tests: Linux network namespaces with their own addresses and host names.

``Nodes.start(n)`` makes a namespace per node and one for a switch: a bridge there, and a veth pair from it to
each node's ``eth0`` (10.77.0.1, .2, ...). Each node has its own loopback and its own hosts file naming every
node (``/etc/netns/NS/hosts``, bound over /etc/hosts in the node's own mount namespace); each process started on
it gets the node's network (``nsenter --net``), host name and PIDs (``unshare --uts --pid``), as on a cluster:
what one node opens on ``localhost`` the other cannot reach, and a PID on one means nothing on the other. The
file system is shared, as a cluster's shared file system is.

Everything the test starts is a child of ours, in a session of its own; ``stop()`` ends each by its process
group, kills anything still in a namespace, then deletes the namespaces (their veths go with them) and the hosts
files. Nothing is left behind, also when the test fails (the context manager stops it).

Needs root and iproute2's ``ip`` (``can_run()`` says why not where either is missing). The namespace names carry
our PID, so two pytest workers each have their own nodes; the addresses are the same in each, but no two sets
share a bridge.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# PID 1 of a node's PID namespace where asked: runs its arguments, passes SIGTERM/SIGINT on, reaps every orphan,
# and exits as its child did.
REAPER = """
import os, signal, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, f: child.send_signal(s))
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        sys.exit(0)
    except InterruptedError:
        continue
    if pid == child.pid:
        sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""
SUBNET = "10.77.0"  # node i has SUBNET.(i + 1); the addresses exist inside the namespaces only
NETNS_ETC = Path("/etc/netns")


def can_run() -> str | None:
    """Why nodes cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2's ip and util-linux's unshare"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def namespaces() -> set[str]:
    """The network namespaces this machine has now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def links() -> set[str]:
    """The network interfaces of the root namespace."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


@dataclass
class Nodes:
    prefix: str  # namespace names: PREFIX-sw (the switch), PREFIX-0, PREFIX-1, ...
    count: int
    procs: list[subprocess.Popen] = field(default_factory=list)  # every process started on a node, in order

    @classmethod
    def start(cls, count: int, prefix: str | None = None) -> Nodes:
        nodes = cls(prefix or f"gn{os.getpid()}", count)
        try:
            nodes._make()
        except BaseException:
            nodes.stop()
            raise
        return nodes

    def name(self, i: int) -> str:
        """Node i's host name (and the name the others resolve to its address)."""
        return f"node{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def netns(self, i: int) -> str:
        return f"{self.prefix}-{i}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(i)} {self.name(i)}\n" for i in range(self.count))
        for i in range(self.count):
            ns, inside, outside = self.netns(i), f"{self.prefix}-v{i}", f"{self.prefix}-b{i}"
            _ip("netns", "add", ns)
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(hosts)
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", outside, "master", "br0")
            _ip("-n", self.switch, "link", "set", outside, "up")
            _ip("-n", ns, "link", "set", inside, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def command(self, i: int, argv: list[str], private: tuple[Path, ...] = (), init: bool = False) -> list[str]:
        """``argv`` as it runs on node i: in its namespace, under its host name, with its own PIDs and hosts file,
        and with an empty folder of its own over each of ``private`` (a disk no other node sees). ``init``: under
        a PID 1 that reaps orphans (a daemon such as slurmd is no init: its jobs' orphans would stay zombies, and
        slurmstepd waits for their process group to empty).

        ``nsenter`` rather than ``ip netns exec``: the latter mounts a fresh /sys without the cgroup file systems,
        and slurmd will not start without them; the hosts file is bound in the node's own mount namespace."""
        unshare = ["unshare", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc"]
        mounts = "".join(f"mount -t tmpfs node-{i}-own {shlex.quote(str(p))} && " for p in private)
        hosts = shlex.quote(str(NETNS_ETC / self.netns(i) / "hosts"))
        script = f'mount --bind {hosts} /etc/hosts && hostname "$0" && {mounts}exec "$@"'
        netns = f"--net=/run/netns/{self.netns(i)}"
        reaper = [sys.executable, "-c", REAPER] if init else []
        return ["nsenter", netns, *unshare, "sh", "-c", script, self.name(i), *reaper, *argv]

    def popen(self, i: int, argv: list[str], private: tuple[Path, ...] = (), **kwargs) -> subprocess.Popen:
        """Start ``argv`` on node i in a session of its own (``stop`` ends its whole group)."""
        proc = subprocess.Popen(self.command(i, argv, private), start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, i: int, argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        proc = self.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def pids(self, i: int) -> list[int]:
        """Every process in node i's network namespace now."""
        out = subprocess.run(["ip", "netns", "pids", self.netns(i)], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def kill_node(self, i: int) -> list[int]:
        """Node i lost at once: SIGKILL to every process in its namespace (its agent and workers); their PIDs."""
        pids = self.pids(i)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """End every process started here (SIGTERM to its group, SIGKILL after 5 s), anything else still in a
        namespace, then the namespaces, their veths and their hosts files."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        existing = namespaces()
        for ns in [self.netns(i) for i in range(self.count)] + [self.switch]:
            if ns in existing:
                for pid in self.pids(int(ns.rsplit("-", 1)[1])) if ns != self.switch else []:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        for i in range(self.count):  # a veth still in the root namespace (a start that failed half-way)
            if f"{self.prefix}-v{i}" in links():
                subprocess.run(["ip", "link", "del", f"{self.prefix}-v{i}"], capture_output=True, timeout=30)

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
