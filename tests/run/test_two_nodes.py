"""Runs across two nodes (network namespaces, tests/run/netns.py) compute what one node computes, bit for bit."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT
from ddp import assert_same, ddp_yaml, results, same, torchrun, weights
from run.netns import Nodes, can_run

from gpt.config import load_config
from gpt.training.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.nodes]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
PORT = 29400  # the rendezvous, on node0's own address: no other test's port lives in these namespaces


@pytest.fixture(scope="module")
def nodes():
    if reason := can_run():
        pytest.skip(reason)
    with Nodes.start(2) as made:
        yield made


def on_nodes(nodes, argv_of, *launcher_args, rdzv_id="run", timeout=300):
    """``argv_of(launcher)`` on both nodes, each one torchrun agent meeting at node0; [(exit, stdout, stderr)]."""
    launcher = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
        *("--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.name(0)}:{PORT}", f"--rdzv-id={rdzv_id}", *launcher_args),
    ]
    procs = [
        nodes.popen(i, argv_of(launcher), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def train_on_nodes(nodes, config, *extra, **kw):
    return on_nodes(nodes, lambda launcher: [*launcher, str(ROOT / "train.py"), str(config), *extra], **kw)


@pytest.fixture(scope="module")
def runs(nodes, tmp_path_factory, token_set):
    """The same 12-step config trained three ways, once a module: on 2 nodes x 1 process (and the wall time
    of it), on 1 node x 2 processes, and in this process with twice the accumulation."""
    folder = tmp_path_factory.mktemp("nodes")
    start = time.monotonic()
    two_nodes = train_on_nodes(nodes, ddp_yaml(folder, token_set, "two_nodes"))
    seconds = time.monotonic() - start
    for code, _, err in two_nodes:
        assert code == 0, err[-3000:]
    start = time.monotonic()
    one_node = subprocess.run(
        torchrun("--standalone", "--nproc_per_node=2", config=ddp_yaml(folder, token_set, "one_node")),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"2 nodes x 1: {seconds:.1f} s; 1 node x 2: {time.monotonic() - start:.1f} s")
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    train(load_config(ddp_yaml(folder, token_set, "single")))
    return folder


def test_two_nodes_equal_one_node_of_two_bit_for_bit_and_one_process_closely(runs):
    summary = json.loads((runs / "two_nodes" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["segments"][0]["host"] == "node0"  # rank 0 ran on the first node
    two, one = results(runs / "two_nodes"), results(runs / "one_node")
    assert two[0] == one[0]  # every logged loss, exactly
    assert same(two[1], one[1]) and same(weights(runs / "two_nodes", 10), weights(runs / "one_node", 10))
    assert_same(results(runs / "single"), two)  # one process sums its micro-batches in another order


def test_evaluation_on_two_nodes_equals_one_process(nodes, runs, tmp_path):
    run = runs / "two_nodes"
    out = on_nodes(
        nodes, lambda launcher: [*launcher, str(ROOT / "evaluate.py"), str(run), "--json", str(tmp_path / "two.json")]
    )
    for code, _, err in out:
        assert code == 0, err[-3000:]
    one = subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), str(run), "--json", str(tmp_path / "one.json"), "--quiet"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    (a,), (b,) = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("one", "two"))
    assert a["world_size"] == 1 and b["world_size"] == 2
    assert a["loss"] == b["loss"] and a["targets_scored"] == b["targets_scored"]


# ------------------------------------------------------------------------------------ a node lost


def long_yaml(folder, token_set, name):
    """``ddp_yaml``'s config, 80 steps long, checkpointed every 10."""
    path = ddp_yaml(folder, token_set, name)
    path.write_text(path.read_text().replace("steps: 12", "steps: 80"))
    return path


def start_on_nodes(nodes, config, *launcher_args, rdzv_id, only=(0, 1)):
    """torchrun agents of ``config`` on nodes ``only``, each writing its output to ``<run>-node<i>.log``."""
    launcher = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
        *("--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.name(0)}:{PORT}", f"--rdzv-id={rdzv_id}", *launcher_args),
    ]
    argv = [*launcher, str(ROOT / "train.py"), str(config), "--resume", "auto"]
    logs = [config.with_name(f"{config.stem}-node{i}.log") for i in range(2)]
    return [nodes.popen(i, argv, env=ENV, stdout=subprocess.DEVNULL, stderr=logs[i].open("a")) for i in only], logs


@pytest.fixture(scope="module")
def straight(tmp_path_factory, token_set):
    """``long_yaml``'s run, uninterrupted, on 1 node x 2 processes (2 nodes compute the same bits): its last weights."""
    folder = tmp_path_factory.mktemp("straight")
    out = subprocess.run(
        torchrun("--standalone", "--nproc_per_node=2", config=long_yaml(folder, token_set, "straight")), env=ENV
    )
    assert out.returncode == 0
    return weights(folder / "straight", 80)


