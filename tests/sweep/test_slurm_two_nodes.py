"""SLURM across two nodes: a slurmd in each of two network namespaces (tests/run/netns.py), their controller on
the first, the commands run there as on a login node. ``scripts/slurm_train.sbatch`` and a ``sweep.py --launcher
slurm --nodes 2`` cell each run one torchrun agent per node, are requeued mid-run, resume on both nodes and end bit
for bit where the same config ends on one node of two processes."""

import json
import os
import re
import subprocess
import sys

import pytest
from ddp import same
from run.netns import Nodes, can_run, namespaces
from safetensors.torch import load_file
from sweep.local_slurm import LocalSlurm
from sweep.slurm_fixtures import meanwhile
from synthetic import ROOT, sized_grid_yaml, write_train_yaml

from gpt.run.directory import find_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.nodes, pytest.mark.serial]

STEPS = 120  # long enough to be requeued after its first checkpoints (every 20)


@pytest.fixture(scope="module")
def cluster(slurm_installed, tmp_path_factory):
    """Two nodes and their SLURM for the module; afterwards no namespace, daemon or job process of theirs is left."""
    if reason := can_run():
        pytest.skip(reason)
    prefix = f"sl{os.getpid()}"
    with (
        Nodes.start(2, prefix=prefix) as nodes,
        LocalSlurm.start(tmp_path_factory.mktemp("slurm2"), nodes=nodes) as made,
    ):
        yield made
    assert not {ns for ns in namespaces() if ns.startswith(prefix)}
    assert made.leftover_pids() == []


def config(folder, token_set, name):
    return sized_grid_yaml(write_train_yaml(folder, token_set, name), steps=STEPS, checkpoint_every=20, eval_every=60)


