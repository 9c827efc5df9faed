"""Held-out test loss of runs: the front door of ``gpt.commands.evaluate`` (``python evaluate.py --help``).

python evaluate.py runs/*
torchrun --nproc_per_node=8 evaluate.py runs/*
"""

import sys

from gpt.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
