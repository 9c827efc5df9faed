"""sweep.py --launcher slurm against a real one-node SLURM cluster (tests/sweep/local_slurm.py): the same
comparison and bits as a local sweep, a cell requeued at its time-limit signal resumed to the same bits, an
idempotent resubmission, a failing cell named by the comparison, a dry run that submits nothing. Two cells (two
norm types, one seed) show each of these: one is requeued, fails or is cancelled while the other is not. The tests
that use the cluster are ``serial``: they share it, and a cell caught mid-run needs the CPUs it was given."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from sweep.slurm_fixtures import meanwhile
from synthetic import sized_grid_yaml

from gpt.run.directory import find_checkpoint
from gpt.sweep import controller
from gpt.sweep.cells import lr_text

NORMS, SEEDS = ["pytorch_layernorm", "no_norm"], ["0"]
CELLS = [f"slurmgrid-{n.replace('_', '-')}-s{s}" for n in NORMS for s in SEEDS]


@pytest.fixture
def grid(train_yaml):
    """A tiny config of 240 steps (checkpoints every 20), long enough to be caught mid-run."""
    return sized_grid_yaml(train_yaml("slurmgrid"), steps=240, checkpoint_every=20, eval_every=80)


def sweep_argv(cluster, config, *args):
    """The sweep command as a user runs it against the cluster (the jobs it submits inherit its environment)."""
    env = {**cluster.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    argv = [sys.executable, "-m", "gpt.commands.sweep", str(config), "--norm-types", *NORMS, "--seeds", *SEEDS]
    return [*argv, *args], env


def sweep(cluster, tmp_path, config, *args, check=True):
    """The sweep command run in ``tmp_path``, to its end."""
    argv, env = sweep_argv(cluster, config, *args)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def jobs_record(runs):
    return json.loads((runs / "slurmgrid-slurm" / "jobs.json").read_text())


def final_weights(run):
    return load_file(str(find_checkpoint(run) / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.serial
def test_dry_run_prints_the_scripts_and_submits_nothing(slurm_cluster, grid, tmp_path, cli):
    env = {"SLURM_CONF": slurm_cluster.conf, "PATH": slurm_cluster.env["PATH"]}
    args = [grid, "--norm-types", *NORMS, "--seeds", "0", "1", "--launcher", "slurm", "--time", "00:10:00"]
    done = cli("sweep", *args, "--dry-run", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --array=0,1,2,3" in done.stdout
    assert "#SBATCH --signal=B:USR1@120" in done.stdout
    assert "--in-job compare" in done.stdout
    assert "comparison: after the cell array" in done.stdout
    assert slurm_cluster.queue() == []
    assert not (tmp_path / "runs" / "slurmgrid-slurm" / "jobs.json").exists()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.serial
def test_slurm_sweep_equals_local_and_a_requeued_cell_resumes_to_the_same_bits(
    slurm_cluster, grid, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # The local sweep, one cell after another in one process, runs meanwhile: it has the CPUs while the SLURM
    # cells wait (held, requeued, or for the comparison job).
    argv, env = sweep_argv(slurm_cluster, grid, "--runs-dir", "local")
    meanwhile(argv, tmp_path, env, lambda: slurm_sweep_and_requeue(slurm_cluster, grid, tmp_path))
    runs = tmp_path / "runs"
    slurm_result = json.loads((runs / "slurmgrid-comparison" / "comparison.json").read_text())
    local_result = json.loads((tmp_path / "local" / "slurmgrid-comparison" / "comparison.json").read_text())
    for g_slurm, g_local in zip(slurm_result["groups"], local_result["groups"], strict=True):
        assert g_slurm["test_loss_mean"] == g_local["test_loss_mean"]
    for cell in jobs_record(runs)["cells"]:
        ours, theirs = final_weights(runs / cell), final_weights(tmp_path / "local" / cell)
        assert all(ours[k].equal(theirs[k]) for k in theirs), cell


def slurm_sweep_and_requeue(slurm_cluster, grid, tmp_path):
    """The SLURM sweep of ``grid``: submitted held, resubmitted, a cell cancelled and resubmitted alone, the other
    requeued at its time-limit signal; waits for the comparison job."""
    first = sweep(slurm_cluster, tmp_path, grid, "--launcher", "slurm", "--slurm-opt", "hold")
    runs = tmp_path / "runs"
    jobs = jobs_record(runs)
    cell_jobs = [jobs["cells"][cell] for cell in CELLS]
    assert "submitted job array" in first.stdout and jobs["compare"]

    # Resubmitting while the cells wait submits nothing; a cancelled cell is resubmitted alone.
    again = sweep(slurm_cluster, tmp_path, grid, "--launcher", "slurm")
    assert "submitted" not in again.stdout.replace("left alone", ""), again.stdout
    assert jobs_record(runs) == jobs
    slurm_cluster.run("scancel", cell_jobs[1])
    slurm_cluster.wait_until(lambda: controller.state(cell_jobs[1]) in (None, "CANCELLED"), 30, "the cancel")
    third = sweep(slurm_cluster, tmp_path, grid, "--launcher", "slurm")
    after = jobs_record(runs)
    assert [c for c in after["cells"] if after["cells"][c] != jobs["cells"][c]] == ["slurmgrid-no-norm-s0"]
    assert after["compare"] == jobs["compare"]  # the pending comparison now also waits for the new job
    assert after["cells"]["slurmgrid-no-norm-s0"].split("_")[0] in slurm_cluster.job(jobs["compare"])["Dependency"]
    assert "(1 cell(s), tasks 1)" in third.stdout
    slurm_cluster.run("scontrol", "release", cell_jobs[0].split("_")[0])

    # Cell 0 gets its time-limit signal mid-run: it checkpoints, requeues itself and resumes.
    metrics = runs / "slurmgrid-pytorch-layernorm-s0" / "metrics.jsonl"
    slurm_cluster.wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 30, 120, "cell 0")
    slurm_cluster.signal(cell_jobs[0], "USR1")  # what SLURM sends --signal-seconds before the time limit
    slurm_cluster.wait_until(lambda: controller.job_info(cell_jobs[0]).get("Restarts") == "1", 60, "the requeue")
    slurm_cluster.wait_until(lambda: controller.state(cell_jobs[0]) == "PENDING", 60, "the requeued job waiting")
    slurm_cluster.release(cell_jobs[0])  # (released before it is PENDING again, it keeps its ~120 s hold)
    slurm_cluster.wait_until(lambda: slurm_cluster.state(jobs["compare"]) == "COMPLETED", 600, "the comparison")

    status = sweep(slurm_cluster, tmp_path, grid, "--status").stdout
    row = next(line for line in status.splitlines() if line.startswith("slurmgrid-pytorch-layernorm-s0 "))
    assert row.split()[-1] == "1" and "240 / 240" in row, status  # requeued once, finished
    events = (runs / "slurmgrid-slurm" / "events" / "slurmgrid-pytorch-layernorm-s0.jsonl").read_text()
    ends = [e for e in map(json.loads, events.splitlines()) if e["event"] == "end"]
    assert [e["outcome"] for e in ends] == ["requeued", "done"]
    assert json.loads((runs / "slurmgrid-pytorch-layernorm-s0" / "summary.json").read_text())["segments"][1:]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.serial
def test_a_failing_cell_is_not_requeued_and_the_comparison_names_it(slurm_cluster, grid, tmp_path):
    blocked = tmp_path / "runs" / "slurmgrid-no-norm-s0"
    blocked.parent.mkdir()
    blocked.write_text("a file where the run's folder goes\n")
    sweep(slurm_cluster, tmp_path, grid, "--launcher", "slurm", "--set", "train.steps=20")
    compare_job = jobs_record(tmp_path / "runs")["compare"]
    slurm_cluster.wait_until(lambda: slurm_cluster.state(compare_job) == "COMPLETED", 600, "the comparison")
    failing = jobs_record(tmp_path / "runs")["cells"]["slurmgrid-no-norm-s0"]
    info = slurm_cluster.job(failing)
    assert (info["JobState"], info["Restarts"]) == ("FAILED", "0")
    report = (tmp_path / "runs" / "slurmgrid-comparison" / "comparison.md").read_text()
    line = next(x for x in report.splitlines() if "slurmgrid-no-norm-s0" in x)
    assert line.startswith("**Failed, no result:** slurmgrid-no-norm-s0: error: cannot write the run directory runs/")
    status = sweep(slurm_cluster, tmp_path, grid, "--set", "train.steps=20", "--status").stdout
    assert "FAILED" in status and "error: " in status
    assert blocked.read_text() == "a file where the run's folder goes\n"  # nothing of the user's touched


def test_scripts_on_paper_for_several_nodes(grid, tmp_path, cli):
    """Two nodes of 8 GPUs: the script asks for them; the cells' torchrun meets on the first node (srun)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp_path}
    done = cli("sweep", grid, "--norm-types", "dyt", "--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "8",
               "--partition", "gpu", "--account", "lab", "--qos", "high", "--constraint", "h100",
               "--push-to-hub", "alice", "--dry-run", cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for line in ("--nodes=2", "--gpus-per-node=8", "--partition=gpu", "--account=lab", "--qos=high",
                 "--constraint=h100"):  # fmt: skip
        assert f"#SBATCH {line}\n" in done.stdout
    assert "--nproc 8" in done.stdout
    compare_line = next(x for x in done.stdout.splitlines() if x.endswith("--in-job compare"))
    assert "--push-to-hub alice" in compare_line  # the comparison job publishes the sweep when it has compared


def test_a_cell_on_several_nodes_runs_the_preflight_then_torchrun_on_each_under_srun(monkeypatch):
    from gpt.sweep import cell_job, controller

    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(controller, "head_node", lambda: "gpu-a01")
    cell_job.rendezvous.cache_clear()
    start = cell_job.job_launcher(8)
    assert start[:6] == [
        *("srun", "--kill-on-bad-exit=1", "--ntasks=2", "--ntasks-per-node=1"),
        *("env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),  # a node that replaces a lost one finds the others
    ]
    assert start[-5:] == [
        "--nproc_per_node=8",
        "--rdzv-id=77",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cell_job.rendezvous()}",
        "-m",
    ]
    host, port = cell_job.rendezvous().split(":")
    assert host == "gpu-a01" and 1024 <= int(port) < 65536  # a port free on the first node, this job's own
    # before it, each node checks that the nodes meet where torchrun will meet them
    assert cell_job.preflight_command()[:4] == start[:4]
    assert cell_job.preflight_command()[-3:] == [
        *("gpt.commands.preflight", "--nodes=2", f"--rendezvous={cell_job.rendezvous()}"),
    ]
    monkeypatch.setenv("SLURM_NNODES", "1")
    assert cell_job.job_launcher(8)[-3:] == ["--standalone", "--nproc_per_node=8", "-m"]
    assert cell_job.preflight_command() is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--slurm-opt", "array=0-3"], "error: --slurm-opt array=0-3: the sweep sets --array itself"),
        (["--slurm-opt", "=x"], "error: --slurm-opt '=x': expected KEY=VALUE or KEY"),
        (["--nodes", "0"], "error: --nodes 0 must be >= 1"),
        ([], "error: sbatch: not found; --launcher slurm runs on a SLURM cluster's login node"),
        # a line break in a value would end sbatch's directives and run the rest as a shell line: refused
        (["--slurm-opt", "mem=500M\ntouch x", "--dry-run"],
         "error: '--mem=500M\\ntouch x': a SLURM option or path with a line break or control character cannot go "
         "into a job script; give it on one line"),
        (["--partition", "gpu\rrm -rf x", "--dry-run"], "error: '--partition=gpu\\rrm -rf x': a SLURM option or"),
        (["--qos", "hi\x00", "--dry-run"], "error: '--qos=hi\\x00': a SLURM option or path with a line break"),
    ],
)  # fmt: skip
def test_slurm_options_a_user_gets_wrong_are_one_line_before_anything_is_submitted(grid, tmp_path, args, message, cli):
    env = {"PATH": tmp_path, "HOME": tmp_path}  # no sbatch on the PATH
    done = cli("sweep", grid, "--norm-types", "dyt", "--launcher", "slurm", *args, cwd=tmp_path, env=env)
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert done.stderr.startswith(message)
    assert not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.serial
