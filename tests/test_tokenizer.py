"""The offline GPT-2 tokenizer equals tiktoken's own."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from gpt.common.errors import UserError
from gpt.data import tokenizer
from gpt.data.tokenizer import EOT_TOKEN, get_tokenizer, gpt2_encoding, gpt2_files_dir

TEXTS = [
    "Hello world",
    "  leading spaces\n\nand\ttabs",
    "naïve café — 日本語 🎭",
    "I'll've we're 123456",
    "O Romeo, Romeo! wherefore art thou Romeo?\n",
    "<|endoftext|> as plain text",
]


def test_known_ids():
    enc = gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN] == [50256]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257 and enc.name == "gpt2"
    assert get_tokenizer("gpt2") is enc
    for text in TEXTS:
        assert enc.decode(enc.encode_ordinary(text)) == text
    # encode_ordinary treats the separator as text: a document cannot inject one
    assert EOT_TOKEN not in enc.encode_ordinary("<|endoftext|>")


def test_matches_tiktoken_get_encoding(tmp_path):
    # Give tiktoken its own two files under the cache names it looks up, so its own
    # get_encoding("gpt2") runs offline; both encodings must agree on every text.
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(gpt2_files_dir() / name, cache / hashlib.sha1((base + name).encode()).hexdigest())
    code = (
        "import json, sys, tiktoken\n"
        "enc = tiktoken.get_encoding('gpt2')\n"
        "texts = json.loads(sys.stdin.read())\n"
        "print(json.dumps([enc.encode(t, allowed_special='all') for t in texts] + [enc.n_vocab]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(TEXTS),
        capture_output=True,
        text=True,
        env={"TIKTOKEN_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    *theirs, n_vocab = json.loads(out.stdout)
    enc = gpt2_encoding()
    assert n_vocab == enc.n_vocab
    assert theirs == [enc.encode(t, allowed_special="all") for t in TEXTS]
    assert theirs[0] == [15496, 995]


def test_corrupted_files_are_refused(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(gpt2_files_dir() / "encoder.json", data / "encoder.json")
    (data / "vocab.bpe").write_text("#version: 0.2\nh e\n")
    monkeypatch.setattr(tokenizer, "gpt2_files_dir", lambda: data)
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(UserError, match=r"vocab.bpe: sha256 [0-9a-f]{64} is not tiktoken's GPT-2 file"):
            gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()


def test_unknown_tokenizer_name():
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt5'; use gpt2 or a tiktoken encoding"):
        get_tokenizer("gpt5")
