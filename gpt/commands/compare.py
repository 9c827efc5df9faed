"""Compare runs across norm types and seeds: a table with intervals, and plots.

    python scripts/compare.py runs/* [--baseline handrolled_layernorm] [--out comparison/] [--equivalence-margin 0.01]
    python scripts/compare.py runs/* --vary optim.lr --baseline "handrolled_layernorm, optim.lr=0.0014"
    python scripts/compare.py runs/lr-* --select-on val --allow-differ optim.min_lr  # each norm's rate chosen on val
    python scripts/compare.py runs/* --allow-differ hardware.name     # seeds trained on two kinds of GPU
    python scripts/compare.py runs/x-* --by optim.name  # each norm's effect per optimizer, and how it differs
    python scripts/compare.py --results table.csv --detect 0.01       # numbers from anywhere (gpt.analysis.results)
    python scripts/compare.py runs/ladder-* --across-sizes --predict-at 124M    # runs of several model.size
    python scripts/compare.py runs/demo-*[a-z]-s? --ladder runs/demo-*-t*-s? [--throughput BENCH.jsonl]  # speedup
    python -m gpt.commands.compare ...   /   gpt-compare ...

Reads only run directories (config, metrics, summary with the fingerprints, and the evaluation
evaluate.py wrote beside the chosen checkpoint). Runs must differ in the norm type and the seeds
only: any other difference in their configs, fingerprints or evaluations is refused, naming each
key, unless --vary or --allow-differ names it. --select-on val makes optim.lr an axis, chooses each norm
type's rate by its lowest mean validation loss over seeds and compares the test losses at the chosen rates
(gpt.analysis.selection). Writes comparison.md, comparison.json, runs.csv (as --results reads it) and the
charts into --out, and prints the report. --across-sizes: runs of several model.size, each size compared into
--out/sizes/<size>/, then per norm type the fits against size and the gap's trend (gpt.analysis.across_sizes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.analysis import scaling, speedup
from gpt.commands.cli import command, parser_for
from gpt.config import PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__)
    add = parser.add_argument
    add("runs", nargs="*", type=Path, metavar="RUN")
    add("--results", type=Path, metavar="FILE.csv",
        help="compare a table of results instead of run directories: columns group, init_seed, data_seed, "
        "test_loss, optionally status and TASK.METRIC columns (as every comparison's runs.csv)")  # fmt: skip
    add("--baseline", help="group to compare against (default: handrolled_layernorm; without it, "
        "the first norm type in the write-up's order)")  # fmt: skip
    add("--out", type=Path, default=Path("comparison"), help="output folder (default comparison/)")
    add("--which", choices=("final", "best", "latest"), default="final",
        help="whose evaluation to use (as given to evaluate.py)")  # fmt: skip
    add("--split", default="test", help="evaluated split (default test)")
    add("--precision", choices=PRECISIONS, default="fp32", help="evaluation precision (default fp32)")
    add("--equivalence-margin", type=float, metavar="DELTA",
        help="also test whether each group is equivalent to the baseline within +-DELTA "
        "(two one-sided t tests on the paired differences)")  # fmt: skip
    add("--detect", type=float, metavar="DELTA",
        help="plan for a true difference of DELTA: the independent seed pairs that find it with 80%% power "
        "(default: the equivalence margin)")  # fmt: skip
    add("--tokens", type=int, metavar="N",
        help="the results evaluate.py kept over N tokens from --offset (as its --tokens gave them; "
        "default: over each run's configured test range)")  # fmt: skip
    parser.add_argument("--offset", type=int, help="with --tokens: the first token (default: data.test_offset)")
    parser.add_argument("--no-plots", action="store_true", help="write the tables only, no charts (seconds faster)")
    _add_differing_keys(parser)
    scaling.add_arguments(parser)
    speedup.add_arguments(parser)
    return parser


def _add_differing_keys(parser: argparse.ArgumentParser) -> None:
    """--vary, --allow-differ and --select-on: the keys runs may differ in, and how."""
    add = parser.add_argument
    add("--vary", action="append", default=[], metavar="KEY",
        help="a config or fingerprint key the runs may differ in, as an axis of the table: one "
        "group per norm type and value (repeatable)")  # fmt: skip
    add("--allow-differ", action="append", default=[], metavar="KEY",
        help="a key the runs may differ in without forming groups; the report says so "
        "(repeatable; a prefix like data.train names every key under it)")  # fmt: skip
    add("--by", action="append", default=[], metavar="KEY", help="a factor crossed with the norm types "
        "(optim.name, model.block; repeatable): each norm's effect per level, and across them")  # fmt: skip
    add("--select-on", choices=("val",),
        help="val: per norm type, the optim.lr with the lowest mean validation loss over seeds (never the test "
        "loss); test losses compared at the chosen rates (implies --vary optim.lr)")  # fmt: skip


@command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.runs and args.results is None:
        parser.error("give the run directories to compare, or --results FILE.csv")
    if args.offset is not None and args.tokens is None:
        parser.error("--offset needs --tokens: a range kept by evaluate.py is named by its first and last token")

    keys = ("which", "split", "precision", "equivalence_margin", "detect", "vary", "allow_differ", "tokens", "offset")
    options = {k: getattr(args, k) for k in (*keys, "select_on")}
    fit = {"predict_at": args.predict_at, "form": args.form, "irreducible": args.irreducible}
    if not args.across_sizes and args.predict_at is not None:
        parser.error("--predict-at predicts from a fit across sizes: add --across-sizes")
    if not (args.across_sizes or args.ladder) and (args.form, args.irreducible) != ("auto", None):
        parser.error("--form and --irreducible fit a curve: add --across-sizes, or --ladder RUN...")
    if args.across_sizes and (args.results is not None or args.ladder or args.by):
        parser.error("--across-sizes reads run directories of several sizes (their curve), not --results/--ladder/--by")
    if args.across_sizes:  # each size compared as below, then the fits across sizes
        from gpt.analysis.across_sizes import compare_sizes as compare
        from gpt.analysis.across_sizes import markdown

        options.update(fit)
    else:
        from gpt.analysis.report import markdown
        from gpt.analysis.table import compare

        options.update(results=args.results, ladder=args.ladder, throughput=args.throughput, form=args.form,
                       irreducible=args.irreducible, by=args.by)  # fmt: skip
    result = compare(args.runs, args.out, args.baseline, plots=not args.no_plots, **options)
    print(markdown(result), end="")
    plots = ", ".join(Path(p).name for p in result["plots"]) or "none (--no-plots)"
    tables = "sizes/" if args.across_sizes else "runs.csv"
    print(f"\nwrote {args.out / 'comparison.md'}, comparison.json, {tables} and plots: {plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
