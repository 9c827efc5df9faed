"""Can the nodes of a job meet? ``preflight --nodes N --rendezvous HOST:PORT``, run on every node (``srun``) before
``torchrun --nnodes=N --rdzv-endpoint=HOST:PORT``, so that a network fault is one line in the first minute.

torchrun itself answers each of these faults with a traceback, and only after its timeouts: 60 s a try when
nothing listens at the endpoint, ``join_timeout`` (600 s) when a node never comes, the process group's timeout
when the ranks cannot reach each other's addresses. Here, in the order a job meets them:

1. the rendezvous host's name resolves on this node, and so does this node's own name, to an address the other
   nodes can reach (gloo and NCCL advertise what the host name resolves to; a loopback address reaches no one);
2. the node whose address the endpoint names hosts a store there (what torchrun's c10d rendezvous does); every
   other node reaches it within the timeout;
3. all N nodes arrive;
4. a gloo all-reduce goes through across them: the nodes reach each other at the addresses they advertise.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gpt.common.errors import clipped
from gpt.run.distributed import addresses_of, own_addresses
from gpt.run.machine import MachineError, last_line

KEYS = "gpt-norm-harness/preflight"  # a prefix of our own in the store


def parse_endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MachineError(f"--rendezvous {text!r}: expected HOST:PORT, e.g. node0:29500")
    return host.strip("[]"), int(port)


def check_names(host: str) -> tuple[list[str], bool]:
    """Step 1: the endpoint's addresses, and whether this node hosts the rendezvous."""
    me = socket.gethostname()
    where = addresses_of(host)
    if not where:
        raise MachineError(
            f"the rendezvous host {host!r} does not resolve on {me}: give the first node's name as the other nodes "
            "resolve it (DNS or /etc/hosts on every node), or its address"
        )
    mine = own_addresses()
    if not mine:
        raise MachineError(
            f"this node's host name {me!r} does not resolve on it: gloo and NCCL advertise that address to the "
            "other nodes; add it to /etc/hosts with the address the nodes share, or set GLOO_SOCKET_IFNAME and "
            "NCCL_SOCKET_IFNAME to that interface (e.g. eth0)"
        )
    if all(a.startswith("127.") or a == "::1" for a in mine):
        raise MachineError(
            f"{me}'s host name resolves to {', '.join(mine)} (loopback), which no other node reaches: set "
            "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface the nodes share (e.g. eth0), or map the "
            "name to that interface's address in /etc/hosts"
        )
    return where, bool(set(where) & set(mine)) or host == me


def check_rendezvous(nodes: int, endpoint: str, timeout: float) -> str:
    """Steps 1-4 on this node; what went through, or MachineError naming the first fault and its fix."""
    host, port = parse_endpoint(endpoint)
    where, hosting = check_names(host)
    me, start = socket.gethostname(), time.monotonic()
    store = _store(host, port, where, hosting, timeout, me)
    index = store.add(f"{KEYS}/arrived", 1) - 1
    store.set(f"{KEYS}/name/{index}", me)
    try:
        arrived = _count_reaches(store, "arrived", nodes, start + timeout)
        names = ", ".join(store.get(f"{KEYS}/name/{i}").decode() for i in range(arrived))
    except (RuntimeError, OSError):  # the hosting node gave up first (it says why) and its store went with it
        raise MachineError(
            f"the rendezvous at {endpoint} went away while {me} waited for the other nodes: its host gave up "
            "(its own line says why)"
        ) from None
    if arrived < nodes:
        raise MachineError(
            f"only {arrived} of {nodes} nodes reached the rendezvous at {endpoint} in {timeout:g} s ({names}): "
            f"start the job on every node (--nnodes {nodes}); a node that cannot reach {endpoint} says so itself"
        )
    try:
        _all_reduce(store, index, nodes, timeout, me)
    finally:
        with contextlib.suppress(RuntimeError, OSError):  # the host may be gone already
            store.add(f"{KEYS}/left", 1)
        if hosting:  # the store goes with this process: wait until the others are done with it
            _count_reaches(store, "left", nodes, time.monotonic() + timeout)
    return f"{me} met {nodes - 1} other node(s) at {endpoint} and a gloo all-reduce went through"


def _count_reaches(store: dist.Store, key: str, count: int, deadline: float) -> int:
    """Wait until the store's counter ``key`` reaches ``count`` or the monotonic ``deadline`` passes; its value."""
    while (value := store.add(f"{KEYS}/{key}", 0)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def _store(host: str, port: int, where: list[str], hosting: bool, timeout: float, me: str) -> dist.TCPStore:
    """Step 2: the rendezvous store, hosted here or reached."""
    try:
        return dist.TCPStore(host, port, is_master=hosting, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    except (RuntimeError, OSError) as e:  # DistNetworkError, DistStoreError and the like
        if hosting:
            raise MachineError(
                f"{me} hosts the rendezvous ({host} resolves to its address {', '.join(where)}) but cannot listen "
                f"on port {port} ({last_line(e)}): another job's rendezvous there? pick another port"
            ) from None
        raise MachineError(
            f"{me} cannot reach the rendezvous at {host}:{port} ({', '.join(where)}) in {timeout:g} s: is the job "
            f"running on {host}, does {host} take that address as its own (torchrun: --rdzv-conf is_host=true "
            f"there otherwise), and is port {port} open between the nodes?"
        ) from None


def _all_reduce(store: dist.Store, index: int, nodes: int, timeout: float, me: str) -> None:
    """Step 4: one gloo all-reduce across the nodes, one process each."""
    group_store = dist.PrefixStore(f"{KEYS}/gloo", store)
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    advertised = f"the address of GLOO_SOCKET_IFNAME={interface}" if interface else ", ".join(addresses_of(me))
    hint = (
        f"{me} advertises {advertised}: the nodes reach the rendezvous but not each other there; set "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface the nodes share (e.g. eth0), and open the ports "
        "between the nodes (gloo and NCCL pick theirs at random)"
    )
    try:
        dist.init_process_group(
            "gloo", store=group_store, rank=index, world_size=nodes, timeout=timedelta(seconds=timeout)
        )
        total = torch.ones(1)
        dist.all_reduce(total)
    except (RuntimeError, OSError) as e:
        said = last_line(e)
        if source := re.search(r"\.(?:cc|h|cpp):\d+\] (.*)", said):  # gloo's words, not its source file's name
            said = source.group(1)
        raise MachineError(f"gloo across {nodes} nodes failed on {me} ({clipped(said)}): {hint}") from None
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    if total.item() != nodes:
        raise MachineError(f"gloo across {nodes} nodes summed {total.item():g}, not {nodes}: {hint}")
