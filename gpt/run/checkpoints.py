"""Checkpoints: atomic writes, ``latest`` / ``best`` pointers, retention, checks, loading.

A checkpoints folder (a run's ``checkpoints/``, see ``gpt.run.directory``) holds
``step-00000617/`` folders, each with

    model.safetensors   the weights (shared tensors stored once)
    state.pt            optimizer, grad scaler, data reader, counters, every rank's RNG states
    config.yaml         the resolved config of the run
    checkpoint.json     step, tokens, losses, time: readable without torch

A new best validation between checkpoints keeps the weights only: ``best-00000500/`` holds
model.safetensors, config.yaml and checkpoint.json (no state.pt: it is evaluated and published,
never resumed from), written by ``save_best_weights`` from a copy the trainer holds in host
memory (``host_copy``) until its next checkpoint.

A checkpoint is written into a hidden temporary folder and renamed into place; the
pointer files ``checkpoints/latest`` and ``checkpoints/best`` (one line: a folder name)
are replaced atomically afterwards, and old checkpoints are deleted only after that. A
crash at any moment therefore leaves a complete checkpoint; ``tidy`` recovers the one
case where it is not at its name (a kill between the two renames of a same-step
replacement), and ``newest_loadable`` skips a damaged one, saying why. A write that
fails (a full disk, a file-size limit, a read-only folder) removes its temporary folder
and stops with the operating system's reason and the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import math
import pickle
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError

from gpt.common.errors import UserError, first_line, quoted, shortened
from gpt.common.files import WriteError, read_json, replacing_folder, write_atomically
from gpt.config import RESUMABLE, Config, ConfigError, config_differences, load_config

if TYPE_CHECKING:  # torch is imported where a tensor is saved or loaded: reading a run folder needs none
    import torch

MODEL_FILE, STATE_FILE, CONFIG_FILE, INFO_FILE = "model.safetensors", "state.pt", "config.yaml", "checkpoint.json"
# torch's own message for such a file advises the unsafe load: it is never repeated
UNSAFE = "holds objects a safe (weights-only) load refuses, so this trainer did not write it; it is not loaded"
POINTERS = ("latest", "best")
STEP_NAME = re.compile(r"step-\d{8}")  # a whole checkpoint: it resumes
BEST_NAME = re.compile(r"best-\d{8}")  # a best validation's weights alone (no state.pt)
CHECKPOINT_NAME = re.compile(r"(?:step|best)-\d{8}")  # what a pointer may name


CHECKPOINTS_PER_RUN = 10  # train.checkpoint_every null: a kill loses at most a tenth of the run


def checkpoint_interval(total_steps: int, eval_every: int, every: int | None) -> int:
    """Steps between checkpoints: ``every`` (train.checkpoint_every), or, when null, about a tenth of the run
    rounded up to a multiple of ``eval_every``, so that every checkpoint follows a validation (a best there is
    the checkpoint itself). GPT-2 small: 33,157 steps, validation every 500 -> every 3,500: 10 writes."""
    if every is not None:
        return every
    return eval_every * max(1, math.ceil(total_steps / CHECKPOINTS_PER_RUN / eval_every))


class CheckpointError(UserError):
    """A checkpoint that is missing, damaged, or does not fit the config; or one that cannot be written."""


def checkpoint_name(step: int, kind: str = "step") -> str:
    return f"{kind}-{step:08d}"


def _write_pointer(root: Path, pointer: str, target: str) -> None:
    write_atomically(root / pointer, target + "\n")


def read_pointer(root: Path, pointer: str) -> Path | None:
    """The checkpoint folder a pointer file names (None: no pointer). A pointer is one folder name of
    this checkpoints folder; anything else (binary, a path, another name) is a CheckpointError."""
    path = Path(root) / pointer
    if not path.is_file():
        return None
    try:
        name = path.read_text().strip()
    except (UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: damaged pointer ({first_line(e)})") from None
    if not CHECKPOINT_NAME.fullmatch(name):
        raise CheckpointError(f"{path}: damaged pointer ({name[:40]!r} is not a checkpoint name like step-00000617)")
    return Path(root) / name


def _pointed(root: Path) -> set[str]:
    names = set()
    for pointer in POINTERS:
        try:
            target = read_pointer(root, pointer)
        except CheckpointError:
            continue
        if target is not None:
            names.add(target.name)
    return names


def step_folders(root: Path) -> list[Path]:
    """The checkpoint folders of a checkpoints folder, oldest first."""
    root = Path(root)
    return sorted(p for p in root.glob("step-*") if p.is_dir() and STEP_NAME.fullmatch(p.name)) if root.is_dir() else []


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    *,
    state: dict,
    config_yaml: str,
    info: dict,
    keep_last: int,
    is_best: bool,
) -> Path:
    """Write checkpoint ``step`` into the checkpoints folder ``root`` atomically, move ``latest``
    (and ``best``) to it, and prune old ones: the last ``keep_last`` and the pointed-to stay.

    A write that fails removes its temporary folder and raises a CheckpointError naming the
    operating system's reason and the last good checkpoint, which stays as it was."""
    import torch
    from safetensors.torch import save_model

    root, name = Path(root), checkpoint_name(step)
    with _failing_as_checkpoint_error(root, name):
        with replacing_folder(root / name) as tmp:  # the same step again (a resumed run passing it): swapped whole
            save_model(model, str(tmp / MODEL_FILE))
            with open(tmp / STATE_FILE, "wb") as f:  # a file object: torch then keeps the OS error as the cause
                torch.save(state, f)
            (tmp / CONFIG_FILE).write_text(config_yaml)
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
            for kept in _kept_beside(root / name, tmp):  # its evaluation results, where the weights are the same
                shutil.copy2(kept, tmp / kept.name)
        for pointer in ("latest", "best") if is_best else ("latest",):
            _write_pointer(root, pointer, name)
    _prune(root, keep_last)
    return root / name


