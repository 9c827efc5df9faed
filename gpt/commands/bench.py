"""Benchmark training steps per norm type: tokens/s, ms/step, MFU, peak memory; or each norm alone.

    python scripts/bench.py CONFIG [--norm-types ...] [--compile on|off|both] [--steps N] [--warmup W]
                            [--data config|synthetic|ready] [--peak-tflops T] [--json] [--jsonl FILE]
                            [--set KEY=VALUE ...]
    torchrun --nproc_per_node=8 scripts/bench.py CONFIG ...     # on the configured world size
    python scripts/bench.py --norms-only [--shape 12 1024 768] [--precision auto|fp32|bf16|fp16] [--compile ...]
    python scripts/bench.py CONFIG --generate [--prompt-tokens 32] [--new-tokens 256] [--repeats 3]
    python -m gpt.commands.bench ...   /   gpt-bench ...

Each row times real training steps of CONFIG with one norm type (the trainer's own
step: data, forward, backward, optimizer) after --warmup steps, on the config's fast path
(precision, TF32, prefetch) with compile as --compile says (default: both on a GPU, off on
the CPU). Model FLOPs per token = 6 x (weights of every linear layer, the output head
included) + 12 x layers x context x d_model; MFU divides the achieved model FLOP/s by the
GPU's dense bf16 peak (A100 312, H100 SXM / H200 989 TFLOP/s; --peak-tflops for another
chip: an unknown one gets no MFU). The time ratio is to the hand-rolled LayerNorm row of the
same compile setting. --json prints one JSON object per row instead of the table; --jsonl
appends each row to a file the moment it is measured (a benchmark stopped part-way keeps
every finished row). A row that fails (out of memory, a compile error) is an error row
naming the exception, and the next row runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpt.commands.cli import add_overrides, command, config_from_args, is_rank0, parser_for
from gpt.common.errors import UserError
from gpt.config import NORM_TYPES

COMPILE_CHOICES = {"on": [True], "off": [False], "both": [False, True]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = parser_for(__doc__, 2)
    parser.add_argument("config", nargs="?", help="YAML config file (not needed with --norms-only)")
    add_overrides(parser)
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), choices=NORM_TYPES, metavar="NORM_TYPE")
    parser.add_argument("--compile", choices=COMPILE_CHOICES, help="default: both on a GPU, off on the CPU")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row (default 10)")
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps before them, the first one compiling (default 3)"
    )
    parser.add_argument(
        "--data",
        choices=("config", "synthetic", "ready"),
        default="config",
        help="the config's token set, a random one, or one batch read once (default config)",
    )
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, for a chip not in the table")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument(
        "--jsonl", type=Path, metavar="FILE", help="append each row to FILE as one JSON line the moment it is measured"
    )
    parser.add_argument("--norms-only", action="store_true", help="time each norm layer alone, forward + backward")
    shape = "--norms-only: the activation's shape (default the write-up's 12 1024 768)"
    parser.add_argument("--shape", type=int, nargs=3, default=[12, 1024, 768], metavar=("B", "T", "D"), help=shape)
    autocast = "--norms-only: the autocast (default auto: bf16 on a GPU, fp32 on the CPU)"
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto", help=autocast)
    parser.add_argument("--generate", action="store_true", help="time greedy generation, without and with the cache")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="--generate: the prompt's length (default 32)")
    parser.add_argument("--new-tokens", type=int, default=256, help="--generate: tokens generated (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="--generate: timed generations per row (default 3)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        raise UserError(
            f"--steps {args.steps} --warmup {args.warmup}: both must be >= 1 (the first step compiles "
            "and warms up, so it is never timed)"
        )
    if args.config is None and not args.norms_only:
        raise UserError("give a CONFIG to time its training steps, or --norms-only to time the norm layers alone")
    return args


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = None if args.norms_only else config_from_args(args)  # a config mistake stops here, before building
    if args.generate and args.prompt_tokens + args.new_tokens > cfg.model.context_length:
        raise UserError(
            f"--prompt-tokens {args.prompt_tokens} + --new-tokens {args.new_tokens} exceed model.context_length="
            f"{cfg.model.context_length}: past it the cache gives way to a sliding window; "
            f"--set model.context_length={args.prompt_tokens + args.new_tokens} (or more)"
        )
    from gpt.run.distributed import setup
    from gpt.speed import timing as benchmark  # the heavy imports, after the arguments are known good
    from gpt.speed.rows import append_to, table

    dist = setup(cfg.run.device if cfg else "auto")
    emit = append_to(args.jsonl) if args.jsonl is not None and dist.is_main else None
    try:
        compiles = COMPILE_CHOICES[args.compile or ("both" if dist.device.type == "cuda" else "off")]
        timed = dict(steps=args.steps, warmup=args.warmup, emit=emit)
        if args.generate:
            sizes = dict(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, repeats=args.repeats)
            rows = benchmark.generation_rows(cfg, args.norm_types, device=dist.device, emit=emit, **sizes)
        elif args.norms_only:
            precision = benchmark.norms_precision(args.precision, dist.device)
            layer = dict(shape=tuple(args.shape), device=dist.device, precision=precision)
            rows = benchmark.norm_rows(args.norm_types, compiles, **layer, **timed)
        else:
            rows = benchmark.step_rows(
                cfg, dist, args.norm_types, compiles, data=args.data, peak=args.peak_tflops, **timed
            )
    finally:
        dist.close()
    if is_rank0():
        print("\n".join(json.dumps(r) for r in rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
