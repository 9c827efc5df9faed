"""The fingerprint of a computation: what decides a run's numbers besides its config.

The config says what a run asks for; the fingerprint says what it got where it ran:
``train.precision: auto`` and ``train.compile: null`` resolved, TF32 as applied, the
device type and name, the world size and gradient accumulation, torch and CUDA, the
code, and the identity of the tokens read (``gpt.data.tokens.TokenFile.identity``). Each key
sits under the config key it resolves where there is one (``train.precision``), so a
comparison reads both as one flat mapping (``computation``).

A training process takes one when it starts (``take``). A run's first start and every
resume is a *segment*; the run carries the list of its segments in every checkpoint's
``checkpoint.json`` and in its ``summary.json``. ``check_resume`` refuses a resume that
would change what is computed (``FIXED_ON_RESUME``): the data's content, the resolved
precision or TF32, the device type. A change of world size is allowed (the reader gives
every world size the same batches) and shows as a new segment.

An evaluation takes ``evaluation_fingerprint``: the precision path (autocast, and fp32 matmuls in
IEEE as the evaluation sets them), the batch size, where it ran, the code and, for a test loss,
the test split's identity.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from gpt.config import flatten
from gpt.data.tokens import TokenFile
from gpt.run.checkpoints import CheckpointError
from gpt.run.distributed import Dist, device_name
from gpt.run.fastpath import FastPath, fp32_precision

PACKAGE = "gpt-norm-harness"
SOURCE = Path(__file__).resolve().parents[1]  # the package whose code is hashed (every .py file in it)

# Recorded for the reader, never compared: they do not change a number (code.source stands for the code).
PER_SEGMENT = ("from_step", "started", "host")
INFORMATIONAL = (
    *PER_SEGMENT,
    "code.version",
    "code.commit",
    "code.dirty",
    "software.python",
    "software.numpy",
    "data.dir",
)
# An evaluation's recorded keys that change no number: the code's name for itself (code.source stands for the
# code), the interpreter, and the world size (ranks score whole batches and sum them in batch order: the same
# bits on any number of processes, tested). Every other key of its fingerprint is compared.
EVALUATION_INFORMATIONAL = (
    "code.version",
    "code.commit",
    "code.dirty",
    "software.python",
    "software.numpy",
    "hardware.world_size",
    "test",
)
# Config keys that say where the tokens are; the fingerprint's data identity says what they are.
LOCATION = ("data.path", "data.hub_repo", "data.hub_revision")
# What a resume may not change (prefixes of flat keys): the run would compute something else from there on.
FIXED_ON_RESUME = ("data.tokenizer", "data.train.", "data.val.", "train.precision", "train.tf32", "hardware.device")


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """The code that runs: the package's version, the sha256 of its source files, and, where the package
    is a git checkout's, its commit and whether the checkout has uncommitted changes."""
    h = hashlib.sha256()
    for path in sorted(SOURCE.rglob("*.py")):
        h.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        version = None
    return {"version": version, "source": h.hexdigest(), **_git_state()}


def _git_state() -> dict:
    """``{"commit", "dirty"}`` of the checkout the package lives in; None for both when it is not one
    (an installed copy, or no git)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel"))
        if (top / SOURCE.name).resolve() != SOURCE:  # a copy installed inside some other repository
            return {"commit": None, "dirty": None}
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def take(
    fast: FastPath,
    dist: Dist,
    *,
    data_dir: Path,
    tokenizer: str,
    micro_batch_size: int,
    grad_accum: int,
    train: TokenFile,
    train_range: tuple[int, int],
    val: TokenFile,
    val_range: tuple[int, int],
    from_step: int,
) -> dict:
    """The fingerprint of a training segment starting after ``from_step`` on this process's device."""
    return {
        "from_step": from_step,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "train": {
            "precision": fast.precision,
            "compile": fast.compile,
            "tf32": fast.tf32,
            "micro_batch_size": micro_batch_size,
            "grad_accum": grad_accum,
        },
        **where(dist),
        "code": code_version(),
        "data": {
            "dir": str(data_dir),
            "tokenizer": tokenizer,
            "train": {**train.identity(), "range": list(train_range)},
            "val": {**val.identity(), "range": list(val_range)},
        },
    }


