"""Compare runs across norm types and seeds: the front door of ``gpt.commands.compare`` (``--help``).

python scripts/compare.py runs/gpt2-small-* --baseline handrolled_layernorm --out comparison/
"""

import sys

from gpt.commands.compare import main

if __name__ == "__main__":
    sys.exit(main())
