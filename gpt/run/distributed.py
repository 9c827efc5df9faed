"""The torchrun environment: ranks, process groups, the device, and small collectives.

Under ``torchrun`` (RANK, LOCAL_RANK, WORLD_SIZE set) the default process group is NCCL
with one GPU per local rank, or gloo on the CPU. A second, gloo, group carries control
flags (stop requested?) between CPU values, so asking "should we stop?" every step
never waits for the GPU. Without torchrun everything is a one-process no-op.

A restarted group (``torchrun --max-restarts``) meets in a store of its own. torchrun's
agent keeps one key-value store for the whole job, and torch's process group setup
writes its ranks' addresses there under the same keys on every attempt, so after a
restart a rank may read the address of a rank of the attempt before, which is dead:
``Gloo connectFullMesh failed ... Connection refused``, or a hang (torch 2.4 onward; see
pytorch/pytorch#135712). ``_attempt_store`` asks the agent's store only for the address
of a store that rank 0 opens anew each attempt, by a handshake that no key left by an
earlier attempt can answer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import re
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from gpt.common.errors import UserError
from gpt.common.files import process_alive

# What a collective says when a peer is gone: gloo's socket errors, NCCL's aborts
PEER_FAILURE = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|NCCL (error|communicator)|remote process exited"
)
PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")  # gloo names the peer it lost: "[10.0.0.2]:41704"


class Peer(NamedTuple):
    """Where a rank runs: its machine's host name, its PID there, and the addresses its collectives use."""

    host: str
    pid: int
    addresses: tuple[str, ...] = ()


def addresses_of(host: str) -> list[str]:
    """The addresses ``host`` resolves to here, each once; [] where it does not resolve."""
    try:
        return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, None)))
    except OSError:
        return []


def own_addresses() -> tuple[str, ...]:
    """The addresses this machine's ranks talk from: those its host name resolves to (gloo's and NCCL's
    default) and those of the interfaces GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name."""
    found = addresses_of(socket.gethostname())
    names = ",".join(os.environ.get(k, "") for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"))
    for name in filter(None, (n.strip().lstrip("=^") for n in names.split(","))):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = name[:15].encode().ljust(256, b"\0")  # struct ifreq; SIOCGIFADDR (Linux)
            found.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, request)[20:24]))
    return tuple(dict.fromkeys(found))


MEET_S = 60  # how long the ranks that ended well wait at the end for a peer (one that failed alone: gone)


@dataclass
class Dist:
    """This process's place in the job, and the collectives the harness uses."""

    rank: int = 0  # global rank, 0 .. world_size - 1; rank 0 alone writes files and prints
    local_rank: int = 0  # rank on this node: the index of its GPU
    world_size: int = 1  # processes in the job (1: no torchrun, no process group)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank computes
    control: object = None  # gloo group for CPU flags (None: one process)
    peers: list[Peer] = field(default_factory=list)  # every rank's place, in rank order (empty: one process)
    met: bool = False  # the ranks met at the end of their work (``meet``): leaving needs no meeting again

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier(group=self.control)

    def any_flag(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank (a CPU all-reduce)."""
        if not self.enabled:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return bool(t.item())

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over ranks (on the training device; the default group)."""
        if self.enabled:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def on_main(self, fn):
        """Run ``fn`` on rank 0 alone; every rank returns its result, or raises the UserError it raised
        (so no rank waits at a collective for a rank 0 that has stopped)."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except UserError as e:
                error = e
        result, error = self.gather_objects((result, error))[0]
        if error is not None:
            raise error
        return result

    def gather_objects(self, obj) -> list:
        """``obj`` from every rank, in rank order (on every rank)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def synchronize(self) -> None:
        """Wait for the work queued on this rank's GPU (nothing to wait for on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Copy a CPU batch to this rank's device; pinned on CUDA, so the copy does not wait for the GPU."""
        if self.device.type == "cuda":
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def meet(self) -> None:
        """Every rank waits for the others, at the end of work that ended well: after it no rank is in a
        collective, so each may tear its group down whenever it leaves. The trainer meets before rank 0 waits
        for its uploads (as long as they take), so the others never wait for those; ``close`` meets otherwise.
        A peer that failed alone is waited for ``MEET_S`` at most (it says why itself)."""
        if self.enabled and not self.met:
            with contextlib.suppress(RuntimeError):
                dist.monitored_barrier(group=self.control, timeout=timedelta(seconds=MEET_S))
        self.met = True

    def close(self) -> None:
        """Leave the process group. On the way out of work that ended well, the ranks meet first (``meet``,
        unless they have): a rank that tears its group down (rank 0: its store too) while a peer is still in a
        collective can die in gloo's teardown (SIGABRT, "terminate called without an active exception"). On the
        way out of a failure they do not meet (a peer may be gone). Then the group is let go of: ``control``
        (the default group itself on the CPU) would keep it, its gloo threads and rank 0's store alive into the
        interpreter's exit, whose teardown of them aborted about one run in 100."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        if sys.exc_info()[1] is None:
            self.meet()
        dist.destroy_process_group()
        self.control = None

    def lost_ranks(self, exc: BaseException) -> list[int] | None:
        """If ``exc`` is a collective that failed because a peer is gone: the ranks on this machine whose
        process has ended, else those of the machine whose address the error names (its node lost, or a
        process of it), else none (unknown). None if ``exc`` is something else."""
        if not self.enabled or not isinstance(exc, RuntimeError):
            return None
        here = socket.gethostname()
        lost = [r for r, p in enumerate(self.peers) if p.host == here and not process_alive(p.pid)]
        if lost or not PEER_FAILURE.search(str(exc)):
            return lost or None
        named = set(PEER_ADDRESS.findall(str(exc)))
        return [r for r, p in enumerate(self.peers) if p.host != here and named & set(p.addresses)]

    def speaks_for(self, lost: list[int]) -> bool:
        """Whether this rank is the one on its machine to say that ``lost`` are gone: the lowest one left."""
        here = socket.gethostname()
        return self.rank == min(r for r, p in enumerate(self.peers) if p.host == here and r not in lost)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's as the platform reports it."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


# Peak memory is kept under a key that says what was measured; each key's short name and meaning.
PEAK_MEMORY = {
    "peak_cuda_allocated_bytes": ("CUDA alloc", "the CUDA allocator's peak on one GPU (tensors; not its cache)"),
    "peak_rss_bytes": ("RSS", "the process's peak resident set (CPU: Python, libraries, data and model)"),
}


def peak_memory(device: torch.device) -> dict[str, int]:
    """This process's peak memory, under the key of what was measured (``PEAK_MEMORY``): the CUDA
    allocator's peak on a GPU, the peak resident set on the CPU. They are not comparable."""
    if device.type == "cuda":
        return {"peak_cuda_allocated_bytes": torch.cuda.max_memory_allocated(device)}
    return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB


def peak_memory_of(record: dict) -> tuple[str, int] | None:
    """(key, bytes) of the peak memory a summary or benchmark row holds; None if it holds none."""
    return next(((key, record[key]) for key in PEAK_MEMORY if record.get(key) is not None), None)


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("run.device is cuda but torch sees no GPU; use run.device: auto or cpu")
    if local_rank >= torch.cuda.device_count():
        raise UserError(
            f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); "
            "use --nproc_per_node <= the number of GPUs"
        )
    return torch.device("cuda", local_rank)


