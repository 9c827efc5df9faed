"""A budgeted run of stages: each a command under its own time limit, sized from what is left.

Built for a short loan of a machine (``gpt.commands.gpu_check``): the whole run must end inside one
call's limit, and a stop at any moment must leave what was measured. So stages run in
the order given, each as a subprocess in its own process group. A stage gets what is left
of the budget after the least time every later stage needs (their ``min_s``), up to its own
``max_s``; where that leaves it less than its own ``min_s``, it takes what is left (the
earlier, cheaper stage goes first) and the later ones are skipped, each listed with the
time it was left. A stage
that runs past its limit is stopped (SIGTERM to its whole group, then SIGKILL); one that
keeps its results as they come (``cut_ok``: a benchmark writing one row at a time, a search
logging each probe) is then "cut", not failed. After every stage ``on_stage`` is called with the outcomes so far, so
a summary can be rewritten each time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PASSED, FAILED, TIMED_OUT, CUT, SKIPPED = "passed", "failed", "timed out", "cut", "skipped"
GRACE_S = 5.0  # how long a stopped stage may take to end before it is killed


@dataclass(frozen=True)
class Stage:
    """One command of a budgeted run."""

    name: str  # a short name (--stages selects by it)
    what: str  # what it does, for the summary
    command: list[str]  # the argv it runs
    log: str  # the file in the output folder its stdout and stderr are appended to
    min_s: float  # the least time worth starting it with
    max_s: float | None = None  # its own cap; None: whatever is left
    cut_ok: bool = False  # a measurement that keeps its results as they come: out of time cuts it, not fails it


@dataclass
class Outcome:
    """What became of one stage."""

    stage: Stage
    status: str  # passed, failed, timed out, cut or skipped
    seconds: float = 0.0  # how long it ran
    limit_s: float = 0.0  # the time it was given (skipped: the time it was left)
    returncode: int | None = None
    tail: list[str] = field(default_factory=list)  # the last lines it wrote

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, TIMED_OUT)


def run_stages(
    stages: list[Stage],
    out: Path,
    budget_s: float,
    *,
    reserve_s: float = GRACE_S + 5.0,
    on_stage: Callable[[list[Outcome]], None] = lambda outcomes: None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Run ``stages`` in order inside ``budget_s`` seconds (``reserve_s`` of it kept for stopping a stage
    that runs over and for the caller's last words), appending each one's output to ``out / stage.log``;
    returns every stage's outcome."""
    start, outcomes = clock(), []
    for i, stage in enumerate(stages):
        left = budget_s - reserve_s - (clock() - start)
        cap = stage.max_s if stage.max_s is not None else left
        limit = min(cap, left - sum(s.min_s for s in stages[i + 1 :]))  # room left for every later stage
        if limit < stage.min_s:  # not enough for all: this one first, with what is left
            limit = min(cap, left)
        if limit < stage.min_s:
            outcomes.append(Outcome(stage, SKIPPED, limit_s=max(left, 0.0)))
        else:
            outcomes.append(_run(stage, out / stage.log, limit, clock))
        on_stage(outcomes)
    return outcomes


def _run(stage: Stage, log_path: Path, limit: float, clock) -> Outcome:
    began = clock()
    with open(log_path, "a") as log:
        log.write(f"== {stage.name}: {shlex.join(stage.command)} (at most {limit:.0f} s)\n")
        log.flush()
        start_offset = log.tell()
        proc = subprocess.Popen(stage.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
            status = PASSED if code == 0 else FAILED
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code, status = None, CUT if stage.cut_ok else TIMED_OUT
    return Outcome(stage, status, clock() - began, limit, code, _tail(log_path, start_offset))


def _stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the stage's whole process group (torchrun, compile workers), then, after at most
    ``grace_s``, SIGKILL to whatever of it is left."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


def _tail(path: Path, offset: int, lines: int = 5) -> list[str]:
    with open(path, errors="replace") as f:
        f.seek(offset)
        return [line.rstrip("\n") for line in f.read().splitlines()[-lines:]]
