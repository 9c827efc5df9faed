"""Calls that may not hold a run up: one given a time limit, and a process end that does not wait for it.

A library call that talks to a server (wandb's start and finish) can wait far longer than it
was told to: wandb's own timeouts leave out its login check, and at exit its teardown waits
for its service process, which waits for a server that may never answer. ``within`` runs
such a call in a daemon thread and stops waiting after the limit (or at a stop signal);
the call is then *abandoned*, and ``leave`` ends the process without running the exit
hooks that would wait for it (the commands call it once their own files are written).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

_abandoned: list[str] = []  # what was given up on in this process


def within(seconds: float, call, what: str):
    """``call()``'s result, or a TimeoutError after ``seconds``; ``what`` names it. The call goes on in a
    daemon thread nothing waits for; given up on (a timeout, or a stop signal raised while waiting), it
    is recorded as abandoned."""
    result: dict = {}
    done = threading.Event()  # not the thread's own state: a join a signal interrupts marks it stopped

    def run():
        try:
            result["value"] = call()
        except BaseException as e:  # noqa: BLE001  handed to the caller
            result["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"bounded-{what}", daemon=True).start()
    try:
        done.wait(seconds)
    finally:
        if not done.is_set():
            _abandoned.append(what)
    if not done.is_set():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def abandoned() -> list[str]:
    return list(_abandoned)


def leave(code: int) -> None:
    """End the process now with ``code`` when a call was abandoned (its library's exit hooks would wait
    for it), after flushing what was printed; otherwise return, and the process ends as usual."""
    if not _abandoned:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
