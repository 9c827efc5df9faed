"""Mean cross-entropy over a fixed token range, exact on any number of ranks.

The range ``[offset, offset + n_tokens)`` of a token file is cut into sequences of
``seq_len + 1`` tokens (inputs and next-token targets) that start every ``seq_len``
tokens, and the sequences into batches of ``batch_size`` in order. Ranks take whole
batches round robin. Each batch's summed loss goes into its own slot of a float64
vector; an all-reduce adds only zeros to it, and every rank sums the slots in batch
order. So the result is bit-identical on one rank or many, and it is a token-weighted
mean, never an average of averages.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from gpt.data import TokenFile
from gpt.distributed import Dist


def eval_sequences(n_tokens: int, seq_len: int) -> int:
    """Sequences in a range of ``n_tokens`` (each needs seq_len + 1 tokens of it)."""
    return max(0, (n_tokens - 1) // seq_len)


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, tokens: TokenFile, offset: int, n_tokens: int, seq_len: int,
                  batch_size: int, dist: Dist, autocast=contextlib.nullcontext, progress=None) -> tuple[float, int]:
    """(mean loss, tokens scored) of ``model`` on ``tokens[offset : offset + n_tokens]``."""
    n_seq = eval_sequences(n_tokens, seq_len)
    n_batches = math.ceil(n_seq / batch_size)
    sums = torch.zeros(n_batches, dtype=torch.float64, device=dist.device)
    was_training = model.training
    model.eval()
    for b in range(dist.rank, n_batches, dist.world_size):
        ids = range(b * batch_size, min((b + 1) * batch_size, n_seq))
        rows = np.stack([tokens.read(offset + i * seq_len, seq_len + 1) for i in ids]).astype(np.int64)
        batch = torch.from_numpy(rows).to(dist.device, non_blocking=True)
        with autocast():
            logits, _ = model(batch[:, :-1])
        losses = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        sums[b] = losses.double().sum()
        if progress is not None:
            progress(len(ids) * seq_len)
    model.train(was_training)
    total = dist.all_sum(sums).cpu()
    scored = n_seq * seq_len
    return (float(total.sum()) / scored if scored else math.nan), scored
