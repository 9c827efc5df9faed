"""Stops and unwritable places: repeated signals, read-only folders, a Hub or wandb server that never
answers, resumes that must log what an uninterrupted run logs, hostile checkpoints, results kept per range.

Each test reproduces the fault and asserts the outcome: one line naming the problem, no traceback, the
run intact (its newest checkpoint loads, a resume ends where an uninterrupted run ends).
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, write_train_yaml
from hubserver import HubServer
from safetensors.torch import load_file

from gpt.analysis.table import compare
from gpt.config import load_config
from gpt.run.checkpoints import load_state, problem
from gpt.run.directory import find_checkpoint
from gpt.training.loop import train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMING = ("tokens_per_s", "elapsed_s")  # the only fields of a metric record that may differ after a resume


def run_cli(*args, env=None, **kw):
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600, env={**ENV, **(env or {})}, **kw
    )


def start_train(yaml, *args, env=None):
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), str(yaml), *map(str, args)],
        env={**ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline and not condition():
        time.sleep(0.02)
    assert condition(), "timed out waiting"


def logged(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def records(run_dir):
    """The metric records with the timing fields left out: what must not depend on a resume."""
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def weights(run_dir):
    return load_file(str(find_checkpoint(run_dir) / "model.safetensors"))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def long_yaml(train_yaml, tmp_path, name, steps=40, checkpoint_every=1000, log_every=5, extra=""):
    """A run that logs every ``log_every`` steps: the loss window spans several steps."""
    text = (
        train_yaml(name)
        .read_text()
        .replace("steps: 20", f"steps: {steps}")
        .replace("checkpoint_every: 10", f"checkpoint_every: {checkpoint_every}")
        .replace("eval_every: 10", "eval_every: 1000")
        .replace("log_every: 1", f"log_every: {log_every}")
    )
    path = tmp_path / f"{name}-long.yaml"
    path.write_text(text + extra)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, token_set):
    """The uninterrupted 40-step run every stopped run must end up equal to, trained once a module in a fresh
    process, as the stopped runs are (the same thread count). Read it, never change it. It checkpoints every 10
    steps (a test starts from its step 10): where a run checkpoints changes nothing it computes, so it is the
    reference of runs that checkpoint elsewhere, or only when stopped."""
    folder = tmp_path_factory.mktemp("reference")
    yaml = long_yaml(lambda name: write_train_yaml(folder, token_set, name), folder, "ref", checkpoint_every=10)
    out = run_cli(ROOT / "train.py", yaml)
    assert out.returncode == 0, out.stderr
    return folder / "ref"


# ----------------------------------------------------------------------------- signals


@pytest.mark.slow
def test_two_sigints_stop_cleanly_and_the_resume_ends_equal(train_yaml, tmp_path, reference):
    ref = reference
    yaml = long_yaml(train_yaml, tmp_path, "stop")
    proc = start_train(yaml)
    wait_for(lambda: logged(tmp_path / "stop") >= 3)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 4 and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted at step "), err
    run = tmp_path / "stop"
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    newest = find_checkpoint(run)
    assert problem(newest) is None and load_state(newest)["progress"]["step"] > 0  # it loads
    out = run_cli(ROOT / "train.py", yaml, "--resume", "auto")
    assert out.returncode == 0, out.stderr
    assert same_weights(weights(ref), weights(run))
    assert records(run) == records(ref)  # the loss window was in the checkpoint: the same means


@pytest.mark.slow
def test_a_third_signal_stops_at_once_in_one_line(train_yaml, tmp_path, reference):
    # a resumed run held at its start by a wandb server that never answers (60 s allowed): three Ctrl-Cs,
    # 0.3 s apart, and the third ends it there and then
    ref = reference
    yaml = long_yaml(train_yaml, tmp_path, "stop3")
    run = shutil.copytree(ref, tmp_path / "stop3")  # the reference, as a kill after its step 10 leaves it
    rewind_to(run, "step-00000010")
    server = silent_server()
    env = {k: v for k, v in ENV.items() if k != "WANDB_MODE"}
    env.update(
        WANDB_API_KEY="x" * 40,
        WANDB_BASE_URL=f"http://127.0.0.1:{server.getsockname()[1]}",
        WANDB_DIR=str(tmp_path / "wandb"),
        WANDB_INIT_TIMEOUT="60",
        WANDB_SILENT="true",
    )
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "train.py"),
                str(yaml),
                "--set",
                "log.wandb=true",
                "--set",
                "train.checkpoint_every=10",
                "--resume",
                "auto",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: (run / "summary.json").is_file())  # started: the run directory says "running"
        time.sleep(1)
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        _, err = proc.communicate(timeout=60)
    finally:
        server.close()
    ours = [line for line in err.splitlines() if not line.startswith("wandb:")]
    assert proc.returncode == 4 and "Traceback" not in err and len(ours) == 1, err
    assert ours[0] == (
        "stopped at once by a third stop signal (SIGINT); the newest checkpoint stands: --resume auto continues from it"
    ), err
    summary = json.loads((run / "summary.json").read_text())  # whole, never half-written
    assert summary["status"] == "interrupted" and summary["stop_reason"].startswith("stopped at once")
    assert not list((run / "checkpoints").glob(".tmp-*"))
    out = run_cli(ROOT / "train.py", yaml, "--set", "train.checkpoint_every=10", "--resume", "auto")
    assert out.returncode == 0, out.stderr
    assert same_weights(weights(ref), weights(run))


def rewind_to(run, step_name):
    """The run as a kill just after checkpoint ``step_name`` leaves it."""
    for ckpt in (run / "checkpoints").glob("step-*"):
        if ckpt.name > step_name:
            shutil.rmtree(ckpt)
    (run / "checkpoints" / "latest").write_text(step_name + "\n")
    (run / "checkpoints" / "best").unlink(missing_ok=True)
    (run / "summary.json").unlink()


@pytest.mark.slow
def test_kill_9_at_a_random_moment_and_resume_logs_what_an_uninterrupted_run_logs(train_yaml, tmp_path, reference):
    ref = reference
    yaml = long_yaml(train_yaml, tmp_path, "killed", checkpoint_every=7)
    proc = start_train(yaml)
    run = tmp_path / "killed"
    wait_for(lambda: (run / "checkpoints" / "latest").is_file())
    time.sleep(random.uniform(0.0, 0.5))
    proc.kill()
    proc.communicate()
    out = run_cli(ROOT / "train.py", yaml, "--resume", "auto")
    assert out.returncode == 0, out.stderr
    assert records(run) == records(ref)  # every step's train loss, grad norm, lr ... as uninterrupted
    assert same_weights(weights(ref), weights(run))


# ------------------------------------------------------------------ places that cannot be written


def immutable(path) -> bool:
    """chattr +i where the file system and the user allow it (root on ext4 does): a folder nothing may
    change, as a read-only mount is."""
    return (
        shutil.which("chattr") is not None
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    )


def one_line_error(out, *fragments):
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: "), out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_folder_that_cannot_be_written_is_one_line(train_yaml, tmp_path, cli):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    yaml = train_yaml()
    out = cli(ROOT / "train.py", yaml, "--set", f"run.dir={blocker / 'run'}")
    one_line_error(out, f"cannot write the run directory {blocker / 'run'}: Not a directory")
    assert blocker.read_text() == "not a folder" and not (tmp_path / "run").exists()
    # an existing run whose lock cannot be opened for writing (a read-only file system does this)
    train(load_config(yaml, ["train.steps=4", "train.checkpoint_every=2"]))
    run = tmp_path / "run"
    (run / ".lock").unlink()
    (run / ".lock").mkdir()
    before = files_of(run)
    out = cli(
        ROOT / "train.py", yaml, "--set", "train.steps=4", "--set", "train.checkpoint_every=2", "--resume", "auto"
    )
    one_line_error(out, f"cannot write the run directory {run}: Is a directory")
    assert files_of(run) == before


@pytest.mark.slow
def test_a_read_only_run_refuses_training_and_still_evaluates(train_yaml, tmp_path, cli):
    yaml = train_yaml()
    train(load_config(yaml, ["train.steps=4", "train.checkpoint_every=2"]))
    run = tmp_path / "run"
    final = find_checkpoint(run)
    made_immutable = []
    try:
        for folder in (run, final):
            if immutable(folder):
                made_immutable.append(folder)
        if not made_immutable:  # no chattr here: the result's place taken by a folder stands in
            (final / "eval-test-fp32.json").mkdir()
        before = files_of(run)
        if made_immutable:
            out = cli(
                ROOT / "train.py",
                yaml,
                "--set",
                "train.steps=4",
                "--set",
                "train.checkpoint_every=2",
                "--resume",
                "auto",
            )
            one_line_error(out, f"cannot write the run directory {run}: Operation not permitted")
        out = cli(ROOT / "evaluate.py", run, "--quiet", "--json", tmp_path / "elsewhere.json")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith(f"warning: cannot keep the result in {final / 'eval-test-fp32.json'}: ")
        assert "--json FILE writes it where you choose" in out.stderr and out.stderr.count("\n") == 1
        loss = json.loads((tmp_path / "elsewhere.json").read_text())[0]["loss"]
        assert f"{loss:.6f}" in out.stdout
        assert files_of(run) == before
    finally:
        for folder in made_immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)


# ------------------------------------------------------------------ a Hub that never answers


def silent_server():
    """Accepts connections and never answers: a network that hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    return server


