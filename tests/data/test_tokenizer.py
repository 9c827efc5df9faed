"""The offline GPT-2 tokenizer equals tiktoken's own; the bytes tokenizer prepares, trains and generates."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from gpt.common.errors import UserError
from gpt.data import tokenizer
from gpt.data.tokenizer import BYTES_EOT_TOKEN, EOT_TOKEN, get_tokenizer, gpt2_encoding, gpt2_files_dir

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
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt5'; use gpt2, bytes or a tiktoken encoding"):
        get_tokenizer("gpt5")


def test_bytes_encoding_is_utf8_with_a_separator():
    enc = get_tokenizer("bytes")
    assert enc.name == "bytes" and enc.n_vocab == 257 and enc.eot_token == BYTES_EOT_TOKEN == 256
    assert get_tokenizer("bytes") is enc
    for text in TEXTS:
        assert enc.encode_ordinary(text) == list(text.encode("utf-8"))
        assert enc.decode(enc.encode_ordinary(text)) == text
    assert enc.encode("<|endoftext|>", allowed_special="all") == [256]
    assert BYTES_EOT_TOKEN not in enc.encode_ordinary("<|endoftext|>")  # in a document it is text
    assert enc.decode([256, 104, 105]) == "<|endoftext|>hi"
    assert enc.decode([104, 0xC3]) == "h\ufffd"  # a character cut in the middle (generation stopped there)


def test_a_bytes_model_trains_and_generates(tmp_path, capsys):
    from synthetic import write_train_yaml

    from gpt.commands import generate, prepare_data, train

    corpus = tmp_path / "plays"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"{i}.txt").write_text(f"Scene {i}. " + "The king doth wake tonight and takes his rouse. " * 20)
    assert (
        prepare_data.main(
            [
                str(corpus),
                "--out",
                str(tmp_path / "bytes"),
                "--tokenizer",
                "bytes",
                "--val-tokens",
                "2048",
                "--test-tokens",
                "2048",
                "--quiet",
            ]
        )
        == 0
    )
    cfg = write_train_yaml(tmp_path, tmp_path / "bytes")
    cfg.write_text(cfg.read_text().replace("vocab_size: 256", "vocab_size: 257"))
    assert train.main([str(cfg)]) == 0
    capsys.readouterr()
    argv = [str(tmp_path / "run"), "--prompt", "The king", "--max-new-tokens", "12", "--temperature", "0"]
    assert generate.main([*argv, "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    # the prompt as bytes (GPT-2's ids 464 and 5822 would be refused: beyond a vocabulary of 257), then 12 more
    assert text.startswith("The king") and len(text.rstrip("\n").encode("utf-8", "replace")) >= len("The king") + 4
    # publishing it is refused in one line, before any file is written: the export ships GPT-2's tokenizer
    from gpt.common.errors import UserError
    from gpt.publish.export import export_checkpoint
    from gpt.run.directory import find_checkpoint

    out = tmp_path / "export"
    with pytest.raises(UserError, match=r"trained on 'bytes' tokens, and a published model carries GPT-2's") as e:
        export_checkpoint(find_checkpoint(tmp_path / "run", "latest"), out, "me/bytes")
    assert "\n" not in str(e.value) and not out.exists()
