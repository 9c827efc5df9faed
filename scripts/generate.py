"""Sample text from a checkpoint or a Hub repo: the front door of ``gpt.commands.generate`` (``--help``).

python scripts/generate.py runs/tiny --prompt "ROMEO:" --max-new-tokens 60
"""

import sys

from gpt.commands.generate import main

if __name__ == "__main__":
    sys.exit(main())
