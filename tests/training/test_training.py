"""The trainer: files and fields, exact resume, signals, crashes, divergence, bad input, wandb."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, write_train_yaml
from safetensors.torch import load_file

from gpt.commands.cli import standard_hooks
from gpt.common.errors import UserError
from gpt.config import load_config
from gpt.data.tokens import DataError
from gpt.model.gpt import GPT
from gpt.run import checkpoints as ckpt_io
from gpt.run.directory import RunDir, find_checkpoint
from gpt.run.distributed import Dist
from gpt.training.hooks import RunHooks
from gpt.training.loop import train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir):
    return load_file(str(find_checkpoint(run_dir) / "model.safetensors"))


def run_train(*args, env=None, **kw):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
        **kw,
    )


def test_short_run_learns_and_writes_every_file(train_yaml, tmp_path):
    cfg = load_config(train_yaml())
    summary = train(cfg, hooks=standard_hooks(cfg))  # as the train command runs it: charts drawn
    run = tmp_path / "run"
    records = metrics(run)
    assert [r["step"] for r in records] == list(range(1, 21))
    for r in records:
        assert {
            "step",
            "tokens",
            "train_loss",
            "lr",
            "grad_norm",
            "tokens_per_s",
            "elapsed_s",
            "nonfinite_steps",
        } <= r.keys()
        assert r["tokens"] == r["step"] * 8 * 32
    assert [r["step"] for r in records if "val_loss" in r] == [10, 20]
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 1.0  # it learns the synthetic rule
    assert records[0]["lr"] == pytest.approx(1e-2 / 2) and records[-1]["lr"] == pytest.approx(1e-3)

    saved = json.loads((run / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    info = json.loads((run / "checkpoints" / "step-00000020" / "checkpoint.json").read_text())
    assert saved["status"] == "completed" and saved["steps"] == 20 and saved["tokens"] == 20 * 256
    assert saved["final_train_loss"] == records[-1]["train_loss"]
    assert saved["best_val_loss"] == min(r["val_loss"] for r in records if "val_loss" in r)
    assert saved["tokens_per_s"] > 0 and saved["wall_seconds"] > 0
    # on the CPU the peak memory is the resident set (Python and torch alone hold more than 50 MB), under its
    # own key: never under the key of the CUDA allocator's peak
    assert saved["peak_rss_bytes"] > 50 * 2**20 and "peak_cuda_allocated_bytes" not in saved
    assert saved["world_size"] == 1 and saved["device"]
    [segment] = saved["segments"]  # one process, one segment: its fingerprint
    assert segment["from_step"] == 0 and segment["software"]["torch"] == torch.__version__
    assert segment["train"] == {
        "precision": "fp32",
        "compile": False,
        "tf32": False,
        "micro_batch_size": 4,
        "grad_accum": 2,
    }
    assert segment["hardware"] == {"device": "cpu", "name": saved["device"], "world_size": 1}
    assert segment["data"]["train"]["range"] == saved["train_token_range"][1:]
    assert info["segments"] == saved["segments"]
    assert saved["train_token_range"][0] == "train" and saved["val_token_range"] == ["val", 0, 2048]

    assert load_config(run / "config.yaml") == cfg
    for png in ("loss.png", "lr.png", "grad_norm.png"):
        assert (run / png).read_bytes()[:8] == PNG_MAGIC and (run / png).stat().st_size > 5000
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "latest", "step-00000010", "step-00000020"]
    final = ckpts / "step-00000020"
    assert sorted(p.name for p in final.iterdir()) == [
        "checkpoint.json",
        "config.yaml",
        "model.safetensors",
        "state.pt",
    ]
    state = ckpt_io.load_state(final)
    assert {"optimizer", "scaler", "data", "progress", "rng"} <= state.keys()
    assert state["data"]["step"] == 20 and state["progress"]["tokens"] == 20 * 256
    assert {"python", "numpy", "torch", "cuda"} <= state["rng"][0].keys()
    assert info["step"] == 20 and info["val_loss"] == records[-1]["val_loss"]
    model = GPT(cfg.model)
    ckpt_io.load_weights(model, final)  # the weights load back into the model


@pytest.mark.slow
def test_resume_is_exact(train_yaml, tmp_path):
    # 20 steps straight, versus 10 steps, a fresh process, 10 more from the step-10 checkpoint
    out = run_train(train_yaml("straight"))  # both in fresh processes with the same thread count
    assert out.returncode == 0, out.stderr
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step-00000020")
    (resumed_dir / "checkpoints" / "latest").write_text("step-00000010\n")
    (resumed_dir / "checkpoints" / "best").unlink()
    out = run_train(train_yaml("resumed"), "--resume", "auto")
    assert out.returncode == 0, out.stderr
    a, b = final_weights(tmp_path / "straight"), final_weights(resumed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = metrics(tmp_path / "straight"), metrics(resumed_dir)
    assert [r["step"] for r in mb] == list(range(1, 21))  # steps 11-20 logged once, not twice
    for ra, rb in zip(ma, mb):
        assert (ra["train_loss"], ra["grad_norm"], ra.get("val_loss")) == (
            rb["train_loss"],
            rb["grad_norm"],
            rb.get("val_loss"),
        )
    resumed = json.loads((resumed_dir / "summary.json").read_text())
    assert resumed["final_train_loss"] == straight["final_train_loss"]
    assert [s["from_step"] for s in resumed["segments"]] == [0, 10]  # every process of the run, in order
    assert resumed["segments"][0] == straight["segments"][0]


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_finishes_identically(train_yaml, tmp_path):
    def cfg(name):
        return (
            train_yaml(name)
            .read_text()
            .replace("steps: 20", "steps: 60")
            .replace("checkpoint_every: 10", "checkpoint_every: 1000")
            .replace("eval_every: 10", "eval_every: 1000")
        )

    (tmp_path / "ref.yaml").write_text(cfg("ref"))
    (tmp_path / "stop.yaml").write_text(cfg("stop"))
    reference, proc = (  # the uninterrupted run trains meanwhile
        subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), str(tmp_path / f"{name}.yaml")],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("ref", "stop")
    )
    log = tmp_path / "stop" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.is_file() and len(log.read_text().splitlines()) >= 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err
    summary = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 5 <= summary["steps"] < 60
    assert find_checkpoint(tmp_path / "stop").name == f"step-{summary['steps']:08d}"
    assert f"interrupted at step {summary['steps']}" in err
    out = run_train(tmp_path / "stop.yaml", "--resume", "auto")
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "stop" / "summary.json").read_text())["status"] == "completed"
    _, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err
    a, b = final_weights(tmp_path / "ref"), final_weights(tmp_path / "stop")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in metrics(tmp_path / "ref")] == [r["train_loss"] for r in metrics(tmp_path / "stop")]


@pytest.mark.slow
def test_kill_9_while_checkpointing_never_breaks_latest(train_yaml, tmp_path):
    text = (
        train_yaml("crash")
        .read_text()
        .replace("steps: 20", "steps: 400")
        .replace("checkpoint_every: 10", "checkpoint_every: 1")
        .replace("log_every: 1", "log_every: 50")
    )
    (tmp_path / "crash.yaml").write_text(text)
    cfg = load_config(tmp_path / "crash.yaml")
    rng = random.Random(0)
    seen = set()
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), str(tmp_path / "crash.yaml"), "--resume", "auto"],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        root = tmp_path / "crash" / "checkpoints"
        before = (root / "latest").read_text() if (root / "latest").is_file() else None
        deadline = time.time() + 120  # wait for this process's first checkpoint
        while time.time() < deadline and not ((root / "latest").is_file() and (root / "latest").read_text() != before):
            time.sleep(0.02)
        time.sleep(rng.uniform(0.3, 2.0))  # a checkpoint is written every step: likely mid-write
        proc.kill()
        proc.wait()
        latest = find_checkpoint(tmp_path / "crash")
        model = GPT(cfg.model)
        ckpt_io.load_weights(model, latest)
        state = ckpt_io.load_state(latest)
        assert state["progress"]["step"] == int(latest.name.split("-")[1])
        seen.add(latest.name)
    assert len(seen) >= 3  # the runs got further each time


def test_diverging_run_stops_itself(train_yaml, tmp_path):
    text = (
        train_yaml("diverge")
        .read_text()
        .replace("norm_type: pytorch_layernorm", "norm_type: no_norm")
        .replace("lr: 1.0e-2", "lr: 10.0")
        .replace("steps: 20", "steps: 500")
        .replace("eval_every: 10", "eval_every: 1000")
    )
    (tmp_path / "diverge.yaml").write_text(text.replace("keep_last: 5", "keep_last: 5, max_nonfinite_steps: 3"))
    summary = train(load_config(tmp_path / "diverge.yaml"))
    assert summary["status"] == "diverged" and summary["diverged_at_step"] < 50
    assert summary["stop_reason"] == "3 consecutive steps with a non-finite loss or gradient"
    assert summary["nonfinite_steps"] >= 3
    saved = json.loads((tmp_path / "diverge" / "summary.json").read_text())
    assert saved["status"] == "diverged" and saved["steps"] == summary["diverged_at_step"]
    assert metrics(tmp_path / "diverge")[-1]["step"] == summary["diverged_at_step"]
    # a ceiling stops a run whose loss explodes while staying finite
    ceiling = text.replace("lr: 10.0", "lr: 0.3").replace("keep_last: 5", "keep_last: 5, loss_ceiling: 6.0")
    (tmp_path / "ceiling.yaml").write_text(
        ceiling.replace("name: diverge", "name: ceiling").replace(str(tmp_path / "diverge"), str(tmp_path / "ceiling"))
    )
    summary = train(load_config(tmp_path / "ceiling.yaml"))
    assert summary["status"] == "diverged" and summary["steps"] < 500
    assert summary["stop_reason"].startswith("train loss") and "above train.loss_ceiling 6" in summary["stop_reason"]


def test_config_errors_stop_before_anything_is_built(train_yaml, tmp_path, cli):
    out = cli("train", train_yaml(), "--set", "train.micro_batch=4")
    assert out.returncode == 2 and out.stderr.startswith(
        "error: --set: train.micro_batch: unknown key; did you mean 'train.micro_batch_size'?"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        UserError,
        match=r"train.global_batch_size 8 is not a multiple of train.micro_batch_size 4 "
        r"x 3 processes; choose a global batch divisible by 12",
    ):
        train(load_config(train_yaml()), dist=Dist(world_size=3))
    assert not (tmp_path / "run").exists()
    too_long = load_config(train_yaml(), ["train.steps=100000"])
    with pytest.raises(
        DataError,
        match=r"train.bin: 200,000 tokens are 781 steps of 8 x 32 tokens, but the run "
        r"asks for 100,000 steps",
    ):
        train(too_long)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_resume_with_a_different_model_is_refused(train_yaml, tiny_run_copy):
    tiny_run_copy("run")
    bigger = load_config(train_yaml(), ["model.d_model=64", "model.n_heads=4"])
    with pytest.raises(
        UserError,
        match=r"step-00000020 holds a different model; model.d_model: checkpoint 32, "
        r"config 64; model.n_heads: checkpoint 2, config 4$",
    ):
        train(bigger, resume="auto")


def test_existing_run_is_not_overwritten(train_yaml, tmp_path, tiny_run_copy):
    cfg = load_config(train_yaml())
    tiny_run_copy("run")  # cfg's run, completed
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(
        UserError,
        match=r"already holds a run \(checkpoints up to step-00000020\); pass --resume "
        r"auto to continue it, --overwrite to start over",
    ):
        train(cfg)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    again = train(cfg, resume="auto")  # nothing left to do: the finished run stays finished
    assert again["steps"] == 20 and again["status"] == "completed"
    # continuing another run's checkpoint in a new directory is fine once, not over a run
    other = load_config(train_yaml(), [f"run.dir={tmp_path / 'other'}"])
    assert train(other, resume=str(tmp_path / "run"))["steps"] == 20
    with pytest.raises(UserError, match="other already holds a run"):
        train(other, resume=str(tmp_path / "run"))
    train(cfg, overwrite=True)
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(moved) == 1 and (moved[0] / "metrics.jsonl").read_text() == before


def test_missing_resume_path_and_data(train_yaml, tmp_path):
    with pytest.raises(UserError, match=f"{tmp_path / 'nope'}: no such run or checkpoint"):
        train(load_config(train_yaml()), resume=str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no such data directory"):
        train(load_config(train_yaml(), [f"data.path={tmp_path / 'nodata'}"]))


def test_wandb_offline_receives_the_run(train_yaml, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(train_yaml(), ["log.wandb=true", "train.steps=10", "log.tags=[demo]", "log.stats_every=5"])
    train(cfg)
    runs = list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history = list(runs[0].glob("run-*.wandb"))
    assert len(history) == 1
    records = metrics(tmp_path / "run")
    # protobuf records: keys and JSON values are stored as text. wandb's service process writes the file on
    # its own schedule after finish() returns (under load, later: CI once read only its 7-byte header)
    deadline = time.monotonic() + 60
    while (
        json.dumps(records[-1]["val_loss"]).encode() not in (data := history[0].read_bytes())
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert len(records) == 10
    for r in records:
        assert b"train_loss" in data and json.dumps(r["train_loss"]).encode() in data, r["step"]
    assert json.dumps(records[-1]["val_loss"]).encode() in data
    assert b"pytorch_layernorm" in data and b"seed-0" in data and b"demo" in data  # config and tags
    stats = json.loads((tmp_path / "run" / "stats.jsonl").read_text().splitlines()[-1])
    assert b"stats/resid_rms/1" in data and json.dumps(stats["resid_rms"][1]).encode() in data  # log.stats_every


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(train_yaml, precision, tmp_path):
    # autocast on the CPU; fp16 also runs the GradScaler with fused AdamW's device-side skip
    summary = train(load_config(train_yaml(), [f"train.precision={precision}"]))
    records = metrics(tmp_path / "run")
    assert summary["status"] == "completed" and summary["nonfinite_steps"] == 0
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 1.0
    scaler = ckpt_io.load_state(find_checkpoint(tmp_path / "run"))["scaler"]
    assert (scaler.get("scale", 0) > 0) == (precision == "fp16")  # the scaler's state is checkpointed


# ------------------------------------------------------------------------ validity


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_refuses_a_changed_experiment(train_yaml, tiny_run_copy, cli):
    run = tiny_run_copy("run")
    before = files_of(run)
    for change, named in (
        (["optim.lr=0.02"], "optim.lr: checkpoint 0.01, config 0.02"),
        (["train.steps=30"], "train.steps: checkpoint 20, config 30"),
        (["optim.schedule=constant"], "optim.schedule: checkpoint 'cosine', config 'constant'"),
        (["train.precision=fp16"], "train.precision: checkpoint 'fp32', config 'fp16'"),
        (["optim.name=muon"], "optim.name: checkpoint 'adamw', config 'muon'"),
    ):
        with pytest.raises(
            UserError,
            match=f"step-00000020 was trained with a different config; {named}; a resumed "
            "run may change only run.*, log.*, hub.*",
        ):
            train(load_config(train_yaml(), change), resume="auto")
        assert files_of(run) == before, change  # nothing written
    out = cli("train", train_yaml(), "--resume", "auto", "--set", "optim.lr=0.02")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "optim.lr: checkpoint 0.01" in out.stderr

    # what only changes logging and cadence continues; the run's config.yaml stays as the run began
    shutil.rmtree(run / "checkpoints" / "step-00000020")
    (run / "checkpoints" / "latest").write_text("step-00000010\n")
    (run / "summary.json").unlink()
    original = (run / "config.yaml").read_text()
    summary = train(
        load_config(train_yaml(), ["log.log_every=5", "train.checkpoint_every=5", "train.keep_last=3"]), resume="auto"
    )
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert (run / "config.yaml").read_text() == original
    assert [r["step"] for r in metrics(run)] == [*range(1, 11), 15, 20]
    assert load_config(run / "checkpoints" / "step-00000020" / "config.yaml").log.log_every == 5


def test_resume_refuses_another_plan_of_length(train_yaml, tiny_run_copy):
    run = tiny_run_copy("run")
    ckpt = run / "checkpoints" / "step-00000010"
    state = ckpt_io.load_state(ckpt)
    state["progress"]["total_steps"] = 25  # as if the step count had been worked out differently
    torch.save(state, ckpt / "state.pt")
    (run / "checkpoints" / "latest").write_text("step-00000010\n")
    with pytest.raises(UserError, match="step-00000010 belongs to a run of 25 steps, but this config now gives 20"):
        train(load_config(train_yaml()), resume="auto")


def inject_nonfinite(monkeypatch, bad_steps, accum):
    """Make the training loss NaN on the given (1-based) steps, counting training forward passes."""
    original, calls = GPT.forward, {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if targets is not None:
            step = calls["n"] // accum + 1
            calls["n"] += 1
            if step in bad_steps:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    return lambda: monkeypatch.setattr(GPT, "forward", original)


def test_nonfinite_steps_between_log_steps_are_counted_and_kept_on_resume(train_yaml, tmp_path, monkeypatch):
    sets = ["log.log_every=10", "train.checkpoint_every=7", "train.eval_every=100", "train.max_nonfinite_steps=5"]
    restore = inject_nonfinite(monkeypatch, {3, 4, 5}, accum=2)
    summary = train(load_config(train_yaml(), sets))
    restore()
    assert summary["status"] == "completed" and summary["nonfinite_steps"] == 3
    assert [r.get("nonfinite_steps") for r in metrics(tmp_path / "run")] == [0, 3, 3]  # steps 1, 10, 20
    # the checkpoint of step 7 (no log step) carries the three skipped steps into a resumed run
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run", resumed)
    for name in ("step-00000014", "step-00000020"):
        shutil.rmtree(resumed / "checkpoints" / name)
    (resumed / "checkpoints" / "latest").write_text("step-00000007\n")
    (resumed / "summary.json").unlink()
    again = train(load_config(train_yaml(), [*sets, f"run.dir={resumed}"]), resume="auto")
    assert again["status"] == "completed" and again["nonfinite_steps"] == 3


def test_a_streak_between_log_steps_is_a_divergence(train_yaml, tmp_path, monkeypatch):
    inject_nonfinite(monkeypatch, {3, 4, 5}, accum=2)
    sets = ["log.log_every=10", "train.checkpoint_every=7", "train.eval_every=100", "train.max_nonfinite_steps=3"]
    summary = train(load_config(train_yaml(), sets))
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 5 and summary["steps"] == 7
    assert summary["stop_reason"] == "3 consecutive steps with a non-finite loss or gradient"
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing is saved from a diverged run


def test_logged_train_loss_is_the_window_mean(train_yaml, tmp_path, tiny_run):
    every = metrics_of(json.loads((tiny_run / "summary.json").read_text()), tiny_run)  # the same run, logging each step
    windows = metrics_of(train(load_config(train_yaml("windows"), ["log.log_every=5"])), tmp_path / "windows")
    by_step = {r["step"]: r["train_loss"] for r in every}
    assert [r["step"] for r in windows if "train_loss" in r] == [1, 5, 10, 15, 20]
    logged = [r for r in windows if "train_loss" in r]
    for previous, r in zip(logged, logged[1:]):  # the steps since the previous log: 2-5, 6-10, ...
        window = [by_step[s] for s in range(previous["step"] + 1, r["step"] + 1)]
        assert r["train_loss"] == pytest.approx(sum(window) / len(window), rel=1e-6)
        assert r["train_loss_last"] == pytest.approx(by_step[r["step"]], rel=1e-6)
        assert r["train_loss"] != pytest.approx(r["train_loss_last"], rel=1e-6)  # it learns within a window


def metrics_of(summary, run_dir):
    assert summary["status"] == "completed"
    return metrics(run_dir)


def test_tokens_per_param_gives_every_norm_type_the_same_length(train_yaml, tmp_path):
    lengths = set()
    for norm_type in ("pytorch_layernorm", "pytorch_rmsnorm", "no_norm", "dyt"):
        cfg = load_config(
            train_yaml(norm_type),
            [f"model.norm_type={norm_type}", "train.steps=null", "train.tokens_per_param=0.05", "train.eval_every=100"],
        )
        summary = train(cfg)
        lengths.add((summary["total_steps"], summary["tokens"], summary["n_params_outside_norms"]))
        in_norms = {"pytorch_layernorm": 5 * 2 * 32, "pytorch_rmsnorm": 5 * 32, "no_norm": 0, "dyt": 5 * (2 * 32 + 1)}
        assert summary["n_params"] - summary["n_params_outside_norms"] == in_norms[norm_type]
    assert len(lengths) == 1, lengths


def test_pauses_leave_out_the_wait_for_the_device(monkeypatch):
    from gpt.training import monitors

    clock = {"t": 100.0}
    monkeypatch.setattr(monitors.time, "perf_counter", lambda: clock["t"])
    th = monitors.Throughput(step=0, total_steps=100, tokens_per_step=10)

    def device_finishes_the_step():
        clock["t"] += 3.0  # the step was still running: that is training time

    clock["t"] += 1.0
    with th.paused(device_finishes_the_step):
        clock["t"] += 2.0  # evaluating
    assert th.paused_seconds == 2.0
    assert th.since_last_log(step=4) == pytest.approx(4 * 10 / 4.0)  # 1 + 3 s of training for 4 steps


class Recorder(RunHooks):
    """A hook that writes down what the trainer told it, and adds its own key to the summary."""

    def __init__(self, problem=None):
        self.calls, self.problem = [], problem

    def started(self, run_path):
        self.calls.append(("started", Path(run_path).name, (Path(run_path) / "summary.json").is_file()))

    def checkpoint_saved(self, ckpt):
        self.calls.append(("checkpoint_saved", ckpt.name, (ckpt / "model.safetensors").is_file()))

    def finished(self, status, final, summary, stop):
        self.calls.append(("finished", status, final.name if final else None, summary["steps"]))
        summary["recorder"] = len(self.calls)
        return self.problem


def test_the_trainer_tells_its_hooks_in_order_and_knows_nothing_else(train_yaml, tmp_path, capsys):
    cfg = load_config(train_yaml())
    first, second = Recorder(), Recorder(problem="the recorder's own problem")
    summary = train(cfg, hooks=[first, second])
    assert (
        first.calls
        == second.calls
        == [
            ("started", "run", True),  # after the run folder is set up and marked running
            ("checkpoint_saved", "step-00000010", True),
            ("checkpoint_saved", "step-00000020", True),
            ("finished", "completed", "step-00000020", 20),
        ]
    )
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["recorder"] == saved["recorder"] == 4 and saved["status"] == "completed"
    assert capsys.readouterr().err.splitlines()[-1] == "warning: the recorder's own problem"  # one line, no stop
    # without hooks the trainer draws nothing and uploads nothing: charts and the Hub are the hooks' business
    assert not any((tmp_path / "run" / png).exists() for png in ("loss.png", "lr.png", "grad_norm.png"))


def test_a_checkpoint_written_before_the_folders_moved_resumes_to_the_same_run(token_set, tmp_path):
    # tests/fixtures/before_the_move: the step-10 checkpoint of a 20-step run by the flat package (2c85bcc),
    # its step-20 weights and last metrics. Resumed by this code, the run ends where the old code's did: within
    # float tolerance of the stored numbers (they were computed on another CPU, whose SIMD kernels round
    # differently), and bit for bit between two resumes here.
    fixture = ROOT / "tests" / "fixtures" / "before_the_move"
    finals = []
    for name in ("run", "again"):
        ckpt = tmp_path / name / "checkpoints" / "step-00000010"
        shutil.copytree(fixture / "step-00000010", ckpt)
        cfg = load_config(
            write_train_yaml(tmp_path, token_set, name), ["train.checkpoint_every=10", "train.keep_last=5"]
        )
        summary = train(cfg, resume=str(ckpt))
        assert summary["status"] == "completed" and summary["steps"] == 20
        assert [s["from_step"] for s in summary["segments"]] == [0, 10]  # the old segment, then this one
        finals.append(load_file(tmp_path / name / "checkpoints" / "step-00000020" / "model.safetensors"))
    old, new = load_file(fixture / "step-00000020-model.safetensors"), finals[0]
    assert old.keys() == new.keys() and all(torch.equal(new[k], finals[1][k]) for k in old)  # same machine: bits
    worst = max(float(((old[k] - new[k]).abs() / (old[k].abs() + 1e-3)).max()) for k in old)
    assert worst < 1e-4, worst  # another machine's float rounding, not another computation
    expected = json.loads((fixture / "expected.json").read_text())["step_20"]
    last = metrics(tmp_path / "run")[-1]
    assert {k: last[k] for k in expected} == {k: pytest.approx(v, rel=1e-4) for k, v in expected.items()}


def test_random_states_restore_every_generator_a_step_draws_from():
    import numpy as np

    from gpt.run.random_state import rng_state, set_rng_state

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = json.loads(json.dumps({k: v for k, v in rng_state().items() if k not in ("torch", "cuda")}))
    saved.update({k: v for k, v in rng_state().items() if k in ("torch", "cuda")})  # as a checkpoint keeps them
    draws = (random.random(), np.random.rand(), torch.rand(3).tolist())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    set_rng_state(saved)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist()) == draws


def test_metrics_lines_stay_standard_json(tmp_path):
    from gpt.training.metrics import Metrics

    cfg = load_config(write_train_yaml(tmp_path, tmp_path / "tokens"))
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    sink = Metrics(run, cfg)
    sink.log({"step": 1, "train_loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3})
    sink.log({"step": 2, "train_loss": 4.5, "lr": 2e-3})
    sink.close()
    lines = run.metrics_file.read_text().splitlines()
    assert [json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}")) for line in lines] == [
        {"step": 1, "train_loss": "nan", "grad_norm": "inf", "lr": 1e-3},
        {"step": 2, "train_loss": 4.5, "lr": 2e-3},
    ]
