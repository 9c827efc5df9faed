"""The batch order: global step s takes the sequences at positions ``[s * G, (s + 1) * G)`` of a seeded
permutation of the split's sequences (``FeistelPermutation``, G = global batch in sequences); rank r of W takes the
r-th of W equal slices of those, in micro-batches (``TrainBatches``, reading ahead one step in a thread with
``train.prefetch``). The batches are a pure function of ``(seed, step, rank, world_size)``: any world size reads
the same sequences in the same order, and none twice."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from gpt.common.errors import quoted
from gpt.data.tokens import DataError, TokenFile, check_ids, read_sequences


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

    def __init__(
        self,
        tokens: TokenFile,
        seq_len: int,
        micro_batch: int,
        global_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        vocab_size: int | None = None,
        prefetch: bool = False,
        pin_memory: bool = False,
    ):
        if global_batch % (micro_batch * world_size):
            raise DataError(
                f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} x world size {world_size}"
            )
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
                f"({steps * per_step:,} tokens); use a larger data set or fewer tokens"
            )

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
            chunk = seq[k * self.micro_batch : (k + 1) * self.micro_batch]
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
        return {
            "step": self.step,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "n_sequences": self.n_sequences,
            "order": self._order_name(),
        }

    def _order_name(self) -> str:
        return f"feistel-{FeistelPermutation.ROUNDS}" if self.shuffle else "sequential"

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        state = {"order": "affine" if state["shuffle"] else "sequential", **state}  # before: an affine order
        for key in ("seed", "shuffle", "seq_len", "global_batch", "n_sequences", "order"):
            if state[key] != mine[key]:
                raise DataError(
                    f"cannot resume the data reader: {key} was {quoted(state[key])}, "
                    f"now {quoted(mine[key])}; resume with the same data and batch settings"
                )
        self.step = int(state["step"])
