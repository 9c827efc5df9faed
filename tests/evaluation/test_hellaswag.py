"""HellaSwag, our own scorer: its three answers against a hand computation from the model's log-probabilities,
context truncation, one process against two, and the offline error."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, require

from gpt.common.errors import UserError
from gpt.config import ModelConfig
from gpt.data.tokenizer import get_tokenizer
from gpt.evaluation.hellaswag import encode_item, fetch_validation, load_items, read_items, score_items, summarise
from gpt.model.gpt import GPT
from gpt.run.checkpoints import checkpoint_config, load_weights
from gpt.run.distributed import setup

WORDS = [
    "the",
    "a",
    "man",
    "woman",
    "dog",
    "ball",
    "runs",
    "throws",
    "catches",
    "quickly",
    "slowly",
    "into",
    "over",
    "park",
    "river",
    "house",
    "red",
    "blue",
]


def write_sample(path, n=20, seed=0, ctx_words=(6, 14)):
    """n HellaSwag-format items of random words: ctx, 4 endings of different lengths, a label."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            ctx = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*ctx_words))).capitalize() + "."
            endings = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + "." for _ in range(4)]
            item = {"ind": 100 + i, "ctx": ctx, "endings": endings, "label": rng.randrange(4), "activity_label": "x"}
            f.write(json.dumps(item) + "\n")
    return path


def model(context_length=64, seed=1):
    cfg = ModelConfig(vocab_size=50257, context_length=context_length, d_model=32, n_layers=2, n_heads=2)
    return GPT(cfg, seed=seed).eval()


def by_hand(m, item, context_length):
    """Each ending's summed log-probability and token count, one sequence at a time, no batching."""
    enc = get_tokenizer().encode_ordinary
    sums, counts = [], []
    for ending in item.endings:
        ctx, tail = enc(item.ctx), enc(" " + ending)
        seq = (ctx + tail)[-(context_length + 1) :]  # the model reads at most context_length of them
        n = min(len(tail), len(seq) - 1)
        with torch.no_grad():
            logp = F.log_softmax(m(torch.tensor([seq[:-1]]))[0][0].double(), dim=-1)
        sums.append(sum(logp[t - 1, seq[t]].item() for t in range(len(seq) - n, len(seq))))
        counts.append(n)
    return sums, counts


@pytest.mark.parametrize("context_length", [64, 12])  # 12: the context is cut from the left, some endings too
def test_three_answers_equal_a_hand_computation(tmp_path, context_length):
    items = read_items(write_sample(tmp_path / "sample.jsonl"))
    m = model(context_length)
    got = score_items(m, items, get_tokenizer().encode_ordinary, setup("cpu"), context_length=context_length, chunk=3)
    expect = {"acc": 0, "acc_norm": 0, "acc_token_mean": 0}
    for item, r in zip(items, got):
        sums, counts = by_hand(m, item, context_length)
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(r["sum_logprob"], sums, strict=True))
        assert r["n_tokens"] == counts and r["ind"] == item.ind and r["label"] == item.label
        answers = {
            "acc": max(range(4), key=lambda k: sums[k]),
            "acc_norm": max(range(4), key=lambda k: sums[k] / len(item.endings[k])),
            "acc_token_mean": min(range(4), key=lambda k: -sums[k] / counts[k]),
        }
        assert {k: r[k] for k in answers} == answers
        for k in expect:
            expect[k] += answers[k] == item.label
    summary = summarise(got)
    assert summary["n_items"] == 20
    assert {k: summary[f"{k}_correct"] for k in expect} == expect
    assert all(math.isclose(summary[k], expect[k] / 20) for k in expect)
    if context_length == 12:  # the truncation really happened
        rows, _ = encode_item(items[0], get_tokenizer().encode_ordinary, 12)
        assert max(map(len, rows)) == 13


TWO_PROCESSES = """
import json, sys
sys.path[:0] = sys.argv[2:]  # this test file's folder and tests/ (its conftest)
from test_hellaswag import model
from gpt.data.tokenizer import get_tokenizer
from gpt.evaluation.hellaswag import read_items, score_items
from gpt.run.distributed import setup
dist = setup("cpu")
got = score_items(model(), read_items(sys.argv[1]), get_tokenizer().encode_ordinary, dist, context_length=64, chunk=3)
if dist.is_main:
    print(json.dumps(got))
dist.close()
"""


