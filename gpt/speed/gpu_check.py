"""The GPU check: the CUDA tests and the benchmark, budgeted to fit one short loan of a GPU.

    bash scripts/gpu_check.sh OUTDIR [--budget-s 400] [--stages norms,eager,tests,compiled,micro_batch] [--quick]
                             [--cache-dir DIR]
    python -m gpt.commands.gpu_check OUTDIR --tests tests/speed/test_cuda.py --config configs/gpt2-small.yaml [...]

The script checks that a GPU is visible, then runs this command with the checkout's test
file and config. Stages run cheapest first, each under its own time limit sized from what
is left of the budget (``gpt.speed.stages``); one that would not fit is skipped, and the summary
says with how much time:

    norms        each norm layer alone, eager and compiled (the norm-only benchmark)
    eager        GPT-2 small in bf16 on random tokens, every norm type, compile off
    tests        the CUDA tests: bf16 / fp16 training, every fast-path option, exact resume, no
                 waiting for the GPU between log steps, flash attention, NCCL DDP (2 GPUs), the
                 micro-batch search, the benchmark
    compiled     GPT-2 small compiled: PyTorch and hand-rolled LayerNorm first (the write-up's
                 question), then the other norm types while time remains
    micro_batch  the largest micro-batch of GPT-2 small on this GPU

The budget is sized for one loan of a GPU machine: 15 minutes (900 s) of device time, the
machine's start (2-4 minutes) included, one call at most 600 s. The default budget (400 s,
counted from this command's start) and --quick's (180 s) let a full check and one --quick
rerun fit one loan with the slowest start: 240 s + 400 s + 180 s + about 25 s a call outside
the budget (the script's GPU probe, copying the checkout there and the files back) = 870 s.
Each stage's least and most seconds (min / cap; --quick in brackets): norms 20 / 45, eager
30 / 70 (20 / 40), tests 180 / 300 (60 / 90), compiled 60 / none (50 / none), micro_batch
30 / 60. The tests' minimum is the largest, as it is what the stages before must leave it:
about 15 short training runs, four cold compiles and two subprocesses get about 180 s
(--quick: about 75 s) even when norms and eager run to their caps. The plan (each stage's min,
cap, and its limit should every stage before it use all of its own) is printed first and
heads summary.txt.

``--quick``: the tests that prove correctness on CUDA (bf16 and fp16 steps, exact resume
with the fast path, flash attention) and one eager and one compiled row for each
LayerNorm, in 3 minutes. Every benchmark row lands in ``rows.jsonl`` the moment it
is measured (a row that fails is an error row, and the next runs); ``summary.txt`` is
rewritten after every stage and, while one runs, as each row lands (the stage shown
"running" with its seconds so far), so a kill at any moment leaves a readable summary. The
tests run under pytest -v, and the summary says how many passed, failed and were skipped,
which one was running when time ran out and which never ran (without pytest, the test
file runs its own tests, and says which passed and failed). OUTDIR holds five files:
summary.txt, rows.jsonl, tests.log, bench.log, micro_batch.log.

Every stage compiles into one cache, DIR/inductor and DIR/triton (``--cache-dir``, default
``$XDG_CACHE_HOME/gpt-harness/compile``, i.e. ``~/.cache/gpt-harness/compile``; torch's FX
graph and autograd caches on), outside OUTDIR: a stage reuses what an earlier one compiled
for the same graph, and a rerun on the same machine what the first run compiled.

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
import os
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

BUDGET_S = 400  # a full check and a --quick rerun fit one 15-minute loan, its start included (docstring)
QUICK_BUDGET_S = 180
FILES = ("summary.txt", "rows.jsonl", "tests.log", "bench.log", "micro_batch.log")  # everything written to OUTDIR
LAYERNORMS = ["pytorch_layernorm", "handrolled_layernorm"]  # the write-up's question first
QUICK_TESTS = ["mixed_precision", "exact_resume", "flash_attention"]  # the tests --quick runs
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpt-harness" / "compile"
REFRESH_S = 10.0  # while a stage runs and no row lands: how often the summary's seconds are brought up to date
ENVIRONMENT = """import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}")"""


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


