"""Train a GPT from a YAML config.

    python train.py CONFIG [--set KEY=VALUE ...] [--resume auto|PATH] [--overwrite] [--dry-run]
    torchrun --nproc_per_node=8 train.py CONFIG ...          # DDP, one GPU per process

Thin entry point: parse the arguments, resolve and validate the config (a mistake is one
line on stderr and exit status 2, before anything heavy), then hand over to
gpt.training. Exit status: 0 completed, 3 diverged, 4 interrupted (a checkpoint was
written; rerun with --resume auto), 2 a user error.
"""

import argparse
import os
import sys

from gpt.config import add_config_args, config_from_args, describe_fields, dump_config
from gpt.errors import UserError

EXIT = {"completed": 0, "diverged": 3, "interrupted": 4}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--help-config" in argv:
        print(describe_fields())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--resume", metavar="auto|PATH",
                        help="auto: continue from the run's latest checkpoint if there is one, else start; "
                             "PATH: a run directory or checkpoint folder to continue from")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run directory that holds a run (the old one is moved aside)")
    parser.add_argument("--dry-run", action="store_true", help="build the model, report it and stop")
    parser.add_argument("--print-config", action="store_true", help="print the fully resolved config as YAML")
    parser.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")
    args = parser.parse_args(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        cfg = config_from_args(args)
        if args.print_config:
            print(dump_config(cfg), end="")
            return 0
        if args.dry_run:
            from gpt.model import GPT  # after validation: importing and building is the heavy part
            from gpt.summary import model_summary

            print(model_summary(cfg, GPT(cfg.model, seed=cfg.init_seed)))
            return 0
        from gpt.training import train

        summary = train(cfg, resume=args.resume, overwrite=args.overwrite)
    except UserError as e:
        if rank0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    return EXIT[summary["status"]]


if __name__ == "__main__":
    sys.exit(main())
