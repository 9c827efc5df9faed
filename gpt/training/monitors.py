"""What the training loop keeps an eye on: throughput, divergence, the train loss, stop signals.

Each is a small object the loop asks one question of: how fast (``Throughput``), has
the run diverged (``Divergence``), what was the loss since the last log (``LossWindow``),
has someone asked us to stop (``StopFlag``).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass

import torch

from gpt.common.stops import StopNow

STEADY_SKIP = 0.1  # the steady-state tokens/s leaves out the first 10% of the steps (start-up, compile)


@dataclass(frozen=True)
class Mark:
    """A point in the run that a rate is measured from."""

    time: float  # time.perf_counter() seconds
    step: int  # optimizer steps done by then
    paused: float  # seconds spent evaluating or checkpointing by then


class Throughput:
    """Training tokens/s since the last log, and steady-state tokens/s for the summary.

    Time spent inside ``paused()`` (evaluation, checkpoints) is not training time and is
    left out of both rates. The steady-state rate also leaves out the first
    ``STEADY_SKIP`` of the run's steps after this process started.
    """

    def __init__(self, step: int, total_steps: int, tokens_per_step: int):
        self.start = time.perf_counter()
        self.tokens_per_step = tokens_per_step
        self.paused_seconds = 0.0
        self._steady_from = step + max(1, round(STEADY_SKIP * total_steps))
        self._last = Mark(self.start, step, 0.0)
        self._steady: Mark | None = None

    def _mark(self, step: int) -> Mark:
        return Mark(time.perf_counter(), step, self.paused_seconds)

    def _rate(self, since: Mark, now: Mark) -> float | None:
        if now.step == since.step:
            return None  # no step timed in between
        seconds = now.time - since.time - (now.paused - since.paused)
        return (now.step - since.step) * self.tokens_per_step / max(seconds, 1e-9)

    def seconds(self) -> float:
        """Wall seconds since this process started training (pauses included)."""
        return time.perf_counter() - self.start

    @contextlib.contextmanager
    def paused(self, wait_for_device=None):
        """Time inside is not training time. ``wait_for_device`` (called first) lets the step still
        running on the device finish, so that its time counts as training."""
        if wait_for_device is not None:
            wait_for_device()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.paused_seconds += time.perf_counter() - began

    def restart(self, step: int) -> None:
        """Measure the next rate from now, ``step`` steps done: the steps before (a first step that
        compiled the model) count in the wall time but in no rate."""
        self._last = self._mark(step)

    def step_done(self, step: int) -> None:
        if self._steady is None and step >= self._steady_from:
            self._steady = self._mark(step)

    def since_last_log(self, step: int) -> float | None:
        """Tokens/s since the previous call (or the start; None: no step since); the next call measures
        from now."""
        now = self._mark(step)
        rate, self._last = self._rate(self._last, now), now
        return rate

    def steady(self, step: int) -> float | None:
        """Tokens/s after the first steps; None if the run stopped before any such step was done."""
        if self._steady is None or step <= self._steady.step:
            return None
        return self._rate(self._steady, self._mark(step))


class Divergence:
    """Counts steps whose update was skipped for a non-finite gradient, on the device (no waiting),
    and says, whenever the loop reads the counters (log steps, checkpoints), whether the run has
    diverged, also when the streak that crossed the threshold ended between two reads."""

    def __init__(
        self,
        device: torch.device,
        *,
        step: int,
        total: int,
        consecutive: int,
        max_nonfinite: int,
        loss_ceiling: float | None,
        warmup: int,
    ):
        self.step = torch.tensor(step, device=device)  # steps done, counted on the device
        self.total = torch.tensor(total, device=device)  # skipped steps in the whole run
        self.consecutive = torch.tensor(consecutive, device=device)  # skipped steps in a row, up to now
        self.crossed_at = torch.tensor(-1, device=device)  # the step a streak first reached max_nonfinite
        self.max_nonfinite, self.loss_ceiling, self.warmup = max_nonfinite, loss_ceiling, warmup

    def record(self, skipped: torch.Tensor) -> None:
        self.step += 1
        self.total += skipped
        self.consecutive = (self.consecutive + 1) * skipped
        crossed = (self.crossed_at < 0) & (self.consecutive >= self.max_nonfinite)
        self.crossed_at = torch.where(crossed, self.step, self.crossed_at)

    def on_device(self) -> torch.Tensor:
        """(total, consecutive, crossed_at) stacked on the device, to be read with a log step's other numbers."""
        return torch.stack([self.total, self.consecutive, self.crossed_at])

    def counts(self, read: list[float] | None = None) -> tuple[int, int, int | None]:
        """(total, consecutive, the step a streak crossed the threshold or None). ``read``: ``on_device()`` as a
        log step read it back; else read now (one wait for the device)."""
        total, consecutive, crossed_at = (int(v) for v in (read if read is not None else self.on_device().tolist()))
        return total, consecutive, (crossed_at if crossed_at >= 0 else None)

    def reason(self, crossed_at: int | None, step: int, train_loss: float | None) -> tuple[str, int] | None:
        """(why, at which step) the run counts as diverged, or None. ``train_loss`` (a log step's) is
        checked against the ceiling after warmup."""
        if crossed_at is not None:
            return f"{self.max_nonfinite} consecutive steps with a non-finite loss or gradient", crossed_at
        if (
            train_loss is not None
            and self.loss_ceiling is not None
            and step > self.warmup
            and not train_loss <= self.loss_ceiling
        ):
            return f"train loss {train_loss:.4g} above train.loss_ceiling {self.loss_ceiling:g}", step
        return None


