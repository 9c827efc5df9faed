"""The GPU check: the CUDA tests and the benchmark, in a time budget, on a fresh GPU VM before a long run.

    bash scripts/gpu_check.sh OUTDIR [--budget-s 480] [--stages eager,compiled,tests,...] [--quick] [--cache-dir DIR]
    bash scripts/gpu_check.sh OUTDIR [--quick] --plan      # the plan only: no GPU needed, nothing run
    python -m gpt.commands.gpu_check OUTDIR --tests tests/speed/test_cuda.py --config configs/gpt2-small.yaml [...]

The script checks that a GPU is visible, then runs this command with the checkout's test
file and config. Stages run in this order, each under its own time limit sized from what is
left of the budget (``gpt.speed.stages``): the write-up's question first (compile off and on
for the two LayerNorms), then the tests, then the optional stages (*), on whatever time is
left over. One that would not fit is skipped, and the summary says with how much time:

    eager           GPT-2 small in bf16 on random tokens, compile off: PyTorch and hand-rolled
                    LayerNorm, then the other norm types
    compiled        GPT-2 small compiled: PyTorch and hand-rolled LayerNorm
    tests           the CUDA tests: bf16 / fp16 training, every fast-path option, exact resume, no
                    waiting for the GPU between log steps, flash attention, the norms' precision under
                    autocast, NCCL DDP (2 GPUs), the micro-batch search, the benchmark, one compiled
                    GPT-2 small row in its time
    norms*          each norm layer alone, eager and compiled (the norm-only benchmark)
    micro_batch*    the largest micro-batch of GPT-2 small on this GPU
    compiled_rest*  GPT-2 small compiled: the other norm types

``--quick``: one eager and one compiled row of PyTorch's LayerNorm, then the tests that prove
correctness on CUDA (bf16 and fp16 steps, exact resume with the fast path, flash attention, the
norms' precision under autocast).

Each stage's seconds, min / cap (expected; --quick's in brackets): eager 25 / 70 (62) [18 / 25
(18)], compiled 203 / none (203) [107 / none (107)], tests 180 / 300 (217) [60 / 90 (30)],
norms 20 / 45 (45), micro_batch 30 / 60 (58), compiled_rest 107 / none (492). The expected
seconds are an estimate for GPT-2 small in bf16 on one H100, at the slow end of what is known:
a stage's process starts in 10 s (Python, torch, the CUDA context); a step row builds in 3.2 s
(measured), compiles cold in 90 s (40-90 s; each norm type is a graph of its own, so the two
LayerNorms are two cold compiles) or from the cache in 20 s (10-20 s), then runs 3 untimed
steps (the first compiling) and 10 timed ones, each of 8 micro-steps of 12 x 1024 tokens, 30
ms a micro-step compiled (25-35 ms: 35-45% MFU) and 40 ms eager (no fusions). So compiled:
10 + 2 x (3.2 + 90 + 13 x 8 x 0.030) = 203 s; --quick's one row: 107 s. The tests: pytest's
start 10 s, about 15 short training runs of 4 s, four cold compiles of a small model of 20 s,
three subprocesses of 10 s, and the compiled GPT-2 small row from the cache the compiled stage
filled (37 s). A benchmark stage's minimum is the estimate for the rows it promises, which it
runs first (eager and compiled: the two LayerNorms; --quick: PyTorch's), and compiled has no
cap, so even should every stage before it use all of its own, compiled gets its rows' time:
full, 480 s - 8 s (the environment's probe) - 10 s (kept to stop a stage and write the
summary) - 70 s (eager's cap) - 180 s (the tests' minimum, kept for them) = 212 s >= 203 s;
--quick, 220 - 8 - 10 - 25 - 60 = 117 s >= 107 s. The optional stages (*) keep nothing from
the stages before them: they run on what the others leave. The plan (each stage's min, cap,
the limit it gets should every stage before it use all of its own, and its expected seconds
with how they are counted) is printed first and heads summary.txt; --plan prints it alone.

The budget is yours (--budget-s). The default budget (480 s, counted from this command's start) is
the first minutes of a fresh GPU VM, spent before a 2.5-hour run is paid for: whether the
environment trains at all, what each norm type costs, whether compile pays, with every row
kept should the VM be stopped or preempted on the way. --quick's (220 s) is a second look after
a fix: one eager and one compiled row of PyTorch's LayerNorm and the correctness tests; a rerun
on the same VM finds its compiled graphs in the cache (20 s a compile, not 90) and ends well
inside its budget.

Every benchmark row lands in ``rows.jsonl`` the moment it is measured (a row that fails is an
error row, and the next runs); ``summary.txt`` is rewritten after every stage and, while one
runs, as each row lands (the stage shown "running" with its seconds so far), so a kill at any
moment leaves a readable summary. The tests run under pytest -v, and the summary says how
many passed, failed and were skipped, which one was running when time ran out and which
never ran (without pytest, the test file runs its own tests, and says which passed and
failed). OUTDIR holds five files: summary.txt, rows.jsonl, tests.log, bench.log,
micro_batch.log.

Every stage compiles into one cache, DIR/inductor and DIR/triton (``--cache-dir``, default
``.cache/compile`` in the checkout this package is imported from, git-ignored; torch's FX
graph and autograd caches on), outside OUTDIR: a stage reuses what an earlier one compiled
for the same graph (the tests' compiled GPT-2 small row, the compiled stage's first), and a
rerun by the same command what the first run compiled, while the machine, and so the
checkout with its ignored files, is kept.

A SIGTERM or SIGINT (Ctrl-C) stops the stage under way with its whole process group
(SIGTERM, SIGKILL 5 s later), writes the summary (that stage "stopped" with the rows it
measured, the later ones "not run", the verdict "stopped") and exits with 128 + the
signal's number (143, 130), within 10 s. Otherwise the exit status is 0 when nothing
failed (a skipped stage, a measurement or the tests cut short by the budget are not
failures; a test that failed, a failed stage or an error row are), 1 otherwise.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from gpt.common.errors import UserError
from gpt.common.files import write_atomically
from gpt.config import NORM_TYPES
from gpt.speed.progress_plugin import results_of_tests
from gpt.speed.stages import (
    NAME_WIDTH,
    RESERVE_S,
    RUNNING,
    SKIPPED,
    Outcome,
    Stage,
    Stopped,
    budget_lines,
    run_stages,
    stopping_on,
)

BUDGET_S = 480  # a fresh VM's first minutes (docstring)
QUICK_BUDGET_S = 220
PROBE_S = 8.0  # what the environment's probe takes of the budget, as the docstring's arithmetic counts it
FILES = ("summary.txt", "rows.jsonl", "tests.log", "bench.log", "micro_batch.log")  # everything written to OUTDIR
LAYERNORMS = ["pytorch_layernorm", "handrolled_layernorm"]  # the write-up's question first
QUICK_TESTS = ["mixed_precision", "exact_resume", "flash_attention", "norm_precision"]  # the tests --quick runs
CHECKOUT = Path(__file__).resolve().parents[2]  # the checkout this package is imported from
CACHE_DIR = CHECKOUT / ".cache" / "compile"  # git-ignored; kept with the checkout while the machine is kept
REFRESH_S = 10.0  # while a stage runs and no row lands: how often the summary's seconds are brought up to date
ENVIRONMENT = """import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}")"""