def hub_env(tmp_path, url):
    return {
        "HF_ENDPOINT": url,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_OFFLINE": "0",
        "HF_TOKEN": "hf_FAKEstopsToken",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


HUB_YAML = "hub: {repo_id: me/stops, push_every_checkpoint: true, wait_on_exit_s: 3}\n"


def stop_while_uploading(yaml, run, tmp_path, signals: int):
    """Train against a Hub that never answers; once two checkpoints are queued, send SIGTERM (and, with
    ``signals=2``, a second one 2 s later, while the run waits for its uploads). Returns the process, its
    stderr and the seconds from the last signal to its end."""
    server = silent_server()
    try:
        proc = start_train(yaml, env=hub_env(tmp_path, f"http://127.0.0.1:{server.getsockname()[1]}"))
        wait_for(lambda: len(list((run / "checkpoints").glob("step-*"))) >= 2)
        proc.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(2)  # the step, its checkpoint, and then the wait for the silent Hub
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
        signalled = time.time()
        _, err = proc.communicate(timeout=120)
        return proc, err, time.time() - signalled
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.serial  # a bound on the seconds it waits
def test_sigterm_with_uploads_queued_for_a_silent_hub_waits_only_so_long(train_yaml, tmp_path):
    yaml = long_yaml(train_yaml, tmp_path, "hubstop", checkpoint_every=3, log_every=1, extra=HUB_YAML)
    run = tmp_path / "hubstop"
    proc, err, waited = stop_while_uploading(yaml, run, tmp_path, signals=1)
    assert proc.returncode == 4 and waited < 3 + 10 and "Traceback" not in err, (waited, err)
    summary = json.loads((run / "summary.json").read_text())
    left = summary["hub"]["left"]
    assert summary["status"] == "interrupted" and len(left) >= 2 and summary["hub"]["uploaded"] == []
    assert json.loads((run / "hub.json").read_text())["left"] == left
    assert err.count("\n") == 1 and f"{len(left)} left for the next start" in err, err
    assert sorted(p.name.split("-", 2)[2] for p in (run / ".hub-staging").iterdir()) == sorted(left)
    with HubServer() as hub:  # the Hub is back: the resumed run uploads what was left, first
        out = run_cli(ROOT / "train.py", yaml, "--resume", "auto", env=hub_env(tmp_path, hub.url))
        assert out.returncode == 0, out.stderr
        for branch in left:
            assert hub.head("me/stops", branch) is not None, branch
        commits = [path for method, path in hub.requests if method == "POST" and "/commit/" in path]
        assert [c.rsplit("/", 1)[-1] for c in commits[: len(left)]] == left  # before anything new
    assert not (run / ".hub-staging").exists()


@pytest.mark.slow
@pytest.mark.serial  # a bound on the seconds it waits
def test_a_second_signal_ends_the_wait_for_uploads_at_once(train_yaml, tmp_path):
    yaml = long_yaml(
        train_yaml,
        tmp_path,
        "hubstop2",
        checkpoint_every=3,
        log_every=1,
        extra=HUB_YAML.replace("wait_on_exit_s: 3", "wait_on_exit_s: 120"),
    )
    run = tmp_path / "hubstop2"
    proc, err, waited = stop_while_uploading(yaml, run, tmp_path, signals=2)
    assert proc.returncode == 4 and waited < 5 and "Traceback" not in err, (waited, err)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["hub"]["left"]
    assert "a second stop signal: nothing waited for after the checkpoint" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_hub_that_is_down_leaves_no_staged_copies(train_yaml, tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: every connection is refused at once
    yaml = long_yaml(train_yaml, tmp_path, "down", steps=8, checkpoint_every=2, log_every=4, extra=HUB_YAML)
    out = run_cli(ROOT / "train.py", yaml, env=hub_env(tmp_path, f"http://127.0.0.1:{port}"))
    assert out.returncode == 0, out.stderr
    run = tmp_path / "down"
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["hub"]["failed"]) == 5 and summary["hub"]["left"] == []  # 4 checkpoints and main
    assert not (run / ".hub-staging").exists()
    warning = out.stderr.strip().splitlines()
    assert len(warning) == 1 and len(warning[0]) < 400, out.stderr  # one line, each reason once, with counts
    assert (
        f"Hub uploads to me/stops at http://127.0.0.1:{port}: 5 failed (step-00000002, step-00000004, "
        "step-00000006 and 2 more)" in warning[0]
    )
    assert f"the Hub at http://127.0.0.1:{port} did not answer; check the network, or HF_ENDPOINT" in warning[0]
    assert "token" not in warning[0]
    # a kill leaves staged copies (one whole, one cut short): the next start queues the whole one, drops the other
    staging = run / ".hub-staging"
    shutil.copytree(run / "checkpoints" / "step-00000008", staging / "step-00000008-step-00000008")
    (staging / "step-00000006-step-00000006").mkdir(parents=True)
    out = run_cli(ROOT / "train.py", yaml, "--resume", "auto", env=hub_env(tmp_path, f"http://127.0.0.1:{port}"))
    assert out.returncode == 0, out.stderr
    assert not staging.exists()


# --------------------------------------------------------------------------- wandb that never answers


@pytest.mark.slow
@pytest.mark.serial  # bounds on the seconds each part takes
def test_wandb_start_and_finish_are_bounded(train_yaml, tmp_path):
    server = silent_server()
    bound = 5
    env = {k: v for k, v in ENV.items() if k != "WANDB_MODE"}
    env.update(
        WANDB_API_KEY="x" * 40,
        WANDB_BASE_URL=f"http://127.0.0.1:{server.getsockname()[1]}",
        WANDB_DIR=str(tmp_path / "wandb"),
        WANDB_INIT_TIMEOUT=str(bound),
    )
    began = time.time()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "train.py"),
            str(train_yaml()),
            "--set",
            "log.wandb=true",
            "--set",
            "train.steps=4",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    said = {}
    for line in proc.stderr:
        said.setdefault("first", time.time() - began)
        if line.startswith("wandb: disabled"):
            said["disabled"] = time.time() - began
            said["line"] = line
    proc.wait(timeout=120)
    total = time.time() - began
    server.close()
    assert proc.returncode == 0 and "disabled" in said, said
    assert "training goes on without it" in said["line"] and f"{bound} s at most" in said["line"]
    # the first wandb line comes once its login starts; from there the start takes the bound, not 3 times it
    assert said["disabled"] - said["first"] < bound + 3, said
    assert total - said["disabled"] < bound + 15, (total, said)  # 4 steps, and an exit that waits for nothing


