"""Faults a user can hit: a second trainer, bad names, torn and damaged files, full disks, foreign data.

Each test reproduces the fault and asserts the outcome: one line naming the problem and the
fix (or the fallback taken), no traceback, and nothing that existed before lost or changed.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, VOCAB, write_meta, write_token_set
from safetensors.torch import load_file

from gpt.common.errors import UserError, os_reason
from gpt.config import ConfigError, load_config
from gpt.data.tokens import DataError
from gpt.run.checkpoints import CheckpointError
from gpt.run.directory import RunDir, find_checkpoint
from gpt.training.loop import train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_cli(*args, cwd=None, preexec_fn=None, env=None):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**ENV, **(env or {})},
        preexec_fn=preexec_fn,
    )


def one_line_error(out, *fragments):
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, (
        out.stderr
    )
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def weights(run_dir, step=20):
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def finished(tiny_run_copy):
    """A completed 20-step run (checkpoints at 10 and 20) at tmp_path/done, where train_yaml("done") trains: the
    session's tiny run, copied."""
    return tiny_run_copy("done")


def rewind_to_step_10(run_dir):
    """The run as a kill after step 10's checkpoint leaves it (minus what a test damages)."""
    shutil.rmtree(run_dir / "checkpoints" / "step-00000020")
    (run_dir / "checkpoints" / "latest").write_text("step-00000010\n")
    (run_dir / "checkpoints" / "best").unlink(missing_ok=True)
    (run_dir / "summary.json").unlink()


# ------------------------------------------------------------------------ one run per directory


def running_pid(summary_file):
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError):  # not there yet, or being written
        return None
    return summary.get("pid") if summary.get("status") == "running" else None


