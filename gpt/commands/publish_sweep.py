"""Publish a whole sweep on the Hugging Face Hub: every run a model, the comparison a dataset, one collection.

    python scripts/publish_sweep.py SWEEP_DIR --namespace USER [--prefix NAME] [--include-failed]
                                    [--comparison DIR] [--public] [--dry-run]
    python scripts/sweep.py CONFIG ... --push-to-hub USER [--hub-prefix NAME]   (the same, after the sweep)
    python -m gpt.commands.publish_sweep ...   /   gpt-publish-sweep ...

SWEEP_DIR is the folder a sweep wrote (scripts/sweep.py's --runs-dir, runs/ by default): its
runs and its comparison folder. Every completed, evaluated run becomes the model repo
USER/[NAME-]<run> (loadable with trust_remote_code=True, its card with its test loss and its
row); runs that diverged or did not complete only with --include-failed, their cards saying
so. The comparison becomes the dataset repo USER/[NAME-]<comparison folder> (the table, the
charts, every run's config, summary, evaluation and metrics, a card with the reproduction
commands), and the collection "<NAME or config>: norm layers compared" holds the dataset, then
the models in table order. Repos are created private unless --public.

Rerunning uploads only what changed (a sweep that gained a seed: that run's repo and the
comparison's files). --dry-run prints every repo, file and collection change it would make, and
only reads from the Hub. A repo that fails is named (exit status 2); the others are complete,
and running the same command again finishes the job. The token comes from HF_TOKEN or
`hf auth login`, and is written nowhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.commands.cli import command, parser_for


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", type=Path, help="the folder the sweep wrote (its --runs-dir)")
    parser.add_argument("--namespace", required=True, metavar="USER", help="the Hub user or organisation")
    parser.add_argument("--prefix", metavar="NAME", help="before every repo name, and the collection's title")
    parser.add_argument(
        "--comparison", type=Path, metavar="DIR", help="the comparison folder, if SWEEP_DIR has several"
    )
    parser.add_argument(
        "--include-failed", action="store_true", help="publish runs that diverged or did not complete too"
    )
    parser.add_argument("--public", dest="private", action="store_false", help="create public repos (default private)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be uploaded; change nothing")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gpt.publish.release import outcome_problems, publish_sweep

    outcome = publish_sweep(
        args.sweep_dir,
        args.namespace,
        prefix=args.prefix,
        comparison=args.comparison,
        include_failed=args.include_failed,
        private=args.private,
        dry_run=args.dry_run,
    )
    outcome_problems(outcome)  # raises the one line naming what failed
    return 0


if __name__ == "__main__":
    sys.exit(main())