def save_best_weights(
    root: Path, step: int, weights: dict[str, torch.Tensor], *, config_yaml: str, info: dict, keep_last: int
) -> Path:
    """Write a best validation's weights alone (``host_copy``'s, taken at step ``step``) as ``best-<step>/``
    and move ``best`` to it; the best folder it replaces is pruned. Fails as ``save_checkpoint`` does."""
    from safetensors.torch import save_file

    root, name = Path(root), checkpoint_name(step, "best")
    with _failing_as_checkpoint_error(root, name):
        with replacing_folder(root / name) as tmp:
            save_file(weights, str(tmp / MODEL_FILE))
            (tmp / CONFIG_FILE).write_text(config_yaml)
            (tmp / INFO_FILE).write_text(json.dumps({**info, "weights_only": True}, indent=2) + "\n")
            for kept in _kept_beside(root / name, tmp):  # its evaluation results, where the weights are the same
                shutil.copy2(kept, tmp / kept.name)
        _write_pointer(root, "best", name)
    _prune(root, keep_last)
    return root / name


def _kept_beside(old: Path, new: Path) -> list[Path]:
    """The files kept beside checkpoint folder ``old`` (its evaluation results: anything not the checkpoint's own)
    to carry into ``new``, its replacement being written, where the two hold the same weights byte for byte: a
    resumed run that writes the same step again leaves what was measured on it in place. Other weights make them
    stale: they go with the old folder."""
    if not (old / MODEL_FILE).is_file() or not filecmp.cmp(old / MODEL_FILE, new / MODEL_FILE, shallow=False):
        return []
    own = {MODEL_FILE, STATE_FILE, CONFIG_FILE, INFO_FILE}
    return [f for f in sorted(old.iterdir()) if f.is_file() and f.name not in own]


@contextlib.contextmanager
def _failing_as_checkpoint_error(root: Path, name: str):
    """A write of checkpoint ``name`` that fails (a full disk, a file-size limit, a read-only folder) as a
    CheckpointError naming the operating system's reason and the last good checkpoint, which stands."""
    try:
        yield
    except WriteError as e:
        try:
            last = read_pointer(root, "latest")
        except CheckpointError:
            last = None
        kept = f"the last good checkpoint is {last.name}" if last else "no checkpoint was written yet"
        raise CheckpointError(
            f"cannot write checkpoint {name} in {root}: {e.reason}; {kept}; "
            "free space or fix the folder, then rerun with --resume auto"
        ) from None