# The plan's estimates, in seconds (docstring): GPT-2 small (configs/gpt2-small.yaml) in bf16 on one H100, at the
# slow end of what is known
START_S = 10.0  # a stage's process before its first row: Python, torch, the CUDA context
BUILD_S = 3.2  # a step row's build: the model, fused AdamW, the reader (measured)
COLD_COMPILE_S = 90.0  # a compiled row whose graph is not in the cache (40-90 s); each norm type is its own graph
WARM_COMPILE_S = 20.0  # one whose graph is (the FX graph and autograd caches: 10-20 s)
# one micro-step of 12 x 1024 tokens at 854 MFLOP a token: compiled 25-35 ms (35-45% of 989 TFLOP/s), eager 40 ms
MICRO_STEP_S = {True: 0.030, False: 0.040}
MICRO_STEPS = 8  # a step: the global batch of 96 sequences in micro-batches of 12, on one GPU
WARMUP, STEPS = 3, 10  # each step row: untimed steps (the first compiles), then timed ones
NORM_ROW_S = 5.0  # --norms-only, one norm type: its eager row (0.5 s) and compiled row (a small compile, 4.5 s)
PROBE_STEP_S = 4.0  # one probe of the micro-batch search: a build and two eager steps; about 12 probes
PYTEST_S = 10.0  # pytest's start: collecting the test file (torch, the package), the CUDA context
SHORT_RUN_S = 4.0  # one of the tests' training runs of a small model (its token set, 8-20 steps, a checkpoint)
SMALL_COMPILE_S = 20.0  # a cold compile of the tests' small model
SUBPROCESS_S = 10.0  # a test's subprocess start (train.py, bench.py, evaluate.py)


