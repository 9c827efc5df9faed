"""Publish a whole sweep on the Hub: the front door of ``gpt.commands.publish_sweep`` (``--help``).

python scripts/publish_sweep.py runs --namespace USER [--prefix NAME] [--dry-run]
"""

import sys

from gpt.commands.publish_sweep import main

if __name__ == "__main__":
    sys.exit(main())
