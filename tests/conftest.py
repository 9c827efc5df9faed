import os

# No test may wait on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from gpt.config import ModelConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture
def tiny_model_cfg():
    """A model small enough to build in milliseconds: vocab 97, width 32, 2 layers."""
    def make(**kw):
        base = dict(vocab_size=97, context_length=16, d_model=32, n_layers=2, n_heads=4)
        base.update(kw)
        return ModelConfig(**base)
    return make
