"""Every random number generator a training step may draw from: saved into and restored from checkpoints."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    """Every RNG a training step may draw from, as plain values and tensors."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])},
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.array(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
