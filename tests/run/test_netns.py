"""The nodes of tests/run/netns.py are separate as a cluster's are, and leave nothing behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run.netns import NETNS_ETC, Nodes, can_run, links, namespaces

pytestmark = [pytest.mark.slow, pytest.mark.nodes]

if reason := can_run():
    pytest.skip(reason, allow_module_level=True)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_each_node_has_its_own_name_address_pids_and_loopback():
    with Nodes.start(2, prefix=f"gt{os.getpid()}") as nodes:
        # a server on node0's loopback and on its address; node1 reaches the second alone, by node0's name
        server = nodes.popen(0, [sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "listening"
        probe = nodes.run(1, [sys.executable, "-c", PROBE])
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.split() == ["node1", "node0=10.77.0.1", "address:ok", "loopback:refused", "pid:1"]


SERVE = """
import socket, threading
a, b = socket.create_server(("127.0.0.1", 4000)), socket.create_server(("10.77.0.1", 4000))
print("listening", flush=True)
threading.Thread(target=lambda: a.accept(), daemon=True).start()
b.accept()
"""
PROBE = """
import os, socket
out = [socket.gethostname(), "node0=" + socket.gethostbyname("node0")]
socket.create_connection(("node0", 4000), timeout=5).close()
out.append("address:ok")
try:
    socket.create_connection(("127.0.0.1", 4000), timeout=5)
    out.append("loopback:reached")
except ConnectionRefusedError:
    out.append("loopback:refused")
out.append(f"pid:{os.getpid()}")  # the node's first process: unshare's child, exec'd into sh, then into python
print(*out)
"""


def test_nodes_leave_no_namespace_veth_hosts_file_or_process_behind_when_the_test_fails():
    before_ns, before_links = namespaces(), links()
    prefix = f"gf{os.getpid()}"
    started: list[int] = []
    with pytest.raises(RuntimeError, match="the test failed"), Nodes.start(2, prefix=prefix) as nodes:
        for i in range(2):  # a process that ignores SIGTERM, with a child of its own
            nodes.popen(i, ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300"])
        deadline = time.monotonic() + 30
        while len(started) < 8:  # on each node: unshare, sh, and its two sleeps
            assert time.monotonic() < deadline, started
            started = [pid for i in range(2) for pid in nodes.pids(i)]
        assert namespaces() >= {f"{prefix}-0", f"{prefix}-1", f"{prefix}-sw"}
        assert (NETNS_ETC / f"{prefix}-1" / "hosts").read_text().endswith("10.77.0.1 node0\n10.77.0.2 node1\n")
        raise RuntimeError("the test failed")
    assert namespaces() == before_ns and links() == before_links
    assert not list(NETNS_ETC.glob(f"{prefix}-*"))
    assert not [pid for pid in started if alive(pid)]