class LossWindow:
    """The train loss over the steps since the last log: the mean of the finite (rank, step) losses,
    summed on the device and read at log steps. A non-finite step is left out here and counted by
    ``Divergence``."""

    def __init__(self, device: torch.device, sums: list[float] | None = None):
        # [sum of finite losses, how many micro-batch means]; ``sums``: a window a checkpoint carried
        self.sums = torch.tensor(sums or [0.0, 0.0], device=device)

    def totals(self, all_sum) -> list[float]:
        """The window so far over every rank, without starting a new one: what a checkpoint keeps, so that
        the first log after a resume covers the same steps as an uninterrupted run's."""
        return all_sum(self.sums).tolist()

    def add(self, loss_sum: torch.Tensor, n_micro: int) -> None:
        """One step's sum of ``n_micro`` micro-batch mean losses on this rank."""
        finite = torch.isfinite(loss_sum)
        self.sums += torch.stack([torch.where(finite, loss_sum, 0.0), finite * float(n_micro)])

    def take(self, totals: list[float]) -> float:
        """The window's mean from ``totals``, its sums over every rank as a log step read them back, then start
        a new window."""
        total, count = totals
        self.sums.zero_()
        return total / count if count else math.nan


class StopFlag:
    """SIGTERM / SIGINT, counted. The first asks the loop to finish its step, checkpoint and exit. The
    second (an impatient Ctrl-C, a cluster's second SIGTERM) hurries the stop under way: the checkpoint
    being written is still finished whole, but nothing is waited for after it (queued uploads). The
    third raises ``StopNow`` wherever the run is: it ends at once; a checkpoint it cuts short was being
    written in a temporary folder, so none is half-written."""

    def __init__(self):
        self.signals = 0
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signals >= 1

    @property
    def hurry(self) -> bool:
        return self.signals >= 2

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signals += 1
        if self.signals >= 3:
            raise StopNow(f"stopped at once by a third stop signal ({signal.Signals(signum).name})")

    def __exit__(self, *exc):
        if self.signals:  # the run stopped and this process is ending: a later signal has nothing left to
            for sig in self._previous:  # stop, and must not become a traceback on the way out
                signal.signal(sig, signal.SIG_IGN)
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
