"""Files written whole or not at all, and JSON files read back within bounds.

Every file the package writes goes through ``replacing`` (a file) or ``replacing_folder`` (a folder
of files, such as a checkpoint or a token set): the content is written to a temporary name in the
same folder, flushed to the disk (fsync) and renamed over the final name, which a reader therefore
sees as it was or as it is now, never half-written, whatever stops the writer (a kill, a full disk,
a file-size limit). A write that fails removes its temporary file and raises ``WriteError``: one
line naming the file and the operating system's reason. The only writes outside these are streams
that a reader takes line by line and that tolerate a torn last line (metrics.jsonl, a log); the
architecture test lists them and fails on any other.

``read_json`` is the one reader of the JSON files the package wrote: a size bound checked before
reading, and a damaged file is one line naming it, never an empty dict.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpt.common.errors import UserError, clipped, first_line, os_cause, os_reason

_UMASK = os.umask(0)  # read once: the mode a plainly created file would get
os.umask(_UMASK)

JSON_LIMIT = 64 << 20  # bytes: the largest JSON record the package reads back (HellaSwag's per-item answers: ~3 MB)


class WriteError(UserError, OSError):
    """A file or folder that could not be written (a full disk, a file-size limit, a read-only folder); what
    was at its name before is as it was. An OSError too, with the operating system's words as ``strerror``,
    so that code written for a failed write catches it as before."""

    def __init__(self, path: Path, exc: BaseException):
        self.path, self.reason = Path(path), os_reason(exc)
        super().__init__(f"cannot write {path}: {self.reason}")
        self.errno, self.strerror = getattr(exc, "errno", None), self.reason

    def __str__(self) -> str:  # OSError's would be "[Errno 28] ..."
        return self.args[0]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # it ended just now; or no /proc (not Linux), where kill's answer is all there is
        return not Path("/proc").is_dir()
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # the state follows the command name in parentheses


HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"  # in temporary names: whose they are


def _temporary_name(path: Path, kind: str) -> str:
    """The prefix of ``path``'s temporary (``tmp``) or moved-aside (``old``) siblings: ``.NAME.tmp-HOST-PID-``."""
    return f".{path.name}.{kind}-{HOST}-{os.getpid()}-"


def remove_abandoned(path: Path) -> None:
    """Temporary files and folders that earlier writes of ``path`` on this machine left when their process
    was killed mid-way (a live writer's, or another machine's on a shared file system, are left alone). A
    folder moved aside (``old``) while ``path`` is missing, by a kill between the two renames of a
    replacement, is the last whole one: it is renamed back, not removed."""
    for kind in ("old", "tmp"):
        head = f".{path.name}.{kind}-"
        for stale in path.parent.glob(glob.escape(head) + "*"):
            host, _, rest = stale.name.removeprefix(head).partition("-")
            if not rest:  # .NAME.tmp-PID, as an earlier version named it
                host, rest = HOST, host
            pid = rest.split("-", 1)[0]
            if not (host == HOST and pid.isdigit() and not process_alive(int(pid))):
                continue
            if kind == "old" and not path.exists():
                stale.rename(path)
            else:
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


def fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to the disk; a folder a file system cannot flush is let be."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not Path(path).is_dir():
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so that writers that go by it choose the same format)
    to write ``path``'s new content to; on leaving the block it is flushed and renamed over ``path``. If the
    block raises, or the write fails, the temporary file is removed and ``path`` stays as it was; an
    OSError becomes a WriteError naming ``path``."""
    path = Path(path)
    try:
        remove_abandoned(path)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=_temporary_name(path, "tmp"), suffix=path.suffix)
        os.close(fd)
    except OSError as e:
        raise WriteError(path, e) from e
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK)
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if os_cause(e) is not None:  # a library's write error names the OS's reason in its chain or message
            raise WriteError(path, e) from e
        raise


def write_atomically(path: str | Path, content: str | bytes) -> None:
    """``path`` holds ``content`` whole, or stays as it was (WriteError)."""
    with replacing(path) as tmp:
        tmp.write_bytes(content.encode() if isinstance(content, str) else content)


def write_json(path: str | Path, data, **dumps) -> None:
    """``data`` as indented JSON, atomically (``dumps``: json.dumps's options)."""
    write_atomically(path, json.dumps(data, indent=2, **dumps) + "\n")


def copy_atomically(source: str | Path, path: str | Path) -> None:
    """A copy of file ``source`` at ``path``, whole or not at all."""
    with replacing(path) as tmp:
        shutil.copyfile(source, tmp)


@contextlib.contextmanager
def replacing_folder(path: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; on leaving the block its files are flushed and it is
    renamed to ``path``. A folder already there is moved aside first and removed after; a kill between the
    two renames leaves it aside whole, and the next write of ``path`` (or ``tidy``, for a checkpoint) takes
    it back. If the block raises, the temporary folder is removed and ``path`` is as it was."""
    path = Path(path)
    tmp = path.with_name(f"{_temporary_name(path, 'tmp')}{os.urandom(4).hex()}")
    aside = path.with_name(f"{_temporary_name(path, 'old')}{os.urandom(4).hex()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(path)
        tmp.mkdir()
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync(f)
        if path.exists():
            path.rename(aside)
        tmp.rename(path)
        shutil.rmtree(aside, ignore_errors=True)
        fsync(path.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside.exists() and not path.exists():  # the second rename failed: the old one goes back
            aside.rename(path)
        if os_cause(e) is not None:  # a library's write error names the OS's reason in its chain or message
            raise WriteError(path, e) from e
        raise


def read_json(
    path: str | Path,
    what: str,
    limit: int = JSON_LIMIT,
    fix: str = "restore it or delete it",
    error: type[UserError] = UserError,
) -> dict:
    """The JSON object in ``path``, one of the package's records (``what`` names it in messages). A file
    over ``limit`` bytes is refused before it is read; one that is not a JSON object is an ``error`` (a
    UserError: the caller's own kind) naming it and ``fix``, never an empty dict."""
    path = Path(path)
    try:
        size = path.stat().st_size
        text = path.read_bytes() if size <= limit else None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {os_reason(e)}") from None
    if text is None:
        raise error(f"{path}: damaged {what} ({size:,} bytes, and no {what} is over {limit:,}); {fix}")
    try:
        data = json.loads(text.decode())  # UTF-8, as the package writes it: never an encoding guessed
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise error(f"{path}: damaged {what} (not valid JSON: {clipped(first_line(e), 120)}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: damaged {what} (a JSON {type(data).__name__}, not an object); {fix}")
    return data
