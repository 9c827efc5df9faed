"""scripts/sweep.py: a grid of tiny runs; reruns skip finished cells and resume interrupted ones."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from analysis.test_compare import render_only
from conftest import ROOT
from safetensors.torch import load_file

from gpt.common.errors import UserError
from gpt.run.directory import find_checkpoint
from gpt.sweep.launch import run_sweep


@pytest.fixture
def grid_cfg(train_yaml, tmp_path):
    """6 steps, a checkpoint and a validation every 3; validation on 512 tokens and the test on 1024 (what is
    tested here does not depend on how many)."""
    text = (
        train_yaml("grid")
        .read_text()
        .replace("steps: 20", "steps: 6")
        .replace("checkpoint_every: 10", "checkpoint_every: 3")
        .replace("eval_every: 10", "eval_every: 3")
        .replace("val_tokens: 2048", "val_tokens: 512")
    )
    assert "val_tokens: 512" in text
    path = tmp_path / "grid.yaml"
    path.write_text(text.replace("data: {path:", "data: {test_tokens: 1024, path:"))
    return path


@pytest.fixture
def in_process(monkeypatch):
    """The cells trained in this process on one thread (a tiny model's steps are several times faster than on
    two threads contending for two cores) and the comparison's charts drawn but not rendered (not looked at)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    render_only(monkeypatch)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_sweep_skips_completed_and_resumes_interrupted(grid_cfg, tmp_path, in_process):
    runs = tmp_path / "runs"
    lines = []
    result = run_sweep(grid_cfg, ["pytorch_layernorm", "dyt"], [0], runs, log=lines.append)
    names = ["grid-pytorch-layernorm-s0", "grid-dyt-s0"]
    assert sorted(p.name for p in runs.iterdir()) == sorted(names + ["grid-comparison"])
    assert [g["group"] for g in result["groups"]] == ["pytorch_layernorm", "dyt"]
    assert all(g["n_evaluated"] == 1 for g in result["groups"])
    assert (runs / "grid-comparison" / "comparison.md").is_file()
    assert sum("test loss" in line for line in lines) == 2
    done = runs / "grid-dyt-s0"
    final = load_file(str(find_checkpoint(done) / "model.safetensors"))
    metrics_before = (runs / names[0] / "metrics.jsonl").read_text()

    # make the dyt cell look interrupted after step 3: its last checkpoint is step 3
    ckpts = done / "checkpoints"
    shutil.rmtree(ckpts / "step-00000006")
    (ckpts / "latest").write_text("step-00000003\n")
    (ckpts / "best").write_text("step-00000003\n")
    summary = json.loads((done / "summary.json").read_text())
    (done / "summary.json").write_text(json.dumps({**summary, "status": "interrupted", "steps": 3}))

    lines.clear()
    again = run_sweep(grid_cfg, ["pytorch_layernorm", "dyt"], [0], runs, log=lines.append)
    assert lines[0] == "[1/2] grid-pytorch-layernorm-s0: completed, skipped"
    assert lines[1] == "[2/2] grid-dyt-s0: resuming"
    assert (runs / names[0] / "metrics.jsonl").read_text() == metrics_before  # not retrained
    assert json.loads((done / "summary.json").read_text())["status"] == "completed"
    resumed = load_file(str(find_checkpoint(done) / "model.safetensors"))
    assert all((resumed[k] == final[k]).all() for k in final)  # the same weights as the first time
    assert [json.loads(line)["step"] for line in (done / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))
    assert [g["test_loss_mean"] for g in again["groups"]] == [g["test_loss_mean"] for g in result["groups"]]

    # a diverged cell is a result too: a rerun leaves it as it is
    (done / "summary.json").write_text(
        json.dumps({**json.loads((done / "summary.json").read_text()), "status": "diverged"})
    )
    dyt_metrics = (done / "metrics.jsonl").read_text()
    lines.clear()
    run_sweep(grid_cfg, ["pytorch_layernorm", "dyt"], [0], runs, log=lines.append)
    assert lines[:2] == ["[1/2] grid-pytorch-layernorm-s0: completed, skipped", "[2/2] grid-dyt-s0: diverged, skipped"]
    assert (done / "metrics.jsonl").read_text() == dyt_metrics


