"""Run a grid of norm types x seeds, evaluate every cell, compare them: here, or as SLURM jobs.

    python scripts/sweep.py configs/gpt2-small.yaml --norm-types handrolled_layernorm pytorch_layernorm \
        --seeds 0 1 2 [--nproc 8] [--set KEY=VALUE ...] [--token-fractions 0.5 0.71 1.41 2] [--dry-run]
    python scripts/sweep.py configs/tiny.yaml --norm-types pytorch_layernorm --init-seeds 0 1 2 --data-seeds 0 1 2
    python scripts/sweep.py configs/tiny.yaml --seeds 0 1 --lrs 7e-4 1.4e-3 2.8e-3 [--confirm-seeds 2 3 4]
    python scripts/sweep.py configs/ladder.yaml --sizes 1x16 2x32 3x48 4x64 --seeds 0 1 2 [--predict-at 124M]
    python scripts/sweep.py configs/gpt2-small.yaml --seeds 0 1 2 --launcher slurm --gpus-per-node 8 \
        --time 04:00:00 --partition gpu [--nodes 2] [--slurm-opt KEY=VALUE ...] [--dry-run]
    python scripts/sweep.py configs/gpt2-small.yaml --seeds 0 1 2 --status | --plan   (jobs and progress | power)
    python -m gpt.commands.sweep ...   /   gpt-sweep ...

Locally, cells run one after another (each under torchrun when --nproc > 1) in runs/<config>-<norm-type>-s<seed>;
with --init-seeds and --data-seeds, every initialisation seed is crossed with every data-order seed
(runs/<config>-<norm-type>-i<init>-s<data>), and the comparison splits each group's seed-to-seed variance between
the two. --lrs crosses the grid with learning rates (runs/<config>-<norm-type>-lr<rate>-s<seed>, optim.min_lr at
the config's ratio to optim.lr unless --set fixes it); the comparison then picks each norm type's rate on
validation loss and compares the test losses at the chosen rates (compare --select-on val), whose intervals are
then optimistic (the report says by how much). --confirm-seeds makes it two stages: the grid chooses
(runs/<config>-comparison-selection), then each chosen rate trains on the fresh confirmation seeds and only those
are compared, with 95% intervals. --sizes crosses the grid with model sizes (runs/<config>-<size>-<norm-type>-...,
each on train.tokens_per_param x its parameters), compared across sizes (compare --across-sizes: fits, the gap's
trend, a prediction at --predict-at). With --launcher slurm, every cell is a task of one job array (checkpointed
and requeued before its time limit) and a last job compares them when they have all ended (docs/cluster.md).
Rerunning the same command skips finished cells, resumes (or leaves running) the others. --dry-run prints the
commands or job scripts instead, --plan the seeds' power; --push-to-hub USER then publishes it (publish_sweep.py).
--token-fractions also trains the baseline to those fractions of the token budget (runs/<config>-<norm-type>-t<F>-
s<seed>): its loss-vs-compute curve, from which each norm type's effective speedup is read (compare --ladder).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.analysis import power, scaling, speedup
from gpt.commands.cli import add_grid, add_overrides, command, parser_for, standard_hooks
from gpt.config import NORM_TYPES
from gpt.sweep.slurm import SlurmOptions


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    add = parser.add_argument
    add("config", type=Path)
    add_grid(parser, list(NORM_TYPES), [0])
    add("--init-seeds", nargs="+", type=int, metavar="SEED", help="model.init_seed values, crossed with --data-seeds")
    add("--data-seeds", nargs="+", type=int, metavar="SEED", help="train.seed values, crossed with --init-seeds")
    add("--lrs", nargs="+", type=float, metavar="LR", help="optim.lr values, crossed with the grid; chosen on val")
    add("--confirm-seeds", nargs="+", type=int, metavar="SEED", help="with --lrs: fresh seeds at the chosen rates")
    add("--vary", action="append", dest="factors", metavar="KEY=A,B", help="a config key's values crossed with the "
        "grid (optim.name=adamw,muon; repeatable); compared --by it: effects per level, interactions")  # fmt: skip
    add("--nproc", type=int, help="processes per run and node (torchrun when > 1; default 1, or --gpus-per-node)")
    add("--runs-dir", type=Path, default=Path("runs"))
    add_overrides(parser, "a config value of every cell")
    add("--out", type=Path, help="comparison folder (default runs/<config>-comparison)")
    add("--baseline", help="baseline group of the comparison")
    add("--equivalence-margin", type=float, metavar="DELTA", help="test equivalence within +-DELTA (see compare)")
    add("--allow-differ", action="append", default=[], metavar="KEY", help="a key the cells may differ in (compare)")
    add("--dry-run", action="store_true", help="print the commands (or the job scripts), run nothing")
    add("--push-to-hub", metavar="USER", help="then publish the sweep under this Hub namespace (publish_sweep.py)")
    add("--hub-prefix", metavar="NAME", help="with --push-to-hub: its --prefix")
    add("--launcher", choices=("local", "slurm"), default="local", help="where the cells run (default local)")
    add("--status", action="store_true", help="show each cell's job, state, step, last loss and requeues")
    add("--in-job", metavar="PART", help=argparse.SUPPRESS)  # cell:INDEX or compare: what a SLURM job runs
    scaling.add_arguments(parser, sweep=True)
    speedup.add_arguments(parser, sweep=True)
    power.add_arguments(parser)
    SlurmOptions.add_arguments(parser)
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    from gpt.sweep import slurm
    from gpt.sweep.spec import SweepSpec

    spec = SweepSpec.from_args(args, nproc=args.nproc or args.gpus_per_node or 1)
    folder = slurm.SweepFolder.of(spec.config, spec.runs_dir)
    if args.status or power.planned(args):  # nothing runs
        from gpt.sweep.plan import plan_lines

        print(slurm.status_table(slurm.status_rows(spec.cells(), folder)) if args.status else plan_lines(spec, args))
        return 0
    if args.in_job is not None:  # the heavy imports (torch, matplotlib) from here on, each where its work starts
        from gpt.sweep import cell_job
    if args.in_job is not None and args.in_job.startswith("cell:"):
        return cell_job.run_cell_job(spec, int(args.in_job.removeprefix("cell:")), folder)
    if args.push_to_hub and not args.in_job:  # a name the Hub refuses stops here, not after the training
        from gpt.publish.naming import check_repo_name

        check_repo_name(f"{args.push_to_hub}/{args.hub_prefix + '-' if args.hub_prefix else ''}{args.config.stem}")
    if args.in_job == "compare":
        # then published, with --push-to-hub, by the job (a two-stage sweep's selection: the confirmation submitted)
        result = cell_job.compare_sweep(spec, folder, SlurmOptions.from_args(args))
    elif args.launcher == "slurm":
        slurm.submit_sweep(spec, folder, SlurmOptions.from_args(args), args.dry_run)
        return 0
    else:
        from gpt.sweep.launch import run_sweep

        result = run_sweep(**spec.run_options(), dry_run=args.dry_run, hooks_for=standard_hooks)
    if result is not None:
        from gpt.analysis import across_sizes, report

        print((across_sizes.markdown if spec.sizes else report.markdown)(result), end="")
        print(f"\nplots: {', '.join(result['plots'])}")
    if args.push_to_hub:
        from gpt.sweep.launch import publish_grid

        publish_grid(args.config, args.runs_dir, args.out, args.push_to_hub, args.hub_prefix, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
