"""What a training run tells the world outside it: the ``RunHooks`` interface.

The trainer knows nothing of charts or the Hub. Whoever starts a run (the train command, the
sweep) hands it a list of hooks, and rank 0 calls each in order: when the run folder is set up,
after every checkpoint, and once at the end. ``gpt.commands.cli.standard_hooks`` builds the
usual ones: the run's charts (``gpt.analysis.charts.RunCharts``), then the Hub uploads
(``gpt.publish.uploads.HubUploads``) when ``hub.repo_id`` is set.
"""

from __future__ import annotations

from pathlib import Path


class RunHooks:
    """Rank 0's listener of a training run. Every method does nothing unless overridden; none may raise
    for a problem of its own (a full disk, a silent server): ``finished`` returns it in one line."""

    def started(self, run_path: Path) -> None:
        """The run folder is set up and marked running; no step has been taken in this process yet."""

    def checkpoint_saved(self, ckpt: Path) -> None:
        """``ckpt`` was just written (the training thread waits for this call: keep it short). A problem of
        the hook's own here is not the run's: training goes on, and ``finished`` reports what still stands."""

    def finished(self, status: str, final: Path | None, summary: dict, stop) -> str | None:
        """The run ended with ``status``; ``final``: its last checkpoint when it completed, else None.
        ``summary`` is what summary.json will say: a hook may add its own key. ``stop``: the run's
        StopFlag (``requested`` after a signal, ``hurry`` after a second one), so waits can be bounded."""
        return None
