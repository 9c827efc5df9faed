"""Uploads: one checkpoint now (``push``), or a run's checkpoints in the background while it trains.

``HubUploads`` is the training run's hook (``gpt.training.hooks.RunHooks``): the train command
hands it to the trainer, which knows nothing of the Hub.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gpt.common.errors import first_line, os_reason, shortened
from gpt.common.files import copy_atomically
from gpt.config import Config
from gpt.publish.export import export_checkpoint
from gpt.publish.hub_api import endpoint, upload_folder
from gpt.publish.layouts import Layout
from gpt.run.checkpoints import CONFIG_FILE, INFO_FILE, MODEL_FILE, read_info
from gpt.run.directory import RunDir, eval_result_files
from gpt.training.hooks import RunHooks


def push(
    ckpt: Path,
    repo_id: str,
    *,
    layout: Layout = Layout.REMOTE_CODE,
    private: bool = True,
    revision: str | None = None,
    comparison: dict | None = None,
) -> tuple[str, list[str]]:
    """Export ``ckpt`` to a temporary folder and upload it; returns (commit id, files)."""
    with tempfile.TemporaryDirectory(prefix="gpt-hub-") as tmp:
        files = export_checkpoint(ckpt, Path(tmp), repo_id, layout=layout, comparison=comparison)
        info = read_info(ckpt)
        commit = upload_folder(
            Path(tmp),
            repo_id,
            private=private,
            revision=revision,
            message=f"{ckpt.name} (step {info.get('step', '?')})",
        )
    return commit, files


def stage(ckpt: Path, staged: Path) -> None:
    """Hard-link (or copy) what an export reads of ``ckpt`` into ``staged``."""
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in (MODEL_FILE, CONFIG_FILE, INFO_FILE):
        try:
            (staged / name).hardlink_to(ckpt / name)
        except OSError:  # another file system, or no hard links: a copy
            copy_atomically(ckpt / name, staged / name)
    for e in eval_result_files(ckpt):
        copy_atomically(e, staged / e.name)


class CheckpointUploader:
    """Uploads a run's checkpoints from one background thread, so training never waits for the Hub.

    Each checkpoint goes to the branch named after it (``step-00001000``), the final model to
    ``main`` with its card. Submitting hard-links the checkpoint's files into the run's staging
    folder (so pruning cannot take them away) and returns at once; a staged copy is removed
    once its upload succeeds or fails, so the staging folder is the queue, on disk. A run that
    stopped with uploads left (or was killed) leaves their staged copies: the next start
    queues them again, before anything new, and removes whatever is incomplete. What was
    uploaded is kept in the run's ``hub.json``: no checkpoint is uploaded twice.
    """

    def __init__(self, run: RunDir, repo_id: str, private: bool, attempts: int = 3, backoff: float = 1.0):
        self.run, self.repo_id, self.private = run, repo_id, private
        self.attempts, self.backoff = attempts, backoff
        self.lock = threading.Lock()  # the record is written by the worker and, at the end, by the trainer
        self.record = run.hub_record()  # {"repo_id", "uploaded": {branch: commit}, "failed": {branch: reason}}
        self.record["repo_id"] = repo_id
        self.jobs: queue.Queue = queue.Queue()
        self.current: tuple[Path, str] | None = None  # the upload under way
        self.requeued = self._requeue_staged()
        self.thread = threading.Thread(target=self._work, name="hub-upload", daemon=True)
        self.thread.start()

    def _requeue_staged(self) -> list[str]:
        """Queue the staged copies an earlier process left (oldest step first); remove incomplete ones."""
        staging, branches = self.run.hub_staging, []
        for staged in sorted(staging.iterdir()) if staging.is_dir() else []:
            branch = staged.name[len("step-00000000-") :]
            complete = all((staged / name).is_file() for name in (MODEL_FILE, CONFIG_FILE, INFO_FILE))
            if complete and branch and (branch == "main" or branch not in self.record["uploaded"]):
                self.jobs.put((staged, branch, None))
                branches.append(branch)
            else:
                shutil.rmtree(staged, ignore_errors=True)
        return branches

    def submit(self, ckpt: Path, branch: str | None = None, summary: dict | None = None) -> bool:
        """Queue ``ckpt`` for upload to ``branch`` (default: its own name); False if it is already there."""
        branch = branch or ckpt.name
        if branch != "main" and branch in self.record["uploaded"]:
            return False
        staged = self.run.hub_staging / f"{ckpt.name}-{branch}"
        try:
            stage(ckpt, staged)
        except OSError as e:  # a full disk, say: this checkpoint is not uploaded, training goes on
            self._note(branch, failed=f"not staged for upload: {os_reason(e)}")
            shutil.rmtree(staged, ignore_errors=True)
            return False
        self.jobs.put((staged, branch, summary))
        return True

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            staged, branch, summary = job
            self.current = (staged, branch)
            try:
                with tempfile.TemporaryDirectory(prefix="gpt-hub-") as tmp:
                    export_checkpoint(staged, Path(tmp), self.repo_id, run=self.run, summary=summary)
                    commit = upload_folder(
                        Path(tmp),
                        self.repo_id,
                        private=self.private,
                        revision=branch,
                        message=f"{staged.name} ({branch})",
                        attempts=self.attempts,
                        backoff=self.backoff,
                    )
                self._note(branch, uploaded=commit)
            except Exception as e:  # noqa: BLE001  a failed upload is recorded, never raised into training
                self._note(branch, failed=getattr(e, "reason", None) or first_line(e))
            finally:
                shutil.rmtree(staged, ignore_errors=True)
                self.current = None

    def _note(self, branch: str, uploaded: str | None = None, failed: str | None = None) -> None:
        with self.lock:
            if uploaded is not None:
                self.record["uploaded"][branch] = uploaded
                self.record["failed"].pop(branch, None)
            else:
                self.record["failed"][branch] = failed
            self.run.write_hub_record(self.record)

    def left(self) -> list[str]:
        """The branches still to upload: the one under way, then the queue."""
        current = [self.current[1]] if self.current is not None else []
        return current + [job[1] for job in list(self.jobs.queue) if job is not None]

    def finish(self, final: Path | None = None, summary: dict | None = None, stop=None, wait_s: float = 60.0) -> dict:
        """Upload ``final`` to main (when given) and wait for the queued uploads: for all of them, unless a
        stop signal came (``stop.requested``), then for at most ``wait_s`` seconds from it, or a second one
        (``stop.hurry``), then not at all. What is left stays staged for the next start; the report says it."""
        if final is not None:
            self.submit(final, "main", summary)
        self.jobs.put(None)
        deadline = None
        while self.thread.is_alive():
            if stop is not None and stop.hurry:
                break
            if stop is not None and stop.requested:
                deadline = deadline or time.monotonic() + wait_s
                if time.monotonic() >= deadline:
                    break
            self.thread.join(0.2)
        with self.lock:
            left = self.left() if self.thread.is_alive() else []
            self.record["left"] = left
            self.run.write_hub_record(self.record)
            if not left:
                shutil.rmtree(self.run.hub_staging, ignore_errors=True)
            return {
                "repo_id": self.repo_id,
                "endpoint": endpoint(),
                "uploaded": sorted(self.record["uploaded"]),
                "failed": dict(self.record["failed"]),
                "left": left,
            }


def upload_problems(report: dict) -> str | None:
    """The uploads of a run's end in one line: how many failed and why (each reason once, with its count),
    how many are left for the next start; None when all went up."""
    failed, left = report["failed"], report["left"]
    if not failed and not left:
        return None
    reasons: dict[str, list[str]] = {}
    for branch, why in failed.items():
        reasons.setdefault(why, []).append(branch)
    parts = [f"{len(branches)} failed ({shortened(branches)}): {why}" for why, branches in reasons.items()]
    if left:
        parts.append(f"{len(left)} left for the next start ({shortened(left)})")
    return f"Hub uploads to {report['repo_id']} at {report['endpoint']}: " + "; ".join(parts)


class HubUploads(RunHooks):
    """A training run's uploads (``hub.*`` of its config): every checkpoint to its own branch when
    ``hub.push_every_checkpoint``, the final model to main with its card. Without ``hub.repo_id`` it
    only removes what an earlier process staged, since nothing will upload it."""

    def __init__(self, cfg: Config):
        self.hub = cfg.hub
        self.uploader: CheckpointUploader | None = None

    def started(self, run_path: Path) -> None:
        run = RunDir(run_path)
        if self.hub.repo_id is not None:  # it queues first what an earlier process left staged
            self.uploader = CheckpointUploader(run, self.hub.repo_id, self.hub.private)
        else:
            shutil.rmtree(run.hub_staging, ignore_errors=True)

    def checkpoint_saved(self, ckpt: Path) -> None:
        if self.uploader is not None and self.hub.push_every_checkpoint:
            self.uploader.submit(ckpt)  # returns at once: the upload runs in the background

    def finished(self, status: str, final: Path | None, summary: dict, stop) -> str | None:
        """Wait for the uploads (bounded once a stop signal came), the final model to main; the report goes
        into the summary as ``hub``."""
        if self.uploader is None:
            return None
        summary["hub"] = self.uploader.finish(final, summary, stop=stop, wait_s=self.hub.wait_on_exit_s)
        return upload_problems(summary["hub"])
