"""Time each norm layer alone: forward + backward on a (B, T, D) activation.

    python scripts/bench_norms.py [--shape 12 1024 768] [--device cuda] [--dtype bf16] [--compile]
    python -m gpt.bench_norms ...   /   gpt-bench-norms ...

Prints the median over --reps timed repetitions (after --warmup) per norm type and
the ratio to the hand-rolled LayerNorm. This isolates the norm; what it costs in a
whole training step is the trainer's tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from gpt.cli import command
from gpt.norms import NORM_TYPES, make_norm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_norm(norm_type: str, shape, device: str, dtype, reps: int, warmup: int, compile_: bool) -> float:
    norm = make_norm({"norm_type": norm_type, "d_model": shape[-1]}).to(device=device, dtype=dtype)
    fn = torch.compile(norm) if compile_ else norm
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(shape, device=device, dtype=dtype)
    times = []
    for i in range(warmup + reps):
        sync(device)
        start = time.perf_counter()
        fn(x).backward(grad)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        x.grad = None
    return statistics.median(times)


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[4, 1024, 768], metavar=("B", "T", "D"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="time torch.compile(norm) instead of eager")
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), metavar="NORM_TYPE")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"forward + backward, shape {tuple(args.shape)}, {args.device}, {args.dtype}, "
          f"{'compiled' if args.compile else 'eager'}, median of {args.reps}; torch {torch.__version__}")
    results = {}
    for norm_type in args.norm_types:
        results[norm_type] = time_norm(norm_type, args.shape, args.device, DTYPES[args.dtype],
                                       args.reps, args.warmup, args.compile)
    base = results.get("handrolled_layernorm")
    print(f"{'norm_type':<28}{'ms':>10}{'vs handrolled_layernorm':>26}")
    for norm_type, seconds in results.items():
        ratio = f"{seconds / base:.2f}x" if base else "-"
        print(f"{norm_type:<28}{seconds * 1e3:>10.3f}{ratio:>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
