"""Compare runs across norm types and seeds: a table with intervals, and plots.

    python scripts/compare.py runs/* [--baseline handrolled_layernorm] [--out comparison/]

Reads only run directories (config, metrics, summary, and the eval JSON that evaluate.py
wrote beside the chosen checkpoint). Writes comparison.md, comparison.json,
train_loss.png, val_loss.png, grad_norm.png and test_loss.png into --out, and prints the
table.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gpt.errors import UserError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    parser.add_argument("--baseline", help="group to compare against (default: handrolled_layernorm if present)")
    parser.add_argument("--out", type=Path, default=Path("comparison"), help="output folder (default comparison/)")
    parser.add_argument("--which", choices=("final", "best", "latest"), default="final",
                        help="whose evaluation to use (as given to evaluate.py)")
    parser.add_argument("--split", default="test", help="evaluated split (default test)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="evaluation precision (default fp32)")
    args = parser.parse_args(argv)

    from gpt.compare import compare, markdown

    try:
        result = compare(args.runs, args.out, args.baseline, args.which, args.split, args.precision)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(result), end="")
    print(f"\nwrote {args.out / 'comparison.md'}, comparison.json and plots: "
          + ", ".join(Path(p).name for p in result["plots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