def bench_command(python: str, config: Path, rows: str, quick: bool) -> list[str]:
    """The benchmark of GPT-2 small's steps on synthetic data in bf16, rows appended to ``rows``."""
    options = ["--data", "synthetic", "--set", "train.precision=bf16", "--warmup", "3"]
    return [
        python,
        "-m",
        "gpt.commands.bench",
        str(config),
        *options,
        "--steps",
        "10" if quick else "20",
        "--jsonl",
        rows,
    ]


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
    """The check's stages, cheapest first, with their minimum and cap in seconds (the docstring's table). Each
    keeps its results as they come (rows, probes, test results), so running out of time cuts it, never fails it."""
    rows = str(out / "rows.jsonl")
    bench, test_run = bench_command(python, config, rows, quick), test_command(python, tests, quick)
    rest = [n for n in NORM_TYPES if n not in LAYERNORMS]
    norms = LAYERNORMS if quick else LAYERNORMS + rest
    stage = functools.partial(Stage, cut_ok=True, env=compile_env(cache_dir))
    stages = [
        stage(
            "norms",
            "each norm layer alone, 12 x 1024 x 768, eager and compiled",
            [python, "-m", "gpt.commands.bench", "--norms-only", "--compile", "both", "--jsonl", rows],
            "bench.log",
            20,
            45,
        ),
        stage(
            "eager",
            f"GPT-2 small, bf16, compile off: {', '.join(norms)}",
            [*bench, "--compile", "off", "--norm-types", *norms],
            "bench.log",
            *((20, 40) if quick else (30, 70)),
        ),
        stage(
            "tests",
            "the CUDA tests" + (f" ({', '.join(QUICK_TESTS)})" if quick else ""),
            test_run,
            "tests.log",
            *((60, 90) if quick else (180, 300)),
            findings=results_of_tests,  # which ran, passed, failed; a failed test fails the stage, cut or not
        ),
        stage(
            "compiled",
            f"GPT-2 small, bf16, compiled: {', '.join(norms)}",
            [*bench, "--compile", "on", "--norm-types", *norms],
            "bench.log",
            50 if quick else 60,
            None,
        ),
        stage(
            "micro_batch",
            "the largest micro-batch of GPT-2 small on this GPU (each probe logged)",
            [python, "-m", "gpt.commands.train", str(config), "--set", "train.precision=bf16", "--find-micro-batch"],
            "micro_batch.log",
            30,
            60,
        ),
    ]
    return [s for s in stages if not (quick and s.name in ("norms", "micro_batch"))]


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
    lines = [*head, "", f"{'stage':<12}{'status':<11}{'seconds':>8}{'limit s':>9}  what"]
    for i, stage in enumerate(stages):
        lines += stage_lines(stage, outcomes[i] if i < len(outcomes) else None, finished)
    return "\n".join(lines + [""] + row_lines(rows)) + "\n"


def stage_lines(stage: Stage, o: Outcome | None, finished: bool) -> list[str]:
    """A stage's line in the summary, with what its log says under it (and its last lines, if it failed)."""
    if o is None:  # not reached: still to come, or never (a stop, the end)
        return [f"{stage.name:<12}{'not run' if finished else 'waiting':<11}{'':>8}{'':>9}  {stage.what}"]
    if o.status == SKIPPED:
        return [
            f"{stage.name:<12}{o.status:<11}{'-':>8}{'-':>9}  {stage.what} (needs {stage.min_s:.0f} s, "
            f"{o.limit_s:.0f} s were left)"
        ]
    lines = [f"{stage.name:<12}{o.status:<11}{o.seconds:>8.0f}{o.limit_s:>9.0f}  {stage.what}"]
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
