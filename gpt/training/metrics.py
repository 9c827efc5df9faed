"""Metrics sinks: ``metrics.jsonl`` in the run directory always, Weights & Biases when enabled.

Only rank 0 builds a ``Metrics``. A wandb problem (no credentials, no network, a crash
inside wandb) never stops training: without credentials the run is logged offline
with a one-line notice, and any wandb error disables wandb for the rest of the run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import uuid
from pathlib import Path

from gpt.common.bounded import within
from gpt.common.errors import first_line, os_reason
from gpt.common.files import write_atomically
from gpt.config import Config, config_to_dict
from gpt.run.directory import RunDir

WANDB_INIT_TIMEOUT = 30.0  # seconds wandb may hold training's start to reach its server (its own default: 90)


def _clean(value):
    """JSON has no NaN / Infinity: write them as strings, so the file stays standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _clean_all(value):
    """``_clean``, of a number or of each number in a list (a stats record's per-block values)."""
    return [_clean(v) for v in value] if isinstance(value, list) else _clean(value)


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def _settings_fields(wandb) -> set[str]:
    """The settings this wandb knows (``finish_timeout`` is recent)."""
    fields = getattr(wandb.Settings, "model_fields", None) or getattr(wandb.Settings, "__fields__", {})
    return set(fields)


class Metrics:
    """Rank 0's sink for metric records: appended to the run's metrics.jsonl, and sent to wandb."""

    def __init__(self, run: RunDir, cfg: Config):
        self.file = open(run.metrics_file, "a")  # noqa: SIM115  the sink stays open for the whole run
        # log.stats_every: stats.jsonl, what each norm does inside the model (gpt.training.inside)
        self.stats = open(run.stats_file, "a") if cfg.log.stats_every else None  # noqa: SIM115
        self.write_failed = False  # warned once about a failing metrics.jsonl
        self.wandb = self._start_wandb(run, cfg) if cfg.log.wandb else None

    def _start_wandb(self, run: RunDir, cfg: Config):
        timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", WANDB_INIT_TIMEOUT))
        try:
            import wandb

            # WANDB_MODE, passed on explicitly: wandb's process-wide settings may have been read before it was set
            mode = os.environ.get("WANDB_MODE") or None
            if mode is None and not _has_wandb_credentials():
                mode = "offline"
                print(
                    "wandb: no credentials (WANDB_API_KEY or `wandb login`); logging offline "
                    f"under {os.environ.get('WANDB_DIR', run.path)}; `wandb sync` uploads it later",
                    file=sys.stderr,
                )
            id_file = run.wandb_id_file  # a resumed run continues the same wandb run
            run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
            write_atomically(id_file, run_id + "\n")
            tags = [cfg.model.norm_type, f"seed-{cfg.train.seed}", *cfg.log.tags]
            bounds = {k: timeout for k in ("init_timeout", "finish_timeout") if k in _settings_fields(wandb)}
            return within(
                timeout,
                lambda: wandb.init(
                    project=cfg.log.wandb_project,
                    entity=cfg.log.wandb_entity,
                    name=cfg.run.name,
                    id=run_id,
                    resume="allow",
                    tags=tags,
                    config=config_to_dict(cfg),
                    mode=mode,
                    dir=os.environ.get("WANDB_DIR", str(run.path)),
                    settings=wandb.Settings(**bounds),
                ),
                "wandb start",
            )
        except Exception as e:  # never let logging stop training
            print(
                f"wandb: disabled, training goes on without it ({type(e).__name__}: {first_line(e)}; it waits "
                f"{timeout:g} s at most for the server (WANDB_INIT_TIMEOUT); WANDB_MODE=offline logs without one)",
                file=sys.stderr,
            )
            return None

    def log(self, record: dict) -> None:
        self._write(self.file, record)
        self._send({k: v for k, v in record.items() if k != "step" and v is not None}, record["step"])

    def log_stats(self, record: dict) -> None:
        """A stats record: a line of stats.jsonl, and to wandb as ``stats/<key>`` (``stats/<key>/<block>``)."""
        self._write(self.stats, record)
        flat = {}
        for key, value in record.items():
            if key in ("step", "tokens") or value is None:
                continue
            for i, v in enumerate(value) if isinstance(value, list) else [(None, value)]:
                flat[f"stats/{key}" if i is None else f"stats/{key}/{i}"] = v
        self._send(flat, record["step"])

    def _write(self, file, record: dict) -> None:
        try:
            file.write(json.dumps({k: _clean_all(v) for k, v in record.items()}) + "\n")
            file.flush()
        except OSError as e:  # a full disk: training goes on; the next checkpoint says whether it can
            if not self.write_failed:
                print(
                    f"warning: cannot write {file.name}: {os_reason(e)}; records from step {record['step']} "
                    "on are missing until it can",
                    file=sys.stderr,
                )
            self.write_failed = True

    def _send(self, values: dict, step: int) -> None:
        if self.wandb is not None:
            try:
                self.wandb.log(values, step=step)
            except Exception as e:
                print(f"wandb: disabled after an error ({type(e).__name__}: {e})", file=sys.stderr)
                self.wandb = None

    def close(self, summary: dict | None = None) -> None:
        with contextlib.suppress(OSError):  # its last buffered line hit the same full disk; already warned
            self.file.close()
            if self.stats is not None:
                self.stats.close()
        if self.wandb is not None:
            run, timeout = self.wandb, float(os.environ.get("WANDB_INIT_TIMEOUT", WANDB_INIT_TIMEOUT))

            def finish():
                if summary:
                    run.summary.update({k: v for k, v in summary.items() if not isinstance(v, dict)})
                run.finish(exit_code=0 if not summary or summary.get("status") == "completed" else 1)

            try:
                within(timeout, finish, "wandb finish")
            except Exception as e:
                print(
                    f"wandb: could not finish the run ({type(e).__name__}: {first_line(e)}); `wandb sync` "
                    "uploads what was logged",
                    file=sys.stderr,
                )
            self.wandb = None
