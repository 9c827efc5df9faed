"""The GPU check: the CUDA tests and the benchmark, in a time budget, on a fresh GPU VM before a long run.

    bash scripts/gpu_check.sh OUTDIR [--budget-s 480] [--stages eager,compiled,tests,...] [--quick] [--plan]

The stages, their budget and the summary are ``gpt.speed.gpu_check``'s (its docstring is this command's
``--help``); this module reads the arguments and runs them.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from gpt.commands.cli import command, parser_for
from gpt.common.errors import UserError
from gpt.speed import gpu_check
from gpt.speed.gpu_check import (
    BUDGET_S,
    CACHE_DIR,
    PROBE_S,
    QUICK_BUDGET_S,
    check,
    check_stages,
    environment,
    select,
)
from gpt.speed.stages import budget_lines


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(gpu_check.__doc__, 2)
    parser.add_argument("out", type=Path, metavar="OUTDIR")
    parser.add_argument("--tests", type=Path, required=True, help="the CUDA test file (tests/speed/test_cuda.py)")
    parser.add_argument("--config", type=Path, required=True, help="the benchmark's config (configs/gpt2-small.yaml)")
    parser.add_argument(
        "--budget-s", type=float, help=f"seconds for the whole check (default {BUDGET_S}; --quick: {QUICK_BUDGET_S})"
    )
    parser.add_argument("--stages", help="comma-separated stages to run, in the check's order (default: all)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one eager and one compiled row of PyTorch's LayerNorm, then the correctness tests only",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=CACHE_DIR,
        metavar="DIR",
        help=f"the compile cache every stage shares, kept for reruns (default {CACHE_DIR}: in the checkout)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help=f"print the plan (counting {PROBE_S:g} s for the environment's probe) and exit: no GPU needed",
    )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # the budget counts the environment's probe too
    args = build_parser().parse_args(argv)
    budget = args.budget_s if args.budget_s is not None else QUICK_BUDGET_S if args.quick else BUDGET_S
    if not (math.isfinite(budget) and budget >= 60):
        raise UserError(f"--budget-s {budget:g}: give the check a finite 60 s or more (default {BUDGET_S})")
    cache_dir = args.cache_dir.expanduser().absolute()
    stages = select(check_stages(args.out, args.tests, args.config, args.quick, cache_dir=cache_dir), args.stages)
    if args.plan:
        print("\n".join([*budget_lines(stages, budget, spent_s=PROBE_S), f"compile cache (every stage): {cache_dir}"]))
        return 0
    env = [*environment(), f"compile cache (every stage): {cache_dir}"]
    return check(args.out, stages, budget, env, args.quick, started=started)


if __name__ == "__main__":
    sys.exit(main())
