"""Requests to the Hugging Face Hub: bounded in time, retried, and failing in one line.

Uploads go through ``huggingface_hub`` with the token from the environment (``HF_TOKEN``) or
the Hub's own login; it is passed to nothing and written nowhere.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpt.common.errors import UserError, first_line


class HubError(UserError):
    """An export or upload that cannot be done."""


class UploadError(HubError):
    """An upload that failed after its retries; ``reason`` says why and what to do, without the repo."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# Every request to the Hub gives up after these (connect, read, write, pool) seconds: the client's own default
# is to wait forever, and a Hub that accepts connections and never answers would hold a run's end for good.
HUB_TIMEOUT_S = (10.0, 60.0, 60.0, 10.0)


def bounded_session():
    """huggingface_hub's shared HTTP client, with ``HUB_TIMEOUT_S`` on every request it makes."""
    from huggingface_hub import get_session

    session = get_session()
    if hasattr(session, "timeout"):  # httpx (huggingface_hub >= 1.0); requests' sessions take no default
        session.timeout = HUB_TIMEOUT_S
    return session


def hub_client():
    """huggingface_hub's client, every request bounded in time (the token: HF_TOKEN or the Hub's login)."""
    from huggingface_hub import HfApi  # imported when used: training without the Hub never needs it

    bounded_session()
    return HfApi()


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def why_upload_failed(error: BaseException) -> str:
    """The fix a failed upload calls for: the network and the endpoint when the Hub did not answer or could
    not be reached, the token when it refused."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return "check the token (HF_TOKEN or `hf auth login`) and its write access"
    if status is not None and status >= 500:
        return "the Hub failed to answer (a server error): wait and run again"
    network = ("Timeout", "ConnectError", "ConnectionError", "NetworkError", "RemoteProtocolError", "ReadError")
    if any(
        name in type(e).__name__
        for e in (error, error.__cause__, error.__context__)
        if e is not None
        for name in network
    ):
        return f"the Hub at {endpoint()} did not answer; check the network, or HF_ENDPOINT"
    return "check the repository name and the token's write access (HF_TOKEN or `hf auth login`)"


def retried(action, what: str, *, attempts: int = 3, backoff: float = 1.0):
    """``action()``'s result; any failure is retried ``attempts`` times with doubling waits, then raised as
    one UploadError line naming ``what`` (a repo, a repo@branch, a collection)."""
    error = None
    for attempt in range(attempts):
        try:
            return action()
        except Exception as e:  # noqa: BLE001  any failure of the client or the network: retried, then one line
            error = e
            if attempt + 1 < attempts:
                time.sleep(backoff * 2**attempt)
    reason = f"{first_line(error)}; {why_upload_failed(error)}"
    raise UploadError(
        f"upload to {what} failed after {attempts} attempts: "
        f"{first_line(error)}; nothing local changed: {why_upload_failed(error)}, then run again",
        reason,
    )


def upload_folder(
    folder: Path,
    repo_id: str,
    *,
    private: bool = True,
    revision: str | None = None,
    message: str = "Upload model",
    attempts: int = 3,
    backoff: float = 1.0,
) -> str:
    """Create the repo (and branch) if needed and upload ``folder`` in one commit; returns the commit id.
    Errors are retried ``attempts`` times with doubling waits, then raised as one HubError line."""
    api = hub_client()

    def upload() -> str:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision not in (None, "main"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), revision=revision, commit_message=message
        ).oid

    where = f"{repo_id}{'@' + revision if revision else ''}"
    return retried(upload, where, attempts=attempts, backoff=backoff)