@pytest.mark.slow
def test_two_trainers_on_one_run_directory(train_yaml, tmp_path):
    cfg = train_yaml("busy")
    cfg.write_text(cfg.read_text().replace("steps: 20", "steps: 700").replace("log_every: 1", "log_every: 100"))
    start = [sys.executable, str(ROOT / "train.py"), str(cfg), "--resume", "auto"]
    procs = [
        subprocess.Popen(start, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    deadline = time.time() + 120
    while time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    loser = next(p for p in procs if p.poll() is not None)
    holder = next(p for p in procs if p is not loser)
    err = loser.stderr.read()
    assert loser.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert f"busy is in use by another trainer (PID {holder.pid} on " in err
    summary = tmp_path / "busy" / "summary.json"
    while time.time() < deadline and running_pid(summary) != holder.pid:
        assert holder.poll() is None, holder.stderr.read()  # the holder goes on
        time.sleep(0.1)
    holder.kill()  # kill -9: the kernel drops its lock with it
    holder.wait()
    again = subprocess.Popen(start, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while time.time() < deadline and running_pid(summary) != again.pid:
        assert again.poll() is None, again.stderr.read()  # it took the lock the killed holder left
        time.sleep(0.1)
    assert (tmp_path / "busy" / ".lock").read_text().startswith(f"{again.pid} on ")
    time.sleep(1.0)  # into its training loop
    again.send_signal(signal.SIGTERM)  # stop it cleanly
    _, err = again.communicate(timeout=120)
    assert again.returncode == 4, err
    assert json.loads((tmp_path / "busy" / "summary.json").read_text())["status"] == "interrupted"


def test_a_second_trainer_between_the_holders_lock_and_its_pid_still_names_it(tmp_path):
    # The holder takes the flock, then writes "PID on host": a second trainer arriving in
    # between waits for the name instead of reporting "PID unknown" (a race CI once hit).
    import fcntl
    import threading

    run = RunDir(tmp_path / "race")
    run.path.mkdir()
    fd = os.open(run.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, nothing written yet
    threading.Timer(0.2, os.pwrite, (fd, b"4242 on elsewhere\n", 0)).start()
    with pytest.raises(UserError) as err:
        run.lock()
    assert str(err.value) == (
        f"{run.path} is in use by another trainer (PID 4242 on elsewhere); wait for it to "
        "end or stop it, or choose another run.name"
    )
    os.close(fd)


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b"])
def test_a_run_name_is_one_folder_name(train_yaml, tmp_path, cli, name):
    runs = tmp_path / "runs"
    (runs / "other").mkdir(parents=True)
    (runs / "other" / "metrics.jsonl").write_text("{}\n")
    out = cli(
        ROOT / "train.py",
        train_yaml(),
        "--set",
        f"run.name={name!r}",
        "--set",
        "run.dir=null",
        "--overwrite",
        cwd=tmp_path,
    )
    one_line_error(out, f"run.name: {name!r} is not a run name: one non-empty folder name")
    assert sorted(p.name for p in runs.iterdir()) == ["other"]  # nothing moved aside
    with pytest.raises(ConfigError, match="run.dir: empty"):
        load_config(train_yaml(), ["run.dir=' '"])


def test_the_running_mark(train_yaml, tmp_path, monkeypatch):
    from gpt.training import loop as trainer

    seen = []
    validate = trainer.Trainer.validate
    monkeypatch.setattr(
        trainer.Trainer, "validate", lambda self, record: seen.append(self.run.summary()) or validate(self, record)
    )
    train(load_config(train_yaml()))
    assert seen[0]["status"] == "running" and seen[0]["pid"] == os.getpid()
    assert seen[0]["train_token_range"][0] == "train" and seen[0]["val_token_range"] == ["val", 0, 2048]
    run = RunDir(tmp_path / "run")
    assert run.status() == "completed"
    run.write_summary(seen[0])  # a finished run being continued: its final checkpoint is no longer final
    with pytest.raises(UserError, match=r"the run has no final checkpoint \(status: running\)"):
        run.checkpoint("final")


def test_evaluating_a_checkpoint_that_is_pruned_meanwhile(finished, monkeypatch, capsys):
    from gpt.evaluation import held_out as evaluation
    from gpt.evaluation.held_out import EvalOptions, evaluate_checkpoint
    from gpt.run.distributed import Dist

    ckpt = finished / "checkpoints" / "step-00000010"
    score = evaluation.evaluate_model

    def pruned_while_scoring(*args, **kwargs):  # the running trainer's retention removes it meanwhile
        result = score(*args, **kwargs)
        shutil.rmtree(ckpt)
        return result

    monkeypatch.setattr(evaluation, "evaluate_model", pruned_while_scoring)
    result = evaluate_checkpoint(ckpt, Dist(), EvalOptions(show_progress=False))
    assert result["loss"] > 0 and not ckpt.exists()  # the result is returned; the folder is not recreated
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"warning: {ckpt} was removed while it was evaluated" in err
    monkeypatch.setattr(evaluation, "evaluate_model", score)
    with pytest.raises(CheckpointError, match=r"step-00000010: no config.yaml; cannot tell what model it holds"):
        evaluate_checkpoint(ckpt, Dist(), EvalOptions(show_progress=False))


# ---------------------------------------------------------------------- torn and damaged files


def test_torn_metrics_line_resumes_to_the_same_model(finished, train_yaml, tmp_path, capsys):
    torn = tmp_path / "torn"
    shutil.copytree(finished, torn)
    rewind_to_step_10(torn)
    lines = (torn / "metrics.jsonl").read_text().splitlines()
    (torn / "metrics.jsonl").write_text("\n".join(lines[:10]) + '\n{"step": 11, "tok')  # a kill mid-write
    summary = train(load_config(train_yaml("done"), [f"run.dir={torn}"]), resume="auto")
    assert summary["status"] == "completed"
    assert same_weights(weights(finished), weights(torn))
    assert [json.loads(line)["step"] for line in (torn / "metrics.jsonl").read_text().splitlines()] == list(
        range(1, 21)
    )
    assert (
        "metrics.jsonl: dropped unparsable line(s) 11 (a kill or a full disk cut them short)" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "damage",
    [
        "truncated weights",
        "corrupt state",
        "missing state",
        "binary latest",
        "latest names a missing step",
        "latest escapes the run",
    ],
)
def test_resume_auto_falls_back_past_a_damaged_checkpoint(finished, train_yaml, tmp_path, capsys, damage):
    run = tmp_path / "damaged"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()
    ckpts = run / "checkpoints"
    newest = ckpts / "step-00000020"
    if damage == "truncated weights":
        data = (newest / "model.safetensors").read_bytes()
        (newest / "model.safetensors").write_bytes(data[: len(data) // 2])
        why = "skipped checkpoint step-00000020: model.safetensors is truncated ("
    elif damage == "corrupt state":
        data = bytearray((newest / "state.pt").read_bytes())
        data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
        (newest / "state.pt").write_bytes(bytes(data))
        why = "skipped checkpoint step-00000020: state.pt is damaged ("
    elif damage == "missing state":
        (newest / "state.pt").unlink()
        why = "skipped checkpoint step-00000020: no state.pt"
    elif damage == "binary latest":
        shutil.rmtree(newest)
        (ckpts / "latest").write_bytes(b"\x00\xffstep\x80")
        why = "latest: damaged pointer"
    elif damage == "latest names a missing step":
        shutil.rmtree(newest)
        why = "skipped checkpoint step-00000020: missing"
    else:
        shutil.rmtree(newest)
        (ckpts / "latest").write_text("../../done/checkpoints/step-00000020\n")
        why = "latest: damaged pointer ('../../done/checkpoints/step-00000020' is not a checkpoint name"
    untouched = {p: b for p, b in files_of(ckpts).items() if p.parts[0] == "step-00000010"}
    summary = train(load_config(train_yaml("done"), [f"run.dir={run}"]), resume="auto")
    assert why in capsys.readouterr().err
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert same_weights(weights(finished), weights(run))  # resumed from step 10: the same model
    assert {p: b for p, b in files_of(ckpts).items() if p.parts[0] == "step-00000010"} == untouched


def test_explicit_resume_of_a_damaged_checkpoint_is_one_line(finished, train_yaml, tmp_path, cli):
    target = finished / "checkpoints" / "step-00000020"
    data = (target / "model.safetensors").read_bytes()
    (target / "model.safetensors").write_bytes(data[:-100])
    before = files_of(finished)
    out = cli(ROOT / "train.py", train_yaml("done"), "--resume", target, "--set", f"run.dir={tmp_path / 'new'}")
    one_line_error(
        out,
        f"{target}: cannot resume from it: model.safetensors is truncated (",
        "choose another checkpoint (--resume auto takes the newest one that loads)",
    )
    assert files_of(finished) == before and not (tmp_path / "new").exists()
    out = cli(ROOT / "evaluate.py", target, "--quiet")  # loading it for evaluation: one line too
    one_line_error(out, f"{target / 'model.safetensors'}: cannot load (")


@pytest.mark.parametrize(
    "aside, half",
    [
        (".step-00000020.old-4242-0a1b2c3d", ".step-00000020.tmp-4242-9f8e7d6c"),  # gpt.common.files' names
        (".old-step-00000020-4242", ".tmp-step-00000020-4242"),  # an earlier version's
    ],
)
def test_an_interrupted_same_step_replacement_is_recovered(finished, train_yaml, tmp_path, capsys, aside, half):
    ckpts = finished / "checkpoints"
    before = files_of(ckpts / "step-00000020")
    # a kill between the two renames of save_checkpoint: the old folder aside, the new one not yet in place
    (ckpts / "step-00000020").rename(ckpts / aside)
    shutil.copytree(ckpts / aside, ckpts / half)
    (ckpts / ".latest.tmp-4242-0a1b2c3d").write_text("step-000")  # and a pointer half-written
    (finished / "summary.json").unlink()
    summary = train(load_config(train_yaml("done")), resume="auto")
    err = capsys.readouterr().err
    assert f"recovered step-00000020 from {aside}" in err
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert files_of(ckpts / "step-00000020") == before
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "latest", "step-00000010", "step-00000020"]


def test_missing_latest_target_names_the_fix(finished):
    shutil.rmtree(finished / "checkpoints" / "step-00000020")
    with pytest.raises(
        CheckpointError,
        match=r"latest names step-00000020, which is missing or incomplete; give a "
        r"checkpoint folder instead \(checkpoints there: step-00000010\)",
    ):
        find_checkpoint(finished)


# ----------------------------------------------------------------------------- write failures


def limit_file_size(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_stops_cleanly(train_yaml, tmp_path, tiny_run_copy):
    cfg = train_yaml("limited")  # its model.safetensors is about 170 KB; every other file of the run is smaller
    out = run_cli(ROOT / "train.py", cfg, preexec_fn=limit_file_size(100_000))
    assert out.returncode == 4 and "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted at step 10: cannot write checkpoint step-00000010 in ")
    assert "File too large; no checkpoint was written yet; free space or fix the folder" in last
    ckpts = tmp_path / "limited" / "checkpoints"
    assert list(ckpts.iterdir()) == []  # the half-written temporary folder is gone
    # with a good checkpoint behind it: the message names it, and it stays as it was
    shutil.rmtree(tmp_path / "limited")
    completed = tiny_run_copy("limited")  # the same config's run, trained with no limit (in this process)
    assert json.loads((completed / "summary.json").read_text())["status"] == "completed"
    rewind_to_step_10(completed)
    before = files_of(ckpts)
    out = run_cli(ROOT / "train.py", cfg, "--resume", "auto", preexec_fn=limit_file_size(100_000))
    assert out.returncode == 4 and "Traceback" not in out.stderr, out.stderr
    assert "cannot write checkpoint step-00000020 in " in out.stderr
    assert "File too large; the last good checkpoint is step-00000010" in out.stderr
    assert files_of(ckpts) == before


def test_a_refused_write_names_the_reason(train_yaml, tmp_path, monkeypatch, capsys):
    import safetensors.torch  # gpt.run.checkpoints imports save_model from it when it saves

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(safetensors.torch, "save_model", refuse)
    summary = train(load_config(train_yaml()))
    assert summary["status"] == "interrupted" and summary["steps"] == 10
    assert summary["stop_reason"].startswith("cannot write checkpoint step-00000010 in ")
    assert "Permission denied; no checkpoint was written yet" in summary["stop_reason"]
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []
    assert capsys.readouterr().err.count("interrupted at step 10: cannot write checkpoint") == 1


def test_os_reason_reads_library_messages():
    full = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    full.__context__ = OSError(28, "No space left on device")
    assert os_reason(full) == "No space left on device"
    assert os_reason(Exception("Error while serializing: I/O error: (os error 28)")) == "No space left on device"
    assert os_reason(ValueError("plain\nsecond")) == "plain"


# ---------------------------------------------------------------------------- foreign data


def test_token_ids_beyond_the_vocabulary(train_yaml, tmp_path):
    data = write_token_set(tmp_path / "big", n_train=20_000, n_val=4_000, n_test=4_000)
    write_meta(data, 50257)  # a GPT-2 set for a 256-token model
    with pytest.raises(
        DataError,
        match=r"big: its tokenizer \(synthetic\) has 50,257 tokens, more than "
        r"model.vocab_size 256",
    ):
        train(load_config(train_yaml(), [f"data.path={data}"]))
    write_meta(data, VOCAB)  # the record says 256, but the validation split holds a larger id
    val = np.fromfile(data / "val.bin", dtype=np.uint16)
    val[1000] = 300
    val.tofile(data / "val.bin")
    with pytest.raises(DataError, match=r"val.bin \[0, 2,048\): token id 300 is >= model.vocab_size 256"):
        train(load_config(train_yaml(), [f"data.path={data}"]))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before training
    val[1000] = 1
    val.tofile(data / "val.bin")
    tokens = np.fromfile(data / "train.bin", dtype=np.uint16)
    tokens[5_000:5_100] = 999  # in some training batch
    tokens.tofile(data / "train.bin")
    with pytest.raises(DataError, match=r"train.bin, step \d+: token id 999 is >= model.vocab_size 256"):
        train(load_config(train_yaml(), [f"data.path={data}", "train.steps=70"]))


def test_malformed_files_are_one_line(train_yaml, tmp_path, token_set, finished, cli):
    data = tmp_path / "data"
    shutil.copytree(token_set, data)
    for meta, said in (
        ([1, 2], "damaged token set record (a JSON list, not an object); prepare the set again"),
        ({"dtype": "float7"}, "dtype 'float7' is not a token dtype"),
        ("{not json", "not valid JSON"),
    ):
        (data / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        one_line_error(cli("train", train_yaml("m"), "--set", f"data.path={data}"), said)
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes(train_yaml("u").read_text().encode("utf-16"))
    one_line_error(cli("train", utf16), f"{utf16}: not UTF-8 text (byte 0:")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    one_line_error(cli("train", binary), f"{binary}: not UTF-8 text")
    out = cli("evaluate", finished, "--batch-size=-1")  # argparse's own usage line and error
    assert out.returncode == 2
    assert "argument --batch-size: '-1' is not a positive whole number" in out.stderr
    # files that evaluate.py and compare.py read, garbled
    assert cli("evaluate", finished, "--quiet").returncode == 0
    ckpt = finished / "checkpoints" / "step-00000020"
    before = files_of(finished)
    for path, what, args in (
        (finished / "summary.json", "summary", ("evaluate", finished, "--quiet")),
        (finished / "summary.json", "summary", ("compare", finished, "--out", tmp_path / "c")),
        (ckpt / "eval-test-fp32.json", "evaluation result", ("compare", finished, "--out", tmp_path / "c")),
        (finished / "config.yaml", "config", ("compare", finished, "--out", tmp_path / "c")),
    ):
        original = path.read_bytes()
        path.write_bytes(b"\x00garbled: [")
        one_line_error(cli(*args), f"{path}: damaged {what}")
        path.write_bytes(original)
    assert files_of(finished) == before
    # and through train.py, the front door
    (data / "meta.json").write_text("[]")
    one_line_error(cli(ROOT / "train.py", train_yaml("m"), "--set", f"data.path={data}"), "a JSON list")


def test_preparation_faults_name_the_real_cause(tmp_path, capsys):
    from gpt.commands.prepare_data import main

    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "latin.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": "b"\n')
    for name, said in (
        ("binary.txt", "cannot read as text: UnicodeDecodeError: 'utf-8' codec can't decode byte"),
        ("latin.txt", "cannot read as text: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9"),
        ("bad.jsonl", "cannot read as json: ArrowInvalid: JSON parse error"),
    ):
        assert main([str(tmp_path / name), "--out", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {tmp_path / name}: {said}") and err.count("\n") == 1, err
    # a killed preparation's temporary folder: removed by the next one, and never taken for a data set
    abandoned = tmp_path / ".corpus.tmp-999999999"
    abandoned.mkdir()
    (abandoned / "train.bin").write_bytes(b"\x00\x01" * 100)
    with pytest.raises(DataError, match=r"no meta.json, so not a complete prepared set"):
        from gpt.data.folders import open_split

        open_split(abandoned, "train")
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"document {i} " * 50 for i in range(40)))
    assert (
        main(
            [
                str(tmp_path / "corpus.txt"),
                "--out",
                str(tmp_path / "corpus"),
                "--sample-by",
                "paragraph",
                "--val-tokens",
                "100",
                "--test-tokens",
                "100",
                "--quiet",
            ]
        )
        == 0
    ), capsys.readouterr().err
    assert not abandoned.exists() and (tmp_path / "corpus" / "meta.json").is_file()


def test_sweep_reads_the_run_not_torchruns_exit_status(tmp_path, train_yaml, monkeypatch):
    from gpt.sweep import launch as grid

    cell = grid.lay_out(train_yaml(), ["pytorch_layernorm"], [0], tmp_path / "runs")[0]
    cell.run.path.mkdir(parents=True)

    def torchrun_after_sigterm(command, **kwargs):  # torchrun says 1 for a clean SIGTERM of its workers
        cell.run.write_summary({"status": "interrupted"})
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(grid.subprocess, "run", torchrun_after_sigterm)
    with pytest.raises(
        UserError,
        match=r"run-pytorch-layernorm-s0: training stopped \(interrupted, exit status 1\); "
        r"rerun the sweep to resume it",
    ):
        grid.train_cell(train_yaml(), cell, nproc=2)


def test_an_old_no_norm_run_with_settings_now_refused_loads_as_the_model_it_built(train_yaml, tmp_path, capsys):
    """Before no_norm refused a QK-norm, a placement or final_norm false (one model under several names), runs
    were written with them: a run folder, its checkpoints and a published config.json still load, said so."""
    from gpt.commands.evaluate import main as evaluate_main
    from gpt.config.architecture import from_hub

    config = train_yaml("old")
    config.write_text(config.read_text().replace("norm_type: pytorch_layernorm}", "norm_type: no_norm}"))
    cfg = load_config(config)
    train(cfg)
    written = [cfg.run_dir / "config.yaml", *sorted((cfg.run_dir / "checkpoints").glob("*/config.yaml"))]
    for f in written:  # as the run was written then: qk_norm a bool, no qk_norm_type
        text = (
            f.read_text()
            .replace("norm_placement: pre", "norm_placement: post")
            .replace("final_norm: true", "final_norm: false")
        )
        f.write_text("".join(line for line in text.replace("qk_norm: none", "qk_norm: true").splitlines(True)
                             if "qk_norm_type" not in line))  # fmt: skip
    with pytest.raises(ConfigError, match="model.qk_norm: qk_norm_type no_norm builds no QK-norm; set model.qk_norm"):
        load_config(written[0])  # as a new config: still refused
    before = {f: f.read_bytes() for f in written}
    assert evaluate_main([str(cfg.run_dir), "--quiet"]) == 0
    err = capsys.readouterr().err
    ckpt = find_checkpoint(cfg.run_dir)
    for said in (
        "model.qk_norm head with qk_norm_type no_norm builds no QK-norm: read as qk_norm none, the model it built",
        "model.norm_placement post with norm_type no_norm builds the pre-norm no_norm model (no norm to place): read "
        "as norm_placement pre, the model it built",
        "model.final_norm false with norm_type no_norm builds the same model (no final norm either way): read as "
        "final_norm true, the model it built",
    ):
        assert f"note: {ckpt / 'config.yaml'}: {said}\n" in err
    assert "error" not in err and (ckpt / "eval-test-fp32.json").is_file()
    assert {f: f.read_bytes() for f in written} == before  # read as built, never rewritten
    published = {"norm_type": "no_norm", "norm_placement": "post", "qk_norm": True, "final_norm": False}
    options = from_hub(published)
    assert (options["norm_placement"], options["qk_norm"], options["final_norm"]) == ("pre", "none", True)


def test_a_kill_before_the_summary_resumes_to_the_same_summary(finished, train_yaml):
    """Killed after the last checkpoint, before summary.json: the resume has no step left to run, and its summary
    still says the run's final train loss (kept in the checkpoint), not null."""
    first = json.loads((finished / "summary.json").read_text())
    (finished / "summary.json").unlink()
    again = train(load_config(train_yaml("done")), resume="auto")
    assert again["steps"] == first["steps"] == 20 and again["status"] == "completed"
    assert first["final_train_loss"] is not None and again["final_train_loss"] == first["final_train_loss"]
    assert again["best_val_loss"] == first["best_val_loss"]


def test_a_peri_run_computing_norms_in_their_input_dtype_resumes_to_the_same_bits(train_yaml, tmp_path):
    """norm_compute_dtype: input is upgraded to float32 only where it changes nothing (pre/post without QK-norm):
    a peri run under bf16 autocast keeps it through a kill and a resume, and ends on the uninterrupted run's bits."""
    config = train_yaml("peri")
    text = config.read_text().replace("precision: fp32", "precision: bf16")
    config.write_text(text.replace("norm_type: pytorch_layernorm}", "norm_type: handrolled_layernorm, "
                                   "norm_placement: peri, norm_compute_dtype: input}"))  # fmt: skip
    cfg = load_config(config)
    train(cfg)
    killed = tmp_path / "killed"
    shutil.copytree(cfg.run_dir, killed)
    shutil.rmtree(killed / "checkpoints" / "step-00000020")  # as a kill after step 10's checkpoint leaves it
    (killed / "checkpoints" / "latest").write_text("step-00000010\n")
    (killed / "summary.json").unlink()
    resumed = load_config(killed / "config.yaml", [f"run.dir={killed}"])
    assert (resumed.model.norm_placement, resumed.model.norm_compute_dtype) == ("peri", "input")
    train(resumed, resume="auto")
    assert same_weights(weights(cfg.run_dir), weights(killed))
    saved = load_config(killed / "checkpoints" / "step-00000020" / "config.yaml")
    assert saved.model.norm_compute_dtype == "input"