def env_of(cluster):
    return {**cluster.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHON": sys.executable}


def one_node(yaml):
    """The config on one node of two processes (this machine, torchrun --standalone), to its end."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", yaml]
    done = subprocess.run(
        [str(a) for a in argv], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


def final_weights(run):
    return load_file(str(find_checkpoint(run) / "model.safetensors"))


def checkpoints_reached(run, step):
    metrics = run / "metrics.jsonl"
    return metrics.is_file() and any(json.loads(x)["step"] >= step for x in metrics.read_text().splitlines())


def requeue_and_release(cluster, job, run):
    """Once ``run`` is past its second checkpoint: ``scontrol requeue`` (every task on both nodes gets SIGTERM: the
    ranks checkpoint and stop), then let the requeued job start at once."""
    cluster.wait_until(lambda: checkpoints_reached(run, 41), 300, f"{run.name} past step 40")
    cluster.run("scontrol", "requeue", job)
    cluster.wait_until(lambda: cluster.job(job).get("Restarts") == "1", 60, "the requeue")
    cluster.wait_until(lambda: cluster.state(job) == "PENDING", 60, "the requeued job waiting")
    cluster.release(job)


def test_the_sbatch_script_on_two_nodes_requeued_ends_as_on_one_node(cluster, tmp_path, token_set):
    two, one = config(tmp_path, token_set, "two"), config(tmp_path, token_set, "one")
    out = tmp_path / "job.out"
    job = cluster.submit(
        *(
            f"--chdir={ROOT}",
            f"--output={out}",
            "--open-mode=append",
            "--gpus-per-node=0",
            "--cpus-per-task=1",
            "--export=ALL",
        ),
        str(ROOT / "scripts" / "slurm_train.sbatch"),
        str(two),
        env=env_of(cluster) | {"NPROC_PER_NODE": "1"},
    )
    one_node(one)  # meanwhile
    requeue_and_release(cluster, job, tmp_path / "two")
    cluster.wait_until(lambda: cluster.state(job) == "COMPLETED", 600, "the job's end")
    log = out.read_text()
    assert len(re.findall(r"met 1 other node\(s\) at node0:\d+ and a gloo all-reduce went through: ok", log)) == 4
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert len(summary["segments"]) == 2 and summary["segments"][1]["from_step"] >= 40
    assert {s["host"] for s in summary["segments"]} == {"node0"}  # rank 0 on the first node, both times
    ours, theirs = final_weights(tmp_path / "two"), final_weights(tmp_path / "one")
    assert same(ours, theirs)


def test_a_sweep_cell_on_two_nodes_requeued_ends_as_on_one_node(cluster, tmp_path, token_set):
    grid = config(tmp_path, token_set, "twogrid")
    sweep = [sys.executable, "-m", "gpt.commands.sweep", str(grid), "--norm-types", "pytorch_layernorm", "no_norm"]
    sweep += ["--seeds", "0"]
    env = env_of(cluster)
    submitted = subprocess.run(
        cluster.on_node([*sweep, "--launcher", "slurm", "--nodes", "2"]),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    local = [*sweep, "--nproc", "2", "--runs-dir", "local"]  # one node of two processes, meanwhile
    meanwhile(local, tmp_path, env, lambda: requeue_a_cell(cluster, tmp_path))
    runs = tmp_path / "runs"
    jobs = json.loads((runs / "twogrid-slurm" / "jobs.json").read_text())
    requeued = jobs["cells"]["twogrid-pytorch-layernorm-s0"]
    assert cluster.job(requeued)["NodeList"] == "node[0-1]"
    events = (runs / "twogrid-slurm" / "events" / "twogrid-pytorch-layernorm-s0.jsonl").read_text()
    assert [e["outcome"] for e in map(json.loads, events.splitlines()) if e["event"] == "end"] == ["requeued", "done"]
    for cell in jobs["cells"]:
        summary = json.loads((runs / cell / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["world_size"] == 2, cell
        assert same(final_weights(runs / cell), final_weights(tmp_path / "local" / cell)), cell
    ours = json.loads((runs / "twogrid-comparison" / "comparison.json").read_text())
    theirs = json.loads((tmp_path / "local" / "twogrid-comparison" / "comparison.json").read_text())
    assert [g["test_loss_mean"] for g in ours["groups"]] == [g["test_loss_mean"] for g in theirs["groups"]]


def requeue_a_cell(cluster, tmp_path):
    """The first cell of the sweep, signalled past step 40 as before its time limit: it checkpoints and requeues
    itself, and resumes on both nodes; waits for the comparison."""
    runs = tmp_path / "runs"
    jobs = json.loads((runs / "twogrid-slurm" / "jobs.json").read_text())
    requeued = jobs["cells"]["twogrid-pytorch-layernorm-s0"]
    cluster.wait_until(lambda: checkpoints_reached(runs / "twogrid-pytorch-layernorm-s0", 41), 300, "cell 0")
    cluster.signal(requeued, "USR1")  # what SLURM sends before the time limit: checkpoint, requeue itself
    cluster.wait_until(lambda: cluster.job(requeued).get("Restarts") == "1", 60, "the requeue")
    cluster.wait_until(lambda: cluster.state(requeued) == "PENDING", 60, "the requeued cell waiting")
    cluster.release(requeued)
    cluster.wait_until(lambda: cluster.state(jobs["compare"]) == "COMPLETED", 600, "the comparison")


def test_a_cell_whose_nodes_cannot_meet_fails_with_the_preflight_line_and_trains_nothing(cluster, tmp_path, token_set):
    grid = config(tmp_path, token_set, "apart")
    sweep = [sys.executable, "-m", "gpt.commands.sweep", str(grid), "--norm-types", "pytorch_layernorm", "no_norm"]
    env = env_of(cluster) | {"GLOO_SOCKET_IFNAME": "nosuch0"}  # an interface no node has, passed on to the jobs
    submitted = subprocess.run(
        cluster.on_node([*sweep, "--seeds", "0", "--launcher", "slurm", "--nodes", "2"]),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = json.loads((tmp_path / "runs" / "apart-slurm" / "jobs.json").read_text())
    cluster.wait_until(
        lambda: cluster.state(jobs["compare"]) == "FAILED", 300, "the comparison, with nothing to compare"
    )
    for cell, job in jobs["cells"].items():
        assert (cluster.job(job)["JobState"], cluster.job(job)["Restarts"]) == ("FAILED", "0"), cell
        events = (tmp_path / "runs" / "apart-slurm" / "events" / f"{cell}.jsonl").read_text()
        end = json.loads(events.splitlines()[-1])
        assert end["outcome"] == "failed" and end["error"].startswith(
            "error: preflight: gloo across 2 nodes failed on node"
        )
        assert end["error"].endswith("(gloo and NCCL pick theirs at random)"), end["error"]
        assert not (tmp_path / "runs" / cell).exists()  # nothing trained, no run folder
    said = (tmp_path / "runs" / "apart-slurm" / "logs" / f"apart-compare-{jobs['compare']}.out").read_text()
    assert said.splitlines()[-1].startswith(
        "error: no cell has a run to compare: apart-pytorch-layernorm-s0: error: preflight: gloo across 2 nodes"
    )
