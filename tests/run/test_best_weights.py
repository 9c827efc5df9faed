"""A new best between checkpoints keeps its weights only (held in host memory, written before the next
checkpoint): the number of full checkpoint writes is the checkpoints', and every best stays loadable.

The validation losses are scripted (``evaluate_loss`` replaced) so that the best falls where each test needs it;
the training itself is real: the tiny config of ``write_train_yaml``, 6 steps, validation every step."""

import pytest
import torch
from conftest import write_train_yaml
from safetensors.torch import load_file

from gpt.config import load_config
from gpt.model.gpt import GPT
from gpt.run import checkpoints as ckpt_io
from gpt.run.directory import find_checkpoint
from gpt.training import loop
from gpt.training.loop import train
from gpt.training.monitors import Divergence


def scripted_run(tmp_path, token_set, monkeypatch, name, losses, checkpoint_every, diverge_at=None):
    """Train 6 steps validating every step with ``losses`` as the validation losses; returns (the run's folder,
    the steps of every full checkpoint write, the steps of every weights-only write)."""
    yaml = write_train_yaml(tmp_path, token_set, name)
    text = yaml.read_text().replace("steps: 20", "steps: 6").replace("eval_every: 10", "eval_every: 1")
    yaml.write_text(text.replace("checkpoint_every: 10", f"checkpoint_every: {checkpoint_every}"))
    scripted = iter(losses)
    monkeypatch.setattr(loop, "evaluate_loss", lambda *a, **k: (next(scripted),))
    full, best = [], []
    save, save_best = ckpt_io.save_checkpoint, ckpt_io.save_best_weights
    monkeypatch.setattr(
        loop, "save_checkpoint", lambda root, step, *a, **k: full.append(step) or save(root, step, *a, **k)
    )
    monkeypatch.setattr(  # HeldBest writes through it
        ckpt_io, "save_best_weights", lambda root, step, *a, **k: best.append(step) or save_best(root, step, *a, **k)
    )
    if diverge_at is not None:
        monkeypatch.setattr(
            Divergence, "reason", lambda self, c, step, loss: ("scripted", step) if step == diverge_at else None
        )
    train(load_config(yaml))
    return tmp_path / name, full, best


def names(run):
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_a_best_between_checkpoints_is_written_once_as_weights_before_the_next_checkpoint(
    tmp_path, token_set, monkeypatch
):
    # best at step 2 (not a checkpoint step: held), step 3's checkpoint is not a best: step 2's weights go first
    run, full, best = scripted_run(tmp_path, token_set, monkeypatch, "held", [5, 3, 4, 4, 4, 4], checkpoint_every=3)
    assert full == [3, 6] and best == [2]
    assert names(run) == ["best", "best-00000002", "latest", "step-00000003", "step-00000006"]
    folder = find_checkpoint(run, "best")
    assert folder.name == "best-00000002" and not (folder / "state.pt").exists()
    info = ckpt_io.read_info(folder)
    assert (info["step"], info["val_loss"], info["best_val_loss"], info["weights_only"]) == (2, 3, 3, True)
    # the weights are step 2's, bit for bit: the same run checkpointing at step 2 wrote the same tensors
    twin, full2, best2 = scripted_run(tmp_path, token_set, monkeypatch, "twin", [5, 3, 4, 4, 4, 4], checkpoint_every=2)
    assert full2 == [2, 4, 6] and best2 == [] and find_checkpoint(twin, "best").name == "step-00000002"
    held, written = (
        load_file(str(folder / "model.safetensors")),
        load_file(str(twin / "checkpoints/step-00000002/model.safetensors")),
    )
    assert held.keys() == written.keys() and all(torch.equal(held[k], written[k]) for k in held)
    # holding a copy changed nothing the run computes: both runs end on the same bits
    ends = [load_file(str(r / "checkpoints/step-00000006/model.safetensors")) for r in (run, twin)]
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])
    # it loads where a checkpoint does (evaluate, publish), and is refused as a place to resume from
    model = GPT(load_config(run / "config.yaml").model, seed=None)
    ckpt_io.load_weights(model, folder)
    assert (
        ckpt_io.problem(folder)
        == "it holds a best validation's weights alone (no state.pt): resume from a step-* checkpoint"
    )
    assert ckpt_io.newest_loadable(run / "checkpoints", print).name == "step-00000006"
    # exact resume is unchanged: from step 3, the same last weights, and the best held before it still the best
    scripted = iter([4, 4, 4])
    monkeypatch.setattr(loop, "evaluate_loss", lambda *a, **k: (next(scripted),))
    summary = train(load_config(run / "config.yaml"), resume=str(run / "checkpoints" / "step-00000003"))
    again = load_file(str(run / "checkpoints/step-00000006/model.safetensors"))
    assert all(torch.equal(again[k], ends[0][k]) for k in again)
    assert (summary["best_val_loss"], summary["best_val_step"]) == (3, 2)
    assert find_checkpoint(run, "best").name == "best-00000002"


