"""evaluate.py and gpt.evaluation.held_out: exactness, determinism, world sizes, disjoint ranges, bad input."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

from gpt.common.errors import UserError
from gpt.config import load_config
from gpt.data.tokens import TokenFile, TokenRange
from gpt.evaluation.held_out import EvalOptions, RangeOverride, evaluate_checkpoint
from gpt.evaluation.token_loss import evaluate_loss
from gpt.model.gpt import GPT
from gpt.run.directory import find_checkpoint, read_eval_result, resolve_which
from gpt.run.distributed import Dist
from gpt.training.loop import train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
QUIET = EvalOptions(show_progress=False)


def run_eval(*args, launcher=None):
    cmd = [*(launcher or [sys.executable]), str(ROOT / "evaluate.py"), *map(str, args), "--quiet"]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, token_set):
    """One finished tiny run (module-wide: several tests evaluate it)."""
    from conftest import VOCAB

    folder = tmp_path_factory.mktemp("evalrun")
    path = folder / "cfg.yaml"
    path.write_text(f"""
run: {{name: evalrun, dir: {folder / "run"}, device: cpu}}
model: {{vocab_size: {VOCAB}, context_length: 32, d_model: 32, n_layers: 2, n_heads: 2}}
data: {{path: {token_set}, val_tokens: 2048, test_tokens: 5000}}
train: {{steps: 8, micro_batch_size: 4, global_batch_size: 8, eval_every: 8, checkpoint_every: 8}}
log: {{progress: false}}
""")
    train(load_config(path))
    return folder / "run"


def test_loss_matches_a_hand_computation(tiny_model_cfg, tmp_path):
    cfg = tiny_model_cfg(context_length=8)
    model = GPT(cfg, seed=3).eval()
    tokens = (np.arange(1000) * 31 % 97).astype(np.uint16)
    (tmp_path / "t.bin").write_bytes(tokens.tobytes())
    f = TokenFile(tmp_path / "t.bin")
    offset, n_tokens, T = 17, 203, 8  # 25 sequences of 9 tokens; batches of 4 leave a partial one
    loss, scored = evaluate_loss(model, TokenRange(f, offset, n_tokens), Dist(), seq_len=T, batch_size=4)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range((n_tokens - 1) // T):
            seq = torch.tensor(tokens[offset + i * T : offset + i * T + T + 1].astype(np.int64))
            logits = model(seq[None, :-1])[0][0].double()
            for pos in range(T):  # -log softmax of the true next token, one by one
                total += (torch.logsumexp(logits[pos], 0) - logits[pos, seq[pos + 1]]).item()
                count += 1
    assert scored == count == 25 * 8
    assert abs(loss - total / count) <= 1e-6


@pytest.mark.slow  # two torchrun processes
def test_repeat_and_world_sizes_agree_exactly(trained, tmp_path, cli):
    ddp = run_eval(
        trained,
        "--json",
        tmp_path / "c.json",
        launcher=[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the subprocesses (OMP_NUM_THREADS=1)
    try:
        first = cli(ROOT / "evaluate.py", trained, "--json", tmp_path / "a.json", "--quiet")
        b = evaluate_checkpoint(find_checkpoint(trained), Dist(), QUIET, write=False)  # again
    finally:
        torch.set_num_threads(threads)
    for out in (first, ddp):
        assert out.returncode == 0, out.stderr[-2000:]
    a, c = (json.loads((tmp_path / f"{x}.json").read_text())[0] for x in "ac")
    assert a["loss"] == b["loss"] == c["loss"]  # bit-identical, not just close
    assert c["world_size"] == 2 and a["world_size"] == 1
    assert a["targets_scored"] == (5000 - 1) // 32 * 32 and a["split"] == "test" and a["precision"] == "fp32"
    assert a["perplexity"] == pytest.approx(math.exp(a["loss"]))
    assert f"{a['loss']:.6f}" in first.stdout and "evalrun" in first.stdout
    assert "tokens scored" in first.stdout and f" {a['targets_scored']:,} " in first.stdout  # the count kept
    written = json.loads((find_checkpoint(trained) / "eval-test-fp32.json").read_text())
    assert written["loss"] == a["loss"] and written["step"] == 8 and written["range"] == [0, 5000]


def test_range_is_disjoint_from_what_training_read(trained):
    summary = json.loads((trained / "summary.json").read_text())
    result = (
        json.loads((find_checkpoint(trained) / "eval-test-fp32.json").read_text())
        if (find_checkpoint(trained) / "eval-test-fp32.json").is_file()
        else evaluate_checkpoint(find_checkpoint(trained), Dist(), QUIET)
    )
    start, end = result["range"]
    for split, lo, hi in (summary["train_token_range"], summary["val_token_range"]):
        assert split != result["split"] or end <= lo or hi <= start
    with pytest.raises(UserError, match=r"test range train \[0, 5,000\) overlaps the tokens run read for train"):
        evaluate_checkpoint(find_checkpoint(trained), Dist(), QUIET, RangeOverride(split="train"))
    with pytest.raises(UserError, match=r"overlaps the tokens run read for val: val \[0, 2,048\)"):
        evaluate_checkpoint(find_checkpoint(trained), Dist(), QUIET, RangeOverride(split="val", offset=1000))
    ok = evaluate_checkpoint(
        find_checkpoint(trained), Dist(), QUIET, RangeOverride(split="val", offset=2048, n_tokens=2000), write=False
    )
    assert ok["range"] == [2048, 4048]


def test_bad_paths(trained, tmp_path, cli):
    out = cli(ROOT / "evaluate.py", tmp_path, "--quiet")
    assert out.returncode == 2 and out.stderr.startswith(f"error: {tmp_path}: not a run directory or checkpoint")
    broken = tmp_path / "broken"
    (broken / "checkpoints").mkdir(parents=True)
    ckpt = find_checkpoint(trained)
    target = broken / "checkpoints" / ckpt.name
    target.mkdir()
    (target / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    out = cli(ROOT / "evaluate.py", target, "--quiet")
    assert out.returncode == 2
    assert out.stderr == f"error: {target}: no config.yaml; cannot tell what model it holds\n"
    original = (trained / "summary.json").read_text()
    (trained / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    try:
        with pytest.raises(UserError, match=r"the run has no final checkpoint \(status: interrupted\); use --which"):
            resolve_which(trained, "final")
        assert resolve_which(trained, "latest") == ckpt
    finally:
        (trained / "summary.json").write_text(original)


def test_hf_gpt2_is_scored_on_the_same_tokens(tmp_path, token_set):
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpt.evaluation.held_out import evaluate_hf

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    hf.save_pretrained(tmp_path / "hf-tiny")
    result = evaluate_hf(
        str(tmp_path / "hf-tiny"),
        Dist(),
        None,
        EvalOptions("fp32", 4, show_progress=False),
        RangeOverride(data=str(token_set), split="test", n_tokens=1000),
    )
    assert result["run"] == f"hf:{tmp_path / 'hf-tiny'}" and result["targets_scored"] == (1000 - 1) // 32 * 32
    tokens = np.fromfile(token_set / "test.bin", dtype=np.uint16)[:1000].astype(np.int64)
    n_seq = (1000 - 1) // 32
    seqs = torch.tensor(np.stack([tokens[i * 32 : i * 32 + 33] for i in range(n_seq)]))
    with torch.no_grad():  # transformers' own forward pass
        logits = hf(seqs[:, :-1]).logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), seqs[:, 1:].flatten()).item()
    assert abs(result["loss"] - expected) <= 1e-5
    with pytest.raises(UserError, match="--hf needs the tokens to score"):
        evaluate_hf("gpt2", Dist(), None, EvalOptions("fp32", 4))


def test_a_result_written_before_the_count_was_named_reads_as_tokens_scored(tmp_path):
    # results kept the count of tokens scored as "tokens" before it was named for what it counts
    (tmp_path / "eval-test-fp32.json").write_text(json.dumps({"loss": 3.5, "tokens": 32_704, "n_tokens": 32_768}))
    result = read_eval_result(tmp_path, "test", "fp32")
    assert result == {"loss": 3.5, "targets_scored": 32_704, "n_tokens": 32_768}


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def test_evaluation_sets_its_own_matmul_precision_and_records_it(token_set, tmp_path):
    # a fresh evaluate.py process is the reference: what this one has set (TF32, bf16 matmuls) it must not inherit
    from gpt.run.fastpath import apply_tf32, fp32_precision, set_fp32_precision

    trained = _tiny_run(tmp_path, token_set, "wide", "pytorch_layernorm", width=256)  # oneDNN's bf16 path: K >= 256
    fresh = run_eval(trained, "--json", tmp_path / "fresh.json")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    a = json.loads((tmp_path / "fresh.json").read_text())[0]
    fp = a["fingerprint"]
    assert fp["tf32"] is False and set(fp["fp32_matmul"].values()) == {"ieee"} and fp["batch_size"] == 4
    assert fp["hardware"]["world_size"] == 1 and "dirty" in fp["code"] and fp["code"]["source"]
    before = fp32_precision()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the subprocess (OMP_NUM_THREADS=1)
    try:
        # what a process may hold when it evaluates after training: a CUDA trainer's TF32, a CPU's bf16 matmuls
        apply_tf32(True)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        ckpt = find_checkpoint(trained)
        after_training = evaluate_checkpoint(ckpt, Dist(), QUIET, write=False)
        leaked = after_training["fingerprint"]
        assert fp32_precision()["mkldnn.matmul"] == "bf16" and fp32_precision()["cuda.matmul"] == "tf32"  # restored
        if _cpu_has_bf16():  # on this CPU the setting changes the bits: the evaluator must not inherit it
            cfg = load_config(trained / "config.yaml")
            model = GPT(cfg.model)
            from gpt.run.checkpoints import load_weights

            load_weights(model, ckpt)
            span = TokenRange(TokenFile(Path(a["data_dir"]) / "test.bin"), 0, 3000)
            inherited, _ = evaluate_loss(model, span, Dist(), seq_len=32, batch_size=4)
            assert inherited != a["loss"]
    finally:
        torch.set_num_threads(threads)
        set_fp32_precision(before)
    assert after_training["loss"] == a["loss"]  # the same bits as a fresh evaluate.py
    assert leaked["tf32"] is False and set(leaked["fp32_matmul"].values()) == {"ieee"}


def _tiny_run(folder, token_set, name, norm_type, width=32):
    from conftest import VOCAB

    path = folder / f"{name}.yaml"
    path.write_text(f"""
