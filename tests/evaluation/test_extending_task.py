"""Adding an evaluation task is one module and one registry entry: a next-token accuracy declared only in this
file is a choice of evaluate.py with its own argument, keeps its result beside the checkpoint, prints its table
line, is compared over seeds, reported, and put on the model card, with no other file changed
(docs/extending.md)."""

import json

import pytest
import torch
from conftest import write_token_set, write_train_yaml

from gpt.analysis.table import compare
from gpt.commands.evaluate import main
from gpt.common.errors import UserError
from gpt.config import load_config
from gpt.evaluation.declaration import Metric, Option, Task, TaskInputs
from gpt.evaluation.held_out import RangeOverride, held_out_range
from gpt.evaluation.tasks import TASKS, register_task, unregister_task
from gpt.model.gpt import GPT
from gpt.publish.export import export_checkpoint
from gpt.run.checkpoints import checkpoint_config, checkpoint_identity, load_weights
from gpt.run.directory import find_checkpoint, write_eval_result
from gpt.run.distributed import setup
from gpt.training.loop import train

# ---- the module: how the task scores a checkpoint (in gpt/evaluation/next_token.py, say)

NAME = "next_token"


def evaluate_checkpoint(ckpt, dist, inputs) -> dict:
    """The share of the first ``--next-token-tokens`` tokens of the run's test range whose token the model
    ranks first, kept as eval-next_token-<precision>.json beside the checkpoint."""
    cfg = checkpoint_config(ckpt)
    _, span = held_out_range(cfg, RangeOverride(n_tokens=inputs.prepared[NAME]))
    model = GPT(cfg.model)
    load_weights(model, ckpt)
    model.eval()
    seq = span.read(range(span.n_sequences(cfg.model.context_length)), cfg.model.context_length)
    with torch.no_grad():
        logits, _ = model(seq[:, :-1])
    right = (logits.argmax(-1) == seq[:, 1:]).double()
    result = {
        **checkpoint_identity(ckpt, cfg),
        "split": NAME,  # its result file's name: eval-next_token-<precision>.json
        "precision": inputs.options.precision,
        "targets_scored": right.numel(),
        "accuracy": float(right.mean()),
    }
    if dist.is_main:
        write_eval_result(ckpt, result)
    return result


def tokens_to_score(args) -> int:
    """--next-token-tokens, checked before any model loads."""
    if args.next_token_tokens < 2:
        raise UserError(f"--next-token-tokens {args.next_token_tokens}: score at least 2 tokens")
    return args.next_token_tokens


# ---- the registry entry (in gpt/evaluation/tasks.py, an entry of TASKS)

NEXT_TOKEN = Task(
    NAME,
    "the run's test range: its first --next-token-tokens tokens",
    evaluate_checkpoint,
    f"{'run':<36}{'step':>7}{'tokens':>9}{'accuracy':>10}",
    lambda r: f"{r['run']:<36}{r['step']:>7}{r['targets_scored']:>9,}{r['accuracy']:>10.4f}",
    metrics=(Metric("accuracy", "the share of tokens the model ranks first"),),
    title="Next-token accuracy",
    card=lambda r: f"- Next-token accuracy: {r['accuracy']:.4f} of {r['targets_scored']:,} test tokens.",
    options=(Option(("--next-token-tokens",), {"type": int, "default": 1024, "metavar": "N"}),),
    prepare=tokens_to_score,
)


@pytest.fixture
def next_token():
    register_task(NEXT_TOKEN)
    yield NEXT_TOKEN
    unregister_task(NAME)
    assert NAME not in TASKS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two norm types, two seeds each, trained 4 steps."""
    root = tmp_path_factory.mktemp("extending-task")
    tokens = write_token_set(root / "tokens", n_train=30_000, n_test=4096)
    out = []
    for norm in ("handrolled_layernorm", "pytorch_rmsnorm"):
        for seed in (0, 1):
            name = f"{norm}-s{seed}"
            steps = ["train.steps=4", "train.eval_every=4", "train.checkpoint_every=4"]
            cfg = load_config(
                write_train_yaml(root, tokens, name), [*steps, f"model.norm_type={norm}", f"train.seed={seed}"]
            )
            train(cfg)
            out.append(root / name)
    return out


def test_a_task_not_registered_is_no_choice(runs, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(runs[0]), "--task", NAME])
    assert e.value.code == 2 and f"argument --task: invalid choice: '{NAME}'" in capsys.readouterr().err


def test_one_registry_entry_is_enough(next_token, runs, tmp_path, capsys):
    args = ["--quiet", "--task", "test_loss", "--task", NAME, "--next-token-tokens", "513"]
    assert main([*map(str, runs), *args]) == 0
    out = capsys.readouterr().out
    kept = {}
    for run in runs:
        ckpt = find_checkpoint(run)
        kept[run.name] = json.loads((ckpt / f"eval-{NAME}-fp32.json").read_text())
        again = evaluate_checkpoint(ckpt, setup("cpu"), TaskInputs(prepared={NAME: 513}))
        assert kept[run.name]["accuracy"] == again["accuracy"] and kept[run.name]["targets_scored"] == 16 * 32
        assert f"{run.name:<36}{4:>7}{512:>9,}{again['accuracy']:>10.4f}" in out.splitlines()
        assert (ckpt / "eval-test-fp32.json").is_file()  # the test loss, as before, beside it
    assert f"{'run':<36}{'step':>7}{'tokens':>9}{'accuracy':>10}" in out.splitlines()
    # its argument is read before any work: a bad value is one line
    assert main([str(runs[0]), "--task", NAME, "--next-token-tokens", "1"]) == 2
    assert capsys.readouterr().err == "error: --next-token-tokens 1: score at least 2 tokens\n"

    # the comparison carries its metric over seeds, against the baseline paired by seed
    result = compare(runs, tmp_path / "cmp")
    rows = {g["group"]: g["tasks"][NAME] for g in result["groups"]}
    accs = {n: [kept[f"{n}-s{s}"]["accuracy"] for s in (0, 1)] for n in rows}
    for norm, row in rows.items():
        assert row["n_seeds"] == 2 and row["metrics"]["accuracy"]["mean"] == pytest.approx(sum(accs[norm]) / 2)
    diff = [a - b for a, b in zip(accs["pytorch_rmsnorm"], accs["handrolled_layernorm"])]
    versus = rows["pytorch_rmsnorm"]["vs_baseline"]["accuracy"]
    assert versus["method"] == "paired" and versus["diff"] == pytest.approx(sum(diff) / 2)
    assert result["families"][NAME] == 1
    assert (tmp_path / "cmp" / "runs.csv").read_text().splitlines()[0].endswith(f",{NAME}.accuracy")

    # the report shows it, headed by its title, its metric explained
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "## Next-token accuracy\n\naccuracy: the share of tokens the model ranks first (higher is better)\n" in md
    mean = rows["handrolled_layernorm"]["metrics"]["accuracy"]["mean"]
    assert f"| handrolled_layernorm | 2 | {mean:.4f} [" in md

    # the model card says it
    ckpt = find_checkpoint(runs[0])
    export_checkpoint(ckpt, tmp_path / "export", "me/x")
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"- Next-token accuracy: {kept[runs[0].name]['accuracy']:.4f} of 512 test tokens." in card
