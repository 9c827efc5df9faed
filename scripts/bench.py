"""Benchmark training steps per norm type, or each norm alone: the front door of ``gpt.commands.bench`` (``--help``).

python scripts/bench.py configs/gpt2-small.yaml --compile both --json
"""

import sys

from gpt.commands.bench import main

if __name__ == "__main__":
    sys.exit(main())
