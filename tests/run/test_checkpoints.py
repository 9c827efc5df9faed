"""Checkpoint retention (gpt.run.checkpoints): the last keep_last and every pointed-to checkpoint stay, no more."""

import torch

from gpt.run.checkpoints import checkpoint_name, read_pointer, save_checkpoint, step_folders


def test_retention_keeps_the_last_keep_last_and_the_best_and_no_more(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (10, 20, 30, 40, 50):
        save_checkpoint(tmp_path, step, model, state={}, config_yaml="", info={"step": step}, keep_last=2,
                        is_best=step == 10)  # fmt: skip
        kept = [p.name for p in step_folders(tmp_path)]
        expected = {checkpoint_name(10), *(checkpoint_name(s) for s in (step - 10, step) if s >= 10)}
        assert kept == sorted(expected), kept
    assert read_pointer(tmp_path, "latest") == tmp_path / checkpoint_name(50)
    assert read_pointer(tmp_path, "best") == tmp_path / checkpoint_name(10)


def test_a_checkpoints_evaluations_are_read_once_and_handed_out_again(tmp_path):
    """A sweep's release, the model card and the dataset share one ``Evaluations`` of a checkpoint: each result
    is read from the disk once (it used to be read three times, by three modules)."""
    from gpt.run.directory import Evaluations, write_eval_result

    ckpt = tmp_path / "step-00000010"
    ckpt.mkdir()
    write_eval_result(ckpt, {"split": "test", "precision": "fp32", "loss": 3.25})
    write_eval_result(ckpt, {"split": "hellaswag", "precision": "fp32", "acc": 0.3})
    evaluations = Evaluations(ckpt)
    assert [p.name for p in evaluations.files] == ["eval-hellaswag-fp32.json", "eval-test-fp32.json"]
    first = evaluations.result("test")
    (ckpt / "eval-test-fp32.json").write_text('{"loss": 9}')  # changed on the disk after the first read
    assert evaluations.result("test") is first and first["loss"] == 3.25
    assert evaluations.result("hellaswag")["acc"] == 0.3 and evaluations.result("test", "bf16") is None
