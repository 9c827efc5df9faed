"""The one kind of error a user can cause and fix: a bad config, path, data set or resume, a full disk.

Its message is one line naming what is wrong and what is allowed. Entry points print it
as ``error: <message>`` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import os
import re


class UserError(ValueError):
    """A mistake in the user's input, or a fault of the machine the user can fix; the message is one line."""


def os_reason(exc: BaseException) -> str:
    """The operating system's words for why ``exc`` happened ("No space left on device"), found in its
    chain of causes or in a library's message that quotes an errno; else the exception's first line."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        quoted = re.search(r"os error (\d+)", str(seen))  # Rust libraries (safetensors): "... (os error 28)"
        if quoted:
            return os.strerror(int(quoted.group(1)))
        seen = seen.__cause__ or seen.__context__
    return first_line(exc)


def shortened(items: list, keep: int = 3) -> str:
    """``a, b, c and 4 more``: a long list said in a few words."""
    items = [str(x) for x in items]
    return ", ".join(items[:keep]) + (f" and {len(items) - keep} more" if len(items) > keep else "")


def first_line(exc: BaseException) -> str:
    """``exc``'s message, first line only, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