def setup(device_choice: str = "auto") -> Dist:
    """Join the torchrun job if there is one; choose this rank's device."""
    if "RANK" not in os.environ:
        return Dist(device=pick_device(device_choice))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = pick_device(device_choice, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(minutes=30)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's: outlives restarts
    dist.init_process_group(
        backend,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
        **(
            {"store": _attempt_store(rank, world_size, timeout), "rank": rank, "world_size": world_size}
            if agent_store
            else {}
        ),
    )
    control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    peers = [None] * world_size
    dist.all_gather_object(peers, Peer(socket.gethostname(), os.getpid(), own_addresses()), group=control)
    return Dist(rank, local_rank, world_size, device, control, peers)


AGENT_KEYS = "gpt-norm-harness/attempt-store"  # the handshake's keys in torchrun's agent store


def _attempt_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """A store that rank 0 opens for this attempt of the group alone, found through torchrun's agent store
    (MASTER_ADDR:MASTER_PORT), which earlier attempts wrote to. Each other rank writes a fresh random word
    under a number the agent's store counts out, and waits for the answer to that word: rank 0 answers
    every word it finds with its new store's address until all ranks have joined it. A word or an address
    an earlier attempt left is never taken for this attempt's (rank 0 answers old words too: harmless)."""
    host, seconds = os.environ["MASTER_ADDR"], timeout.total_seconds()
    agent = dist.TCPStore(host, int(os.environ["MASTER_PORT"]), None, False, timeout)
    count = f"{AGENT_KEYS}/hellos"
    if rank != 0:
        word = os.urandom(8).hex()
        agent.set(f"{AGENT_KEYS}/hello/{agent.add(count, 1)}", word)
        address, port = agent.get(f"{AGENT_KEYS}/answer/{word}").decode().rsplit(" ", 1)
        store = dist.TCPStore(address, int(port), None, False, timeout)
        store.add("joined", 1)
        return store
    store = dist.TCPStore(host, 0, world_size, True, timeout, wait_for_workers=False)  # port 0: a free one
    answered, deadline = set(), time.monotonic() + seconds
    while store.add("joined", 0) < world_size - 1:
        for i in range(1, agent.add(count, 0) + 1):  # one check for each hello not yet answered
            key = f"{AGENT_KEYS}/hello/{i}"
            if i not in answered and agent.check([key]):
                agent.set(f"{AGENT_KEYS}/answer/{agent.get(key).decode()}", f"{host} {store.port}")
                answered.add(i)
        if time.monotonic() > deadline:
            raise UserError(f"rank 0: the other ranks did not join within {seconds:.0f} s; did they start?")
        time.sleep(0.01)
    return store
