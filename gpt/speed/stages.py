"""A budgeted run of stages: each a command under its own time limit, sized from what is left.

Built for the GPU check (``gpt.commands.gpu_check``): the whole run must end inside the budget a user
gives it, and a stop at any moment (a kill, a preempted VM) must leave what was measured. So stages run in
the order given, each as a subprocess in its own process group. A stage gets what is left
of the budget after the least time every later stage needs (their ``min_s``; an ``optional``
stage's is not kept for it: it runs on time left over), up to its own ``max_s``; where that
leaves it less than its own ``min_s``, it takes what is left (the earlier stage goes first)
and the later ones are skipped, each listed with the time it was left. ``budget_lines``
prints that plan before anything runs, with each stage's ``expected_s`` (an estimate, and
how it is counted) beside the limit it gets should every stage before it use all of its
own: the plan shows whether a stage's promise fits even then. A stage that runs
past its limit is stopped (SIGTERM to its whole group, then SIGKILL after ``GRACE_S``); one
that keeps its results as they come (``cut_ok``: a benchmark writing one row at a time, a
search logging each probe, tests reporting each as it ends) is then "cut", not failed.
A stage may read its own log (``findings``: the tests stage's is
``gpt.speed.progress_plugin.results_of_tests``), and a failure found there fails the stage
even when it was cut.

``on_stage`` is called with the outcomes so far after every stage, and every ``POLL_S``
while one runs (the running one last, status "running", with its seconds so far), so a
summary can follow each row as it lands. Inside ``stopping_on()`` a SIGTERM or SIGINT
stops the stage under way with its whole group (status "stopped") and the later stages
do not run.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PASSED, FAILED, TIMED_OUT, CUT, SKIPPED = "passed", "failed", "timed out", "cut", "skipped"
RUNNING, STOPPED = "running", "stopped"
GRACE_S = 5.0  # how long a stopped stage may take to end before it is killed
RESERVE_S = GRACE_S + 5.0  # of the budget: stopping a stage that runs over, and the caller's last words
POLL_S = 1.0  # while a stage runs: how often on_stage hears of it (and a stop signal is acted on)
NAME_WIDTH = 15  # the stage names' column in the plan and the summary


class Stopped(Exception):
    """The whole run was asked to stop (SIGTERM, SIGINT): raised in the main thread by ``stopping_on``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stopping_on(signals=(signal.SIGTERM, signal.SIGINT)) -> Iterator[list[int]]:
    """Inside the block, the first of ``signals`` raises ``Stopped`` (``run_stages`` then stops the stage under
    way with its group); later ones are only recorded, so that the stopping is not itself cut short. Yields the
    list of signals received. The main thread only (Python's signal handlers run there)."""
    received: list[int] = []

    def handler(signum, frame):
        received.append(signum)
        if len(received) == 1:
            raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


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
    env: dict[str, str] = field(default_factory=dict)  # added to the environment it runs in
    # reads what it wrote to its log: whether something in it failed, and lines for the summary
    findings: Callable[[str], tuple[bool, list[str]]] | None = None
    optional: bool = False  # runs only on time left over: no earlier stage keeps its min_s for it
    expected_s: float | None = None  # the seconds it is expected to take (an estimate, printed with the plan)
    estimate: str = ""  # how expected_s is counted


@dataclass
class Outcome:
    """What became of one stage."""

    stage: Stage
    status: str  # passed, failed, timed out, cut, skipped, stopped; "running" while it runs
    seconds: float = 0.0  # how long it ran
    limit_s: float = 0.0  # the time it was given (skipped: the time it was left)
    returncode: int | None = None
    tail: list[str] = field(default_factory=list)  # the last lines it wrote
    notes: list[str] = field(default_factory=list)  # what its findings say

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, TIMED_OUT)


def stage_limit(stages: list[Stage], i: int, left: float) -> float:
    """Stage ``i``'s time limit with ``left`` seconds left: what the later stages' minimums leave (an optional
    stage's is not kept), up to its cap; if that is under its own minimum, whatever is left up to its cap
    (below its minimum: skipped)."""
    stage = stages[i]
    cap = stage.max_s if stage.max_s is not None else left
    kept = sum(s.min_s for s in stages[i + 1 :] if not s.optional)
    limit = min(cap, left - kept)  # room left for every later stage that is not optional
    return limit if limit >= stage.min_s else min(cap, left)  # not enough for all: this one first


