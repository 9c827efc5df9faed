"""DDP under torchrun (gloo, CPU) optimises exactly like one process with more accumulation."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import ROOT
from safetensors.torch import load_file

from gpt.run.directory import find_checkpoint

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*launcher_args, config):
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, str(ROOT / "train.py"), str(config)]


def results(run_dir):
    losses = [json.loads(line)["train_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return losses, load_file(str(find_checkpoint(run_dir) / "model.safetensors"))


def assert_same(single, multi):
    (la, wa), (lb, wb) = single, multi
    assert len(la) == len(lb) == 12
    for a, b in zip(la, lb):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5


@pytest.fixture
def ddp_cfg(train_yaml, tmp_path):
    def make(name):
        text = train_yaml(name).read_text().replace("steps: 20", "steps: 12").replace("eval_every: 10", "eval_every: 6")
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        return path

    return make


@pytest.fixture
def single(ddp_cfg, tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), str(ddp_cfg("single"))],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "single" / "summary.json").read_text())["world_size"] == 1
    return results(tmp_path / "single")


def test_two_processes_equal_one_with_twice_the_accumulation(ddp_cfg, single, tmp_path):
    out = subprocess.run(
        torchrun("--standalone", "--nproc_per_node=2", config=ddp_cfg("ddp")),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["status"] == "completed"
    assert_same(single, results(tmp_path / "ddp"))


def test_two_nodes_with_a_rendezvous_equal_one_process(ddp_cfg, single, tmp_path):
    cfg = ddp_cfg("nodes")
    port = free_port()
    procs = [
        subprocess.Popen(
            torchrun(
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={i}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=nodes-test",
                config=cfg,
            ),
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert json.loads((tmp_path / "nodes" / "summary.json").read_text())["world_size"] == 2
    assert_same(single, results(tmp_path / "nodes"))


def test_a_resume_on_another_world_size_is_a_new_segment(ddp_cfg, single, tmp_path):
    # one process trained to step 10; two finish the run from there, with the same global batch
    run = tmp_path / "single"
    shutil.rmtree(run / "checkpoints" / "step-00000012")
    (run / "checkpoints" / "latest").write_text("step-00000010\n")
    (run / "checkpoints" / "best").unlink()
    out = subprocess.run(
        [*torchrun("--standalone", "--nproc_per_node=2", config=ddp_cfg("single")), "--resume", "auto"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert [(s["from_step"], s["hardware"]["world_size"], s["train"]["grad_accum"]) for s in summary["segments"]] == [
        (0, 1, 2),
        (10, 2, 1),
    ]
    assert_same(single, results(run))  # the reader gives every world size the same batches
