"""Train a GPT from a YAML config: ``python train.py CONFIG [--set KEY=VALUE ...]``.

Thin entry point: parse the arguments, resolve and validate the config (any mistake
is one line on stderr and exit status 2, before anything heavy), build the model.
Today it reports what the config describes (``--help-config`` lists every key); the
training loop is the trainer issue's.
"""

import argparse
import sys

from gpt.config import ConfigError, add_config_args, config_from_args, describe_fields, dump_config


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--help-config" in argv:
        print(describe_fields())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_args(parser)
    parser.add_argument("--print-config", action="store_true", help="print the fully resolved config as YAML")
    parser.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0

    from gpt.model import GPT  # after validation: importing and building is the heavy part
    from gpt.summary import model_summary

    print(model_summary(cfg, GPT(cfg.model, seed=cfg.init_seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
