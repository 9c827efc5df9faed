"""train.py --dry-run says what a run spends besides its training steps: validations, checkpoint writes (how many,
their bytes) and stats steps, each with its share of the run under the assumptions it names."""

import re

import pytest
import torch
from synthetic import CONFIGS

from gpt.config import load_config
from gpt.model.gpt import GPT
from gpt.speed.overheads import checkpoint_bytes, count_steps, overhead_lines


def gpt2_small():
    cfg = load_config(CONFIGS / "gpt2-small.yaml")
    with torch.device("meta"):  # shapes and counts only: GPT-2 small without allocating it
        return cfg, GPT(cfg.model, seed=None)


def test_gpt2_small_on_8_gpus_states_its_checkpoint_writes_validations_and_stats_steps():
    cfg, model = gpt2_small()
    whole, weights = checkpoint_bytes(model)
    assert weights == 163_009_536 * 4 + (50_304 - 50_257) * 768 * 4  # fp32, the head's padded rows included
    assert whole == weights + 2 * 163_009_536 * 4 + 2 * (50_304 - 50_257) * 768 * 4  # AdamW's two moments
    lines = overhead_lines(cfg, model, 8)
    assert lines[0].startswith("overheads on 8 GPUs (estimates: H100 bf16 peak 989 TFLOP/s at 40% MFU")
    minutes = float(re.search(r"training steps: 33,157 in ([\d.]+) min", lines[1])[1])
    assert 13 < minutes < 16  # 3.26B tokens x 1.08 GFLOP / (8 x 989 TFLOP/s x 40%)
    assert "validation: 67 x 4,194,304 tokens (every 500 steps and the end)" in lines[2]
    said = "checkpoint writes: 10 (every 3,500 steps, train.checkpoint_every null: sized to the run, and the end) x "
    assert said in lines[3]
    assert "1.82 GiB = 18.2 GiB" in lines[3] and "at most 10 more writes, 6.1 GiB" in lines[3]
    share = float(re.search(r"([\d.]+)% of the training steps", lines[3])[1])
    assert 3 < share < 5  # 18.2 GiB at 0.5 GiB/s against ~14.7 minutes
    assert lines[4] == "  stats steps: 331 (every 100 steps)"  # not costed without a count
    cost = {"kernel_ops": 247, "forward_ops": 857, "host_reads": 1, "bytes_copied": weights}  # stats_step_cost's
    stats = overhead_lines(cfg, model, 8, cost)[4]
    assert stats.startswith("  stats steps: 331 (every 100 steps) x (1,104 eager ops, 1 host read, 0.61 GiB of weights")
    found = re.search(r"~(\d+) ms while the other ranks wait\): [\d.]+ s, ([\d.]+)% of the training", stats)
    ms, share = found.groups()
    assert 10 < int(ms) < 20 and float(share) < 1  # 3.7 ms of forward, 11 ms of launches, 0.7 ms of copy


def test_the_counts_follow_the_loops_rules():
    assert count_steps(33_157, 500) == 67 and count_steps(1_000, 500) == 2 and count_steps(20, 10) == 2
    cfg, model = gpt2_small()
    cfg.train.checkpoint_every, cfg.log.stats_every = 617, 0  # as set in a config
    lines = overhead_lines(cfg, model, 1)
    assert "checkpoint writes: 54 (every 617 steps, and the end)" in lines[3]
    assert lines[0].startswith("overheads on 1 GPU ")
    assert lines[4] == "  stats steps: none (log.stats_every 0)"


def test_the_dry_run_prints_them(cli):
    out = cli("train", CONFIGS / "tiny.yaml", "--dry-run", "--gpus", "2", "--set", "train.global_batch_size=16")
    assert out.returncode == 0 and "overheads on 2 GPUs" in out.stdout, out.stderr
    assert "checkpoint writes: " in out.stdout and " 1 host read, " in out.stdout  # the stats step counted


def test_a_gpu_count_below_one_is_refused_in_one_line(cli):
    out = cli("train", CONFIGS / "tiny.yaml", "--dry-run", "--gpus", "0")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].endswith("argument --gpus: 0 is not a number of GPUs (1 or more)")


def test_a_gpu_count_the_batch_cannot_split_or_without_a_dry_run_is_refused(capsys, tmp_path):
    from gpt.commands.train import main

    assert main([str(CONFIGS / "gpt2-small.yaml"), "--dry-run", "--gpus", "7"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        "error: --gpus 7: train.global_batch_size 96 is not a multiple of train.micro_batch_size 12 x 7 GPUs; choose "
        "a global batch divisible by 84, or GPUs that split it: 1 2 4 8\n"
    )
    with pytest.raises(SystemExit) as e:  # a run's GPUs are torchrun's: --gpus would be ignored
        main([str(CONFIGS / "tiny.yaml"), "--gpus", "8", "--set", f"run.dir={tmp_path / 'r'}"])
    assert e.value.code == 2 and not (tmp_path / "r").exists()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("argument --gpus: the GPUs a --dry-run estimates for; add --dry-run (a run's GPUs are "
                         "torchrun's --nproc_per_node)")  # fmt: skip