def compile_env(cache_dir: Path) -> dict[str, str]:
    """Every stage's environment: one compile cache for all (inductor's FX graph and autograd caches, triton's
    kernels), and output unbuffered so that a stage's log is whole up to the moment it is stopped."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def bench_command(python: str, config: Path, rows: str) -> list[str]:
    """The benchmark of GPT-2 small's steps on synthetic data in bf16 (``WARMUP`` + ``STEPS`` a row, compiled or
    not), rows appended to ``rows``."""
    options = ["--data", "synthetic", "--set", "train.precision=bf16", "--warmup", str(WARMUP), "--steps", str(STEPS)]
    return [python, "-m", "gpt.commands.bench", str(config), *options, "--jsonl", rows]


def rows_estimate(rows: int, compiled: bool, warm: bool = False) -> tuple[float, str]:
    """The seconds ``rows`` step rows of GPT-2 small take in one benchmark process, and how they are counted."""
    compile_s = (WARM_COMPILE_S if warm else COLD_COMPILE_S) if compiled else 0.0
    micro_s = MICRO_STEP_S[compiled]
    seconds = START_S + rows * (BUILD_S + compile_s + (WARMUP + STEPS) * MICRO_STEPS * micro_s)
    compiling = f" + {'warm' if warm else 'cold'} compile {compile_s:g} s" if compiled else ""
    how = (
        f"start {START_S:g} s + {rows} row{'s' * (rows != 1)} x (build {BUILD_S:g} s{compiling} + "
        f"{WARMUP}+{STEPS} steps x {MICRO_STEPS} micro-steps x {micro_s * 1e3:g} ms)"
    )
    return seconds, how


def tests_estimate(quick: bool) -> tuple[float, str]:
    """The seconds the CUDA tests take (``QUICK_TESTS`` with ``quick``), and how they are counted."""
    if quick:  # bf16 and fp16 runs, exact resume's three, flash attention's one step
        return PYTEST_S + 5 * SHORT_RUN_S, f"pytest {PYTEST_S:g} s + 5 training runs x {SHORT_RUN_S:g} s"
    row_s, _ = rows_estimate(1, compiled=True, warm=True)  # its graph in the cache: the compiled stage's first row
    seconds = PYTEST_S + 15 * SHORT_RUN_S + 4 * SMALL_COMPILE_S + 3 * SUBPROCESS_S + row_s
    how = (
        f"pytest {PYTEST_S:g} s + 15 training runs x {SHORT_RUN_S:g} s + 4 small cold compiles x "
        f"{SMALL_COMPILE_S:g} s + 3 subprocesses x {SUBPROCESS_S:g} s + a compiled GPT-2 small row from the "
        f"cache {math.ceil(row_s)} s"
    )
    return seconds, how


def test_command(python: str, tests: Path, quick: bool) -> list[str]:
    """The CUDA tests: through pytest, each named as it starts and ends (-v) after the list of all it will run
    (the plugin), so that a run cut short says what ran and what did not; on a machine without pytest, the
    file running its tests itself."""
    if importlib.util.find_spec("pytest") is None:
        return [python, str(tests), *(QUICK_TESTS if quick else [])]
    plugin = ["-p", "no:cacheprovider", "-p", "gpt.speed.progress_plugin"]
    command = [python, "-m", "pytest", str(tests), "-m", "cuda", *plugin, "-v", "-ra"]
    return command + (["-k", " or ".join(QUICK_TESTS)] if quick else [])


def check_stages(
    out: Path, tests: Path, config: Path, quick: bool, python: str = sys.executable, cache_dir: Path = CACHE_DIR
) -> list[Stage]:
    """The check's stages, in order, with their minimum, cap and expected seconds (the docstring's table). Each
    keeps its results as they come (rows, probes, test results), so running out of time cuts it, never fails it.
    A benchmark stage's minimum is the estimate for the rows it promises: the two LayerNorms (--quick: the
    first), which come first in it."""
    rows = str(out / "rows.jsonl")
    bench = bench_command(python, config, rows)
    promised = LAYERNORMS[:1] if quick else LAYERNORMS
    rest = [n for n in NORM_TYPES if n not in LAYERNORMS]
    eager_norms = promised if quick else promised + rest
    stage = functools.partial(Stage, cut_ok=True, env=compile_env(cache_dir))

    def bench_stage(name: str, norms: list[str], compiled: bool, promises: int, max_s: float | None, **kw) -> Stage:
        """A benchmark of ``norms``, its minimum the estimate for the first ``promises`` rows."""
        expected_s, how = rows_estimate(len(norms), compiled)
        least = math.ceil(rows_estimate(promises, compiled)[0])
        what = f"GPT-2 small, bf16, {'compiled' if compiled else 'compile off'}: {', '.join(norms)}"
        command = [*bench, "--compile", "on" if compiled else "off", "--norm-types", *norms]
        return stage(name, what, command, "bench.log", least, max_s, expected_s=expected_s, estimate=how, **kw)

    tests_s, tests_how = tests_estimate(quick)
    stages = [
        bench_stage("eager", eager_norms, False, len(promised), 25 if quick else 70),
        bench_stage("compiled", promised, True, len(promised), None),
        stage(
            "tests",
            "the CUDA tests" + (f" ({', '.join(QUICK_TESTS)})" if quick else ""),
            test_command(python, tests, quick),
            "tests.log",
            *((60, 90) if quick else (180, 300)),
            findings=results_of_tests,  # which ran, passed, failed; a failed test fails the stage, cut or not
            expected_s=tests_s,
            estimate=tests_how,
        ),
    ]
    if quick:
        return stages
    return (
        stages
        + leftover_stages(stage, python, config, rows)
        + [bench_stage("compiled_rest", rest, True, 1, None, optional=True)]
    )


def leftover_stages(stage, python: str, config: Path, rows: str) -> list[Stage]:
    """The full check's optional stages run on time left over (``stage``: ``Stage`` with the check's settings):
    the norm layers alone and the micro-batch search."""
    return [
        stage(
            "norms",
            "each norm layer alone, 12 x 1024 x 768, eager and compiled",
            [python, "-m", "gpt.commands.bench", "--norms-only", "--compile", "both", "--jsonl", rows],
            "bench.log",
            20,
            45,
            optional=True,
            expected_s=START_S + len(NORM_TYPES) * NORM_ROW_S,
            estimate=f"start {START_S:g} s + {len(NORM_TYPES)} norm types x {NORM_ROW_S:g} s (eager, compiled)",
        ),
        stage(
            "micro_batch",
            "the largest micro-batch of GPT-2 small on this GPU (each probe logged)",
            [python, "-m", "gpt.commands.train", str(config), "--set", "train.precision=bf16", "--find-micro-batch"],
            "micro_batch.log",
            30,
            60,
            optional=True,
            expected_s=START_S + 12 * PROBE_STEP_S,
            estimate=f"start {START_S:g} s + about 12 probes x {PROBE_STEP_S:g} s (a build, two eager steps)",
        ),
    ]


def environment(python: str = sys.executable) -> list[str]:
    """The interpreter, torch, CUDA and each GPU, in a subprocess (this one never touches the GPU)."""
    try:
        out = subprocess.run([python, "-c", ENVIRONMENT], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ["environment: no answer from torch within 120 s"]
    return out.stdout.splitlines() or [f"environment: {out.stderr.strip().splitlines()[-1:]}"]


def read_rows(path: Path) -> list[dict]:
    """The benchmark rows so far; a line cut short by a kill is left out."""
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def check(
    out: Path,
    stages: list[Stage],
    budget_s: float,
    env: list[str],
    quick: bool = False,
    *,
    reserve_s: float = RESERVE_S,
    started: float | None = None,
    **run_options,
) -> int:
    """Run ``stages`` into ``out`` within ``budget_s``, counted from ``started`` (time.monotonic(); default now),
    keeping the summary up to date; a SIGTERM or SIGINT stops the stage under way. The exit status: 0, 1 when
    something failed, 128 + the signal's number when stopped."""
    began = time.monotonic() if started is None else started
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:  # a rerun into the same folder starts clean: rows of two checks never mix
        (out / name).unlink(missing_ok=True)
    spent = time.monotonic() - began  # the environment's probe
    budget = budget_lines(stages, budget_s, reserve_s, spent)
    print("\n".join(budget), flush=True)
    report = Summary(out, stages, [*env, "", *budget], budget_s, began, quick)
    report.write([])
    outcomes: list[Outcome] = []
    with stopping_on() as received, suppress(Stopped):
        outcomes = run_stages(stages, out, budget_s - spent, reserve_s=reserve_s, on_stage=report.update, **run_options)
    stopped = received[0] if received else None
    print(report.write(outcomes, finished=True, stopped=stopped), end="")
    if stopped is not None:
        return 128 + stopped  # the shell's status for a process ended by that signal
    return 1 if failed(outcomes, read_rows(out / "rows.jsonl")) else 0


