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
