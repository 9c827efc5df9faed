"""Checkpoints: atomic writes, ``latest`` / ``best`` pointers, retention, and loading.

A checkpoints folder (a run's ``checkpoints/``, see ``gpt.rundir``) holds
``step-00000617/`` folders, each with

    model.safetensors   the weights (shared tensors stored once)
    state.pt            optimizer, grad scaler, data reader, counters, every rank's RNG states
    config.yaml         the resolved config of the run
    checkpoint.json     step, tokens, losses, time: readable without torch

A checkpoint is written into a hidden temporary folder and renamed into place; the
pointer files ``checkpoints/latest`` and ``checkpoints/best`` (one line: a folder name)
are replaced atomically afterwards, and old checkpoints are deleted only after that. A
crash at any moment therefore leaves ``latest`` naming a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from gpt.config import RESUMABLE, Config, ConfigError, config_differences, load_config
from gpt.errors import UserError

MODEL_FILE, STATE_FILE, CONFIG_FILE, INFO_FILE = "model.safetensors", "state.pt", "config.yaml", "checkpoint.json"
POINTERS = ("latest", "best")


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete or does not fit the config."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_pointer(root: Path, pointer: str, target: str) -> None:
    tmp = root / f".{pointer}.tmp-{os.getpid()}"
    tmp.write_text(target + "\n")
    _fsync(tmp)
    os.replace(tmp, root / pointer)


def read_pointer(root: Path, pointer: str) -> Path | None:
    path = root / pointer
    if not path.is_file():
        return None
    return root / path.read_text().strip()


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, *, state: dict, config_yaml: str,
                    info: dict, keep_last: int, is_best: bool) -> Path:
    """Write checkpoint ``step`` into the checkpoints folder ``root`` atomically, move ``latest``
    (and ``best``) to it, and prune old ones: the last ``keep_last`` and the pointed-to stay."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / MODEL_FILE))
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(config_yaml)
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    for f in tmp.iterdir():
        _fsync(f)
    final = root / name
    if final.exists():  # the same step again (a resumed run passing it): swap, never a gap
        aside = root / f".old-{name}-{os.getpid()}"
        final.rename(aside)
        tmp.rename(final)
        shutil.rmtree(aside)
    else:
        tmp.rename(final)
    _fsync(root)
    _write_pointer(root, "latest", name)
    if is_best:
        _write_pointer(root, "best", name)
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    keep = {p.name for p in (read_pointer(root, n) for n in POINTERS) if p is not None}
    steps = sorted(p.name for p in root.glob("step-*") if p.is_dir())
    keep |= set(steps[-keep_last:])
    for name in steps:
        if name not in keep:
            shutil.rmtree(root / name, ignore_errors=True)


def remove_stale_temporaries(root: Path) -> None:
    """Folders a killed writer left in the checkpoints folder ``root`` (never pointed to; safe to delete)."""
    root = Path(root)
    for p in root.glob(".tmp-*") if root.is_dir() else ():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint folder itself (it holds the weights)."""
    return (Path(path) / MODEL_FILE).is_file()


def read_info(ckpt: Path) -> dict:
    """The checkpoint's ``checkpoint.json`` (step, tokens, losses, time), or {} if it has none."""
    path = ckpt / INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def checkpoint_config(ckpt: Path) -> Config:
    path = ckpt / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{ckpt}: no {CONFIG_FILE}; cannot tell what model it holds")
    try:
        return load_config(path)
    except ConfigError as e:
        raise CheckpointError(f"{ckpt}: its config no longer loads: {e}") from None


def check_same_experiment(saved: Config, wanted: Config, source: Path) -> None:
    """Refuse to continue ``saved`` (a checkpoint's or a run's config) under ``wanted`` if they differ
    anywhere outside ``RESUMABLE``, naming each differing key with both values."""
    diffs = [(k, old, new) for k, old, new in config_differences(saved, wanted) if not k.startswith(RESUMABLE)]
    if not diffs:
        return
    listed = "; ".join(f"{k}: checkpoint {old!r}, config {new!r}" for k, old, new in diffs)
    if any(k.startswith("model.") for k, _, _ in diffs):
        raise CheckpointError(f"{source} holds a different model; {listed}")
    allowed = ", ".join(p + "*" if p.endswith(".") else p for p in RESUMABLE)
    raise CheckpointError(f"{source} was trained with a different config; {listed}; a resumed run may change "
                          f"only {allowed}: resume with the checkpoint's values, or start a new run")


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    missing, unexpected = load_model(model, str(ckpt / MODEL_FILE), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{ckpt}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def load_state(ckpt: Path) -> dict:
    return torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)


# ------------------------------------------------------------------------ RNG states

def rng_state() -> dict:
    """Every RNG a training step may draw from, as plain values and tensors."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {**np_state, "state": {"key": np_state["state"]["key"].tolist(),
                                        "pos": int(np_state["state"]["pos"])}},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.array(np_state["state"]["key"], dtype=np.uint32),
                         "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
