"""Whether this machine can train: torch sees the GPUs, torch.compile builds and runs a small function on one
(Triton needs a C compiler and Python.h), and an all-reduce (NCCL; gloo on the CPU) goes through across all
of them. Each check raises ``MachineError``, one line naming what failed and the likely fix
(``gpt.commands.preflight``, setup_cloud.sh's GPU preflight, prints it).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt.common.errors import clipped, first_line

ALL_REDUCE_S = 120  # a hung NCCL is stopped after this


class MachineError(Exception):
    """What the machine lacks, in one line naming the likely fix."""


def last_line(error: BaseException) -> str:
    """A worker's exception as the parent sees it: its traceback in the message, the error on the last line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def major(version: str) -> int:
    return int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0


def check_gpus_visible(driver: str, driver_cuda: str, cuda12_index: str) -> int:
    build, on = torch.version.cuda, f"NVIDIA driver {driver} (CUDA {driver_cuda})"
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if build is None:
        raise MachineError(
            f"torch {torch.__version__} is a CPU build (torch.version.cuda None), on {on}: remove .venv and run "
            "bash setup_cloud.sh again without TORCH_SPEC/TORCH_INDEX_URL (it installs the build for this driver)"
        )
    if major(driver_cuda) and major(build) > major(driver_cuda):
        raise MachineError(
            f"torch {torch.__version__} is built for CUDA {build}, newer than {on}: "
            f"TORCH_INDEX_URL={cuda12_index} bash setup_cloud.sh installs its CUDA 12 build (or upgrade the driver)"
        )
    raise MachineError(
        f"torch {torch.__version__} (CUDA {build}) runs on {on} but sees no GPU: check nvidia-smi, "
        "CUDA_VISIBLE_DEVICES and, on NVSwitch machines, the fabric manager (systemctl status nvidia-fabricmanager)"
    )


def check_compile(device: str):
    def f(x):
        return torch.nn.functional.gelu(x) * 2 + 1

    x = torch.randn(4096, device=device)
    try:
        torch.testing.assert_close(torch.compile(f)(x), f(x))
    except Exception as e:
        raise MachineError(
            f"torch.compile failed on {device} ({type(e).__name__}: {clipped(first_line(e))}): it needs a C compiler "
            "and the Python headers (sudo apt-get install -y build-essential python3-dev)"
        ) from None


def all_reduce(rank: int, world: int, init: str, device: str):
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=ALL_REDUCE_S - 20)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timeout)
    x = torch.ones(1024, device=f"cuda:{rank}" if device == "cuda" else "cpu")
    dist.all_reduce(x)
    if x[0].item() != world:
        raise RuntimeError(f"rank {rank} summed {x[0].item()}, not {world}")
    dist.destroy_process_group()


def check_all_reduce(world: int, device: str):
    gpu = device == "cuda"
    what = f"{'NCCL' if gpu else 'gloo'} all-reduce across {world} {'GPU(s)' if gpu else 'processes'}"
    hint = (
        "check nvidia-smi topo -m and the driver (on NVSwitch machines, the fabric manager), or try NCCL_P2P_DISABLE=1"
    )
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        context = mp.start_processes(all_reduce, (world, init, device), nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + ALL_REDUCE_S
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    break
            else:
                return what
        except Exception as e:
            raise MachineError(f"{what} failed ({clipped(last_line(e))}): {hint}") from None
    raise MachineError(f"{what} did not finish in {ALL_REDUCE_S} s: {hint}")
