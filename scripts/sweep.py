"""Run a grid of norm types x seeds: the front door of ``gpt.commands.sweep`` (``--help``).

python scripts/sweep.py configs/gpt2-small.yaml --seeds 0 1 2 --nproc 8
"""

import sys

from gpt.commands.sweep import main

if __name__ == "__main__":
    sys.exit(main())
