"""Run a grid of norm types x seeds, evaluate every cell, compare them.

    python scripts/sweep.py configs/gpt2-small.yaml --norm-types handrolled_layernorm pytorch_layernorm \
        --seeds 0 1 2 [--nproc 8] [--set KEY=VALUE ...] [--dry-run]

Cells run one after another (each under torchrun when --nproc > 1) in
runs/<config>-<norm-type>-s<seed>. Rerunning the same command skips finished cells and
resumes interrupted ones. --dry-run prints the commands instead.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gpt.errors import UserError  # noqa: E402
from gpt.norms import NORM_TYPES  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), choices=NORM_TYPES, metavar="NORM_TYPE",
                        help=f"default: all ({', '.join(NORM_TYPES)})")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun when > 1)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every cell (repeatable)")
    parser.add_argument("--out", type=Path, help="comparison folder (default runs/<config>-comparison)")
    parser.add_argument("--baseline", help="baseline group of the comparison")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    from gpt.compare import markdown
    from gpt.sweep import run_sweep

    try:
        result = run_sweep(args.config, args.norm_types, args.seeds, args.runs_dir, args.nproc, args.overrides,
                           args.out, args.baseline, args.dry_run)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(markdown(result), end="")
        print(f"\nplots: {', '.join(result['plots'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
