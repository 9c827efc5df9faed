"""One optimizer step, as a run takes it and as the benchmark times it and the memory probe tries it.

``StepEngine`` holds what a step runs: the model, built and seeded as every run builds it
(``build_model``), its optimizer and grad scaler on the device (``build_optimizer``), and the model
as stepped (``prepare``: DDP on several ranks, ``torch.compile`` with train.compile, the autocast of
the resolved precision). ``step`` runs each micro-batch's forward under autocast and its backward
(``no_sync`` until the last, so DDP all-reduces gradients once per step), measures the pre-clip
gradient norm and lets fused AdamW apply the update unless the norm is not finite
(``step_unless_nonfinite``: skipped and counted on the device, without waiting for it).

The run (``gpt.training.loop.Trainer``) puts its schedule, logging, validation and checkpoints around
it; the benchmark (``gpt.speed.timing``) and the memory probe (``gpt.speed.micro_batch``) take it as
it is (``ready_engine``), so what they time and try is the step a run takes.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.config import Config
from gpt.data.batches import TrainBatches
from gpt.data.folders import open_split
from gpt.model.gpt import GPT
from gpt.model.loss import autocast_for
from gpt.run.distributed import Dist
from gpt.run.fastpath import FastPath, apply_tf32, resolve
from gpt.training.optimizer import make_optimizer, step_unless_nonfinite

# DDP's gradient buckets, in MB: GPT-2 small's 652 MB of float32 gradients in 7 all-reduces instead of the default
# 25 MB's 27. Fewer, larger messages still overlap the backward pass (each starts once its layers' gradients are
# in), and under torch.compile DDP splits the graph at every bucket boundary: 7 subgraphs to fuse, not 27.
DDP_BUCKET_MB = 100


def train_reader(cfg: Config, dist: Dist, fast: FastPath, data_dir: Path) -> TrainBatches:
    """This rank's training batches of the split in ``data_dir``, reading ahead where the fast path says so."""
    t = cfg.train
    return TrainBatches(
        open_split(data_dir, cfg.data.train_split),
        cfg.model.context_length,
        t.micro_batch_size,
        t.global_batch_size,
        rank=dist.rank,
        world_size=dist.world_size,
        seed=t.seed,
        shuffle=cfg.data.shuffle,
        vocab_size=cfg.model.vocab_size,
        prefetch=fast.prefetch,
        pin_memory=fast.pin_memory,
    )


class RepeatedBatches:
    """A training reader's stand-in that hands back the same micro-batches (x, y) at every step: what the
    benchmark times with no reading in the steps, or the memory probe tries."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self.batches, self.accum = list(batches), len(batches)

    def next_step(self):
        return self.batches

    def check_capacity(self, steps: int) -> None:
        pass

    def close(self) -> None:
        pass


class StepEngine:
    """The model and what steps it, on this rank: ``build_model``, ``build_optimizer``, ``prepare``, then
    ``step`` as often as wanted. Attributes are None until the stage that sets them has run."""

    def __init__(self, cfg: Config, dist: Dist, fast: FastPath | None = None):
        self.cfg, self.dist = cfg, dist
        self.fast = fast or resolve(cfg.train, dist.device)  # precision, compile, TF32, prefetch as they apply
        self.model: GPT | None = None
        self.params: list[torch.nn.Parameter] = []  # the model's parameters, for the gradient norm
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None  # enabled for fp16 only
        self.net: torch.nn.Module | None = None  # the model as stepped: DDP- and compile-wrapped as configured
        self.scorer: torch.nn.Module | None = None  # train.compile: the model compiled for validation, never DDP
        self.autocast = None  # a context-manager factory for the forward passes (autocast_for)

    def build_model(self) -> GPT:
        """Seed this rank (dropout masks differ across ranks, as they should) and build the model, its weights
        drawn from model.init_seed: on the CPU, before anything is moved or allocated on the device."""
        seed = self.cfg.train.seed + self.dist.rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.model = GPT(self.cfg.model, seed=self.cfg.init_seed)
        return self.model

    def build_optimizer(self) -> None:
        """The model on the device (TF32 as configured), its optimizer and grad scaler."""
        dist = self.dist
        if dist.device.type == "cuda":
            apply_tf32(self.fast.tf32)
        self.model.to(dist.device)
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(self.model, self.cfg.optim)
        self.scaler = torch.amp.GradScaler(dist.device.type, enabled=self.fast.precision == "fp16")

    def prepare(self) -> None:
        """Wrap the model for DDP and torch.compile, and choose the autocast: what ``step`` runs."""
        dist = self.dist
        self.net = self.model
        if dist.enabled:
            self.net = DDP(
                self.model,
                device_ids=[dist.device.index] if dist.device.type == "cuda" else None,
                bucket_cap_mb=DDP_BUCKET_MB,
                gradient_as_bucket_view=True,  # the gradients live in the buckets: one copy of them, not two
            )
        if self.fast.compile:
            self.net = torch.compile(self.net)
        # validation: the full batches through a compiled model of their own (no DDP: ranks may score
        # different numbers of batches), the ragged last one eager (it would compile again)
        self.scorer = torch.compile(self.model) if self.fast.compile else None
        self.autocast = autocast_for(self.fast.precision, dist.device)

    def step(self, micro_batches, accum: int, probe=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimizer step on this rank's ``accum`` micro-batches ``(x, y)`` of a global step.

        Returns device tensors, nothing waited for: the sum of the micro-batch losses,
        the gradient norm before clipping, and whether the update was skipped. ``probe``: rank 0's
        ``StatsProbe`` on a stats step, measuring before clipping and the update and after it.
        """
        dist = self.dist
        loss_sum = torch.zeros((), device=dist.device)
        first = None  # the step's first micro-batch: a stats step's activations are its
        for k, (x, y) in enumerate(micro_batches):  # x, y: (micro_batch, T)
            x, y = dist.to_device(x), dist.to_device(y)
            first = x if first is None else first
            last = not dist.enabled or k == accum - 1  # DDP all-reduces the gradients on the last one only
            with contextlib.nullcontext() if last else self.net.no_sync():
                with self.autocast():
                    loss = self.net(x, y, loss_only=True)[1]
                self.scaler.scale(loss / accum).backward()
            loss_sum += loss.detach()
        self.scaler.unscale_(self.optimizer)  # a no-op unless fp16
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if probe is not None:
            probe.measure(self.model, first, self.autocast, self.scaler)
        if self.cfg.optim.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.cfg.optim.grad_clip, grad_norm)
        skipped = step_unless_nonfinite(self.optimizer, self.scaler, grad_norm)
        if probe is not None:
            probe.after_update(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm, skipped


def ready_engine(cfg: Config, dist: Dist) -> StepEngine:
    """A ``StepEngine`` built and prepared as a run's is, outside any run (no run folder, no checkpoint, no
    logging): what the benchmark times and the memory probe tries."""
    engine = StepEngine(cfg, dist)
    engine.build_model()
    engine.build_optimizer()
    engine.prepare()
    return engine
