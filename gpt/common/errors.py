"""The one kind of error a user can cause and fix: a bad config, path, data set or resume, a full disk.

Its message is one line naming what is wrong and what is allowed. Entry points print it
as ``error: <message>`` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import os
import re
import reprlib


class UserError(ValueError):
    """A mistake in the user's input, or a fault of the machine the user can fix; the message is one line."""


def os_cause(exc: BaseException) -> str | None:
    """The operating system's words for why ``exc`` happened ("No space left on device"), found in its
    chain of causes or in a library's message that quotes an errno; None if it has none."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        errno = re.search(r"os error (\d+)", str(seen))  # Rust libraries (safetensors): "... (os error 28)"
        if errno:
            return os.strerror(int(errno.group(1)))
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)  # "from None": not ours
    return None


def os_reason(exc: BaseException) -> str:
    """``os_cause(exc)``, else the exception's first line."""
    return os_cause(exc) or first_line(exc)


QUOTED = reprlib.Repr()  # its limits as attributes: Python 3.11's takes no keywords
QUOTED.maxlevel, QUOTED.maxstring, QUOTED.maxother, QUOTED.maxlong = 3, 80, 80, 40
QUOTED.maxdict = QUOTED.maxlist = QUOTED.maxtuple = QUOTED.maxset = 6
QUOTED_LIMIT = 200  # characters: the most of a value any message quotes


def quoted(value) -> str:
    """``value``'s repr for a message, at most ``QUOTED_LIMIT`` characters however large or deep it is
    (a YAML alias bomb, a 50 MB line): nested containers are cut (``[...]``) before anything is formatted."""
    return clipped(QUOTED.repr(value))


def on_one_line(text: str) -> str:
    """``text`` with its line breaks shown as ``\\n`` / ``\\r``: an error line stays one line whatever user text
    (a group name, a config value) it quotes."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def clipped(text: str, limit: int = QUOTED_LIMIT) -> str:
    """``text``, cut to ``limit`` characters (ending ``...``) if it is longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shortened(items: list, keep: int = 3) -> str:
    """``a, b, c and 4 more``: a long list said in a few words."""
    items = [str(x) for x in items]
    return ", ".join(items[:keep]) + (f" and {len(items) - keep} more" if len(items) > keep else "")


def first_line(exc: BaseException) -> str:
    """``exc``'s message, first line only, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
