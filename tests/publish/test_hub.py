"""Publishing on the Hub, against the real huggingface_hub client and a Hub on 127.0.0.1 (tests/hubserver.py).

Uploads and loads run in fresh processes, pointed at the local Hub with HF_ENDPOINT and a
fresh HF_HOME, with a fake token that must reach the server and appear in no file.
"""

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAKE_TOKEN, ROOT, write_token_set, write_train_yaml
from huggingface_hub import ModelCard

from gpt.commands.cli import standard_hooks
from gpt.commands.evaluate import main as evaluate
from gpt.config import load_config
from gpt.data.tokenizer import get_tokenizer
from gpt.model.gpt import GPT
from gpt.model.norms import NORM_TYPES
from gpt.publish.export import export_checkpoint
from gpt.publish.layouts import SHIPPED
from gpt.run.checkpoints import checkpoint_config, load_weights
from gpt.run.directory import RunDir, find_checkpoint
from gpt.training.loop import train

pytestmark = pytest.mark.slow
PARAGRAPH = (
    "It was the best of times, it was the worst of times,\n\tit was the age of wisdom...  "
    "Numbers 1234 and émigrés; <|endoftext|> and don't stop."
)
IDS = [[0, 64, 65, 66, 7, 100, 200, 255], [3, 1, 4, 1, 5, 9, 2, 6]]  # token ids < 256, the test models' vocabulary


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A short run of every norm type (the dyt one with tied weights and a padded head), one of them evaluated."""
    root = tmp_path_factory.mktemp("hubruns")
    tokens = write_token_set(root / "tokens", n_train=60_000)
    out = {}
    for norm in NORM_TYPES:
        extra = ["model.tie_weights=true", "model.vocab_pad_multiple=96"] if norm == "dyt" else []
        cfg = load_config(
            write_train_yaml(root, tokens, norm),
            ["train.steps=4", "train.eval_every=4", "train.checkpoint_every=4", f"model.norm_type={norm}", *extra],
        )
        train(cfg, hooks=standard_hooks(cfg))  # as the train command does: the charts the card shows
        out[norm] = root / norm
    assert evaluate([str(out["pytorch_layernorm"]), "--quiet"]) == 0  # as evaluate.py does
    return out


def run_py(hub, *args, code=None):
    cmd = [sys.executable, "-c", code] if code else [sys.executable, *map(str, args)]
    return subprocess.run(cmd, env=hub.env, capture_output=True, text=True, timeout=600)


def push(hub, run, repo, *extra):
    out = run_py(hub, ROOT / "scripts" / "push_to_hub.py", run, "--repo", repo, *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


PUSH_ALL = """
import json, sys
from gpt.commands.push_to_hub import main
sys.exit(max(main(args) for args in json.loads(sys.argv[1])))
"""


def push_all(hub, pushes: dict[str, Path]) -> None:
    """Each run pushed to its repo, as push_to_hub.py does, all in one fresh process (one import of torch)."""
    out = run_py(hub, "-c", PUSH_ALL, json.dumps([[str(run), "--repo", repo] for repo, run in pushes.items()]))
    assert out.returncode == 0, out.stderr[-3000:]
    assert [json.loads(line)["repo"] for line in out.stdout.splitlines()] == list(pushes)


def our_logits(run):
    ckpt = find_checkpoint(run)
    model = GPT(checkpoint_config(ckpt).model)
    load_weights(model, ckpt)
    with torch.no_grad():
        return model.eval()(torch.tensor(IDS))[0]


LOAD_ALL = """
import json, sys, torch
from transformers import AutoModelForCausalLM
out = {}
for repo in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(torch.tensor(IDS)).logits
    generated = model.generate(torch.tensor([[64, 65]]), max_new_tokens=5, do_sample=False)
    out[repo] = {"class": type(model).__name__, "logits": logits.tolist(), "generated": generated.tolist()}
