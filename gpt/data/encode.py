"""Documents -> a prepared token set: train / val / test files split by document.

Each document is tokenised (tiktoken's batch encoder, several threads) and written as
``<|endoftext|>`` followed by its tokens, as uint16, to exactly one split. Documents
arrive in a seeded shuffled order; the held-out splits fill first (test, then val,
each until it holds at least the requested tokens), and everything after goes to
train, up to ``max_tokens`` in all. So the held-out sets do not change when you ask
for more training tokens, and no document is in two splits.

Everything is written into a temporary folder beside the output and renamed into
place at the end (``gpt.common.files.replacing_folder``): a failed or interrupted run
leaves no half-written data set, and an existing one is only replaced with ``overwrite``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import tiktoken
from tqdm import tqdm

from gpt.common.files import WriteError, remove_abandoned, replacing_folder
from gpt.data.sources import Source
from gpt.data.tokens import META_FILE, TOKEN_DTYPE, DataError, sample_digest

SPLIT_ORDER = ("test", "val", "train")


def _batched(items: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_tokenizer(enc: tiktoken.Encoding) -> int:
    """The tokenizer's <|endoftext|> id, after checking its ids fit the token files' uint16."""
    limit = int(np.iinfo(TOKEN_DTYPE).max) + 1
    if enc.n_vocab > limit:
        raise DataError(
            f"tokenizer {enc.name} has {enc.n_vocab:,} tokens; token files store uint16, "
            f"which holds at most {limit:,} (GPT-2's 50,257 fit)"
        )
    try:
        return enc.eot_token
    except KeyError:
        raise DataError(f"tokenizer {enc.name} has no <|endoftext|> token to separate documents") from None


def prepare(
    source: Source,
    out: str | Path,
    enc: tiktoken.Encoding,
    *,
    val_tokens: int,
    test_tokens: int,
    max_tokens: int | None = None,
    overwrite: bool = False,
    batch_docs: int = 256,
    threads: int | None = None,
    progress: bool = True,
) -> dict:
    """Tokenise ``source`` into ``out`` (train.bin, val.bin, test.bin, meta.json); returns the meta."""
    out = Path(out)
    eot = check_tokenizer(enc)
    if min(val_tokens, test_tokens) < 0 or (max_tokens is not None and max_tokens <= 0):
        raise DataError("--val-tokens and --test-tokens must be >= 0, --max-tokens > 0")
    remove_abandoned(out)  # a set a killed preparation moved aside comes back first: --overwrite guards it too
    if out.exists() and not overwrite:
        raise DataError(f"{out}: already exists; pass --overwrite to replace it")
    try:  # a temporary folder beside it, renamed into place whole (an old set is moved aside first)
        with replacing_folder(out) as tmp:
            meta = _write_splits(
                source,
                tmp,
                enc,
                eot,
                val_tokens,
                test_tokens,
                max_tokens,
                batch_docs,
                threads or os.cpu_count() or 1,
                progress,
            )
            # no timestamps in it: the same input gives byte-identical files
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    except WriteError as e:
        kept = "the set that was there is unchanged" if out.exists() else "nothing was kept"
        raise DataError(
            f"cannot write the token set {out}: {e.reason}; {kept}: free space (or lift the file-size "
            "limit), or write it elsewhere with --out"
        ) from None
    return meta


def _fill(source: Source, files: dict, enc, eot: int, targets: dict, max_tokens, batch_docs: int, threads: int, bar):
    """Encode ``source``'s documents, in its order, into the split files: test, then val, each until it holds its
    target of tokens (whole documents), the rest to train, until ``max_tokens`` (None: every document). Each
    split's tokens and documents, and how many empty documents were skipped."""
    tokens = dict.fromkeys(SPLIT_ORDER, 0)
    documents = dict.fromkeys(SPLIT_ORDER, 0)
    skipped = 0
    current = 0  # index into SPLIT_ORDER
    for batch in _batched(source.documents, batch_docs):
        texts = [t for t in batch if isinstance(t, str) and t.strip()]
        skipped += len(batch) - len(texts)
        # encode_ordinary: a literal "<|endoftext|>" in a text is text, not a separator
        for ids in enc.encode_ordinary_batch(texts, num_threads=threads):
            while current < 2 and tokens[SPLIT_ORDER[current]] >= targets[SPLIT_ORDER[current]]:
                current += 1
            split = SPLIT_ORDER[current]
            row = np.empty(len(ids) + 1, dtype=TOKEN_DTYPE)
            row[0] = eot
            row[1:] = ids
            files[split].write(row.tobytes())
            tokens[split] += len(row)
            documents[split] += 1
            bar.update(len(row))
            if max_tokens is not None and sum(tokens.values()) >= max_tokens:
                return tokens, documents, skipped
    return tokens, documents, skipped


def _write_splits(
    source: Source,
    folder: Path,
    enc: tiktoken.Encoding,
    eot: int,
    val_tokens: int,
    test_tokens: int,
    max_tokens: int | None,
    batch_docs: int,
    threads: int,
    progress: bool,
) -> dict:
    targets = {"test": test_tokens, "val": val_tokens}
    with contextlib.ExitStack() as open_files:
        files = {s: open_files.enter_context(open(folder / f"{s}.bin", "wb")) for s in SPLIT_ORDER}
        desc = f"tokenising {source.describe['name']}"
        bar = open_files.enter_context(
            tqdm(total=max_tokens, unit="tok", unit_scale=True, desc=desc, disable=not progress, file=sys.stderr)
        )
        tokens, documents, skipped = _fill(source, files, enc, eot, targets, max_tokens, batch_docs, threads, bar)
    total = sum(tokens.values())
    name = source.describe["name"]
    if total == 0:
        raise DataError(f"{name}: no text (every document is empty)")
    if tokens["test"] < test_tokens or tokens["val"] < val_tokens or tokens["train"] == 0:
        limit = f" (stopped at --max-tokens {max_tokens:,})" if max_tokens is not None else ""
        raise DataError(
            f"{name}: {total:,} tokens in {sum(documents.values()):,} documents{limit} are too few "
            f"for --test-tokens {test_tokens:,} + --val-tokens {val_tokens:,} + a non-empty train "
            f"split, whole documents each; ask for smaller held-out splits"
        )
    return {
        "format": "gpt-norm-harness token set, version 1",
        "dtype": np.dtype(TOKEN_DTYPE).name,
        "byteorder": sys.byteorder,
        "tokenizer": {"name": enc.name, "n_vocab": enc.n_vocab, "eot_token": eot},
        "source": source.describe,
        "layout": "each document is <|endoftext|> then its tokens; documents shuffled by seed; "
        "test, then val, filled first with whole documents, the rest to train",
        "requested": {"test_tokens": test_tokens, "val_tokens": val_tokens, "max_tokens": max_tokens},
        "skipped_empty_documents": skipped,
        "splits": {
            s: {
                "file": f"{s}.bin",
                "tokens": tokens[s],
                "documents": documents[s],
                "sha256": sha256_file(folder / f"{s}.bin"),
                "sampled_sha256": sample_digest(folder / f"{s}.bin"),
            }
            for s in ("train", "val", "test")
        },
    }
