"""The GPU preflight of setup_cloud.sh, so that a VM that cannot compile or talk NCCL is known in the
first minute: torch sees the GPUs, torch.compile builds and runs a small function on one (Triton
needs a C compiler and Python.h), and an NCCL all-reduce goes through across all of them. Each
failure is one line naming what failed and the likely fix, exit status 1.

    python scripts/preflight.py --driver 535.129.03 --driver-cuda 12.2 --cuda12-index URL
    python scripts/preflight.py --device cpu --nproc 2    # the same on the CPU (gloo), for the tests
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", default="unknown", help="the NVIDIA driver's version, for the messages")
    parser.add_argument("--driver-cuda", default="unknown", help="the CUDA version the driver supports")
    parser.add_argument("--cuda12-index", default="https://download.pytorch.org/whl/cu126")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--nproc", type=int, default=2, help="processes for the all-reduce with --device cpu")
    args = parser.parse_args(argv)
    from gpt.run.machine import MachineError  # torch, after the arguments are known good

    try:
        check(args)
    except MachineError as e:
        print(f"preflight: {e}", file=sys.stderr)
        return 1
    return 0


def check(args: argparse.Namespace) -> None:
    """Each check in turn, saying how long it took; the first that fails raises."""
    import torch

    from gpt.run.machine import check_all_reduce, check_compile, check_gpus_visible

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


if __name__ == "__main__":
    sys.exit(main())