def budget_lines(stages: list[Stage], budget_s: float, reserve_s: float = RESERVE_S, spent_s: float = 0.0) -> list[str]:
    """The plan, before anything runs: each stage's minimum and cap, the limit it gets should every stage
    before it run to its own limit (the least it can get; stages that end early leave the later ones more),
    and the seconds it is expected to take, with how they are counted. ``spent_s``: what the caller spent of
    ``budget_s`` before the first stage."""
    left = budget_s - spent_s - reserve_s
    lines = [
        f"budget {budget_s:.0f} s: {spent_s:.0f} s spent before the first stage, {reserve_s:.0f} s kept to stop "
        "one and write the summary; limit: a stage's time should every stage before it use all of its own; "
        "expected: the estimate, counted as it says",
        f"  {'stage':<{NAME_WIDTH}}{'min s':>7}{'cap s':>7}{'limit s':>9}{'expected s':>12}",
    ]
    for i, stage in enumerate(stages):
        limit = stage_limit(stages, i, left)
        runs = limit >= stage.min_s
        left -= limit if runs else 0.0
        cap = "-" if stage.max_s is None else f"{stage.max_s:.0f}"
        expected = "-" if stage.expected_s is None else f"{math.ceil(stage.expected_s)}"  # rounded up, as min_s is
        name = stage.name + ("*" if stage.optional else "")
        lines.append(
            f"  {name:<{NAME_WIDTH}}{stage.min_s:>7.0f}{cap:>7}{f'{limit:.0f}' if runs else 'skipped':>9}"
            f"{expected:>12}" + (f"  {stage.estimate}" if stage.estimate else "")
        )
    if any(s.optional for s in stages):
        lines.append("  *: optional, run on time left over (no stage before it keeps its minimum for it)")
    return lines


def run_stages(
    stages: list[Stage],
    out: Path,
    budget_s: float,
    *,
    reserve_s: float = RESERVE_S,
    on_stage: Callable[[list[Outcome]], None] = lambda outcomes: None,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = POLL_S,
) -> list[Outcome]:
    """Run ``stages`` in order inside ``budget_s`` seconds (``reserve_s`` of it kept for stopping a stage
    that runs over and for the caller's last words), appending each one's output to ``out / stage.log``;
    returns the outcome of every stage (of those up to the one a ``Stopped`` ended, when one came)."""
    start, outcomes = clock(), []
    try:
        for i, stage in enumerate(stages):
            left = budget_s - reserve_s - (clock() - start)
            limit = stage_limit(stages, i, left)
            if limit < stage.min_s:
                outcomes.append(Outcome(stage, SKIPPED, limit_s=max(left, 0.0)))
            else:

                def running(seconds: float, stage=stage, limit=limit) -> None:
                    on_stage([*outcomes, Outcome(stage, RUNNING, seconds, limit)])

                outcomes.append(_run(stage, out / stage.log, limit, clock, running, poll_s))
            on_stage(outcomes)
            if outcomes[-1].status == STOPPED:
                break
    except Stopped:  # between two stages, or while reporting one: nothing of theirs is running
        pass
    return outcomes


def _run(stage: Stage, log_path: Path, limit: float, clock, running, poll_s: float) -> Outcome:
    began = clock()
    with open(log_path, "a") as log:
        log.write(f"== {stage.name}: {shlex.join(stage.command)} (at most {limit:.0f} s)\n")
        log.flush()
        start_offset = log.tell()
        proc = subprocess.Popen(
            stage.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **stage.env},
        )
        try:
            code = _wait(proc, began + limit, clock, lambda: running(clock() - began), poll_s)
            status = PASSED if code == 0 else FAILED
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code, status = None, CUT if stage.cut_ok else TIMED_OUT
        except Stopped:
            _stop_group(proc)
            code, status = None, STOPPED
        except BaseException:  # anything else ending the caller ends the stage too: nothing outlives it
            _stop_group(proc)
            raise
    with open(log_path, errors="replace") as f:
        f.seek(start_offset)
        text = f.read()
    failed, notes = stage.findings(text) if stage.findings else (False, [])
    if failed and status in (PASSED, CUT):  # a test that failed fails the stage, cut or not
        status = FAILED
    tail = [line.rstrip("\n") for line in text.splitlines()[-5:]]
    return Outcome(stage, status, clock() - began, limit, code, tail, notes)


def _wait(proc: subprocess.Popen, deadline: float, clock, running: Callable[[], None], poll_s: float) -> int:
    """``proc``'s exit status; ``running()`` every ``poll_s`` meanwhile; TimeoutExpired once past ``deadline``."""
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(poll_s, deadline - clock())))
        except subprocess.TimeoutExpired:
            if clock() >= deadline:
                raise
        running()


def _stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the stage's whole process group (torchrun, compile workers), then, after at most
    ``grace_s``, SIGKILL to whatever of it is left. A stop signal meanwhile hastens the SIGKILL, and is
    raised once the group is gone."""
    stopped = None
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        except Stopped as e:
            stopped = e
    if stopped is not None:
        raise stopped
