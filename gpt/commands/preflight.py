"""The GPU preflight of setup_cloud.sh, so that a VM that cannot compile or talk NCCL is known in the
first minute: torch sees the GPUs, torch.compile builds and runs a small function on one (Triton
needs a C compiler and Python.h), and an NCCL all-reduce goes through across all of them. Each
failure is one line naming what failed and the likely fix, exit status 1.

    python scripts/preflight.py --driver 535.129.03 --driver-cuda 12.2 --cuda12-index URL
    python scripts/preflight.py --device cpu --nproc 2    # the same on the CPU (gloo), for the tests
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt.common.errors import clipped, first_line

ALL_REDUCE_S = 120  # a hung NCCL is stopped after this


def fail(message: str):
    print(f"preflight: {message}", file=sys.stderr)
    sys.exit(1)


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
        fail(
            f"torch {torch.__version__} is a CPU build (torch.version.cuda None), on {on}: remove .venv and run "
            "bash setup_cloud.sh again without TORCH_SPEC/TORCH_INDEX_URL (it installs the build for this driver)"
        )
    if major(driver_cuda) and major(build) > major(driver_cuda):
        fail(
            f"torch {torch.__version__} is built for CUDA {build}, newer than {on}: "
            f"TORCH_INDEX_URL={cuda12_index} bash setup_cloud.sh installs its CUDA 12 build (or upgrade the driver)"
        )
    fail(
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
        fail(
            f"torch.compile failed on {device} ({type(e).__name__}: {clipped(first_line(e))}): it needs a C compiler "
            "and the Python headers (sudo apt-get install -y build-essential python3-dev)"
        )


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
                    fail(f"{what} did not finish in {ALL_REDUCE_S} s: {hint}")
        except Exception as e:
            fail(f"{what} failed ({clipped(last_line(e))}): {hint}")
    return what


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", default="unknown", help="the NVIDIA driver's version, for the messages")
    parser.add_argument("--driver-cuda", default="unknown", help="the CUDA version the driver supports")
    parser.add_argument("--cuda12-index", default="https://download.pytorch.org/whl/cu126")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--nproc", type=int, default=2, help="processes for the all-reduce with --device cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        world = check_gpus_visible(args.driver, args.driver_cuda, args.cuda12_index)
        print(f"preflight: torch {torch.__version__} (CUDA {torch.version.cuda}) sees {world} GPU(s)", flush=True)
    else:
        world = args.nproc
    start = time.monotonic()
    device = "cuda:0" if args.device == "cuda" else "cpu"
    check_compile(device)
    print(f"preflight: torch.compile ran on {device} ({time.monotonic() - start:.0f} s)", flush=True)
    start = time.monotonic()
    what = check_all_reduce(world, args.device)
    print(f"preflight: {what}: ok ({time.monotonic() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
