"""The GPU preflight of setup_cloud.sh, so that a VM that cannot compile or talk NCCL is known in the
first minute: torch sees the GPUs, torch.compile builds and runs a small function on one (Triton
needs a C compiler and Python.h), and an NCCL all-reduce goes through across all of them. Each
failure is one line naming what failed and the likely fix, exit status 1.

    python scripts/preflight.py --driver 535.129.03 --driver-cuda 12.2 --cuda12-index URL
    python scripts/preflight.py --device cpu --nproc 2    # the same on the CPU (gloo), for the tests

With ``--nodes N --rendezvous HOST:PORT``, run on every node of a job instead (``srun``, before torchrun): the nodes
meet at the rendezvous and a gloo all-reduce goes through across them, or one line says which node cannot and why
(gpt/run/rendezvous.py lists the checks).

    srun --ntasks-per-node=1 python scripts/preflight.py --nodes 2 --rendezvous node0:29500
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", default="unknown", help="the NVIDIA driver's version, for the messages")
    parser.add_argument("--driver-cuda", default="unknown", help="the CUDA version the driver supports")
    parser.add_argument("--cuda12-index", default="https://download.pytorch.org/whl/cu126")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--nproc", type=int, default=2, help="processes for the all-reduce with --device cpu")
    parser.add_argument("--nodes", type=int, help="the job's node count: check that they meet instead")
    parser.add_argument("--rendezvous", metavar="HOST:PORT", help="with --nodes: torchrun's --rdzv-endpoint")
    parser.add_argument("--timeout", type=float, default=120, help="with --nodes: seconds to wait for the others")
    args = parser.parse_args(argv)
    if args.nodes is not None and args.nodes < 1:
        parser.error(f"--nodes {args.nodes}: the job's node count must be >= 1")
    if not 0 < args.timeout < math.inf:  # NaN too
        parser.error(f"argument --timeout: {args.timeout}: seconds, a finite number above 0")
    if args.nodes and not args.rendezvous:
        parser.error("--nodes needs --rendezvous HOST:PORT (torchrun's --rdzv-endpoint)")
    # torch's C++ warnings (a stack trace a failed connection attempt) would bury the one line that says why
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from gpt.run.machine import MachineError  # torch, after the arguments are known good

    try:
        if args.nodes:
            from gpt.run.rendezvous import check_rendezvous

            start = time.monotonic()
            what = check_rendezvous(args.nodes, args.rendezvous, args.timeout)
            print(f"preflight: {what}: ok ({time.monotonic() - start:.0f} s)", flush=True)
        else:
            check(args)
    except MachineError as e:
        print(f"error: preflight: {e}", file=sys.stderr)  # an error: line, as the harness says them
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
