"""Mean cross-entropy over a fixed token range, exact on any number of ranks.

The trainer's validation loss and the evaluator's test loss are both this function.
The range's sequences (see ``gpt.data.tokens.TokenRange``) go into batches of ``batch_size``
in order, and ranks take whole batches round robin. Each batch's summed loss goes into
its own slot of a float64 vector; an all-reduce adds only zeros to it, and every rank
sums the slots in batch order. So the result is bit-identical on one rank or many, and
it is a token-weighted mean, never an average of averages.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from gpt.data.tokens import TokenRange, check_ids
from gpt.model.loss import cross_entropy
from gpt.run.distributed import Dist


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    span: TokenRange,
    dist: Dist,
    *,
    seq_len: int,
    batch_size: int,
    autocast=contextlib.nullcontext,
    progress: Callable[[int], object] | None = None,
    compiled: torch.nn.Module | None = None,
) -> tuple[float, int]:
    """(mean loss, tokens scored) of ``model`` on ``span``; ``progress(n)`` is told of each n tokens scored.

    Pass the unwrapped model: ranks may score different numbers of batches, which DDP
    must not see. ``compiled``, the same model under torch.compile, scores the full batches;
    the ragged last one goes through ``model`` (another shape would compile again).
    """
    n_seq = span.n_sequences(seq_len)
    n_batches = math.ceil(n_seq / batch_size)
    sums = torch.zeros(n_batches, dtype=torch.float64, device=dist.device)
    was_training = model.training
    model.eval()
    for b in range(dist.rank, n_batches, dist.world_size):
        ids = range(b * batch_size, min((b + 1) * batch_size, n_seq))
        batch = span.read(ids, seq_len)  # (b, T + 1)
        check_ids(batch, getattr(getattr(model, "cfg", None), "vocab_size", None), f"{span.tokens.path}, batch {b}")
        batch = batch.to(dist.device, non_blocking=True)
        net = compiled if compiled is not None and len(ids) == batch_size else model
        with autocast():
            logits, _ = net(batch[:, :-1])
        sums[b] = cross_entropy(logits, batch[:, 1:], reduction="none").double().sum()
        if progress is not None:
            progress(len(ids) * seq_len)
    model.train(was_training)
    total = dist.all_sum(sums).cpu()
    scored = n_seq * seq_len
    return (float(total.sum()) / scored if scored else math.nan), scored