def where(dist: Dist) -> dict:
    """The hardware and software a process computes on."""
    return {
        "hardware": {"device": dist.device.type, "name": device_name(dist.device), "world_size": dist.world_size},
        "software": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda if dist.device.type == "cuda" else None,
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
    }


def evaluation_fingerprint(dist: Dist, precision: str, batch_size: int, test: TokenFile | None = None) -> dict:
    """What an evaluation result records of how it was computed: the autocast precision, how fp32 matmuls ran
    (taken inside ``gpt.run.fastpath.ieee_fp32``, as applied: ``tf32`` false), the batch size, where it ran
    (device, its name, world size, torch and CUDA), the code (source hash, commit, uncommitted changes) and,
    for a test loss, the test split's identity. ``gpt.analysis.table`` compares every key that can change a
    number (``EVALUATION_INFORMATIONAL`` lists those that cannot)."""
    fp32 = fp32_precision()
    return {
        "precision": precision,
        "tf32": "tf32" in fp32.values(),
        "fp32_matmul": fp32,
        "batch_size": batch_size,
        **where(dist),
        "code": code_version(),
        **({"test": test.identity()} if test is not None else {}),
    }


def check_resume(saved: list[dict], current: dict, source: Path) -> None:
    """Refuse to continue the segments ``saved`` (a checkpoint's) with ``current`` when that changes what
    is computed, naming each change with both values. A checkpoint written before fingerprints has none."""
    if not saved:
        return
    old, new = flatten(saved[-1]), flatten(current)
    changed = [
        (k, old.get(k), new.get(k))
        for k in sorted(old.keys() | new.keys())
        if k.startswith(FIXED_ON_RESUME) and old.get(k) != new.get(k)
    ]
    if changed:
        listed = "; ".join(f"{k}: checkpoint {shown(a)}, now {shown(b)}" for k, a, b in changed)
        raise CheckpointError(
            f"{source} cannot be continued here, the run would compute something else from step "
            f"{current['from_step']:,}: {listed}; resume with the data, precision and device it "
            "was trained with, or start a new run"
        )


def shown(value) -> str:
    """A recorded value as a message shows it: a sha256 cut to 12 characters, other text as it is, anything
    else as JSON (true, null, [8, 4])."""
    if isinstance(value, str):
        return value[:12] + "..." if len(value) == 64 and set(value) <= set("0123456789abcdef") else value
    return json.dumps(value)


def computation(config: dict, segments: list[dict] | None) -> dict:
    """A run's flat view of what decides its numbers: its flattened config, with the compared keys of its
    segments' fingerprints over it (so ``train.precision`` is the precision used, not ``auto``) and the
    data's location replaced by its identity. A key whose value changed between segments holds the list
    of its values in segment order. Without segments (a run from before fingerprints): the config alone."""
    if not segments:
        return dict(config)
    located = {k: v for k, v in config.items() if k not in LOCATION}
    return {**located, **_merged(segments, lambda k: not k.startswith(INFORMATIONAL))}


def informational(segments: list[dict] | None) -> dict:
    """The recorded keys that are not compared (code version and commit, Python, the data's folder), flat,
    merged over the segments as in ``computation``."""
    return _merged(segments or [], lambda k: k.startswith(INFORMATIONAL) and k not in PER_SEGMENT)


def _merged(segments: list[dict], keep) -> dict:
    values: dict[str, list] = {}
    for segment in segments:
        for k, v in flatten(segment).items():
            if keep(k) and v not in values.setdefault(k, []):
                values[k].append(v)
    return {k: vs[0] if len(vs) == 1 else vs for k, vs in values.items()}
