"""A comparison's runs as a table of numbers: written beside every comparison, read by ``compare --results``.

One row per run, as CSV:

    group,init_seed,data_seed,status,test_loss,hellaswag.acc,hellaswag.acc_norm,hellaswag.acc_token_mean
    handrolled_layernorm,0,0,completed,3.2810,0.2931,0.3012,0.2945

Required columns: ``group`` (any label), ``init_seed`` and ``data_seed`` (integers: the seeds of the
initial weights and of the data order; equal for the usual one-seed run), ``test_loss`` (empty: not
evaluated). Optional: ``status`` (``completed`` when absent; any other value leaves the row out of
the statistics, named), and any number of metric columns named ``TASK.METRIC`` (``hellaswag.acc``;
a bare name is a metric of the task ``metrics``), empty where a run has none. ``compare.py --results
FILE.csv`` gives the same report for numbers produced anywhere (another harness, a paper's table)
that run folders give, with the same design detection, and every comparison of run folders writes
its own ``runs.csv`` in this form, so the two routes can be checked against each other.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from gpt.common.errors import UserError, clipped
from gpt.common.files import replacing

MAX_BYTES = 64 * 2**20  # a results table's size at most (a million runs' rows are ~50 MiB)
MAX_ROWS = 1_000_000  # and its rows
MAX_FIELD = 4096  # characters in one field (a group name, a number)
REQUIRED = ("group", "init_seed", "data_seed", "test_loss")
OPTIONAL = ("status",)
DEFAULT_TASK = "metrics"  # the task of a metric column without a dot


def _number(text: str, where: str, column: str) -> float | None:
    if text.strip() == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UserError(
            f"{where}: {column} is {clipped(repr(text))}, not a finite number; write a number, or leave it empty"
        )
    if column == "test_loss" and value < 0:
        raise UserError(f"{where}: test_loss is {text}, below 0; a cross-entropy is >= 0 (nats per token)")
    return value


def _seed(text: str, where: str, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{where}: {column} is {clipped(repr(text))}, not an integer seed") from None


def read_results(path: Path) -> list[dict]:
    """The rows of a results table: ``{"line", "group", "init_seed", "data_seed", "status", "test_loss",
    "tasks": {task: {metric: value}}}``. A file that is not such a table is one line naming what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UserError(
                f"--results {path}: {size:,} bytes, more than a results table may hold ({MAX_BYTES:,}); compare "
                "a table of the runs themselves (one row each)"
            )
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--results {path}: cannot read it ({type(e).__name__}: {clipped(str(e))})") from None
    try:
        return _rows(path, csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:  # a field past the csv module's limit, a NUL byte
        raise UserError(f"--results {path}: not a CSV table ({clipped(str(e))})") from None


def _rows(path: Path, reader: csv.DictReader) -> list[dict]:
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise UserError(
            f"--results {path}: no column {', '.join(missing)}; a results table has the columns "
            f"{', '.join(REQUIRED)} (and optionally status and TASK.METRIC columns such as hellaswag.acc)"
        )
    if len(set(columns)) != len(columns):
        raise UserError(f"--results {path}: a column is named twice: {', '.join(columns)}")
    metrics = [c for c in columns if c not in REQUIRED + OPTIONAL]
    rows, seen = [], {}
    for line, raw in enumerate(reader, start=2):
        if line - 1 > MAX_ROWS:
            raise UserError(f"--results {path}: more than {MAX_ROWS:,} rows; a results table has one row per run")
        row = {k.strip(): (v or "") for k, v in raw.items() if k is not None}
        if None in raw:
            raise UserError(f"{path}:{line}: more values than columns")
        long = next((k for k, v in row.items() if len(v) > MAX_FIELD), None)
        if long is not None:
            raise UserError(f"{path}:{line}: {clipped(long)} is {len(row[long]):,} characters, over {MAX_FIELD:,}")
        where = f"{path}:{line}"
        group = row["group"].strip()
        if not group:
            raise UserError(f"{where}: the group is empty")
        if not group.isprintable():
            raise UserError(f"{where}: the group {clipped(repr(group))} has a line break or control character")
        cell = (group, _seed(row["init_seed"], where, "init_seed"), _seed(row["data_seed"], where, "data_seed"))
        if cell in seen:
            raise UserError(
                f"{where}: group {group!r} has init_seed {cell[1]} and data_seed {cell[2]} already on line "
                f"{seen[cell]}; one row per run"
            )
        seen[cell] = line
        tasks: dict[str, dict] = {}
        for column in metrics:
            value = _number(row[column], where, column)
            if value is not None:
                task, _, metric = column.rpartition(".")
                tasks.setdefault(task or DEFAULT_TASK, {})[metric] = value
        rows.append(
            {
                "line": line,
                "group": group,
                "init_seed": cell[1],
                "data_seed": cell[2],
                "status": row.get("status", "").strip() or "completed",
                "test_loss": _number(row["test_loss"], where, "test_loss"),
                "tasks": tasks,
            }
        )
    if not rows:
        raise UserError(f"--results {path}: no rows under its header")
    return rows


def write_results(rows: list[dict], path: Path) -> Path:
    """Write ``rows`` (as ``read_results`` returns them, without ``line``) as a results table; numbers in full
    (``repr``), so that reading the table back gives the same floats."""
    metrics = sorted({f"{t}.{m}" for r in rows for t, ms in r["tasks"].items() for m in ms})
    with replacing(path) as tmp, open(tmp, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*REQUIRED[:3], "status", "test_loss", *metrics])
        for r in rows:
            values = {f"{t}.{m}": v for t, ms in r["tasks"].items() for m, v in ms.items()}
            out.writerow(
                [
                    r["group"],
                    r["init_seed"],
                    r["data_seed"],
                    r["status"],
                    "" if r["test_loss"] is None else repr(float(r["test_loss"])),
                    *("" if values.get(c) is None else repr(float(values[c])) for c in metrics),
                ]
            )
    return path
