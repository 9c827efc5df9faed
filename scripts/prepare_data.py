"""Tokenise a corpus into token files: the front door of ``gpt.commands.prepare_data`` (``--help``).

python scripts/prepare_data.py shakespeare
python scripts/prepare_data.py fineweb --max-tokens 3.5B
"""

import sys

from gpt.commands.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
