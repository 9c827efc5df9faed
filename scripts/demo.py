"""The embedded demo: no GPU, no network, under 10 minutes on 2 CPU cores.

    python scripts/demo.py [--norm-types ...] [--seeds 0 ...]

Prepares the Shakespeare token set (data/shakespeare) if it is missing, trains the tiny
model of configs/demo.yaml once per norm type from the same seed, evaluates each on the
held-out test split, and prints the comparison table and where the plots are. It is the
same path as a real experiment (prepare_data.py, train.py, evaluate.py, compare.py
through scripts/sweep.py), only small: what it shows and what it cannot is in the README.
Rerunning it skips what is done.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from gpt.errors import UserError  # noqa: E402
from gpt.norms import NORM_TYPES  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), choices=NORM_TYPES, metavar="NORM_TYPE")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    args = parser.parse_args(argv)
    start = time.perf_counter()

    from gpt.compare import markdown
    from gpt.config import load_config
    from gpt.sweep import run_sweep

    try:
        data = Path(load_config(args.config, ["run.name=demo"]).data.path)
        if not data.exists():
            from gpt.prepare import prepare
            from gpt.sources import open_source
            from gpt.tokenizer import gpt2_encoding

            print(f"preparing {data} from the embedded Shakespeare corpus")
            prepare(open_source("shakespeare"), data, gpt2_encoding(), val_tokens=75_000, test_tokens=150_000)
        result = run_sweep(args.config, args.norm_types, args.seeds, args.runs_dir,
                           out=args.runs_dir / f"{args.config.stem}-comparison")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print()
    print(markdown(result), end="")
    print(f"\nplots: {', '.join(result['plots'])}")
    print(f"demo wall time: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
