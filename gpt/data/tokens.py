"""Token files: their layout, reading them lazily, and deterministic per-rank batching.

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

Batching. A split of N tokens holds ``(N - 1) // T`` training sequences of T + 1
tokens (inputs and next-token targets), sequence i starting at token i * T. Global
step s takes the sequences at positions ``[s * G, (s + 1) * G)`` of a seeded
permutation (G = global batch in sequences); rank r of W takes the r-th of W equal
slices of those, in micro-batches of ``micro_batch`` sequences. So the batches are a
pure function of ``(seed, step, rank, world_size)``, any world size reads the same
sequences in the same order, and no sequence is read twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt.common.errors import UserError, first_line, quoted
from gpt.common.files import read_json, replacing_folder

TOKEN_DTYPE = np.uint16  # GPT-2's 50257 tokens fit
META_FILE = "meta.json"
_SAFETENSORS_DTYPES = {"U8": np.uint8, "I16": np.int16, "U16": np.uint16, "I32": np.int32,
                       "U32": np.uint32, "I64": np.int64}


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
                raise DataError(f"{self.path}: {size} bytes is not a whole number of "
                                f"{self.dtype.name} tokens (truncated?)")
            self.n_tokens = size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.n_tokens

    @functools.cached_property
    def sampled_sha256(self) -> str:
        return sample_digest(self.path)

    def identity(self) -> dict:
        """What the tokens are: file name, count, the sha256 recorded at preparation (None where the set
        has no meta.json, like the author's safetensors sets) and the sampled sha256 of the file as it is."""
        return {"file": self.path.name, "tokens": self.n_tokens, "sha256": self.recorded.get("sha256"),
                "sampled_sha256": self.sampled_sha256}

    def check_recorded(self) -> None:
        """Refuse a file that is not the one meta.json describes (changed or replaced since preparation)."""
        tokens, sampled = self.recorded.get("tokens"), self.recorded.get("sampled_sha256")
        changed = (f"{self.n_tokens:,} tokens, {META_FILE} records {tokens:,}" if tokens not in (None, self.n_tokens)
                   else "its sampled sha256 differs from the one recorded" if sampled not in (None, self.sampled_sha256)
                   else None)
        if changed:
            raise DataError(f"{self.path}: not the file that was prepared ({changed}): it changed after "
                            "preparation; prepare the set again with scripts/prepare_data.py")

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
            check_ids(torch.from_numpy(self.tokens.read(start, count).astype(np.int64)), vocab_size,
                      f"{self.tokens.path} [{start:,}, {start + count:,})")


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
        raise DataError(f"{path}: 'splits' must map each split to an object (file, tokens, sha256); prepare the "
                        "set again")
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
        (tmp / META_FILE).write_text(json.dumps({"source": "random", "dtype": dtype,
                                                 "tokenizer": {"name": "random", "n_vocab": vocab_size}}) + "\n")
    return folder


def check_vocabulary(data_dir: Path, vocab_size: int) -> None:
    """Refuse a prepared set whose tokenizer has more tokens than the model's vocabulary."""
    meta = read_meta(data_dir) or {}
    n_vocab = meta.get("tokenizer", {}).get("n_vocab")
    if isinstance(n_vocab, int) and n_vocab > vocab_size:
        raise DataError(f"{data_dir}: its tokenizer ({meta['tokenizer'].get('name', '?')}) has {n_vocab:,} tokens, "
                        f"more than model.vocab_size {vocab_size:,}; use a model with vocab_size >= {n_vocab:,}")


def check_ids(batch: torch.Tensor, vocab_size: int | None, where: str) -> None:
    """Refuse token ids the model has no embedding for, on the CPU, before they reach a device."""
    if vocab_size is not None and batch.numel() and int(batch.max()) >= vocab_size:
        raise DataError(f"{where}: token id {int(batch.max()):,} is >= model.vocab_size {vocab_size:,}; the data set "
                        "was made with another tokenizer than the model expects")


def open_split(data_dir: str | Path, split: str) -> TokenFile:
    """The token file of ``split`` in ``data_dir``: ``<split>.bin`` or ``<split>.safetensors``, checked
    against what the set's ``meta.json`` records of it, if anything (``TokenFile.check_recorded``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data directory (prepare one with scripts/prepare_data.py)")
    if (data_dir / f"{split}.bin").is_file():
        if not (data_dir / META_FILE).is_file():  # written last: a set without it was never finished
            raise DataError(f"{data_dir}: no {META_FILE}, so not a complete prepared set (an interrupted "
                            "preparation leaves such a folder); prepare it again with scripts/prepare_data.py")
        path = data_dir / f"{split}.bin"
    elif (data_dir / f"{split}.safetensors").is_file():
        path = data_dir / f"{split}.safetensors"
    else:
        found = sorted(p.stem for p in data_dir.iterdir() if p.suffix in (".bin", ".safetensors"))
        raise DataError(f"{data_dir}: no split {split!r} ({split}.bin or {split}.safetensors); "
                        f"splits here: {', '.join(found) or 'none'}")
    recorded = ((read_meta(data_dir) or {}).get("splits") or {}).get(split)
    tokens = TokenFile(path, recorded if recorded and recorded.get("file") == path.name else None)
    tokens.check_recorded()
    return tokens


def resolve_data_dir(path: str | None, hub_repo: str | None, revision: str | None = None,
                     cache_dir: str | None = None) -> Path:
    """The local folder of a data set: ``path`` itself, or a snapshot of Hub repo ``hub_repo``."""
    if path is not None:
        return Path(path)
    if hub_repo is None:
        raise DataError("no data set: set data.path (a prepared folder) or data.hub_repo (a Hub data set)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_repo, repo_type="dataset", revision=revision, cache_dir=cache_dir,
                                      allow_patterns=["*.bin", "*.safetensors", META_FILE]))
    except Exception as e:  # offline, unknown repo, no access: the library's first line
        raise DataError(f"data.hub_repo {hub_repo}: cannot fetch: {first_line(e)}") from None


def read_sequences(tokens: TokenFile, ids, seq_len: int, offset: int = 0) -> torch.Tensor:
    """Sequences ``ids`` of ``seq_len + 1`` tokens starting every ``seq_len`` tokens from ``offset``:
    an int64 tensor (len(ids), seq_len + 1), inputs and next-token targets together."""
    rows = [tokens.read(offset + int(i) * seq_len, seq_len + 1) for i in ids]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of 64-bit words (uint64 arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class FeistelPermutation:
    """A seeded pseudo-random permutation of ``range(n)`` in O(1) memory.

    A balanced Feistel network on the smallest even number of bits that holds ``n - 1``
    (``ROUNDS`` rounds, round keys drawn from the seed, splitmix64 as the round function)
    permutes that power-of-two range; cycle walking (apply it again while the result is
    ``>= n``) restricts it to ``range(n)``. Unlike an affine map, nearby positions land in
    unrelated places, so one batch is not the previous one shifted by a constant.
    """

    ROUNDS = 6

    def __init__(self, n: int, seed: int):
        self.n = n
        self.half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)  # bits in each half of a word
        self.mask = np.uint64((1 << self.half) - 1)
        rng = np.random.default_rng(seed)
        self.keys = rng.integers(0, np.iinfo(np.uint64).max, size=self.ROUNDS, dtype=np.uint64, endpoint=True)

    def _network(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Where each position in ``range(n)`` goes (an int64 array of the same shape)."""
        x = self._network(np.asarray(positions, dtype=np.uint64))
        outside = x >= self.n
        while outside.any():  # cycle walking: every cycle through range(n) comes back into it
            x[outside] = self._network(x[outside])
            outside = x >= self.n
        return x.astype(np.int64)


class TrainBatches:
    """Deterministic per-rank training batches over one token file.

    ``next_step()`` returns this rank's micro-batches of the next global step as
    ``[(x, y), ...]``, each ``(micro_batch, T)`` int64, y being x shifted by one token.
    The reader's whole position is ``state_dict()``, a few integers.
    """

    def __init__(self, tokens: TokenFile, seq_len: int, micro_batch: int, global_batch: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 vocab_size: int | None = None, prefetch: bool = False, pin_memory: bool = False):
        if global_batch % (micro_batch * world_size):
            raise DataError(f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} "
                            f"x world size {world_size}")
        self.tokens, self.seq_len = tokens, seq_len
        self.micro_batch, self.global_batch = micro_batch, global_batch
        self.rank, self.world_size = rank, world_size
        self.accum = global_batch // (micro_batch * world_size)
        self.seed, self.shuffle = seed, shuffle
        self.vocab_size = vocab_size  # token ids must be below it (None: not checked)
        self.n_sequences = max(0, (len(tokens) - 1) // seq_len)
        self.steps_available = self.n_sequences // global_batch
        self.order = FeistelPermutation(self.n_sequences, seed) if shuffle else None  # None: in file order
        self.step = 0  # the next global step to read
        self.pin_memory = pin_memory  # batches in page-locked memory: a non_blocking copy to the GPU does not wait
        # one background thread reads the step after the one being trained on; os.pread releases the GIL
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if prefetch else None
        self._ahead: tuple[int, Future] | None = None  # (step, its batches being read)

    def check_capacity(self, steps: int) -> None:
        """Refuse, before training, a run that needs more sequences than the split has."""
        if steps > self.steps_available:
            per_step = self.global_batch * self.seq_len
            raise DataError(
                f"{self.tokens.path}: {len(self.tokens):,} tokens are {self.steps_available:,} steps of "
                f"{self.global_batch} x {self.seq_len} tokens, but the run asks for {steps:,} steps "
                f"({steps * per_step:,} tokens); use a larger data set or fewer tokens")

    def sequence_ids(self, step: int) -> np.ndarray:
        """Sequence numbers this rank reads at global ``step``, in micro-batch order."""
        per_rank = self.global_batch // self.world_size
        first = step * self.global_batch + self.rank * per_rank
        positions = np.arange(first, first + per_rank, dtype=np.int64)
        return self.order(positions) if self.order is not None else positions

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if not 0 <= step < self.steps_available:
            raise IndexError(f"step {step} outside the {self.steps_available} steps the split holds")
        seq = read_sequences(self.tokens, self.sequence_ids(step), self.seq_len)
        check_ids(seq, self.vocab_size, f"{self.tokens.path}, step {step}")
        out = []
        for k in range(self.accum):
            chunk = seq[k * self.micro_batch:(k + 1) * self.micro_batch]
            x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()  # inputs, next-token targets
            out.append((x.pin_memory(), y.pin_memory()) if self.pin_memory else (x, y))
        return out

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of step ``self.step``; with prefetch, the next step is read meanwhile.
        A problem with the data (a token id out of range) is raised here, for the step it belongs to."""
        ahead, self._ahead = self._ahead, None
        out = ahead[1].result() if ahead is not None and ahead[0] == self.step else self.batches(self.step)
        self.step += 1
        if self._pool is not None and self.step < self.steps_available:
            self._ahead = (self.step, self._pool.submit(self.batches, self.step))
        return out

    def close(self) -> None:
        """Stop the prefetch thread (a step read ahead is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._ahead = None, None

    def token_range(self) -> tuple[int, int]:
        """The tokens ``[start, end)`` of the split that training sequences can touch."""
        return 0, (self.n_sequences * self.seq_len + 1 if self.n_sequences else 0)

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "shuffle": self.shuffle, "seq_len": self.seq_len,
                "global_batch": self.global_batch, "n_sequences": self.n_sequences, "order": self._order_name()}

    def _order_name(self) -> str:
        return f"feistel-{FeistelPermutation.ROUNDS}" if self.shuffle else "sequential"

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        state = {"order": "affine" if state["shuffle"] else "sequential", **state}  # before: an affine order
        for key in ("seed", "shuffle", "seq_len", "global_batch", "n_sequences", "order"):
            if state[key] != mine[key]:
                raise DataError(f"cannot resume the data reader: {key} was {quoted(state[key])}, "
                                f"now {quoted(mine[key])}; resume with the same data and batch settings")
        self.step = int(state["step"])