@pytest.mark.slow
def test_one_process_and_two_give_the_same_results(tmp_path):
    sample = write_sample(tmp_path / "sample.jsonl", n=19)  # 7 chunks of 3: the ranks get 4 and 3
    one = score_items(
        model(), read_items(sample), get_tokenizer().encode_ordinary, setup("cpu"), context_length=64, chunk=3
    )
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESSES)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    here = [str(Path(__file__).resolve().parent), str(ROOT / "tests")]
    out = subprocess.run([*cmd, str(sample), *here], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == one  # bit for bit


def test_no_file_and_no_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT_NORM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError) as e:
        load_items(fetch=False)
    assert str(e.value) == (
        f"HellaSwag: no hellaswag_val.jsonl in {tmp_path / 'cache' / 'hellaswag'}; download "
        "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl there, "
        "or pass --hellaswag FILE"
    )
    dest = tmp_path / "cache" / "hellaswag" / "hellaswag_val.jsonl"
    with pytest.raises(UserError) as e:  # a network that does not answer: nothing half-written is left
        fetch_validation(dest, url="http://127.0.0.1:9/hellaswag_val.jsonl", timeout=5)
    assert "\n" not in str(e.value) and "fetching http://127.0.0.1:9/hellaswag_val.jsonl failed" in str(e.value)
    assert f"download that file into {dest.parent}" in str(e.value)
    assert list(dest.parent.iterdir()) == []


def test_a_damaged_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ctx": "a", "endings": ["b", "c"], "label": 0}\n{"ctx": "a"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: not a HellaSwag item \('endings'\)"):
        read_items(path)
    path.write_text('{"ctx": "a", "endings": ["b", "c"], "label": 5}\n')
    with pytest.raises(UserError, match="label 5 names no ending"):
        read_items(path)


@pytest.fixture(scope="module")
def gpt2_vocab_run(tmp_path_factory):
    """A 2-step run of a tiny model with GPT-2's vocabulary (HellaSwag is read in GPT-2 BPE), whose test split is
    2,048 tokens: each scored through a 50,257-wide head."""
    from conftest import write_token_set, write_train_yaml

    from gpt.config import load_config
    from gpt.training.loop import train

    root = tmp_path_factory.mktemp("hs")
    tokens = write_token_set(root / "tokens", n_train=20_000)
    cfg = load_config(
        write_train_yaml(root, tokens, "run"), ["model.vocab_size=50257", "train.steps=2", "data.test_tokens=2048"]
    )
    train(cfg)
    return root / "run"


def test_evaluate_task_hellaswag_keeps_its_result_and_test_loss_is_unchanged(gpt2_vocab_run, tmp_path):
    from gpt.commands.evaluate import main
    from gpt.evaluation.held_out import evaluate_checkpoint
    from gpt.evaluation.hellaswag import METRICS
    from gpt.run.directory import find_checkpoint

    sample = write_sample(tmp_path / "sample.jsonl")
    ckpt = find_checkpoint(gpt2_vocab_run, "latest")
    args = ["--which", "latest", "--quiet", "--task", "test_loss", "--task", "hellaswag", "--hellaswag", str(sample)]
    assert main([str(gpt2_vocab_run), *args]) == 0
    kept = json.loads((ckpt / "eval-hellaswag-fp32.json").read_text())
    m = GPT(checkpoint_config(ckpt).model)
    load_weights(m, ckpt)
    direct = summarise(
        score_items(m, read_items(sample), get_tokenizer().encode_ordinary, setup("cpu"), context_length=32)
    )
    assert {k: kept[k] for k in METRICS} == {k: direct[k] for k in METRICS} and kept["n_items"] == 20
    assert len(kept["labels"]) == 20 and set(kept["answers"]) == set(METRICS)
    # the model card says it
    from gpt.publish.export import export_checkpoint

    export_checkpoint(ckpt, tmp_path / "export", "me/x")
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"- HellaSwag (20 items, fp32, `evaluate.py --task hellaswag`): acc {kept['acc']:.4f} " in card
    # the test loss through the task interface is the function's own, to the last digit
    through_task = json.loads((ckpt / "eval-test-fp32.json").read_text())["loss"]
    assert through_task == evaluate_checkpoint(ckpt, setup("cpu"), write=False)["loss"]


