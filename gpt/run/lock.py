"""The lock that keeps a run folder to one trainer at a time (``RunDir.lock`` takes it).

An exclusive flock on a file in the run folder: the kernel releases it when the process ends,
however it ends, so a kill -9 never leaves a stale lock. Taking it also proves that the folder
can be written, before anything heavy is built.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from gpt.common.errors import UserError, os_reason


class RunBusyError(UserError):
    """Another trainer holds the run directory."""


class RunLock:
    """An exclusive lock (flock) on a run directory, held while one trainer works on it.

    The kernel releases it when the process ends, however it ends, so a kill -9 never
    leaves a stale lock. The lock file holds the holder's PID and host for the message a
    second trainer gets.
    """

    def __init__(self, path: Path, run_path: Path):
        self.path = path
        probe = path.parent / f".write-probe-{os.getpid()}"
        try:  # a folder that takes no new file (read-only, immutable) may still open an existing lock file
            path.parent.mkdir(parents=True, exist_ok=True)
            probe.touch()
            probe.unlink()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # read-only, no permission, a file in the way: before anything is built
            raise UserError(
                f"cannot write the run directory {run_path}: {os_reason(e)}; make it writable, or "
                "set run.dir (or run.name) to a folder this user can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunBusyError(
                f"{run_path} is in use by another trainer (PID {holder}); wait for it to end or "
                "stop it, or choose another run.name"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as e:  # a full disk: the holder could not be named, so the lock is not taken
            _remove_if_alone(path)
            os.close(fd)
            raise UserError(
                f"cannot write the run directory {run_path}: {os_reason(e)}; free space, or set run.dir to "
                "another folder"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        _remove_if_alone(self.path)
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None


def _remove_if_alone(lock: Path) -> None:
    """A folder made only to hold the lock (the run stopped before it began) leaves no trace."""
    try:
        if [p.name for p in lock.parent.iterdir()] == [lock.name]:
            lock.unlink()
            lock.parent.rmdir()
    except OSError:
        pass


def _read_holder(fd: int, patience: float = 2.0) -> str:
    """The lock holder's "PID on host". The holder writes it just after taking the lock, so a
    second trainer that arrives in between waits for it briefly rather than report "unknown"."""
    deadline = time.monotonic() + patience
    while True:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if holder or time.monotonic() > deadline:
            return holder or "unknown"
        time.sleep(0.01)