def stored_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a weights file stores: each once (a tied weight too), under the name safetensors keeps for it
    (the first in sorted order)."""
    state = model.state_dict()
    return {name: state[name] for name in (min(names) for names, _ in stored_tensors(model))}


class HeldBest:
    """Rank 0's best validation between checkpoints: its weights in host memory (``host_copy``'s buffers, reused)
    and its checkpoint.json, until ``write`` keeps them as ``best-<step>/`` (before the next checkpoint, or as a
    diverged run ends) or ``drop`` finds them superseded (a checkpoint that is itself the best)."""

    def __init__(self):
        self.weights: dict[str, torch.Tensor] | None = None
        self.info: dict | None = None  # None: nothing held

    def hold(self, model: torch.nn.Module, info: dict) -> None:
        self.weights, self.info = host_copy(model, self.weights), info  # no wait: ``write`` synchronizes

    def drop(self) -> None:
        self.info = None

    def write(self, root: Path, *, config_yaml: str, keep_last: int, synchronize) -> Path | None:
        """Write what is held, if anything (``synchronize``: the device's, so the host copy is complete)."""
        if self.info is None:
            return None
        synchronize()
        info, self.info = self.info, None
        return save_best_weights(
            root, info["step"], self.weights, config_yaml=config_yaml, info=info, keep_last=keep_last
        )


def host_copy(model: torch.nn.Module, into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The model's stored tensors (``stored_state``) copied to host memory, into ``into``'s buffers when given.
    On CUDA the buffers are pinned and the copies do not wait: synchronize before reading them."""
    import torch

    out = into if into is not None else {}
    for name, t in stored_state(model).items():
        t = t.detach()
        if name not in out:
            out[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        out[name].copy_(t, non_blocking=True)
    return out


def _prune(root: Path, keep_last: int) -> None:
    """Remove the checkpoints neither pointed to nor among the last ``keep_last``, and every best folder
    not pointed to."""
    keep = _pointed(root)
    steps = [p.name for p in step_folders(root)]
    keep |= set(steps[-keep_last:])
    bests = [p.name for p in root.glob("best-*") if p.is_dir() and BEST_NAME.fullmatch(p.name)]
    for name in steps + bests:
        if name not in keep:
            shutil.rmtree(root / name, ignore_errors=True)


# What a killed writer leaves in a checkpoints folder (gpt.common.files names them ``.NAME.tmp-HOST-PID-X`` and
# ``.NAME.old-HOST-PID-X``; earlier versions ``.tmp-NAME-PID`` and ``.old-NAME-PID``)
LEFT_BEHIND = re.compile(r"\.(?:(?P<name>[\w-]+)\.(?P<kind>tmp|old)-.+|(?P<kind0>tmp|old)-(?P<name0>step-\d{8})-\d+)")


def tidy(root: Path) -> list[str]:
    """Clean up after a killed writer (the run's lock is held: no writer is alive); returns what was done,
    one line each. Temporary files and folders (never pointed to) are removed. A complete step folder
    moved aside (``old``) whose step is missing, left by a kill between the two renames of a same-step
    replacement, is renamed back; one whose step exists is removed."""
    root, done = Path(root), []
    if not root.is_dir():
        return done
    for p in sorted(root.glob(".*")):
        match = LEFT_BEHIND.fullmatch(p.name)
        if match is None:
            continue
        name, kind = match["name"] or match["name0"], match["kind"] or match["kind0"]
        whole = weights_problem(p) is None if BEST_NAME.fullmatch(name) else problem(p) is None
        if kind == "old" and CHECKPOINT_NAME.fullmatch(name) and not (root / name).exists() and whole:
            p.rename(root / name)
            done.append(f"recovered {name} from {p.name}, left by a writer killed while replacing it")
        else:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return done


INFO_LIMIT = 16 << 20  # bytes: a checkpoint.json is a few KB (a segment each resume adds ~2 KB)


def problem(ckpt: Path) -> str | None:
    """What makes checkpoint folder ``ckpt`` unloadable, or None. Reads the whole state file (its zip
    checksums), the weights file's layout (names and shapes against its own config's model, not the
    tensors) and its checkpoint.json."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return "missing"
    if BEST_NAME.fullmatch(ckpt.name):
        return f"it holds a best validation's weights alone (no {STATE_FILE}): resume from a step-* checkpoint"
    return _folder_problem(ckpt, (MODEL_FILE, STATE_FILE, CONFIG_FILE, INFO_FILE))


def weights_problem(ckpt: Path) -> str | None:
    """``problem`` for a folder of weights alone (a best folder, ``save_best_weights``): no state file."""
    ckpt = Path(ckpt)
    return "missing" if not ckpt.is_dir() else _folder_problem(ckpt, (MODEL_FILE, CONFIG_FILE, INFO_FILE))


def _folder_problem(ckpt: Path, files: tuple[str, ...]) -> str | None:
    for name in files:
        if not (ckpt / name).is_file():
            return f"no {name}"
    header, damaged = _safetensors_header(ckpt / MODEL_FILE)
    if damaged:
        return f"{MODEL_FILE} {damaged}"
    damaged = _state_problem(ckpt / STATE_FILE) if STATE_FILE in files else None
    if damaged:
        return f"{STATE_FILE} {damaged}"
    try:
        cfg = checkpoint_config(ckpt)
        read_info(ckpt)
    except CheckpointError as e:
        return str(e).removeprefix(f"{ckpt}: ").removeprefix(f"{ckpt}/")  # checkpoint.json: damaged ...
    return _layout_problem(header, cfg)


def _state_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            return f"is damaged (bad checksum in {bad})"
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"is damaged ({first_line(e)})"
    import torch

    try:  # the pickle parsed as load_state will (tensors memory-mapped, not read): one a safe load refuses
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        return UNSAFE
    except (RuntimeError, OSError, ValueError, EOFError) as e:
        return f"is damaged ({first_line(e)})"
    return None


def _safetensors_header(path: Path) -> tuple[dict, str | None]:
    """A safetensors file's header (name -> dtype, shape, offsets), and what is wrong with the file, if anything."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return {}, f"is truncated ({size} bytes)"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return {}, "is not a safetensors file (damaged header)"
        try:
            header = json.loads(f.read(header_len))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, OverflowError, MemoryError):
            return {}, "is not a safetensors file (damaged header)"
    expected = 8 + header_len + end
    return header, None if size == expected else f"is truncated ({size:,} of {expected:,} bytes)"


def stored_tensors(model: torch.nn.Module) -> list[tuple[frozenset[str], tuple[int, ...]]]:
    """The model's tensors as a checkpoint stores them: each once, with every name it goes by (a tied
    weight has two, of which the file keeps one) and its shape."""
    groups: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), ([], tuple(t.shape)))[0].append(name)
    return [(frozenset(names), shape) for names, shape in groups.values()]


def _layout_problem(header: dict, cfg: Config) -> str | None:
    """What differs between a weights file's tensors and the ones ``cfg``'s model stores, or None."""
    import torch

    from gpt.model.gpt import GPT  # here: the model is built only where a checkpoint is checked

    with torch.device("meta"):  # shapes only: nothing allocated, nothing drawn
        expected = stored_tensors(GPT(cfg.model, seed=None))
    stored = {k: tuple(v.get("shape", ())) for k, v in header.items() if k != "__metadata__"}
    wanted = {name: shape for names, shape in expected for name in names}
    wrong = [
        f"{k} {list(stored[k])}, model {list(wanted[k])}" for k in stored if k in wanted and stored[k] != wanted[k]
    ]
    unexpected = [k for k in stored if k not in wanted]
    missing = [min(names) for names, _ in expected if not names & stored.keys()]
    if not (wrong or unexpected or missing):
        return None
    said = [
        f"{len(v)} {what}: {shortened(v)}"
        for what, v in (("of another shape", wrong), ("missing", missing), ("unexpected", unexpected))
        if v
    ]
    return f"{MODEL_FILE} does not fit the model its {CONFIG_FILE} describes ({'; '.join(said)})"


def newest_loadable(root: Path, report: Callable[[str], None]) -> Path | None:
    """The checkpoint ``latest`` names if it loads, else the newest one that does; every one passed
    over is reported with the reason. None: there is none to resume from."""
    candidates = []
    try:
        latest = read_pointer(root, "latest")
    except CheckpointError as e:
        report(f"{e}; ignored")
        latest = None
    if latest is not None:
        candidates.append(latest)
    candidates += [p for p in reversed(step_folders(root)) if p != latest]
    for ckpt in candidates:
        why = problem(ckpt)
        if why is None:
            return ckpt
        report(f"skipped checkpoint {ckpt.name}: {why}")
    return None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint folder itself (it holds the weights)."""
    return (Path(path) / MODEL_FILE).is_file()


def read_info(ckpt: Path) -> dict:
    """The checkpoint's ``checkpoint.json`` (step, tokens, losses, time, segments); a CheckpointError
    naming it if it is missing or damaged (a damaged one is never read as empty)."""
    path = Path(ckpt) / INFO_FILE
    info = read_json(path, "checkpoint record", INFO_LIMIT, error=CheckpointError)
    step, segments = info.get("step"), info.get("segments", [])
    if not (isinstance(step, int) and step >= 0 and isinstance(segments, list)):
        raise CheckpointError(
            f"{path}: damaged checkpoint record (step {quoted(step)}, segments {quoted(segments)}: a step count and "
            "a list expected); restore it, or resume from another checkpoint"
        )
    return info


def checkpoint_tokenizer(ckpt: Path) -> str | None:
    """The tokenizer of the token set the checkpoint was trained on (its last segment's fingerprint), or None
    for a checkpoint that does not record it."""
    segments = read_info(ckpt)["segments"]
    data = segments[-1].get("data", {}) if segments and isinstance(segments[-1], dict) else {}
    return data.get("tokenizer") if isinstance(data, dict) else None


def checkpoint_identity(ckpt: Path, cfg: Config) -> dict:
    """What names a checkpoint in an evaluation result (test loss, HellaSwag, lm-eval): its run, norm type,
    seed, folder and step."""
    return {
        "run": cfg.run.name,
        "norm_type": cfg.model.norm_type,
        "seed": cfg.train.seed,
        "checkpoint": str(ckpt),
        "step": read_info(ckpt).get("step"),
    }


def checkpoint_config(ckpt: Path) -> Config:
    path = ckpt / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{ckpt}: no {CONFIG_FILE}; cannot tell what model it holds")
    try:
        return load_config(path, built=True)  # a model already trained: read as what it built
    except ConfigError as e:
        raise CheckpointError(f"{ckpt}: its config no longer loads: {e}") from None


def check_same_experiment(saved: Config, wanted: Config, source: Path) -> None:
    """Refuse to continue ``saved`` (a checkpoint's or a run's config) under ``wanted`` if they differ
    anywhere outside ``RESUMABLE``, naming each differing key with both values."""
    diffs = [(k, old, new) for k, old, new in config_differences(saved, wanted) if not k.startswith(RESUMABLE)]
    if not diffs:
        return
    listed = "; ".join(f"{k}: checkpoint {quoted(old)}, config {quoted(new)}" for k, old, new in diffs)
    if any(k.startswith("model.") for k, _, _ in diffs):
        raise CheckpointError(f"{source} holds a different model; {listed}")
    allowed = ", ".join(p + "*" if p.endswith(".") else p for p in RESUMABLE)
    raise CheckpointError(
        f"{source} was trained with a different config; {listed}; a resumed run may change "
        f"only {allowed}: resume with the checkpoint's values, or start a new run"
    )


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    from safetensors.torch import load_model

    path = ckpt / MODEL_FILE
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: missing (pruned by a running trainer, or deleted); choose another checkpoint"
        ) from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # a damaged file
        raise CheckpointError(f"{path}: cannot load ({first_line(e)}); the file is damaged") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{ckpt}: weights do not fit the model ({len(missing)} missing: {shortened(missing)}; "
            f"{len(unexpected)} unexpected: {shortened(unexpected)}); it holds another model: "
            "use the config it was trained with"
        )


def load_state(ckpt: Path) -> dict:
    import torch

    path = ckpt / STATE_FILE
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; choose another checkpoint") from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: {UNSAFE}; choose another checkpoint") from None
    except (RuntimeError, OSError, ValueError, EOFError) as e:  # damaged or foreign
        raise CheckpointError(f"{path}: cannot load ({first_line(e)}); the file is damaged") from None
