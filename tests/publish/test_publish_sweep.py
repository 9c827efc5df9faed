"""Publishing a whole sweep (scripts/publish_sweep.py) against the real huggingface_hub client and a Hub on
127.0.0.1 (tests/hubserver.py): model repos, the comparison's dataset repo, the collection; reruns,
a grown sweep, a failing repo, a dry run."""

import json
import shutil

import pytest
import torch
from conftest import FAKE_TOKEN, ROOT, write_token_set, write_train_yaml
from huggingface_hub import DatasetCard
from test_hub import IDS, our_logits, run_py

from gpt.analysis.table import compare
from gpt.commands.cli import standard_hooks
from gpt.config import load_config
from gpt.evaluation.held_out import EvalOptions, evaluate_checkpoint
from gpt.publish.sync import Item, collection_changes
from gpt.run.directory import CHARTS, COMPLETED, RunDir
from gpt.run.distributed import setup
from gpt.training.loop import train

pytestmark = pytest.mark.slow
NORMS = ("pytorch_layernorm", "handrolled_rmsnorm")
# blows up after warmup, stopped as diverged, with a checkpoint from before
DIVERGED = ("no_norm", 0, ["optim.lr=50", "train.loss_ceiling=6", "train.checkpoint_every=1"])
ALLOWED = ["optim.lr", "train.loss_ceiling"]


def grow(folder, tokens, cells):
    """Train (once) and evaluate each (norm, seed, overrides) cell in ``folder``, then compare them all into
    folder/tiny-comparison, as a sweep does."""
    paths = []
    for norm, seed, extra in cells:
        name = f"tiny-{norm.replace('_', '-')}-s{seed}"
        path = folder / name
        if not path.exists():
            cfg = load_config(
                write_train_yaml(folder / ".configs", tokens, name),
                [f"run.dir={path}", f"model.norm_type={norm}", f"train.seed={seed}", "train.steps=6", *extra],
            )
            train(cfg, hooks=standard_hooks(cfg))
            if RunDir(path).status() == COMPLETED:
                ckpt = RunDir(path).checkpoint("final")
                evaluate_checkpoint(ckpt, setup("cpu"), EvalOptions(show_progress=False))
        paths.append(path)
    compare(paths, folder / "tiny-comparison", allow_differ=ALLOWED)
    return paths


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """2 norm types x 2 seeds, and a no_norm run that diverged."""
    root = tmp_path_factory.mktemp("sweep")
    tokens = write_token_set(root / "tokens", n_train=60_000)
    folder = root / "runs"
    (folder / ".configs").mkdir(parents=True)
    cells = [(n, s, []) for n in NORMS for s in (0, 1)] + [DIVERGED]
    grow(folder, tokens, cells)
    assert RunDir(folder / "tiny-no-norm-s0").status() == "diverged"
    return {"folder": folder, "tokens": tokens, "cells": cells}


def copy(sweep, tmp_path):
    shutil.copytree(sweep["folder"], tmp_path / "runs", symlinks=True)
    return tmp_path / "runs"


def publish(hub, folder, *extra, ok=True):
    out = run_py(hub, ROOT / "scripts" / "publish_sweep.py", folder, "--namespace", "me", *extra)
    if ok:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


MODELS = [f"me/tiny-{n}-s{s}" for n in ("pytorch-layernorm", "handrolled-rmsnorm") for s in (0, 1)]


def the_collection(hub):
    (collection,) = hub.collections.values()
    return collection


