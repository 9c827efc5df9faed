"""The embedded demo: no GPU, no network, under 10 minutes on 2 CPU cores.

    python scripts/demo.py [--norm-types ...] [--seeds 0 ...] [--pair-seeds 0 1 2 ...]
    python -m gpt.commands.demo [--config configs/demo.yaml] ...   (from a checkout: the config is a file there)

Prepares the Shakespeare token set (data/shakespeare) if it is missing, trains the tiny
model of configs/demo.yaml for the write-up's question with three seeds (hand-rolled
against PyTorch LayerNorm, --pair-seeds) and every other norm type with one (--seeds),
evaluates each on the held-out test split, and prints the comparison: intervals, the seed
pairs a difference of --equivalence-margin needs, and whether the pair is equivalent within it.
It is the same path as a real experiment (prepare_data, train, evaluate, compare through
the sweep), only small: what it shows and what it cannot is in the README. Rerunning it
skips what is done.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpt.commands.cli import command, parser_for, standard_hooks
from gpt.config import NORM_TYPES

PAIR = ("handrolled_layernorm", "pytorch_layernorm")  # the write-up's question: is their gap real?


def pair_seeds(norm_types: list[str], seeds: list[int]) -> dict[str, list[int]] | None:
    """The write-up's pair gets ``seeds`` when both of it run (one of them alone has nothing to pair with)."""
    return {n: seeds for n in PAIR} if set(PAIR) <= set(norm_types) else None


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), choices=NORM_TYPES, metavar="NORM_TYPE")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds of every norm type (default 0)")
    parser.add_argument(
        "--pair-seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        help=f"seeds of {' and '.join(PAIR)} when both run (default 0 1 2)",
    )
    parser.add_argument(
        "--equivalence-margin",
        type=float,
        default=0.01,
        metavar="DELTA",
        help="test equivalence to the baseline within +-DELTA (default 0.01)",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()

    from gpt.analysis.experiment import run_sweep
    from gpt.analysis.report import markdown
    from gpt.config import load_config

    data = Path(load_config(args.config, ["run.name=demo"]).data.path)
    if not data.exists():
        from gpt.data.encode import prepare
        from gpt.data.sources import default_held_out, open_source
        from gpt.data.tokenizer import gpt2_encoding

        print(f"preparing {data} from the embedded Shakespeare corpus")
        val, test = default_held_out("shakespeare")
        prepare(open_source("shakespeare"), data, gpt2_encoding(), val_tokens=val, test_tokens=test)
    result = run_sweep(
        args.config,
        args.norm_types,
        args.seeds,
        args.runs_dir,
        seeds_for=pair_seeds(args.norm_types, args.pair_seeds),
        out=args.runs_dir / f"{args.config.stem}-comparison",
        equivalence_margin=args.equivalence_margin,
        hooks_for=standard_hooks,
    )
    print()
    print(markdown(result), end="")
    print(f"\nplots: {', '.join(result['plots'])}")
    print(f"demo wall time: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
