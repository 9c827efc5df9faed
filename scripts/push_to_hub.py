"""Publish a checkpoint on the Hugging Face Hub: the front door of ``gpt.commands.push_to_hub`` (``--help``).

python scripts/push_to_hub.py runs/gpt2-small-pytorch-rmsnorm-s0 --repo me/gpt2-small-rmsnorm
"""

import sys

from gpt.commands.push_to_hub import main

if __name__ == "__main__":
    sys.exit(main())
