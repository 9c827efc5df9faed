"""What the tests of runs under torchrun share: the launcher's command, a 12-step config, a run's losses and
weights, and the comparisons (tests/run/test_distributed.py on one machine, tests/run/test_two_nodes.py across two)."""

import json
import socket
import sys

import torch
from safetensors.torch import load_file
from synthetic import ROOT, write_train_yaml

from gpt.run.directory import find_checkpoint


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*launcher_args, config):
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, str(ROOT / "train.py"), str(config)]


def ddp_yaml(folder, token_set, name):
    """``write_train_yaml``'s config, 12 steps long, validated every 6."""
    path = write_train_yaml(folder, token_set, name)
    path.write_text(path.read_text().replace("steps: 20", "steps: 12").replace("eval_every: 10", "eval_every: 6"))
    return path


def results(run_dir):
    """(train losses, the newest checkpoint's weights) of a run."""
    losses = [json.loads(line)["train_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return losses, load_file(str(find_checkpoint(run_dir) / "model.safetensors"))


def assert_same(single, multi):
    """Two runs' ``results`` agree within 1e-5 (one process against several: the sums' order differs)."""
    (la, wa), (lb, wb) = single, multi
    assert len(la) == len(lb) == 12
    for a, b in zip(la, lb):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5


def weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def same(a, b):
    """Two state dicts bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
