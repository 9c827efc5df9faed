"""Train a GPT from a YAML config.

    python train.py CONFIG [--set KEY=VALUE ...] [--resume auto|PATH] [--overwrite] [--dry-run]
    python train.py CONFIG --find-micro-batch              # the largest micro-batch this GPU holds
    torchrun --nproc_per_node=8 train.py CONFIG ...          # DDP, one GPU per process
    python -m gpt.commands.train CONFIG ...   /   gpt-train CONFIG ...  # the same, from anywhere

Parse the arguments, resolve and validate the config (a mistake is one line on stderr
and exit status 2, before anything heavy), then hand over to gpt.training.loop. Exit status:
0 completed, 3 diverged, 4 interrupted (a checkpoint was written; rerun with --resume
auto), 2 a user error.
"""

from __future__ import annotations

import argparse
import sys

from gpt.commands.cli import add_config_args, command, config_from_args, parser_for, standard_hooks
from gpt.common.errors import UserError
from gpt.config import describe_fields, dump_config


def parser() -> argparse.ArgumentParser:
    parser = parser_for(__doc__, 2)
    add_config_args(parser)
    parser.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="auto: continue from the run's latest checkpoint if there is one, else start; "
        "PATH: a run directory or checkpoint folder to continue from",
    )
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run directory that holds a run (the old one is moved aside)")  # fmt: skip
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the model, report it and what the run spends besides its training steps "
        "(validations, checkpoint writes, stats steps), and stop",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="with --dry-run: the GPUs the overheads are estimated for (default: global_batch_size / "
        "micro_batch_size, one micro-step each: 8 for GPT-2 small)",
    )
    parser.add_argument(
        "--find-micro-batch",
        action="store_true",
        help="find the largest micro-batch that fits in this GPU's memory (bisecting with real "
        "steps) and print the accumulation it implies; trains nothing",
    )
    parser.add_argument("--print-config", action="store_true", help="print the fully resolved config as YAML")
    parser.add_argument(
        "--help-config",
        action="store_true",
        help="print every config key with its default as YAML (type and doc as comments)",
    )
    return parser


def dry_run(cfg, gpus: int | None) -> str:
    """The model and what the run spends besides its training steps on ``gpus`` GPUs (default: one micro-step
    each), all on the CPU (the stats step counted on the meta device)."""
    from gpt.model.gpt import GPT  # after validation: building the model is the heavy part
    from gpt.model.inventory import model_summary
    from gpt.speed.overheads import overhead_lines, stats_step_cost
    from gpt.training.optimizer import optimizer_line

    model = GPT(cfg.model, seed=cfg.init_seed)
    gpus = gpus or cfg.train.global_batch_size // cfg.train.micro_batch_size
    stats = stats_step_cost(cfg.model) if cfg.log.stats_every else None
    lines = [model_summary(cfg, model), optimizer_line(cfg.optim, model)]
    return "\n".join([*lines, *overhead_lines(cfg, model, gpus, stats)])


@command
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help-config" in argv:
        print(describe_fields())
        return 0
    commands = parser()
    args = commands.parse_args(argv)
    if args.gpus is not None and args.gpus < 1:
        commands.error(f"argument --gpus: {args.gpus} is not a number of GPUs (1 or more)")
    if args.gpus is not None and not args.dry_run:
        commands.error("argument --gpus: the GPUs a --dry-run estimates for; add --dry-run (a run's GPUs are "
                       "torchrun's --nproc_per_node)")  # fmt: skip
    cfg = config_from_args(args)
    if args.gpus is not None and (unsplit := cfg.train.split_problem(args.gpus, "GPUs")):
        raise UserError(f"--gpus {args.gpus}: {unsplit}")
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    if args.dry_run:
        print(dry_run(cfg, args.gpus))
        return 0
    if args.find_micro_batch:
        from gpt.run.distributed import setup
        from gpt.speed.micro_batch import find_micro_batch

        dist = setup(cfg.run.device)
        try:
            print(find_micro_batch(cfg, dist))
        finally:
            dist.close()
        return 0
    from gpt.run.directory import EXIT_CODES
    from gpt.training.loop import train

    summary = train(cfg, resume=args.resume, overwrite=args.overwrite, hooks=standard_hooks(cfg))
    return EXIT_CODES[summary["status"]]


if __name__ == "__main__":
    sys.exit(main())
