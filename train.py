"""Train a GPT from a YAML config: the front door of ``gpt.commands.train`` (``python train.py --help``).

python train.py configs/tiny.yaml
torchrun --nproc_per_node=8 train.py configs/gpt2-small-pytorch-rmsnorm.yaml
"""

import sys

from gpt.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
