"""What the loop waits for. A log step reads its numbers back from the device once: the losses, the window's mean,
the gradient norm and the divergence counters stacked into one tensor, after one all-reduce (each read is a wait
for the GPU). At the end the ranks meet before rank 0 waits for its uploads, which then hold no other rank."""

import torch
from conftest import write_train_yaml

from gpt.config import load_config
from gpt.run.distributed import Dist
from gpt.training.hooks import RunHooks
from gpt.training.loop import Trainer, train

READS = ("tolist", "item", "__float__", "__int__", "__bool__")  # every way a tensor's value reaches Python


def test_a_log_step_reads_the_device_once(tmp_path, token_set, monkeypatch):
    yaml = write_train_yaml(tmp_path, token_set, "reads")
    text = yaml.read_text().replace("steps: 20", "steps: 6").replace("log_every: 1", "log_every: 2, stats_every: 0")
    text = text.replace("eval_every: 10", "eval_every: 6")
    yaml.write_text(text.replace("checkpoint_every: 10", "checkpoint_every: 6"))
    reads, inside = {}, []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(t, *a, original=original, **k):
            if inside:
                reads[inside[-1]] = reads.get(inside[-1], 0) + 1
            return original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for method in ("log_record", "check_divergence"):
        original = getattr(Trainer, method)

        def watched(self, *a, original=original, **k):
            inside.append(self.progress.step)
            try:
                return original(self, *a, **k)
            finally:
                inside.pop()

        monkeypatch.setattr(Trainer, method, watched)
    all_reduces = []
    monkeypatch.setattr("gpt.run.distributed.Dist.all_sum", lambda self, t: all_reduces.append(t.numel()) or t)
    summary = train(load_config(yaml))
    assert summary["status"] == "completed"
    assert reads == {1: 1, 2: 1, 4: 1, 6: 1}  # the first step, every log step, the last: one read each
    assert all_reduces[:3] == [3, 3, 3]  # one all-reduce a log step: its loss and the window's two sums


def test_the_ranks_meet_before_rank_0_waits_for_its_uploads(tmp_path, token_set):
    seen = []

    class Uploads(RunHooks):
        def finished(self, status, final, summary, stop=None):
            seen.append(dist.met)  # the meeting is behind: the other ranks are free to leave

    dist = Dist()
    yaml = write_train_yaml(tmp_path, token_set, "meets")
    yaml.write_text(yaml.read_text().replace("steps: 20", "steps: 2"))
    train(load_config(yaml), dist=dist, hooks=[Uploads()])
    assert seen == [True]