print(json.dumps(out))
""".replace("IDS", repr(IDS))


def test_every_norm_type_loads_with_transformers_and_gives_our_logits(runs, hub):
    push_all(hub, {f"me/{norm}": run for norm, run in runs.items()})
    out = run_py(hub, code=LOAD_ALL.replace("sys.argv[1:]", repr([f"me/{n}" for n in runs])))
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    for norm, run in runs.items():
        got = loaded[f"me/{norm}"]
        assert got["class"] == "GPTNormForCausalLM"
        assert (torch.tensor(got["logits"]) - our_logits(run)).abs().max().item() <= 1e-5, norm
        assert len(got["generated"][0]) == 7  # generate() adds its 5 tokens
    files = hub.files("me/dyt")
    assert {
        "model.safetensors",
        "config.json",
        "modeling_gpt_norm.py",
        "configuration_gpt_norm.py",
        "gpt.py",
        "norms.py",
        "loss.py",
        "architecture.py",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "README.md",
        "loss.png",
    } <= set(files)
    for name, source in SHIPPED.items():  # the model's own files and its spec, verbatim: one model, not two
        assert files[name] == source.read_bytes(), name
    wrapper = ast.parse(files["modeling_gpt_norm.py"].decode())
    assert [c.name for c in wrapper.body if isinstance(c, ast.ClassDef)] == ["GPTNormForCausalLM"]  # no layers
    assert all(FAKE_TOKEN in a for a in hub.authorization)  # the token reached the Hub


def test_the_tokenizer_from_the_repo_encodes_like_ours(runs, hub):
    push(hub, runs["pytorch_layernorm"], "me/tok")
    code = (
        "import json; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained('me/tok', trust_remote_code=True); "
        f"print(json.dumps(t({PARAGRAPH!r}).input_ids))"
    )
    out = run_py(hub, code=code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == get_tokenizer().encode(PARAGRAPH, allowed_special="all")


def test_native_gpt2_export_loads_without_remote_code(runs, hub):
    push(hub, runs["handrolled_layernorm"], "me/native", "--native-gpt2")
    assert not any(name.endswith(".py") for name in hub.files("me/native"))
    code = (
        "import json, torch; from transformers import GPT2LMHeadModel; "
        "m = GPT2LMHeadModel.from_pretrained('me/native').eval(); "
        f"print(json.dumps(m(torch.tensor({IDS!r})).logits.tolist()))"
    )
    out = run_py(hub, code=code)
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = torch.tensor(json.loads(out.stdout.splitlines()[-1]))
    assert (theirs - our_logits(runs["handrolled_layernorm"])).abs().max().item() <= 1e-5
    refused = run_py(
        hub, ROOT / "scripts" / "push_to_hub.py", runs["pytorch_rmsnorm"], "--repo", "me/rms", "--native-gpt2"
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "GPT2LMHeadModel cannot compute this model: model.norm_type pytorch_rmsnorm (GPT-2: " in refused.stderr
    assert "me/rms" not in hub.repos  # refused before anything was created


def test_the_card_is_valid_metadata_and_holds_the_test_loss(runs, hub):
    run = runs["pytorch_layernorm"]
    push(hub, run, "me/card")
    card = ModelCard(hub.files("me/card")["README.md"].decode())
    evaluation = json.loads((find_checkpoint(run) / "eval-test-fp32.json").read_text())
    data = card.data.to_dict()
    assert (data["license"], data["library_name"], data["pipeline_tag"]) == ("mit", "transformers", "text-generation")
    assert "pytorch-layernorm" in data["tags"]
    result = card.data.eval_results[0]
    assert (result.metric_type, result.metric_value) == ("loss", round(evaluation["loss"], 6))
    assert f"**Held-out test loss: {evaluation['loss']:.4f}**" in card.text
    # the tokens scored: the count the evaluator printed and kept, in the text and in the metadata
    scored = evaluation["targets_scored"]
    t = load_config(run / "config.yaml").model.context_length
    assert scored == (evaluation["n_tokens"] - 1) // t * t
    assert f"the {scored:,} tokens scored (each predicted from those before it)" in card.text
    assert result.metric_name == f"held-out test loss (nats/token, {scored:,} tokens scored)"
    # the peak memory, named for what it measured: a CPU run's resident set
    summary = json.loads((run / "summary.json").read_text())
    assert f"peak memory {summary['peak_rss_bytes'] / 2**30:.2f} GiB, the process's peak resident set" in card.text
    assert "![training and validation loss](loss.png)" in card.text and "trust_remote_code=True" in card.text


def test_a_failed_upload_is_retried_then_one_line(runs, hub):
    run = runs["no_norm"]
    hub.fail_commits = [403, 403]  # statuses the client does not retry itself
    push(hub, run, "me/flaky")
    assert "model.safetensors" in hub.files("me/flaky")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    hub.fail_always = 403
    out = run_py(hub, ROOT / "scripts" / "push_to_hub.py", run, "--repo", "me/down")
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: upload to me/down failed after 3 attempts: 403")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing local changed


def upload_yaml(tmp_path, name, *settings):
    tokens = tmp_path / "tokens"
    if not tokens.is_dir():
        write_token_set(tokens, n_train=60_000)
    path = write_train_yaml(tmp_path, tokens, name)
    path.write_text(path.read_text() + f"hub: {{repo_id: me/{name}, push_every_checkpoint: true}}\n")
    return path


def test_checkpoints_upload_during_training_once(tmp_path, hub):
    cfg = upload_yaml(tmp_path, "live")
    out = run_py(hub, ROOT / "train.py", cfg)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["hub"] == {
        "repo_id": "me/live",
        "endpoint": hub.url,
        "failed": {},
        "left": [],
        "uploaded": ["main", "step-00000010", "step-00000020"],
    }
    assert set(hub.repos["me/live"]) == {"main", "step-00000010", "step-00000020"}
    assert "model.safetensors" in hub.files("me/live", "step-00000010")
    card = hub.files("me/live")["README.md"].decode()
    assert "Held-out test loss: not evaluated yet" in card and "20 steps" in card
    assert not (tmp_path / "live" / ".hub-staging").exists()
    # resume from step 10: step-00000020 is saved again but not uploaded twice
    step10 = len(hub.repos["me/live"]["step-00000010"]), len(hub.repos["me/live"]["step-00000020"])
    ckpts = tmp_path / "live" / "checkpoints"
    for leftover in ("step-00000020", "best"):
        target = ckpts / leftover
        target.unlink() if target.is_file() else shutil.rmtree(target)
    (ckpts / "latest").write_text("step-00000010\n")
    (tmp_path / "live" / "summary.json").unlink()
    again = run_py(hub, ROOT / "train.py", cfg, "--resume", "auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (len(hub.repos["me/live"]["step-00000010"]), len(hub.repos["me/live"]["step-00000020"])) == step10


def test_a_hub_that_is_down_never_stops_training(tmp_path, hub):
    hub.fail_always = 403
    cfg = upload_yaml(tmp_path, "down")
    out = run_py(hub, ROOT / "train.py", cfg)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "down" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["hub"]["uploaded"] == [] and set(summary["hub"]["failed"]) == {
        "main",
        "step-00000010",
        "step-00000020",
    }
    reasons = set(summary["hub"]["failed"].values())  # the same reason for all three, said once
    assert len(reasons) == 1 and "403" in next(iter(reasons)) and "check the token" in next(iter(reasons))
    assert (
        out.stderr.startswith(f"warning: Hub uploads to me/down at {hub.url}: 3 failed (")
        and out.stderr.count("\n") == 1
        and out.stderr.count("403 Forbidden") == 1  # (not "403": the port may hold it)
    )  # one line, the reason once
    assert "(step-00000010, step-00000020, main): 403 Forbidden" in out.stderr


def test_generate_from_a_checkpoint_and_from_the_hub(runs, hub):
    run = runs["pytorch_rmsnorm"]
    push(hub, run, "me/gen")
    args = ["--prompt", "a", "--max-new-tokens", "12", "--seed", "3", "--top-k", "20"]
    local = run_py(hub, ROOT / "scripts" / "generate.py", run, *args)
    remote = run_py(hub, ROOT / "scripts" / "generate.py", "me/gen", *args)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr[-2000:] + remote.stderr[-2000:]
    assert local.stdout == remote.stdout and local.stdout.startswith("a")  # the same seed, the same text
    assert len(local.stdout.encode()) > 12  # 12 sampled byte-level tokens, decoded
    other = run_py(hub, ROOT / "scripts" / "generate.py", run, *args[:-4], "--seed", "4", "--top-k", "20")
    assert other.stdout != local.stdout


def test_no_token_in_any_file_written(tmp_path, runs, hub):
    push(hub, runs["dyt"], "me/secret")
    out = run_py(hub, ROOT / "train.py", upload_yaml(tmp_path, "secret-run"))
    assert out.returncode == 0, out.stderr[-2000:]
    for root in (tmp_path, runs["dyt"].parent):
        for path in root.rglob("*"):
            if path.is_file():
                assert FAKE_TOKEN.encode() not in path.read_bytes(), path
    for files in (hub.files("me/secret"), hub.files("me/secret-run")):
        assert all(FAKE_TOKEN.encode() not in data for data in files.values())


def test_the_card_names_a_hub_data_set_and_tiny_differences(runs, tmp_path):
    # a set prepared from a Hub data set: meta.json's source names its repo; a 1e-9 difference stays visible
    run = runs["pytorch_layernorm"]
    cfg = load_config(run / "config.yaml")
    meta = json.loads((Path(cfg.data.path) / "meta.json").read_text())
    data = tmp_path / "fineweb-like"
    data.mkdir()
    (data / "meta.json").write_text(
        json.dumps({**meta, "source": {"name": "fineweb-edu", "repo": "HuggingFaceFW/fineweb-edu"}})
    )
    ckpt = find_checkpoint(run)
    staged = tmp_path / "ckpt"
    shutil.copytree(ckpt, staged)
    (staged / "config.yaml").write_text((ckpt / "config.yaml").read_text().replace(str(cfg.data.path), str(data)))
    comparison = {
        "group": "pytorch_layernorm",
        "baseline": "handrolled_layernorm",
        "n_evaluated": 3,
        "test_loss_mean": 6.7,
        "test_loss_std": 0.0078,
        "vs_baseline": {"diff": -1.02e-09, "low": -2.34e-08, "high": 2.14e-08},
    }
    export_checkpoint(staged, tmp_path / "out", "me/fw", run=RunDir(run), comparison=comparison)
    card = ModelCard((tmp_path / "out" / "README.md").read_text())
    assert card.data.datasets == ["HuggingFaceFW/fineweb-edu"]
    assert card.data.eval_results[0].dataset_type == "HuggingFaceFW/fineweb-edu"
    assert "| pytorch_layernorm | 3 | 6.7000 | 0.0078 | -1.02e-09 [-2.34e-08, +2.14e-08] |" in card.text


def test_push_with_an_explicit_comparison(runs, hub, tmp_path):
    run = runs["handrolled_rmsnorm"]
    group = {
        "group": "handrolled_rmsnorm",
        "n_evaluated": 1,
        "test_loss_mean": 5.5,
        "test_loss_std": None,
        "vs_baseline": None,
        "runs": [{"path": str(run), "seed": 0}],
    }
    (tmp_path / "with.json").write_text(json.dumps({"baseline": "handrolled_layernorm", "groups": [group]}))
    (tmp_path / "without.json").write_text(json.dumps({"baseline": "handrolled_layernorm", "groups": []}))
    push(hub, run, "me/cmp", "--comparison", tmp_path / "with.json")
    assert "| handrolled_rmsnorm | 1 | 5.5000 | n/a | baseline |" in hub.files("me/cmp")["README.md"].decode()
    out = run_py(
        hub, ROOT / "scripts" / "push_to_hub.py", run, "--repo", "me/cmp2", "--comparison", tmp_path / "without.json"
    )
    assert (
        out.returncode == 2
        and out.stderr == f"error: {tmp_path / 'without.json'}: holds no group with the run {run.resolve()}\n"
    )
    assert "me/cmp2" not in hub.repos


def test_a_failed_runs_card_names_the_checkpoint_it_publishes():
    from gpt.publish.card import CardFacts, status_lines

    summary = {"status": "diverged", "diverged_at_step": 40, "stop_reason": "loss non-finite"}
    for best, which in ((False, "last"), (True, "best-validation")):
        facts = CardFacts(repo_id="me/x", n_params=1, step=35, summary=summary, best=best)
        assert status_lines(facts)[0] == (
            f"> **This run diverged at step 40 (loss non-finite).** Its {which} checkpoint (step 35) is published for "
            "the record; it is not a trained model, and no comparison's statistics use it."
        )
    assert status_lines(CardFacts(repo_id="me/x", n_params=1, summary={"status": "completed"}, best=True)) == []
