"""The torchrun environment: ranks, process groups, the device, and small collectives.

Under ``torchrun`` (RANK, LOCAL_RANK, WORLD_SIZE set) the default process group is NCCL
with one GPU per local rank, or gloo on the CPU. A second, gloo, group carries control
flags (stop requested?) between CPU values, so asking "should we stop?" every step
never waits for the GPU. Without torchrun everything is a one-process no-op.
"""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from gpt.common.errors import UserError


@dataclass
class Dist:
    """This process's place in the job, and the collectives the harness uses."""

    rank: int = 0  # global rank, 0 .. world_size - 1; rank 0 alone writes files and prints
    local_rank: int = 0  # rank on this node: the index of its GPU
    world_size: int = 1  # processes in the job (1: no torchrun, no process group)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank computes
    control: object = None  # gloo group for CPU flags (None: one process)

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

    def close(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


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
    dist.init_process_group(backend, timeout=timedelta(minutes=30), device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    return Dist(rank, local_rank, world_size, device, control)