def lose_node_1(nodes, run, agents, logs, after=30):
    """Every process of node1 killed -9 once checkpoint ``after`` exists; the monotonic time it happened."""
    deadline = time.time() + 240
    while not (run / "checkpoints" / f"step-{after:08d}").is_dir():
        assert all(a.poll() is None for a in agents) and time.time() < deadline, logs[0].read_text()[-3000:]
        time.sleep(0.05)
    assert nodes.kill_node(1)
    return time.monotonic()


def said_lost(log):
    """The survivor's line on the lost node (exactly one), from a node's log, after asserting it holds no traceback
    of ours."""
    text = log.read_text()
    assert "[rank" not in text and "connectFullMesh" not in text, text[-3000:]
    (said,) = [line for line in text.splitlines() if line.startswith("lost node")]
    assert re.match(  # gloo says reset or closed, as the kill fell
        r"lost node node1 \(rank 1; Connection (reset|closed) by peer from 10\.77\.0\.2: its node down, its network "
        r"cut, or its process killed\?\) at step \d+; rank 0 stops too: ",
        said,
    ), said
    return said


def test_a_node_lost_under_max_restarts_is_restarted_on_both_and_resumes(nodes, tmp_path, token_set, straight):
    cfg = long_yaml(tmp_path, token_set, "lost")
    run = tmp_path / "lost"
    agents, logs = start_on_nodes(nodes, cfg, "--max-restarts=1", rdzv_id="lost")
    lost_at = lose_node_1(nodes, run, agents, logs)
    # node0's agent restarts its worker and waits at the rendezvous for the node's return (a scheduler's, or ours)
    (again,), _ = start_on_nodes(nodes, cfg, "--max-restarts=1", rdzv_id="lost", only=(1,))
    while not any(json.loads(line)["step"] > 40 for line in (run / "metrics.jsonl").read_text().splitlines()):
        assert agents[0].poll() is None and time.monotonic() < lost_at + 240, logs[0].read_text()[-3000:]
        time.sleep(0.05)
    print(f"from the node's loss to the first resumed step logged: {time.monotonic() - lost_at:.1f} s")
    assert agents[0].wait(timeout=240) == 0 and again.wait(timeout=60) == 0, logs[0].read_text()[-3000:]
    checkpoint = said_lost(logs[0]).rsplit("checkpoint ", 1)[1]
    assert said_lost(logs[0]).endswith(
        f"rank 0 stops too: torchrun restarts the group (1 restart(s) left) and --resume auto continues from "
        f"checkpoint {checkpoint}"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert [s["from_step"] for s in summary["segments"]] == [0, int(checkpoint.removeprefix("step-"))]
    assert same(weights(run, 80), straight)


def test_a_node_lost_without_restarts_is_continued_by_a_rerun(nodes, tmp_path, token_set, straight):
    cfg = long_yaml(tmp_path, token_set, "rerun")
    run = tmp_path / "rerun"
    agents, logs = start_on_nodes(nodes, cfg, rdzv_id="rerun")
    lose_node_1(nodes, run, agents, logs)
    assert agents[0].wait(timeout=120) != 0
    said = said_lost(logs[0])
    assert said.endswith("(torchrun --max-restarts=N does it by itself)") and "rerun with --resume auto" in said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"] == said
    agents, logs = start_on_nodes(nodes, cfg, rdzv_id="rerun-2")
    assert [a.wait(timeout=240) for a in agents] == [0, 0], logs[0].read_text()[-3000:]
    assert same(weights(run, 80), straight)


# ------------------------------------------------------------------------------------ nodes that differ


def refused(nodes, tmp_path, argv_of_node, private=()):
    """Both nodes' agents started (node i runs ``argv_of_node(i, launcher)``; node1 with ``private`` folders of
    its own); both must fail; node0's one error line, after asserting no worker printed a traceback."""
    launcher = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
        *("--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.name(0)}:{PORT}", f"--rdzv-id={tmp_path.name}"),
    ]
    procs = [
        nodes.popen(
            i,
            argv_of_node(i, launcher),
            private=private if i == 1 else (),
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode != 0 for p in procs] == [True, True], outs
    assert all("[rank" not in err for err in outs), outs[0][-3000:]
    (line,) = [line for line in outs[0].splitlines() if line.startswith("error:")]
    return line


def runs_yaml(tmp_path, token_set, name):
    """``ddp_yaml``'s config, writing its run into tmp_path/runs/name."""
    path = ddp_yaml(tmp_path, token_set, name)
    path.write_text(path.read_text().replace(f"dir: {tmp_path / name}", f"dir: {tmp_path / 'runs' / name}"))
    return path


def test_a_node_with_another_config_is_refused_before_anything_is_written(nodes, tmp_path, token_set):
    cfg = runs_yaml(tmp_path, token_set, "configs")
    other = tmp_path / "other.yaml"
    other.write_text(cfg.read_text().replace("lr: 1.0e-2", "lr: 3.0e-2"))
    line = refused(
        nodes, tmp_path, lambda i, launcher: [*launcher, str(ROOT / "train.py"), str(cfg if i == 0 else other)]
    )
    assert line == (
        "error: rank 1 on node1 has another config than rank 0 on node0 (optim.lr: 0.01 on node0, 0.03 there): "
        "every node must read the same config file with the same --set options (keep it on the shared file system), "
        "then rerun"
    )
    assert not (tmp_path / "runs" / "configs").exists()


def test_a_node_with_other_code_is_refused(nodes, tmp_path, token_set):
    cfg = runs_yaml(tmp_path, token_set, "code")
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "gpt", copy / "gpt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "train.py", copy / "train.py")
    with (copy / "gpt" / "model" / "norms.py").open("a") as f:
        f.write("# another version\n")
    line = refused(
        nodes, tmp_path, lambda i, launcher: [*launcher, str((ROOT if i == 0 else copy) / "train.py"), str(cfg)]
    )
    assert line.startswith("error: rank 1 on node1 runs other code than rank 0 on node0 (source sha256 "), line
    assert line.endswith(
        "install the same checkout on every node (the same commit, or one copy on a shared file system), then rerun"
    )
    assert not (tmp_path / "runs" / "code").exists()


def test_a_run_folder_a_node_does_not_share_is_refused(nodes, tmp_path, token_set):
    cfg = runs_yaml(tmp_path, token_set, "own_disk")
    (tmp_path / "runs").mkdir()
    line = refused(
        nodes, tmp_path, lambda i, launcher: [*launcher, str(ROOT / "train.py"), str(cfg)], private=(tmp_path / "runs",)
    )
    assert line == (
        f"error: rank 1 on node1 does not see what rank 0 on node0 writes in {tmp_path / 'runs'} (a folder on each "
        "node's own disk?): put run.dir on a file system every node shares, or no other node can resume its "
        "checkpoints, then rerun"
    )
    assert list((tmp_path / "runs").iterdir()) == []  # the probe is gone, and nothing else was written


# ------------------------------------------------------------------------------------ before the job: preflight --nodes


def preflight(nodes, on, rendezvous, env_of=lambda i: {}):
    """``preflight --nodes 2 --rendezvous RENDEZVOUS`` started on each node in ``on`` at once; each one's
    (exit status, stdout, stderr)."""
    argv = [sys.executable, str(ROOT / "scripts" / "preflight.py"), "--nodes=2", f"--rendezvous={rendezvous}"]
    procs = [
        nodes.popen(i, [*argv, "--timeout=3"], env={**ENV, **env_of(i)}, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
        for i in on
    ]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, *out) for p, out in zip(procs, outs)]


