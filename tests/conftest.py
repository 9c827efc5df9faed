import os

# No test may wait on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


import pytest  # noqa: E402
from hubserver import HubServer  # noqa: E402
from sweep.slurm_fixtures import slurm_cluster, slurm_installed  # noqa: E402, F401
from synthetic import CONFIGS, ROOT, VOCAB, write_meta, write_token_set, write_train_yaml  # noqa: E402, F401

from gpt.config import ModelConfig  # noqa: E402


@pytest.fixture
def tiny_model_cfg():
    """A model small enough to build in milliseconds: vocab 97, width 32, 2 layers."""

    def make(**kw):
        base = dict(vocab_size=97, context_length=16, d_model=32, n_layers=2, n_heads=4)
        base.update(kw)
        return ModelConfig(**base)

    return make


@pytest.fixture(scope="session")
def token_set(tmp_path_factory):
    return write_token_set(tmp_path_factory.mktemp("tokens") / "synthetic")


@pytest.fixture
def train_yaml(tmp_path, token_set):
    """A tiny CPU training config (vocab 256, fp32) writing into tmp_path/run."""

    def make(name="run"):
        return write_train_yaml(tmp_path, token_set, name)

    return make


FAKE_TOKEN = "hf_FAKEtokenNeverWrittenAnywhere0123456789"


@pytest.fixture
def hub(tmp_path):
    """A Hub on 127.0.0.1 (tests/hubserver.py); ``hub.env`` points a fresh process at it, with a fake token
    that must reach the server and appear in no file."""
    with HubServer() as server:
        server.env = {
            **os.environ,
            "HF_ENDPOINT": server.url,
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": FAKE_TOKEN,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "OMP_NUM_THREADS": "1",
        }
        yield server