def failed(outcomes: list[Outcome], rows: list[dict]) -> bool:
    return any(o.failed for o in outcomes) or any("error" in r for r in rows)


class Summary:
    """summary.txt, rewritten whole (atomically): after every stage and, while one runs, as its rows land."""

    def __init__(self, out: Path, stages: list[Stage], head: list[str], budget_s: float, began: float, quick: bool):
        self.out, self.stages, self.head, self.budget_s, self.began = out, stages, head, budget_s, began
        self.name = f"gpu_check{' --quick' if quick else ''}"
        self.rows_size, self.written = -1, 0.0

    def update(self, outcomes: list[Outcome]) -> None:
        """``run_stages``'s on_stage: a stage that ended always; one running when rows.jsonl grew, or every
        ``REFRESH_S`` (its seconds)."""
        running = bool(outcomes) and outcomes[-1].status == RUNNING
        if running and self._rows_size() == self.rows_size and time.monotonic() - self.written < REFRESH_S:
            return
        self.write(outcomes)

    def write(self, outcomes: list[Outcome], finished: bool = False, stopped: int | None = None) -> str:
        """Write the summary; ``finished``: the check is over (stages without an outcome did not run); returns it."""
        self.rows_size, self.written = self._rows_size(), time.monotonic()
        rows, elapsed = read_rows(self.out / "rows.jsonl"), time.monotonic() - self.began
        if stopped is not None:
            verdict = f"stopped by {signal.Signals(stopped).name} after {elapsed:.0f} s"
        else:
            verdict = ("FAILED" if failed(outcomes, rows) else "passed") if finished else "running"
            verdict += f", {elapsed:.0f} s"
        text = summary(
            outcomes,
            self.stages,
            rows,
            [f"{self.name}: {verdict} of a {self.budget_s:.0f} s budget", *self.head],
            finished,
        )
        write_atomically(self.out / "summary.txt", text)
        return text

    def _rows_size(self) -> int:
        path = self.out / "rows.jsonl"
        return path.stat().st_size if path.is_file() else 0