def test_a_two_stage_sweep_on_slurm_submits_the_confirmation_from_the_selection_job(
    slurm_cluster, train_yaml, tmp_path
):
    """--lrs with --confirm-seeds: the grid's array, then a comparison job that chooses the rates and submits,
    from inside its job, the confirmation cells (each chosen rate on the fresh seeds) and the final comparison."""
    config = sized_grid_yaml(train_yaml("stages"), steps=6, checkpoint_every=6, eval_every=6)
    lrs, confirm = ["3e-2", "1e-1"], ["2", "3"]
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    argv = [sys.executable, "-m", "gpt.commands.sweep", str(config), "--norm-types", *NORMS, "--seeds", "0", "1"]
    argv += ["--lrs", *lrs, "--confirm-seeds", *confirm, "--launcher", "slurm", "--time", "00:10:00"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = tmp_path / "runs"
    first = json.loads((runs / "stages-slurm" / "jobs.json").read_text())
    assert len(first["cells"]) == 2 * 2 * 2  # the grid alone: the rates are not chosen yet
    final = runs / "stages-comparison" / "comparison.json"
    slurm_cluster.wait_until(final.is_file, 600, "the final comparison")
    jobs = json.loads((runs / "stages-slurm" / "jobs.json").read_text())
    assert jobs["compare"] != first["compare"] and slurm_cluster.state(first["compare"]) == "COMPLETED"
    selection = json.loads((runs / "stages-comparison-selection" / "comparison.json").read_text())["selection"]
    chosen = {f["family"]: f["chosen_value"] for f in selection["families"]}
    expected = [f"stages-{n.replace('_', '-')}-lr{lr_text(chosen[n])}-s{s}" for n in NORMS for s in confirm]
    assert sorted(set(jobs["cells"]) - set(first["cells"])) == sorted(expected)  # the confirmation, and no more
    result = json.loads(final.read_text())
    assert result["confirmation"]["confirm_seeds"] == [2, 3] and result["selection"] is None
    for group in result["groups"]:
        assert group["seeds"] == confirm
        folders = [runs / f"stages-{group['group'].replace('_', '-')}-lr{lr_text(chosen[group['group']])}-s{s}"
                   for s in confirm]  # fmt: skip
        losses = [json.loads((find_checkpoint(f) / "eval-test-fp32.json").read_text())["loss"] for f in folders]
        assert group["test_loss_mean"] == pytest.approx(sum(losses) / len(losses))


def processes_running(*words: str) -> list[int]:
    """PIDs of the processes whose command line holds every one of ``words``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = (Path("/proc") / entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            line = " ".join(a.decode(errors="replace") for a in argv)
            if all(w in line for w in words) and int(entry) != os.getpid():
                pids.append(int(entry))
    return pids


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.serial
def test_a_trainer_does_not_outlive_its_job_and_one_resubmission_finishes(slurm_cluster, grid, tmp_path, monkeypatch):
    """kill -9 of the cell job's own Python (as scancel -s KILL, a hard time limit or the OOM killer): its trainer,
    in a session of its own, once trained on outside SLURM; now it checkpoints and stops, and one resubmission
    finishes the sweep."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # controller.state asks scontrol from this process
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    argv = [sys.executable, "-m", "gpt.commands.sweep", str(grid), "--norm-types", "pytorch_layernorm"]
    argv += ["--seeds", "0", "--launcher", "slurm"]
    subprocess.run(argv, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120)
    run = tmp_path / "runs" / "slurmgrid-pytorch-layernorm-s0"
    job = jobs_record(tmp_path / "runs")["cells"]["slurmgrid-pytorch-layernorm-s0"]
    metrics = run / "metrics.jsonl"
    slurm_cluster.wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 25, 120, "training")
    (job_python,) = processes_running("gpt.commands.sweep", "--in-job", "cell:0", str(grid))
    assert processes_running("gpt.commands.train", str(grid))  # the trainer, the job's child
    os.kill(job_python, signal.SIGKILL)
    slurm_cluster.wait_until(lambda: not processes_running("gpt.commands.train", str(grid)), 30, "the trainer's end")
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"  # it checkpointed and stopped
    slurm_cluster.wait_until(lambda: controller.state(job) not in controller.ACTIVE, 60, "the job's end")
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "resubmitted" in done.stdout, done.stdout + done.stderr
    compare_job = jobs_record(tmp_path / "runs")["compare"]
    slurm_cluster.wait_until(lambda: slurm_cluster.state(compare_job) == "COMPLETED", 300, "the comparison")
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert len(json.loads((run / "summary.json").read_text())["segments"]) == 2  # resumed, not started again
