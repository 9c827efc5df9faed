"""What the machines of one job must agree on before it trains: the code, the config and a run folder they all
see; and a word when their clocks disagree.

Every node of a ``torchrun --nnodes=N`` job reads its own config file and imports its own copy of the package.
Two nodes that differ there would train two different things in one group, and a run folder on each node's own
disk would leave the checkpoints where no other node (and no restart elsewhere) can resume them. ``check_nodes``
gathers what each rank has, before anything is written, and refuses in one line, on every rank alike, naming the
first rank that differs from rank 0 and how. A clock that differs changes no number (rank 0 alone stamps the
records) and is said, not refused.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from gpt.common.errors import UserError, quoted, shortened
from gpt.common.files import write_atomically
from gpt.config import Config
from gpt.config.loader import config_differences
from gpt.run.distributed import Dist
from gpt.run.fingerprint import code_version

CLOCK_TOLERANCE_S = 30.0  # clocks further apart than this are worth a word (NTP keeps them within milliseconds)


def check_nodes(dist: Dist, cfg: Config, folder: Path) -> list[str]:
    """Refuse a job whose ranks run other code, read another config, or do not see ``folder`` (where the run
    is written) as rank 0 does; returns what rank 0 should say (clocks apart). A no-op on one process."""
    if not dist.enabled:
        return []
    probe = _write_probe(folder) if dist.is_main else None
    try:
        facts = dist.gather_objects((code_version(), cfg, time.time(), probe))
        sees = dist.gather_objects(facts[0][3] is None or Path(facts[0][3]).is_file())
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)
    first = dist.peers[0].host
    for rank, ((code, other, _, _), seen) in enumerate(zip(facts, sees)):
        where = f"rank {rank} on {dist.peers[rank].host}"
        if code["source"] != facts[0][0]["source"]:
            raise UserError(
                f"{where} runs other code than rank 0 on {first} (source sha256 {code['source'][:12]} against "
                f"{facts[0][0]['source'][:12]}; commit {code['commit']} against {facts[0][0]['commit']}): install the "
                "same checkout on every node (the same commit, or one copy on a shared file system), then rerun"
            )
        if diffs := config_differences(facts[0][1], other):
            listed = shortened([f"{k}: {quoted(a)} on {first}, {quoted(b)} there" for k, a, b in diffs])
            raise UserError(
                f"{where} has another config than rank 0 on {first} ({listed}): every node must read the same "
                "config file with the same --set options (keep it on the shared file system), then rerun"
            )
        if not seen:
            raise UserError(
                f"{where} does not see what rank 0 on {first} writes in {folder} (a folder on each node's own "
                "disk?): put run.dir on a file system every node shares, or no other node can resume its "
                "checkpoints, then rerun"
            )
    times = [t for _, _, t, _ in facts]
    ahead = max(range(len(times)), key=lambda r: abs(times[r] - times[0]))
    if abs(times[ahead] - times[0]) <= CLOCK_TOLERANCE_S:
        return []
    apart, way = abs(times[ahead] - times[0]), "ahead of" if times[ahead] > times[0] else "behind"
    return [
        f"warning: the clock of {dist.peers[ahead].host} (rank {ahead}) is {apart:.0f} s {way} rank 0's on {first}; "
        "the run's records carry rank 0's time, but logs across nodes will not line up: sync the clocks (NTP)"
    ]


def _write_probe(folder: Path) -> str | None:
    """A file in ``folder`` (made if missing) for the other ranks to look for; None if it cannot be written
    (the run's claim then says why, in its own line)."""
    path = folder / f".nodes-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(path, b"")
    except OSError:
        return None
    return str(path)
