"""Run a grid of norm types x seeds, evaluate every cell, compare them.

    python scripts/sweep.py configs/gpt2-small.yaml --norm-types handrolled_layernorm pytorch_layernorm \
        --seeds 0 1 2 [--nproc 8] [--set KEY=VALUE ...] [--dry-run]
    python scripts/sweep.py configs/tiny.yaml --norm-types pytorch_layernorm --init-seeds 0 1 2 --data-seeds 0 1 2
    python -m gpt.commands.sweep ...   /   gpt-sweep ...

Cells run one after another (each under torchrun when --nproc > 1) in
runs/<config>-<norm-type>-s<seed>; with --init-seeds and --data-seeds, every initialisation
seed is crossed with every data-order seed (runs/<config>-<norm-type>-i<init>-s<data>), and
the comparison splits each group's seed-to-seed variance between the two. Rerunning the
same command skips finished cells and resumes interrupted ones. --dry-run prints the
commands instead. --push-to-hub USER then publishes the whole sweep, as
scripts/publish_sweep.py RUNS_DIR --namespace USER does (a model per run, the comparison as a
dataset, one collection; a rerun uploads only what changed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.commands.cli import add_overrides, command, parser_for, standard_hooks
from gpt.config import NORM_TYPES


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    parser.add_argument("config", type=Path)
    parser.add_argument(
        "--norm-types",
        nargs="+",
        default=list(NORM_TYPES),
        choices=NORM_TYPES,
        metavar="NORM_TYPE",
        help=f"default: all ({', '.join(NORM_TYPES)})",
    )
    seeds = "seeds of the initial weights and the data order together (default 0)"
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help=seeds)
    parser.add_argument(
        "--init-seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="with --data-seeds: model.init_seed values, each crossed with every data seed",
    )
    parser.add_argument(
        "--data-seeds",
        nargs="+",
        type=int,
        metavar="SEED",
        help="with --init-seeds: train.seed values (the data order)",
    )
    parser.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun when > 1)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    add_overrides(parser, "a config value of every cell")
    parser.add_argument("--out", type=Path, help="comparison folder (default runs/<config>-comparison)")
    parser.add_argument("--baseline", help="baseline group of the comparison")
    parser.add_argument(
        "--equivalence-margin",
        type=float,
        metavar="DELTA",
        help="test each group's equivalence to the baseline within +-DELTA (see compare)",
    )
    parser.add_argument(
        "--allow-differ",
        action="append",
        default=[],
        metavar="KEY",
        help="a config or fingerprint key the cells may differ in (see compare)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--push-to-hub",
        metavar="USER",
        help="then publish the sweep under this Hub namespace (scripts/publish_sweep.py; private repos)",
    )
    parser.add_argument("--hub-prefix", metavar="NAME", help="with --push-to-hub: its --prefix")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    from gpt.analysis.report import markdown
    from gpt.publish.release import check_repo_name
    from gpt.sweep.launch import publish_grid, run_sweep

    if args.push_to_hub:  # a name the Hub refuses stops here, not after the training
        check_repo_name(f"{args.push_to_hub}/{args.hub_prefix + '-' if args.hub_prefix else ''}{args.config.stem}")
    result = run_sweep(
        args.config,
        args.norm_types,
        args.seeds,
        args.runs_dir,
        init_seeds=args.init_seeds,
        data_seeds=args.data_seeds,
        nproc=args.nproc,
        overrides=args.overrides,
        out=args.out,
        baseline=args.baseline,
        equivalence_margin=args.equivalence_margin,
        allow_differ=args.allow_differ,
        dry_run=args.dry_run,
        hooks_for=standard_hooks,
    )
    if result is not None:
        print(markdown(result), end="")
        print(f"\nplots: {', '.join(result['plots'])}")
    if args.push_to_hub:
        publish_grid(args.config, args.runs_dir, args.out, args.push_to_hub, args.hub_prefix, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
