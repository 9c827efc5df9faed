"""The ways a run ends at once that are not a user's mistake: a third stop signal, a lost peer.

They live here, torch-free, so that the commands' wrapper (``gpt.commands.cli``) can say them in one line
without importing the trainer (and torch) before a command's arguments are checked.
"""

from __future__ import annotations


class StopNow(BaseException):
    """A third stop signal: the run ends at once (a BaseException, so that no ``except Exception`` holds it
    up). Entry points say so in one line and exit with ``EXIT_CODE``, the status of an interrupted run."""

    EXIT_CODE = 4
    hint = "the newest checkpoint stands: --resume auto continues from it"  # said after the message


class LostPeer(StopNow):
    """A collective failed because a peer rank's process ended (killed, out of memory): this rank stops too.
    The message is whole (no ``hint``); ``say``: whether this rank is the one on its machine to print it."""

    hint = ""

    def __init__(self, message: str, say: bool):
        super().__init__(message)
        self.say = say
