"""What every command shares: the UserError -> one line and exit status 2 wrapper, config arguments,
and the hooks a training run started by a command gets.

Each command is a module ``gpt.commands.<command>`` with a ``main(argv=None) -> int`` decorated
with ``@command``; ``python -m gpt.commands.<command>``, the ``gpt-<command>`` console scripts and
the front doors (``train.py``, ``evaluate.py``, ``scripts/*.py``) all call that ``main``. A
command imports this module and the wings below it, never another command.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

from gpt.common.bounded import leave
from gpt.common.errors import UserError, on_one_line
from gpt.common.stops import StopNow
from gpt.config import NORM_TYPES, Config, load_config, norm_label_arg

USER_ERROR_EXIT = 2


def is_rank0() -> bool:
    """True outside torchrun and on its rank 0: the one process that prints."""
    return os.environ.get("RANK", "0") == "0"


INTERRUPTED_EXIT = 130  # Ctrl-C before a command had anything to keep (the shell's own 128 + SIGINT)


def command(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Turn a ``UserError`` raised by ``main`` into ``error: <message>`` on stderr (rank 0) and exit status 2;
    a Ctrl-C or a run stopped at once by a third signal into one line, never a traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        code = _run(main, argv)
        leave(code)  # a call given up on (wandb against a silent server) would hold the exit: not waited for
        return code

    return wrapped


def _run(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``main(argv)``'s exit status, with what a user can cause turned into one line and its status."""
    try:
        return main(argv)
    except UserError as e:
        if is_rank0():
            print(f"error: {on_one_line(str(e))}", file=sys.stderr)
        return USER_ERROR_EXIT
    except StopNow as e:  # a third stop signal, or a lost peer (said by the rank that speaks for the machine)
        if getattr(e, "say", is_rank0()):
            print("; ".join(x for x in (str(e), e.hint) if x), file=sys.stderr)
        return StopNow.EXIT_CODE
    except KeyboardInterrupt:
        if is_rank0():
            print("interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED_EXIT


def parser_for(doc: str, split_at: int = 1) -> argparse.ArgumentParser:
    """An ArgumentParser whose description is ``doc``'s first line and whose epilog is the rest after
    its ``split_at``-th blank line (the usage lines stay in the epilog, as written)."""
    return argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog=doc.split("\n\n", split_at)[split_at],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The arguments every config-driven command shares: CONFIG and repeated --set KEY=VALUE."""
    parser.add_argument("config", help="YAML config file (see configs/)")
    add_overrides(parser)


def add_overrides(parser: argparse.ArgumentParser, what: str = "one config value") -> None:
    """Repeated ``--set KEY=VALUE`` into ``args.overrides``, overriding ``what``."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override {what}, e.g. --set model.norm_type=pytorch_rmsnorm (repeatable; values are YAML scalars)",
    )


def add_grid(parser: argparse.ArgumentParser, norm_types: list[str], seeds: list[int]) -> None:
    """A grid's ``--norm-types`` (a registered norm type each, or one with sites of their own) and ``--seeds``,
    with their defaults."""
    every = "all" if list(norm_types) == list(NORM_TYPES) else " ".join(norm_types)
    parser.add_argument(
        "--norm-types", nargs="+", default=list(norm_types), type=norm_label_arg, metavar="NORM_TYPE",
        help=f"default: {every} (of {', '.join(NORM_TYPES)}); NORM_TYPE+SITE:NORM_TYPE gives a site (attn, mlp, "
        "final) its own",
    )  # fmt: skip
    seeds_help = f"seeds of the initial weights and the data order together (default {' '.join(map(str, seeds))})"
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds), help=seeds_help)


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.config, args.overrides)


def standard_hooks(cfg: Config) -> list:
    """What a training run started by a command tells the world: its charts (drawn at its end, and after a
    checkpoint every few minutes), then its Hub uploads (``hub.*``). Imported here, when a run starts:
    ``--help`` stays fast."""
    from gpt.analysis.charts import RunCharts
    from gpt.publish.uploads import HubUploads

    return [RunCharts(f"{cfg.run.name} ({cfg.model.norm_type})"), HubUploads(cfg)]