run: {{name: {name}, dir: {folder / name}, device: cpu}}
model: {{vocab_size: {VOCAB}, context_length: 32, d_model: {width}, n_layers: 1, n_heads: 2, norm_type: {norm_type}}}
data: {{path: {token_set}, val_tokens: 2048, test_tokens: 3000}}
train: {{steps: 4, micro_batch_size: 4, global_batch_size: 8, eval_every: 4, checkpoint_every: 4}}
log: {{progress: false}}
""")
    train(load_config(path))
    return folder / name


def test_results_of_a_patched_evaluator_are_refused_and_named(token_set, tmp_path, cli):
    # finding 3: a second checkout whose evaluator differs by one uncommitted edit (loss x 1.002)
    import shutil

    from gpt.analysis.table import compare
    from gpt.run.fingerprint import SOURCE

    a = _tiny_run(tmp_path, token_set, "hr", "handrolled_layernorm")
    b = _tiny_run(tmp_path, token_set, "pt", "pytorch_layernorm")
    patched = tmp_path / "other-checkout"
    shutil.copytree(SOURCE, patched / "gpt", ignore=shutil.ignore_patterns("__pycache__"))
    token_loss = patched / "gpt" / "evaluation" / "token_loss.py"
    text = token_loss.read_text()
    assert "return (float(total.sum()) / scored" in text
    token_loss.write_text(
        text.replace("return (float(total.sum()) / scored", "return (1.002 * float(total.sum()) / scored")
    )
    assert cli(ROOT / "evaluate.py", a, "--quiet").returncode == 0
    other = subprocess.run(  # the other checkout's code: a process of its own
        [sys.executable, "-m", "gpt.commands.evaluate", str(b), "--quiet"],
        capture_output=True,
        text=True,
        env={**ENV, "PYTHONPATH": str(patched)},
        cwd=tmp_path,
        timeout=300,
    )
    assert other.returncode == 0, other.stderr[-2000:]
    ours, theirs = (json.loads((find_checkpoint(r) / "eval-test-fp32.json").read_text()) for r in (a, b))
    assert ours["fingerprint"]["code"]["source"] != theirs["fingerprint"]["code"]["source"]
    unpatched = evaluate_checkpoint(find_checkpoint(b), Dist(), QUIET, write=False)["loss"]
    assert theirs["loss"] == pytest.approx(1.002 * unpatched, rel=1e-9)  # the patched code is what ran
    source = (ours["fingerprint"]["code"]["source"][:12], theirs["fingerprint"]["code"]["source"][:12])
    with pytest.raises(
        UserError,
        match=rf"evaluation\.code\.source: {source[0]}\.\.\. \(hr\); {source[1]}\.\.\. \(pt\); compare runs",
    ) as refused:
        compare([a, b], tmp_path / "cmp", plots=False)
    assert "code.commit" not in str(refused.value)  # a commit names the code; its source hash is what counts
    assert not (tmp_path / "cmp").exists()
    accepted = compare([a, b], tmp_path / "cmp", allow_differ=["evaluation.code.source"], plots=False)
    assert list(accepted["allowed_to_differ"]) == ["evaluation.code.source"]
    assert (
        "- **allowed to differ** (--allow-differ): evaluation.code.source: "
        in (tmp_path / "cmp" / "comparison.md").read_text()
    )


def test_bits_per_byte_counts_the_bytes_of_the_scored_targets_text(tmp_path):
    """The bytes are those of the targets' decoded text (the first token of the range is never a target; the
    end-of-document separator is no text), and bits per byte is loss * tokens / (bytes * ln 2)."""
    from gpt.data.folders import open_split
    from gpt.data.tokenizer import EOT_TOKEN, bits_per_byte, gpt2_encoding
    from gpt.evaluation.held_out import bytes_scored

    enc = gpt2_encoding()
    docs = ["Ünïcödé façade — naïve café", "plain ascii text, twice over", "日本語のテキスト 🙂 emoji"] * 40
    ids = [t for d in docs for t in [*enc.encode_ordinary(d), EOT_TOKEN]]
    folder = tmp_path / "set"
    folder.mkdir()
    np.array(ids, np.uint16).tofile(folder / "test.bin")
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint16", "tokenizer": {"name": "gpt2"}}))
    span, seq_len = TokenRange(open_split(folder, "test"), 7, 700), 16
    scored = span.n_sequences(seq_len) * seq_len
    targets = ids[7 + 1 : 7 + 1 + scored]
    text = enc.decode_bytes([t for t in targets if t != EOT_TOKEN])
    assert EOT_TOKEN in targets and len(text) > scored  # multi-byte characters: more bytes than tokens
    assert bytes_scored(span, scored, "gpt2") == len(text)
    assert bits_per_byte(2.5, scored, len(text)) == pytest.approx(2.5 * scored / (len(text) * math.log(2)), rel=1e-12)
    assert bytes_scored(span, scored, "unknown") is None and bits_per_byte(2.5, scored, None) is None
