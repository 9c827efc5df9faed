"""Token files: their layout, their identity, and reading them lazily (the folder they live in is
``gpt.data.folders``, the order batches take them in ``gpt.data.batches``).

A prepared data set is a folder with one flat token stream per split and a
``meta.json`` (written by ``gpt.data.encode``)::

    train.bin  val.bin  test.bin  meta.json      (uint16, native byte order)

The author's published sets hold one safetensors file per split with a single 1-D
``tokens`` tensor (``train.safetensors``, ``validation.safetensors``); both layouts are
read the same way: positional reads (``os.pread``) of just the tokens a batch needs.
Nothing is memory-mapped or loaded whole, so a rank's memory does not grow with the
data set.

Identity. ``prepare_data`` records each split's token count, sha256 and sampled sha256
(``sample_digest``: the size and 256 blocks of 64 KiB spread over the file, all of a
file up to 16 MiB) in ``meta.json``. Hashing a 10 GB split takes a minute, so it is done
once, there; opening a split checks the count and the sampled digest (a few MB read),
which finds a file changed or replaced since. ``TokenFile.identity()`` is what a run's
fingerprint records of the tokens it read (``gpt.run.fingerprint``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt.common.errors import UserError, quoted
from gpt.common.files import read_json, replacing_folder

TOKEN_DTYPE = np.uint16  # GPT-2's 50257 tokens fit
META_FILE = "meta.json"
_SAFETENSORS_DTYPES = {
    "U8": np.uint8,
    "I16": np.int16,
    "U16": np.uint16,
    "I32": np.int32,
    "U32": np.uint32,
    "I64": np.int64,
}


class DataError(UserError):
    """A data set that is missing, malformed or too small for the config."""


SAMPLE_BLOCKS, SAMPLE_BLOCK = 256, 1 << 16  # the sampled digest reads 256 blocks of 64 KiB (16 MiB at most)


def sample_digest(path: Path) -> str:
    """The sha256 of a file's size and of ``SAMPLE_BLOCKS`` blocks of ``SAMPLE_BLOCK`` bytes spread evenly
    over it, the first and the last included: the whole file when it is no larger than that. Cheap for
    any size, it tells a changed or replaced file from the one recorded (not a file forged to match)."""
    size = Path(path).stat().st_size
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
            while block := f.read(1 << 20):
                h.update(block)
        else:
            for i in range(SAMPLE_BLOCKS):
                h.update(os.pread(f.fileno(), SAMPLE_BLOCK, i * (size - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1)))
    return h.hexdigest()


class TokenFile:
    """One split's token stream, read lazily with positional reads."""

    def __init__(self, path: str | Path, recorded: dict | None = None):
        self._fd: int | None = None  # opened on first read
        self.path = Path(path)
        self.recorded = recorded or {}  # what meta.json records of this split (tokens, sha256, sampled_sha256)
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such token file")
        if self.path.suffix == ".safetensors":
            self.dtype, self._start, self.n_tokens = _safetensors_layout(self.path)
        else:
            self.dtype, self._start = np.dtype(_meta_dtype(self.path.parent)), 0
            size = self.path.stat().st_size
            if size % self.dtype.itemsize:
                raise DataError(
                    f"{self.path}: {size} bytes is not a whole number of {self.dtype.name} tokens (truncated?)"
                )
            self.n_tokens = size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.n_tokens

    @functools.cached_property
    def sampled_sha256(self) -> str:
        return sample_digest(self.path)

    def identity(self) -> dict:
        """What the tokens are: file name, count, the sha256 recorded at preparation (None where the set
        has no meta.json, like the author's safetensors sets) and the sampled sha256 of the file as it is."""
        return {
            "file": self.path.name,
            "tokens": self.n_tokens,
            "sha256": self.recorded.get("sha256"),
            "sampled_sha256": self.sampled_sha256,
        }

    def check_recorded(self) -> None:
        """Refuse a file that is not the one meta.json describes (changed or replaced since preparation)."""
        tokens, sampled = self.recorded.get("tokens"), self.recorded.get("sampled_sha256")
        changed = (
            f"{self.n_tokens:,} tokens, {META_FILE} records {tokens:,}"
            if tokens not in (None, self.n_tokens)
            else "its sampled sha256 differs from the one recorded"
            if sampled not in (None, self.sampled_sha256)
            else None
        )
        if changed:
            raise DataError(
                f"{self.path}: not the file that was prepared ({changed}): it changed after "
                "preparation; prepare the set again with scripts/prepare_data.py"
            )

    def __getstate__(self):  # a DataLoader worker or a fork opens its own descriptor
        return {**self.__dict__, "_fd": None}

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` as a new array (only those bytes are read)."""
        if start < 0 or count < 0 or start + count > self.n_tokens:
            raise IndexError(f"{self.path}: tokens [{start}, {start + count}) outside [0, {self.n_tokens})")
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        nbytes = count * self.dtype.itemsize
        buf = os.pread(self._fd, nbytes, self._start + start * self.dtype.itemsize)
        if len(buf) != nbytes:
            raise DataError(f"{self.path}: short read at token {start} (file changed or truncated?)")
        return np.frombuffer(buf, dtype=self.dtype)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


@dataclass(frozen=True)
class TokenRange:
    """Tokens ``[offset, offset + n_tokens)`` of one token file: what a validation or test loss covers.

    The range is cut into sequences of ``seq_len + 1`` tokens (inputs and next-token
    targets) that start every ``seq_len`` tokens.
    """

    tokens: TokenFile  # the split's token file
    offset: int  # first token of the range
    n_tokens: int  # tokens in the range

    def n_sequences(self, seq_len: int) -> int:
        """Whole sequences in the range (each needs ``seq_len + 1`` of its tokens)."""
        return max(0, (self.n_tokens - 1) // seq_len)

    def read(self, ids, seq_len: int) -> torch.Tensor:
        """Sequences ``ids`` of the range, (len(ids), seq_len + 1) int64."""
        return read_sequences(self.tokens, ids, seq_len, self.offset)

    def check_ids(self, vocab_size: int, chunk: int = 1 << 22) -> None:
        """Refuse, before training, a range holding token ids the model has no embedding for."""
        for start in range(self.offset, self.offset + self.n_tokens, chunk):
            count = min(chunk, self.offset + self.n_tokens - start)
            check_ids(
                torch.from_numpy(self.tokens.read(start, count).astype(np.int64)),
                vocab_size,
                f"{self.tokens.path} [{start:,}, {start + count:,})",
            )


def _safetensors_layout(path: Path) -> tuple[np.dtype, int, int]:
    """(dtype, byte offset of the first token, token count) of a 1-D ``tokens`` tensor."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DataError(f"{path}: not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, UnicodeDecodeError):
            raise DataError(f"{path}: not a safetensors file (bad header)") from None
    entry = header.get("tokens")
    if not isinstance(entry, dict):
        names = ", ".join(k for k in header if k != "__metadata__")
        raise DataError(f"{path}: no 'tokens' tensor (holds: {names or 'nothing'})")
    if len(entry["shape"]) != 1 or entry["dtype"] not in _SAFETENSORS_DTYPES:
        raise DataError(f"{path}: 'tokens' must be a 1-D integer tensor, got {entry['dtype']} {entry['shape']}")
    dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
    begin, _ = entry["data_offsets"]
    return dtype, 8 + header_len + begin, entry["shape"][0]


TOKEN_DTYPES = ("uint16", "int16", "uint32", "int32", "int64", "uint8")


def read_meta(data_dir: str | Path) -> dict | None:
    """A prepared set's ``meta.json`` (None: there is none), checked for what the reader relies on."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        return None
    meta = read_json(path, "token set record", fix="prepare the set again", error=DataError)
    if meta.get("dtype", "uint16") not in TOKEN_DTYPES:
        raise DataError(f"{path}: dtype {quoted(meta['dtype'])} is not a token dtype ({', '.join(TOKEN_DTYPES)})")
    if not isinstance(meta.get("tokenizer", {}), dict):
        raise DataError(f"{path}: 'tokenizer' must be an object (name, n_vocab, eot_token)")
    splits = meta.get("splits", {})
    if not isinstance(splits, dict) or not all(isinstance(v, dict) for v in splits.values()):
        raise DataError(
            f"{path}: 'splits' must map each split to an object (file, tokens, sha256); prepare the set again"
        )
    return meta


def tokenizer_name(data_dir: str | Path) -> str:
    """The tokenizer a prepared set names in its meta.json ("unknown" for sets without one)."""
    return (read_meta(data_dir) or {}).get("tokenizer", {}).get("name", "unknown")


def _meta_dtype(data_dir: Path) -> str:
    meta = read_meta(data_dir)
    return meta.get("dtype", "uint16") if meta else "uint16"


def write_random_set(folder: Path, n_tokens: int, vocab_size: int, seed: int = 0) -> Path:
    """A set whose every split is ``n_tokens`` uniformly random ids below ``vocab_size``: the
    benchmark's data where no prepared set is at hand (speed does not depend on the ids)."""
    rng = np.random.default_rng(seed)
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    with replacing_folder(folder) as tmp:
        for split in ("train", "val", "test"):
            (tmp / f"{split}.bin").write_bytes(rng.integers(0, vocab_size, n_tokens, dtype=dtype).tobytes())
        (tmp / META_FILE).write_text(
            json.dumps({"source": "random", "dtype": dtype, "tokenizer": {"name": "random", "n_vocab": vocab_size}})
            + "\n"
        )
    return folder


def check_ids(batch: torch.Tensor, vocab_size: int | None, where: str) -> None:
    """Refuse token ids the model has no embedding for, on the CPU, before they reach a device."""
    if vocab_size is not None and batch.numel() and int(batch.max()) >= vocab_size:
        raise DataError(
            f"{where}: token id {int(batch.max()):,} is >= model.vocab_size {vocab_size:,}; the data set "
            "was made with another tokenizer than the model expects"
        )


def read_sequences(tokens: TokenFile, ids, seq_len: int, offset: int = 0) -> torch.Tensor:
    """Sequences ``ids`` of ``seq_len + 1`` tokens starting every ``seq_len`` tokens from ``offset``:
    an int64 tensor (len(ids), seq_len + 1), inputs and next-token targets together."""
    rows = [tokens.read(offset + int(i) * seq_len, seq_len + 1) for i in ids]
    return torch.from_numpy(np.stack(rows).astype(np.int64))
