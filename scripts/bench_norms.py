"""Time each norm layer alone: the front door of ``gpt.bench_norms`` (``--help``).

    python scripts/bench_norms.py --device cuda --dtype bf16 --compile
"""

import sys

from gpt.bench_norms import main

if __name__ == "__main__":
    sys.exit(main())
