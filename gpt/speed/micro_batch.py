"""The largest micro-batch that fits in a GPU's memory (``train.py --find-micro-batch``), and the plan of
micro-batch and accumulation it implies for each world size.

Each probe builds the trainer for one micro-batch and runs two eager steps (the second holds the
optimizer state too) beside a reserve as large as DDP's gradient buckets; doubling, then bisection.
"""

from __future__ import annotations

import copy
import gc
import sys

import torch

from gpt.common.errors import UserError
from gpt.config import Config
from gpt.run.distributed import Dist, device_name
from gpt.run.fastpath import resolve
from gpt.training.step import ready_engine


def free_memory(device: torch.device) -> None:
    """Let the next row start from an empty device (and fresh compile caches)."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def largest_fitting(fits, limit: int) -> int:
    """The largest m in 1..limit for which ``fits(m)``, fits being monotone (0: not even 1 fits).
    Doubles from 1 until a size fails, then bisects: about 2 log2(limit) probes."""
    good, m = 0, 1
    while m <= limit and fits(m):
        good, m = m, m * 2
    bad = min(m, limit + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def stepping_config(cfg: Config, norm_type: str, compile_: bool, steps: int) -> Config:
    """``cfg`` with one norm type and compile setting, ``steps`` steps long (its own length aside): what the
    benchmark and the memory probe step outside a run (``gpt.training.step.ready_engine``)."""
    c = copy.deepcopy(cfg)
    c.model.norm_type, c.train.compile = norm_type, compile_
    c.train.steps, c.train.tokens, c.train.tokens_per_param = steps, None, None
    return c


def fits_in_memory(cfg: Config, dist: Dist, micro_batch: int) -> bool:
    """Whether two training steps of ``cfg`` at ``micro_batch`` run without running out of GPU memory,
    beside a reserve as large as DDP's gradient buckets (fp32, one copy of the gradients, held all step
    long: under DDP the gradients are views of them, ``gradient_as_bucket_view``)."""
    c = stepping_config(cfg, cfg.model.norm_type, False, 2)  # two eager steps of one micro-batch
    c.train.micro_batch_size = c.train.global_batch_size = micro_batch
    engine, reserve = None, None
    try:
        ids = torch.randint(0, c.model.vocab_size, (micro_batch, c.model.context_length + 1))
        batches = [(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())]
        engine = ready_engine(c, dist)
        reserve = torch.empty(sum(p.numel() for p in engine.params), dtype=torch.float32, device=dist.device)
        for _ in range(2):  # the second step holds the optimizer state too
            engine.step(batches, 1)
        dist.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        del engine, reserve
        free_memory(dist.device)


def micro_batch_plan(cfg: Config, largest: int, world_sizes=(1, 2, 4, 8)) -> list[str]:
    """For each world size that divides the global batch: the largest micro-batch that fits and
    divides the global batch per GPU, and the gradient accumulation it implies."""
    g = cfg.train.global_batch_size
    lines = []
    for w in world_sizes:
        if g % w:
            continue
        m = max((m for m in range(1, min(largest, g // w) + 1) if (g // w) % m == 0), default=0)
        if m:
            lines.append(
                f"  {w} GPU{'s' if w > 1 else ''}: train.micro_batch_size {m}, accumulation "
                f"{g // (w * m)} (global batch {g} = {w} x {m} x {g // (w * m)})"
            )
    return lines


def find_micro_batch(cfg: Config, dist: Dist) -> str:
    """The largest micro-batch of ``cfg`` that fits in this GPU's memory, with the plan it implies."""
    if dist.device.type != "cuda":
        raise UserError(
            "--find-micro-batch measures GPU memory, and no CUDA GPU is visible here; run it on "
            "the kind of machine you will train on"
        )
    limit = cfg.train.global_batch_size

    def probe(m: int) -> bool:  # each probe said as it ends: a search stopped part-way still tells something
        fits = fits_in_memory(cfg, dist, m)
        print(f"micro-batch {m}: {'fits' if fits else 'out of memory'}", file=sys.stderr, flush=True)
        return fits

    largest = largest_fitting(probe, limit)
    if largest == 0:
        raise UserError(
            f"not even a micro-batch of 1 x {cfg.model.context_length} tokens fits on "
            f"{device_name(dist.device)}; use a smaller model or context"
        )
    total = torch.cuda.get_device_properties(dist.device).total_memory
    head = (
        f"largest micro-batch that fits on {device_name(dist.device)} ({total / 2**30:.0f} GiB), eager, "
        f"{resolve(cfg.train, dist.device).precision}, beside DDP's gradient buckets: {largest} sequences of "
        f"{cfg.model.context_length} tokens"
        + (" (the search stops at train.global_batch_size)" if largest == limit else "")
    )
    return "\n".join([head, f"with train.global_batch_size {limit}:", *micro_batch_plan(cfg, largest)])
