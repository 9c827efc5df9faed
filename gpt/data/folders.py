"""A data set's folder: the one named by data.path, or a snapshot of the Hub data set data.hub_repo; its
splits opened (``<split>.bin`` with ``meta.json``, or ``<split>.safetensors``) and checked against what
``meta.json`` records of them, and its tokenizer checked against the model's vocabulary."""

from __future__ import annotations

from pathlib import Path

from gpt.common.errors import first_line
from gpt.data.tokens import META_FILE, DataError, TokenFile, read_meta


def check_vocabulary(data_dir: Path, vocab_size: int) -> None:
    """Refuse a prepared set whose tokenizer has more tokens than the model's vocabulary."""
    meta = read_meta(data_dir) or {}
    n_vocab = meta.get("tokenizer", {}).get("n_vocab")
    if isinstance(n_vocab, int) and n_vocab > vocab_size:
        raise DataError(
            f"{data_dir}: its tokenizer ({meta['tokenizer'].get('name', '?')}) has {n_vocab:,} tokens, "
            f"more than model.vocab_size {vocab_size:,}; use a model with vocab_size >= {n_vocab:,}"
        )


def open_split(data_dir: str | Path, split: str) -> TokenFile:
    """The token file of ``split`` in ``data_dir``: ``<split>.bin`` or ``<split>.safetensors``, checked
    against what the set's ``meta.json`` records of it, if anything (``TokenFile.check_recorded``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data directory (prepare one with scripts/prepare_data.py)")
    if (data_dir / f"{split}.bin").is_file():
        if not (data_dir / META_FILE).is_file():  # written last: a set without it was never finished
            raise DataError(
                f"{data_dir}: no {META_FILE}, so not a complete prepared set (an interrupted "
                "preparation leaves such a folder); prepare it again with scripts/prepare_data.py"
            )
        path = data_dir / f"{split}.bin"
    elif (data_dir / f"{split}.safetensors").is_file():
        path = data_dir / f"{split}.safetensors"
    else:
        found = sorted(p.stem for p in data_dir.iterdir() if p.suffix in (".bin", ".safetensors"))
        raise DataError(
            f"{data_dir}: no split {split!r} ({split}.bin or {split}.safetensors); "
            f"splits here: {', '.join(found) or 'none'}"
        )
    recorded = ((read_meta(data_dir) or {}).get("splits") or {}).get(split)
    tokens = TokenFile(path, recorded if recorded and recorded.get("file") == path.name else None)
    tokens.check_recorded()
    return tokens


def resolve_data_dir(
    path: str | None, hub_repo: str | None, revision: str | None = None, cache_dir: str | None = None
) -> Path:
    """The local folder of a data set: ``path`` itself, or a snapshot of Hub repo ``hub_repo``."""
    if path is not None:
        return Path(path)
    if hub_repo is None:
        raise DataError("no data set: set data.path (a prepared folder) or data.hub_repo (a Hub data set)")
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                hub_repo,
                repo_type="dataset",
                revision=revision,
                cache_dir=cache_dir,
                allow_patterns=["*.bin", "*.safetensors", META_FILE],
            )
        )
    except Exception as e:  # offline, unknown repo, no access: the library's first line
        raise DataError(f"data.hub_repo {hub_repo}: cannot fetch: {first_line(e)}") from None