def test_a_best_superseded_by_a_checkpoints_own_best_is_never_written(tmp_path, token_set, monkeypatch):
    run, full, best = scripted_run(
        tmp_path, token_set, monkeypatch, "superseded", [5, 3, 2, 4, 4, 4], checkpoint_every=3
    )
    assert full == [3, 6] and best == [] and find_checkpoint(run, "best").name == "step-00000003"
    # a later best between checkpoints replaces the best folder, which then goes: one best on the disk
    run, full, best = scripted_run(tmp_path, token_set, monkeypatch, "moves", [5, 3, 4, 2, 1, 4], checkpoint_every=3)
    assert full == [3, 6] and best == [2, 5]
    assert names(run) == ["best", "best-00000005", "latest", "step-00000003", "step-00000006"]


def test_a_diverged_run_keeps_the_best_it_held(tmp_path, token_set, monkeypatch):
    run, full, best = scripted_run(
        tmp_path, token_set, monkeypatch, "diverged", [5, 3, 4, 4, 4, 4], checkpoint_every=6, diverge_at=4
    )
    assert full == [] and best == [2]  # nothing saved of the diverged state; the best before it kept
    assert names(run) == ["best", "best-00000002"]
    assert ckpt_io.read_info(find_checkpoint(run, "best"))["step"] == 2


def test_a_tied_weight_is_held_once_and_loads_back(tmp_path, tiny_model_cfg):
    model = GPT(tiny_model_cfg(tie_weights=True), seed=0)
    held = ckpt_io.host_copy(model)
    assert len(held) == len(ckpt_io.stored_tensors(model)) < len(model.state_dict())
    again = ckpt_io.host_copy(model, held)  # the buffers reused, not reallocated
    assert all(again[k] is held[k] for k in held)
    ckpt_io.save_best_weights(tmp_path, 7, held, config_yaml="", info={"step": 7}, keep_last=2)
    other = GPT(tiny_model_cfg(tie_weights=True), seed=1)
    ckpt_io.load_weights(other, tmp_path / "best-00000007")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize(
    "total, eval_every, every, expected",
    [(33_157, 500, None, 3_500), (20, 10, None, 10), (1_000, 1, None, 100), (5, 10, None, 10), (20, 10, 7, 7)],
)
def test_checkpoints_are_sized_to_the_run_at_validation_steps(total, eval_every, every, expected):
    interval = ckpt_io.checkpoint_interval(total, eval_every, every)
    assert interval == expected
    writes = total // interval + (total % interval != 0)  # and the end's
    assert every is not None or writes <= ckpt_io.CHECKPOINTS_PER_RUN and interval % eval_every == 0


def test_a_best_rewritten_with_the_same_weights_keeps_its_evaluation_and_other_weights_drop_it(
    tmp_path, tiny_model_cfg
):
    cfg = tiny_model_cfg()
    model = GPT(cfg, seed=0)
    write = lambda m: ckpt_io.save_best_weights(  # noqa: E731
        tmp_path, 7, ckpt_io.host_copy(m), config_yaml="", info={"step": 7}, keep_last=2
    )
    folder = write(model)
    (folder / "eval-test-fp32.json").write_text('{"loss": 3.25}\n')
    write(model)  # a resumed run passing step 7 again: the same bits
    assert (folder / "eval-test-fp32.json").read_text() == '{"loss": 3.25}\n'
    write(GPT(cfg, seed=1))  # other weights: what was measured is stale and goes with them
    assert not (folder / "eval-test-fp32.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "best-00000007"]


def test_a_best_folder_a_kill_left_aside_is_recovered_not_deleted(tmp_path, token_set, monkeypatch, capsys):
    run, _, _ = scripted_run(tmp_path, token_set, monkeypatch, "aside", [5, 3, 4, 4, 4, 4], checkpoint_every=3)
    ckpts = run / "checkpoints"
    before = {p.name: p.read_bytes() for p in (ckpts / "best-00000002").iterdir()}
    # killed between the two renames of a resumed run's rewrite of best-00000002: the pointer names a folder aside
    aside = ".best-00000002.old-host-4242-0a1b2c3d"
    (ckpts / "best-00000002").rename(ckpts / aside)
    (ckpts / ".best-00000002.tmp-host-4242-9f8e7d6c").mkdir()
    assert ckpt_io.tidy(ckpts) == [f"recovered best-00000002 from {aside}, left by a writer killed while replacing it"]
    assert {p.name: p.read_bytes() for p in (ckpts / "best-00000002").iterdir()} == before
    assert find_checkpoint(run, "best").name == "best-00000002"
    assert names(run) == ["best", "best-00000002", "latest", "step-00000003", "step-00000006"]
    # one without its weights is no best to restore: removed, and the pointer's fault said where it is read
    (ckpts / "best-00000002").rename(ckpts / aside)
    (ckpts / aside / "model.safetensors").unlink()
    assert ckpt_io.tidy(ckpts) == [] and not (ckpts / aside).exists()