def one_line(out):
    """The one ``error:`` line a failing preflight ends on, after asserting there is no traceback."""
    code, stdout, stderr = out
    assert code == 1 and stdout == "" and "Traceback" not in stderr and "frame #" not in stderr, stderr
    return stderr.splitlines()[-1]


def test_preflight_says_in_one_line_which_node_cannot_meet_the_others_and_why(nodes):
    met = preflight(nodes, (0, 1), f"node0:{PORT + 1}")
    assert [(code, out.split(" (")[0], err) for code, out, err in met] == [
        (0, f"preflight: node{i} met 1 other node(s) at node0:{PORT + 1} and a gloo all-reduce went through: ok", "")
        for i in (0, 1)
    ]
    # Each fault at a port of its own, all at once (gloo's gives up after ~25 s).
    with ThreadPoolExecutor(4) as pool:
        unknown, unreachable, alone, apart = pool.map(
            lambda args: preflight(nodes, *args),
            [
                ((1,), f"nosuchnode:{PORT + 2}"),
                ((1,), f"node0:{PORT + 3}"),  # nothing listens there
                ((0,), f"node0:{PORT + 4}"),
                # both nodes advertise their loopback to gloo: they meet at the rendezvous, not each other
                ((0, 1), f"node0:{PORT + 5}", lambda i: {"GLOO_SOCKET_IFNAME": "lo"}),
            ],
        )
    assert one_line(unknown[0]) == (
        "error: preflight: the rendezvous host 'nosuchnode' does not resolve on node1: give the first node's name as "
        "the other nodes resolve it (DNS or /etc/hosts on every node), or its address"
    )
    assert one_line(unreachable[0]) == (
        f"error: preflight: node1 cannot reach the rendezvous at node0:{PORT + 3} (10.77.0.1) in 3 s: is the job "
        "running on node0, does node0 take that address as its own (torchrun: --rdzv-conf is_host=true there "
        f"otherwise), and is port {PORT + 3} open between the nodes?"
    )
    assert one_line(alone[0]) == (
        f"error: preflight: only 1 of 2 nodes reached the rendezvous at node0:{PORT + 4} in 3 s (node0): start the "
        f"job on every node (--nnodes 2); a node that cannot reach node0:{PORT + 4} says so itself"
    )
    for i, out in enumerate(apart):
        line = one_line(out)
        assert line.startswith(f"error: preflight: gloo across 2 nodes failed on node{i} ("), line
        assert line.endswith(
            f"node{i} advertises the address of GLOO_SOCKET_IFNAME=lo: the nodes reach the rendezvous but not each "
            "other there; set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface the nodes share (e.g. eth0), "
            "and open the ports between the nodes (gloo and NCCL pick theirs at random)"
        )
