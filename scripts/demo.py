"""The embedded demo: the front door of ``gpt.commands.demo`` (``--help``), with this checkout's demo config.

python scripts/demo.py
"""

import sys
from pathlib import Path

from gpt.commands.demo import main

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"

if __name__ == "__main__":
    sys.exit(main(["--config", str(DEMO_CONFIG), *sys.argv[1:]]))  # a --config given here comes last and wins