def test_a_sweep_becomes_models_a_dataset_and_a_collection(sweep, hub, tmp_path):
    folder = copy(sweep, tmp_path)
    out = publish(hub, folder)
    assert sorted(k for k in hub.repos if not k.startswith("datasets/")) == sorted(MODELS)  # the diverged run: no
    assert [k for k in hub.repos if k.startswith("datasets/")] == ["datasets/me/tiny-comparison"]
    data = hub.files("datasets/me/tiny-comparison")
    local = folder / "tiny-comparison"
    assert data["comparison.json"] == (local / "comparison.json").read_bytes()  # byte for byte
    assert data["comparison.md"] == (local / "comparison.md").read_bytes()
    assert {"test_loss.png", "loss.png", "runs.jsonl"} <= set(data)
    for name in ("tiny-pytorch-layernorm-s0", "tiny-no-norm-s0"):  # every run's record, the diverged one too
        for f in ("config.yaml", "summary.json", "metrics.jsonl"):
            assert data[f"runs/{name}/{f}"] == (folder / name / f).read_bytes()
    assert "runs/tiny-pytorch-layernorm-s0/eval-test-fp32.json" in data
    rows = [json.loads(line) for line in data["runs.jsonl"].decode().splitlines()]
    assert [(r["run"], r["status"], r["model"]) for r in rows][-1] == ("tiny-no-norm-s0", "diverged", None)

    # the card: metadata the server validates, the table, the left-out run and why, the reproduction
    card = DatasetCard(data["README.md"].decode())
    validated = run_py(hub, code=f"from huggingface_hub import DatasetCard; DatasetCard({card.content!r}).validate()")
    assert validated.returncode == 0, validated.stderr[-2000:]
    bad = run_py(
        hub, code="from huggingface_hub import DatasetCard; DatasetCard('---\\nlicense: nope\\n---\\nx').validate()"
    )
    assert bad.returncode != 0 and "license" in bad.stderr  # the server's validation can refuse
    assert (
        "| group | design | p | Holm p (" in card.text and "| tiny-no-norm-s0 | no_norm | 0 | diverged |" in card.text
    )
    assert "- tiny-no-norm-s0: diverged: published only with --include-failed" in card.text
    assert "source sha256" in card.text and "![test loss](test_loss.png)" in card.text
    assert "python train.py published/runs/tiny-handrolled-rmsnorm-s1/config.yaml" in card.text
    assert "--allow-differ optim.lr --allow-differ train.loss_ceiling" in card.text

    # the collection: the dataset, then the models in table order, each with its note
    collection = the_collection(hub)
    result = json.loads((local / "comparison.json").read_text())
    order = [r["path"].split("/")[-1] for g in result["groups"] for r in g["runs"] if r["status"] == "completed"]
    assert [(i["type"], i["id"]) for i in collection["items"]] == [("dataset", "me/tiny-comparison")] + [
        ("model", f"me/{name}") for name in order
    ]
    losses = {r["path"].split("/")[-1]: r["test_loss"] for g in result["groups"] for r in g["runs"]}
    assert collection["items"][1]["note"] == f"{result['groups'][0]['group']}, seed 0, test loss {losses[order[0]]:.4f}"
    assert collection["title"] == "tiny: norm layers compared" and collection["private"]

    # every model loads in a fresh process and gives our logits
    code = f"""
import json, torch
from transformers import AutoModelForCausalLM
out = {{}}
for repo in {MODELS!r}:
    model = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True).eval()
    out[repo] = model(torch.tensor({IDS!r})).logits.tolist()
print(json.dumps(out))
"""
    loaded = run_py(hub, code=code)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    logits = json.loads(loaded.stdout.splitlines()[-1])
    for repo in MODELS:
        theirs = torch.tensor(logits[repo])
        assert (theirs - our_logits(folder / repo.split("/")[1])).abs().max().item() <= 1e-5, repo
    card = hub.files("me/tiny-pytorch-layernorm-s1")["README.md"].decode()
    assert (
        f"| tiny-pytorch-layernorm-s1 | pytorch_layernorm | 1 | completed | {losses['tiny-pytorch-layernorm-s1']:.6f} |"
        in card
    )
    assert "[me/tiny-comparison](https://huggingface.co/datasets/me/tiny-comparison)" in card

    # no token anywhere: not in a repo, not in the output, not in the sweep's folder
    every_file = [d for repo in hub.repos for d in hub.files(repo).values()]
    every_file += [p.read_bytes() for p in folder.rglob("*") if p.is_file()]
    assert not any(FAKE_TOKEN.encode() in d for d in every_file)
    assert FAKE_TOKEN not in out.stdout + out.stderr
    assert all(FAKE_TOKEN in a for a in hub.authorization)  # the token reached the Hub