def test_a_model_without_the_gpt2_vocabulary_is_refused(train_yaml, tmp_path, capsys):
    from gpt.commands.evaluate import main
    from gpt.config import load_config
    from gpt.training.loop import train

    cfg = load_config(train_yaml("small"), ["train.steps=2"])  # vocabulary 256
    train(cfg)
    sample = write_sample(tmp_path / "sample.jsonl", n=2)
    assert main([str(tmp_path / "small"), "--which", "latest", "--task", "hellaswag", "--hellaswag", str(sample)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "HellaSwag is read in GPT-2 BPE (50,257 tokens), and this model's vocabulary has 256" in err
    )


LOCAL_TASK = """task: hellaswag_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {sample}
validation_split: validation
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{endings}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.slow
def test_lm_eval_through_the_bridge_answers_as_our_scorer_item_for_item(gpt2_vocab_run, tmp_path, capsys):
    """lm-evaluation-harness (a library no one here wrote), run by evaluate.py --lm-eval on a local task over
    the same items, gives our acc and acc_norm item for item, and our log-likelihoods; the contexts are long
    enough that both cut them to the model's 32 tokens."""
    require("lm_eval")
    from gpt.commands.evaluate import main
    from gpt.run.directory import find_checkpoint

    sample = write_sample(tmp_path / "sample.jsonl", ctx_words=(4, 30))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "hellaswag_local.yaml").write_text(LOCAL_TASK.format(sample=sample))
    ckpt = find_checkpoint(gpt2_vocab_run, "latest")
    args = ["--which", "latest", "--lm-eval", "hellaswag_local", "--lm-eval-include", str(tmp_path / "tasks")]
    assert main([str(gpt2_vocab_run), *args]) == 0
    assert "hellaswag_local" in capsys.readouterr().out
    theirs = json.loads((ckpt / "eval-lm-eval-fp32.json").read_text())
    items = sorted(theirs["items"]["hellaswag_local"], key=lambda x: x["doc_id"])
    m = GPT(checkpoint_config(ckpt).model)
    load_weights(m, ckpt)
    ours = score_items(m, read_items(sample), get_tokenizer().encode_ordinary, setup("cpu"), context_length=32)
    assert max(max(n) for n in (r["n_tokens"] for r in ours)) > 0
    assert any(
        len(row) == 33
        for item in read_items(sample)
        for row in encode_item(item, get_tokenizer().encode_ordinary, 32)[0]
    )
    assert len(items) == len(ours) == 20
    for o, t in zip(ours, items, strict=True):
        assert t["target"] == o["label"]
        assert t["acc"] == float(o["acc"] == o["label"]) and t["acc_norm"] == float(o["acc_norm"] == o["label"])
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(o["sum_logprob"], t["loglikelihoods"], strict=True))
    results = theirs["results"]["hellaswag_local"]
    summary = summarise(ours)
    assert math.isclose(results["acc,none"], summary["acc"]) and math.isclose(
        results["acc_norm,none"], summary["acc_norm"]
    )


@pytest.mark.slow  # imports lm-evaluation-harness (about 12 s)
def test_lm_eval_names_a_task_it_does_not_know_in_one_line(gpt2_vocab_run, capsys):
    require("lm_eval")
    from gpt.commands.evaluate import main

    assert main([str(gpt2_vocab_run), "--which", "latest", "--lm-eval", "no_such_task_here"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --lm-eval no_such_task_here: not a task lm-eval knows (")
    assert "--lm-eval-include DIR adds task YAMLs of your own" in err


def test_the_validation_set_is_fetched_once_into_the_cache(tmp_path, monkeypatch):
    """From a server on 127.0.0.1 standing in for its public home: fetched whole into the cache, read from
    there afterwards (no second request)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    served = tmp_path / "served"
    served.mkdir()
    write_sample(served / "hellaswag_val.jsonl", n=5)
    requests = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("GPT_NORM_CACHE", str(tmp_path / "cache"))
        url = f"http://127.0.0.1:{server.server_address[1]}/hellaswag_val.jsonl"
        monkeypatch.setattr("gpt.evaluation.hellaswag.VALIDATION_URL", url)
        first = load_items()
        again = load_items()
    finally:
        server.shutdown()
        server.server_close()
    cached = tmp_path / "cache" / "hellaswag" / "hellaswag_val.jsonl"
    assert cached.read_bytes() == (served / "hellaswag_val.jsonl").read_bytes()
    assert first == again == read_items(served / "hellaswag_val.jsonl") and len(first) == 5
    assert requests == ["/hellaswag_val.jsonl"]  # fetched once