def summary(outcomes: list[Outcome], stages: list[Stage], rows: list[dict], head: list[str], finished: bool) -> str:
    """The one table: ``head`` (verdict, environment, budget), every stage (its status, seconds, limit, what
    its log says), then every row measured."""
    lines = [*head, "", f"{'stage':<{NAME_WIDTH}}{'status':<11}{'seconds':>8}{'limit s':>9}  what"]
    for i, stage in enumerate(stages):
        lines += stage_lines(stage, outcomes[i] if i < len(outcomes) else None, finished)
    return "\n".join(lines + [""] + row_lines(rows)) + "\n"


def stage_lines(stage: Stage, o: Outcome | None, finished: bool) -> list[str]:
    """A stage's line in the summary, with what its log says under it (and its last lines, if it failed)."""
    if o is None:  # not reached: still to come, or never (a stop, the end)
        return [f"{stage.name:<{NAME_WIDTH}}{'not run' if finished else 'waiting':<11}{'':>8}{'':>9}  {stage.what}"]
    if o.status == SKIPPED:
        return [
            f"{stage.name:<{NAME_WIDTH}}{o.status:<11}{'-':>8}{'-':>9}  {stage.what} (needs {stage.min_s:.0f} s, "
            f"{o.limit_s:.0f} s were left)"
        ]
    lines = [f"{stage.name:<{NAME_WIDTH}}{o.status:<11}{o.seconds:>8.0f}{o.limit_s:>9.0f}  {stage.what}"]
    lines += [f"    {note}" for note in o.notes]
    return lines + ([f"    | {line}" for line in o.tail] if o.failed else [])