def test_publishing_again_changes_nothing_and_a_new_seed_uploads_only_itself(sweep, hub, tmp_path):
    folder = copy(sweep, tmp_path)
    publish(hub, folder)
    commits, collection = hub.commits(), json.dumps(the_collection(hub))
    changes = len(hub.changes())
    again = publish(hub, folder)
    assert hub.commits() == commits and json.dumps(the_collection(hub)) == collection
    assert len(hub.changes()) == changes  # not a request that changes anything
    assert again.stdout.count(": up to date") == 6  # 4 models, the dataset, the collection

    grow(folder, sweep["tokens"], [*sweep["cells"][:2], ("pytorch_layernorm", 2, []), *sweep["cells"][2:]])
    before = {repo: len(branches["main"]) for repo, branches in hub.repos.items()}
    publish(hub, folder)
    grew = {repo for repo, branches in hub.repos.items() if len(branches["main"]) != before.get(repo)}
    assert grew == {"me/tiny-pytorch-layernorm-s2", "datasets/me/tiny-comparison"}
    commit = hub.repos["datasets/me/tiny-comparison"]["main"][-1]
    previous = hub.repos["datasets/me/tiny-comparison"]["main"][-2]
    changed = {p for p in commit["files"] if commit["files"][p] != previous["files"].get(p)}
    assert changed == {
        "README.md",
        "comparison.json",
        "comparison.md",
        "runs.jsonl",
        "test_loss.png",
        "runs/tiny-pytorch-layernorm-s2/config.yaml",
        "runs/tiny-pytorch-layernorm-s2/summary.json",
        "runs/tiny-pytorch-layernorm-s2/metrics.jsonl",
        "runs/tiny-pytorch-layernorm-s2/eval-test-fp32.json",
    } | ({c.file for c in CHARTS} & changed)  # curves' charts (every one in CHARTS) redrawn with a third seed
    ids = [i["id"] for i in the_collection(hub)["items"]]
    assert ids[:4] == ["me/tiny-comparison", *[f"me/tiny-pytorch-layernorm-s{s}" for s in (0, 1, 2)]]