def test_dry_run_prints_commands(grid_cfg, tmp_path, cli):
    args = [grid_cfg, "--norm-types", "no_norm", "--seeds", "1", "2", "--nproc", "2", "--runs-dir", tmp_path / "r"]
    out = cli(
        ROOT / "scripts" / "sweep.py", *args, "--baseline", "no_norm", "--equivalence-margin", "0.01", "--dry-run"
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 5 and not (tmp_path / "r").exists()
    assert "torch.distributed.run --standalone --nproc_per_node=2" in lines[0]
    assert "--set model.norm_type=no_norm --set train.seed=1 --set run.name=grid-no-norm-s1" in lines[0]
    assert (
        lines[0].endswith("--resume auto")
        and "-m gpt.commands.evaluate" in lines[1]
        and "-m gpt.commands.compare" in lines[4]
    )
    assert lines[4].endswith(f"--out {tmp_path / 'r' / 'grid-comparison'} --baseline no_norm --equivalence-margin 0.01")


@pytest.mark.slow
def test_crossed_seeds_split_the_noise(grid_cfg, tmp_path, in_process):
    runs = tmp_path / "runs"
    result = run_sweep(
        grid_cfg, ["pytorch_layernorm"], [0], runs, init_seeds=[0, 1], data_seeds=[3, 4], log=lambda line: None
    )
    names = sorted(p.name for p in runs.iterdir() if p.name != "grid-comparison")
    assert names == [
        "grid-pytorch-layernorm-i0-s3",
        "grid-pytorch-layernorm-i0-s4",
        "grid-pytorch-layernorm-i1-s3",
        "grid-pytorch-layernorm-i1-s4",
    ]
    [group] = result["groups"]
    assert group["seeds"] == ["0/3", "0/4", "1/3", "1/4"]
    losses = [r["test_loss"] for r in group["runs"]]
    assert len(set(losses)) == 4  # the initial weights and the data order each change the result
    noise = group["noise_sources"]
    assert (noise["init_seeds"], noise["data_seeds"], noise["missing"]) == ([0, 1], [3, 4], [])
    init_means = [(losses[0] + losses[1]) / 2, (losses[2] + losses[3]) / 2]
    ms_init = 2 * sum((m - sum(losses) / 4) ** 2 for m in init_means)  # 1 degree of freedom
    residual = noise["components"]["residual"]["mean_square"]
    assert noise["components"]["init"]["estimate"] == pytest.approx((ms_init - residual) / 2)
    md = (runs / "grid-comparison" / "comparison.md").read_text()
    assert "pytorch_layernorm: 2 initialisation seeds x 2 data-order seeds" in md
    with pytest.raises(UserError, match="--init-seeds and --data-seeds go together"):
        run_sweep(grid_cfg, ["dyt"], [0], runs, init_seeds=[0, 1])
    with pytest.raises(
        UserError, match=r"--data-seeds needs at least two different seeds to split the noise \(got 3 3\)"
    ):
        run_sweep(grid_cfg, ["dyt"], [0], runs, init_seeds=[0, 1], data_seeds=[3, 3])


def test_dry_run_of_crossed_seeds(grid_cfg, tmp_path, capsys):
    from gpt.commands.sweep import main

    assert (
        main(
            [
                str(grid_cfg),
                "--norm-types",
                "no_norm",
                "--init-seeds",
                "0",
                "1",
                "--data-seeds",
                "5",
                "6",
                "--runs-dir",
                str(tmp_path / "r"),
                "--allow-differ",
                "hardware.name",
                "--dry-run",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    trains = [line for line in lines if "-m gpt.commands.train" in line]
    assert len(trains) == 4 and not (tmp_path / "r").exists()
    assert "--set train.seed=6 --set model.init_seed=1 --set run.name=grid-no-norm-i1-s6" in trains[3]
    assert lines[-1].endswith("--allow-differ hardware.name") and "-m gpt.commands.compare" in lines[-1]


@pytest.mark.slow
def test_push_to_hub_publishes_the_sweep_at_its_end(grid_cfg, tmp_path, hub, cli):
    runs = tmp_path / "runs"
    sweep = [ROOT / "scripts" / "sweep.py", grid_cfg, "--norm-types", "pytorch_layernorm", "--seeds", "0"]
    sweep += ["--runs-dir", runs]
    refused = cli(*sweep, "--push-to-hub", "bad name")
    assert refused.returncode == 2 and "which the Hub refuses" in refused.stderr and not runs.exists()  # no training
    dry = cli(*sweep, "--push-to-hub", "me", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1].endswith(
        f"scripts/publish_sweep.py {runs} --namespace me --comparison {runs / 'grid-comparison'}"
    )
    # a process of its own: huggingface_hub reads HF_ENDPOINT (the test's Hub) when it is first imported
    argv = [sys.executable, *map(str, sweep), "--push-to-hub", "me"]
    out = subprocess.run(argv, env=hub.env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert set(hub.repos) == {"me/grid-pytorch-layernorm-s0", "datasets/me/grid-comparison"}
    (collection,) = hub.collections.values()
    assert [i["id"] for i in collection["items"]] == ["me/grid-comparison", "me/grid-pytorch-layernorm-s0"]