# ------------------------------------------------------------------------- hostile checkpoints


class Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_a_hostile_state_file_is_a_damaged_checkpoint(train_yaml, tmp_path, tiny_run_copy, cli):
    yaml = train_yaml()
    run = tiny_run_copy("run")  # trained in this process, as the resumes below are: the same thread count
    ref = weights(run)
    marker = tmp_path / "it-ran"
    torch.save({"optimizer": Hostile(marker)}, run / "checkpoints" / "step-00000020" / "state.pt")
    out = cli(ROOT / "train.py", yaml, "--resume", "auto")
    assert out.returncode == 0, out.stderr
    assert "skipped checkpoint step-00000020: state.pt holds objects a safe (weights-only) load refuses" in out.stderr
    assert "weights_only=False" not in out.stderr + out.stdout and not marker.exists()
    assert same_weights(ref, weights(run))  # resumed from step 10, it ends where the first run ended
    torch.save({"optimizer": Hostile(marker)}, run / "checkpoints" / "step-00000020" / "state.pt")
    out = cli(ROOT / "train.py", yaml, "--resume", run / "checkpoints" / "step-00000020")
    one_line_error(out, "state.pt holds objects a safe (weights-only) load refuses")
    assert "weights_only=False" not in out.stderr and not marker.exists()


