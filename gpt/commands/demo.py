"""The embedded demo: no GPU, no network, about 5 minutes on 2 CPU cores.

    python scripts/demo.py [--norm-types ...] [--seeds 0 1 2] [--equivalence-margin DELTA]
    python -m gpt.commands.demo [--config configs/demo.yaml] ...   (from a checkout: the config is a file there)

Prepares the Shakespeare token set at byte level (data/shakespeare-bytes, 256 byte ids and
<|endoftext|>) if it is missing, trains the small model of configs/demo.yaml for every norm
type of --norm-types with every seed of --seeds, evaluates each on the held-out test split,
and prints the comparison: intervals, whether a difference is resolved, whether the
hand-rolled and PyTorch LayerNorms are equivalent within --equivalence-margin, and what each
norm type is worth against the baseline's token ladder (--token-fractions, timed by bench.py
first: the effective speedup, compute- and time-matched). It is the same
path as a real experiment (prepare_data, train, evaluate, compare through the sweep), only
small: what it shows and what it cannot is in docs/. Rerunning it skips what is done.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpt.commands.cli import add_grid, command, parser_for, standard_hooks

# The demo's design (docs/: "The demo"): the write-up's pair, whose equivalence the demo tests, and no_norm,
# which at this learning rate trains measurably worse; three seeds each, so every group has an interval.
NORM_TYPES = ("handrolled_layernorm", "pytorch_layernorm", "no_norm")
SEEDS = (0, 1, 2)
# The baseline also trained to half and twice its 600 steps: its curve, off which each norm type's effective speedup
# is read; its time-matched figure from bench.py's steps timed one norm type after another in one process (a CPU's
# runs, trained one after another beside whatever else the machine does, are no measurement of a norm's speed).
TOKEN_FRACTIONS = (0.5, 2.0)
BENCH_STEPS, BENCH_ROUNDS = 20, 3  # each round times every norm type; the comparison takes each one's median
TOKENIZER = "bytes"  # 257 ids: the embedding and head cost nothing, so a CPU trains past the unigram stage
MARGIN = 0.01


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    add_grid(parser, list(NORM_TYPES), list(SEEDS))
    parser.add_argument(
        "--equivalence-margin",
        type=float,
        default=MARGIN,
        metavar="DELTA",
        help=f"test equivalence to the baseline within +-DELTA nats (default {MARGIN})",
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--token-fractions", nargs="+", type=float, default=list(TOKEN_FRACTIONS), metavar="F",
                        help="the baseline's token ladder, in fractions of its budget (default 0.5 2)")  # fmt: skip
    return parser


def time_steps(config: Path, norm_types: list[str], path: Path) -> None:
    """Time BENCH_STEPS training steps of each norm type, one after another in this process, BENCH_ROUNDS times over,
    into ``path`` (the rows scripts/bench.py writes with --jsonl), and print bench.py's table of them."""
    from gpt.config import load_config
    from gpt.run.distributed import setup
    from gpt.speed.rows import append_to, table
    from gpt.speed.timing import step_rows

    print(f"timing {BENCH_STEPS} training steps of each norm type, {BENCH_ROUNDS} rounds (as bench.py) into {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config, ["run.name=demo"])
    timed = {"steps": BENCH_STEPS, "warmup": 3, "data": "config", "emit": append_to(path)}
    dist = setup(cfg.run.device)
    try:
        rows = [row for _ in range(BENCH_ROUNDS) for row in step_rows(cfg, dist, norm_types, [False], **timed)]
    finally:
        dist.close()
    print(table(rows))


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.perf_counter()

    from gpt.config import load_config

    data = Path(load_config(args.config, ["run.name=demo"]).data.path)
    from gpt.analysis.report import markdown  # the heavy imports, after the config is known good
    from gpt.sweep.launch import run_sweep

    if not data.exists():
        from gpt.data.encode import prepare
        from gpt.data.sources import default_held_out, open_source
        from gpt.data.tokenizer import get_tokenizer

        print(f"preparing {data} from the embedded Shakespeare corpus ({TOKENIZER} tokenizer)")
        val, test = default_held_out("shakespeare")
        prepare(open_source("shakespeare"), data, get_tokenizer(TOKENIZER), val_tokens=val, test_tokens=test)
    bench = args.runs_dir / f"{args.config.stem}-bench.jsonl"
    if not bench.is_file():
        time_steps(args.config, list(args.norm_types), bench)
    result = run_sweep(
        args.config,
        args.norm_types,
        args.seeds,
        args.runs_dir,
        out=args.runs_dir / f"{args.config.stem}-comparison",
        equivalence_margin=args.equivalence_margin,
        hooks_for=standard_hooks,
        token_fractions=list(args.token_fractions),
        throughput=bench,
    )
    print()
    print(markdown(result), end="")
    print(f"\nplots: {', '.join(result['plots'])}")
    print(f"demo wall time: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