def row_lines(rows: list[dict]) -> list[str]:
    """Each benchmark row: tokens/s, ms, MFU, memory, and its time against hand-rolled LayerNorm's row."""
    if not rows:
        return ["rows.jsonl: no row measured yet"]
    base = {
        (r["mode"], r["compile"]): r["ms_per_step"]
        for r in rows
        if r["norm_type"] == "handrolled_layernorm" and "error" not in r
    }
    from gpt.run.distributed import PEAK_MEMORY, peak_memory_of  # torch: not before the check's plan is out

    lines = [
        f"rows.jsonl ({len(rows)} rows; step rows on {rows[-1].get('device', '?')}):",
        f"{'mode':<6}{'norm_type':<27}{'compile':>8}{'tokens/s':>12}{'ms':>10}{'MFU':>7}{'peak GiB':>10}"
        f"{'vs handrolled LN':>18}  memory",
    ]
    for r in rows:
        head = f"{r['mode']:<6}{r['norm_type']:<27}{'on' if r['compile'] else 'off':>8}"
        if "error" in r:
            lines.append(f"{head}  failed: {r['error']}")
            continue
        b = base.get((r["mode"], r["compile"]))
        tokens, mfu, memory = r.get("tokens_per_s"), r.get("mfu"), peak_memory_of(r)
        lines.append(
            f"{head}{_num(tokens, ',.0f', 12)}{r['ms_per_step']:>10.3f}{_num(mfu, '.1%', 7)}"
            f"{_num(memory[1] / 2**30 if memory else None, '.2f', 10)}"
            f"{_num(r['ms_per_step'] / b if b else None, '.3f', 18)}"
            f"{'  ' + PEAK_MEMORY[memory[0]][0] if memory else ''}"
        )
    return lines


def _num(value, spec: str, width: int) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def select(stages: list[Stage], names: str | None) -> list[Stage]:
    """The stages ``--stages`` names (comma-separated; None: all), in the check's order."""
    if names is None:
        return stages
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {s.name for s in stages}]
    if unknown or not wanted:
        raise UserError(
            f"--stages {names}: no stage {', '.join(unknown) or '(empty)'}; stages: {', '.join(s.name for s in stages)}"
        )
    return [s for s in stages if s.name in wanted]