def test_weights_that_do_not_fit_are_named_in_a_short_line(train_yaml, tmp_path):
    from gpt.model.gpt import GPT
    from gpt.run.checkpoints import CheckpointError, load_weights

    cfg = load_config(train_yaml(), ["train.steps=2", "train.checkpoint_every=2"])
    train(cfg)
    other = GPT(load_config(train_yaml(), ["model.norm_type=pytorch_rmsnorm", "model.n_layers=4"]).model)
    with pytest.raises(CheckpointError) as e:
        load_weights(other, find_checkpoint(tmp_path / "run"))
    message = str(e.value)
    assert len(message) < 400 and "missing: " in message and " more" in message, message
    assert "unexpected: " in message and "use the config it was trained with" in message


# ------------------------------------------------------------------------ results per token range


@pytest.mark.slow
def test_evaluations_over_different_ranges_live_side_by_side(train_yaml, tmp_path, cli):
    yaml = train_yaml()
    for seed, norm in ((0, "pytorch_layernorm"), (0, "handrolled_layernorm")):
        name = f"r-{norm}"
        train(
            load_config(
                yaml,
                [
                    f"run.name={name}",
                    f"run.dir={tmp_path / name}",
                    f"model.norm_type={norm}",
                    "train.steps=4",
                    "train.checkpoint_every=4",
                    f"train.seed={seed}",
                ],
            )
        )
    runs = [tmp_path / "r-pytorch_layernorm", tmp_path / "r-handrolled_layernorm"]
    for tokens in (1024, 4096):
        out = cli(ROOT / "evaluate.py", *runs, "--tokens", tokens, "--quiet")
        assert out.returncode == 0, out.stderr
    out = cli(ROOT / "evaluate.py", *runs, "--quiet")
    assert out.returncode == 0, out.stderr
    final = find_checkpoint(runs[0])
    assert sorted(p.name for p in final.glob("eval-*.json")) == [
        "eval-test-0-1024-fp32.json",
        "eval-test-0-4096-fp32.json",
        "eval-test-fp32.json",
    ]
    again = cli(ROOT / "evaluate.py", runs[0], "--tokens", 1024, "--quiet")  # a repeat replaces its own
    assert again.returncode == 0 and len(list(final.glob("eval-*.json"))) == 3
    for tokens in (1024, 4096, None):
        result = compare(runs, tmp_path / f"c{tokens}", tokens=tokens, plots=False)
        assert result["test_range"]["n_tokens"] == (tokens or 20_000)
    small = compare(runs, tmp_path / "c1", tokens=1024, plots=False)["groups"][0]["test_loss_mean"]
    large = compare(runs, tmp_path / "c2", tokens=4096, plots=False)["groups"][0]["test_loss_mean"]
    assert small != large


@pytest.mark.slow
@pytest.mark.serial  # a bound on the seconds a request takes
def test_every_hub_request_gives_up_after_its_timeout(tmp_path):
    # the client's default waits forever; here a silent Hub costs the read timeout (shortened for the test)
    server = silent_server()
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "README.md").write_text("x")
    code = (
        "import sys, time; import gpt.publish.hub_api as hub\n"
        "hub.HUB_TIMEOUT_S = (2.0, 2.0, 2.0, 2.0); began = time.time()\n"
        "try:\n    hub.upload_folder(__import__('pathlib').Path(sys.argv[1]), 'me/x', attempts=1)\n"
        "except hub.UploadError as e:\n    print(round(time.time() - began, 1)); print(e)"
    )
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        out = run_cli("-c", code, folder, env=hub_env(tmp_path, url))
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    seconds, message = out.stdout.splitlines()
    assert 1.5 <= float(seconds) < 10, seconds
    assert f"the Hub at {url} did not answer" in message
    assert "ReadTimeout" in message or "timed out" in message, message