def test_a_repo_that_fails_is_named_and_a_rerun_finishes(sweep, hub, tmp_path):
    folder = copy(sweep, tmp_path)
    hub.fail_repos = {"me/tiny-pytorch-layernorm-s1"}
    out = publish(hub, folder, ok=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: publishing failed for 1: me/tiny-pytorch-layernorm-s1 (Server error '500")
    assert "the Hub failed to answer (a server error): wait and run again" in out.stderr
    assert "the other 4 repos are complete: run the same command again to finish" in out.stderr
    for repo in [m for m in MODELS if m != "me/tiny-pytorch-layernorm-s1"]:
        assert "model.safetensors" in hub.files(repo) and "README.md" in hub.files(repo)
    assert "comparison.json" in hub.files("datasets/me/tiny-comparison")
    assert "me/tiny-pytorch-layernorm-s1" not in [i["id"] for i in the_collection(hub)["items"]]
    hub.fail_repos = set()
    publish(hub, folder)
    assert "model.safetensors" in hub.files("me/tiny-pytorch-layernorm-s1")
    items = [i["id"] for i in the_collection(hub)["items"]]
    assert items.index("me/tiny-pytorch-layernorm-s1") == items.index("me/tiny-pytorch-layernorm-s0") + 1


def test_a_dry_run_changes_nothing_and_says_everything(sweep, hub, tmp_path):
    folder = copy(sweep, tmp_path)
    out = publish(hub, folder, "--dry-run")
    assert hub.changes() == [] and hub.repos == {} and hub.collections == {}
    assert any(method == "GET" for method, _ in hub.requests)  # it did look
    for repo in MODELS:
        assert f"model {repo}: would create, upload" in out.stdout
    assert "dataset me/tiny-comparison: would create, upload" in out.stdout
    assert "\n  model.safetensors\n" in out.stdout and "\n  runs/tiny-no-norm-s0/summary.json\n" in out.stdout
    assert "collection: would create collection 'tiny: norm layers compared' in me" in out.stdout
    assert out.stdout.count("collection: would add ") == 5
    publish(hub, folder)
    requests = len(hub.changes())
    again = publish(hub, folder, "--dry-run")
    assert len(hub.changes()) == requests and "would" not in again.stdout


def test_include_failed_publishes_the_diverged_run_saying_so(sweep, hub, tmp_path):
    folder = copy(sweep, tmp_path)
    publish(hub, folder, "--include-failed", "--prefix", "exp")
    assert "me/exp-tiny-no-norm-s0" in hub.repos
    card = hub.files("me/exp-tiny-no-norm-s0")["README.md"].decode()
    assert "> **This run diverged at step" in card and "published for the record" in card
    assert "model-index" not in card  # no test loss to claim
    items = the_collection(hub)["items"]
    assert the_collection(hub)["title"] == "exp: norm layers compared"
    assert items[0]["id"] == "me/exp-tiny-comparison" and len(items) == 6
    assert items[-1]["note"].startswith("no_norm, seed 0, diverged")


def test_bad_sweep_folders_are_one_line(sweep, hub, tmp_path, cli):
    # a folder that is no sweep is refused before the Hub is asked anything: in this process
    out = cli(ROOT / "scripts" / "publish_sweep.py", tmp_path / "nowhere", "--namespace", "me")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no such folder" in out.stderr
    (tmp_path / "empty").mkdir()
    out = cli(ROOT / "scripts" / "publish_sweep.py", tmp_path / "empty", "--namespace", "me")
    assert (
        out.returncode == 2 and "a sweep folder holds one comparison folder (comparison.json), found none" in out.stderr
    )
    folder = copy(sweep, tmp_path)
    out = publish(hub, folder, "--prefix", "bad name!", ok=False)
    assert out.returncode == 2 and "which the Hub refuses" in out.stderr and hub.repos == {}


def test_collection_changes_add_mend_and_order():
    a, b, c = Item("dataset", "me/d", "table"), Item("model", "me/a", "x"), Item("model", "me/b", "y")
    assert collection_changes([], [a, b]) == [("add", a, None), ("add", b, None)]
    assert collection_changes([a, b], [a, b]) == []
    assert collection_changes([a, Item("model", "me/a", "old")], [a, b]) == [("note", b, None)]
    # a model added between two others is moved into place; items beyond the list stay after it
    extra = Item("model", "me/old", "kept")
    assert collection_changes([a, c, extra], [a, b, c]) == [("add", b, None), ("move", b, 1)]


@pytest.mark.parametrize(
    "record, wrong",
    [
        ({"sizes": []}, "no groups, and no sizes"),
        ({"sizes": [{}]}, "a size without its name"),
        ({"groups": 5}, "groups is not a list of groups"),
        ({"groups": [{"group": "ln", "runs": [{"seed": "0", "status": "completed"}]}]},
         "group ln: a run without its path, seed or status"),
        ({"groups": [{"group": "ln", "runs": 3}]}, "group ln: runs is not a list"),
    ],
)  # fmt: skip
def test_a_comparison_of_the_wrong_shape_is_one_line_naming_it(tmp_path, record, wrong):
    from gpt.common.errors import UserError
    from gpt.publish.sweep_source import read_sweep

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "comparison.json").write_text(json.dumps(record))
    before = (tmp_path / "c" / "comparison.json").read_bytes()
    with pytest.raises(UserError) as e:
        read_sweep(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'c' / 'comparison.json'}: not a comparison as compare.py writes it ({wrong}); run "
        "scripts/compare.py (or the sweep) again to rewrite it"
    )
    assert (tmp_path / "c" / "comparison.json").read_bytes() == before
