"""The GPU check: the CUDA tests and the benchmark, budgeted to fit one short loan of a GPU.

    bash scripts/gpu_check.sh OUTDIR [--budget-s 540] [--stages norms,eager,tests,compiled,micro_batch] [--quick]
    python -m gpt.commands.gpu_check OUTDIR --tests tests/test_cuda.py --config configs/gpt2-small.yaml [...]

The script checks that a GPU is visible, then runs this command with the checkout's test
file and config. Stages run cheapest first, each under its own time limit sized from what
is left of the budget (``gpt.analysis.stages``); one that would not fit is skipped, and the summary
says with how much time:

    norms        each norm layer alone, eager and compiled (the norm-only benchmark)
    eager        GPT-2 small in bf16 on random tokens, every norm type, compile off
    tests        the CUDA tests: bf16 / fp16 training, every fast-path option, exact resume, no
                 waiting for the GPU between log steps, flash attention, NCCL DDP (2 GPUs), the
                 micro-batch search, the benchmark
    compiled     GPT-2 small compiled: PyTorch and hand-rolled LayerNorm first (the write-up's
                 question), then the other norm types while time remains
    micro_batch  the largest micro-batch of GPT-2 small on this GPU

``--quick``: the tests that prove correctness on CUDA (bf16 and fp16 steps, exact resume
with the fast path, flash attention) and one eager and one compiled row for each
LayerNorm, in under 4 minutes. Every benchmark row lands in ``rows.jsonl`` the moment it
is measured (a row that fails is an error row, and the next runs); ``summary.txt`` is
rewritten after every stage, so a kill at any moment leaves a readable summary. OUTDIR
holds five files: summary.txt, rows.jsonl, tests.log, bench.log, micro_batch.log. Exit
status: 0 when nothing failed (a skipped stage, or a measurement cut short by the budget,
is not a failure; tests that run out of time are), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from gpt.analysis.stages import SKIPPED, Outcome, Stage, run_stages
from gpt.commands.cli import command, parser_for
from gpt.common.errors import UserError
from gpt.common.files import write_atomically
from gpt.config import NORM_TYPES
from gpt.run.distributed import PEAK_MEMORY, peak_memory_of

BUDGET_S = 540  # one device call may run 600 s: leave room for the machine's own start and the copy back
QUICK_BUDGET_S = 230  # --quick: under 4 minutes
FILES = ("summary.txt", "rows.jsonl", "tests.log", "bench.log", "micro_batch.log")  # everything written to OUTDIR
LAYERNORMS = ["pytorch_layernorm", "handrolled_layernorm"]  # the write-up's question first
QUICK_TESTS = ["mixed_precision", "exact_resume", "flash_attention"]  # the tests --quick runs
ENVIRONMENT = """import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}")"""


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
    """The CUDA tests: through pytest, or on a machine without it, the file running its tests itself."""
    if importlib.util.find_spec("pytest") is None:
        return [python, str(tests), *(QUICK_TESTS if quick else [])]
    command = [python, "-m", "pytest", str(tests), "-m", "cuda", "-p", "no:cacheprovider", "-q", "-ra"]
    return command + (["-k", " or ".join(QUICK_TESTS)] if quick else [])


def plan(out: Path, tests: Path, config: Path, quick: bool, python: str = sys.executable) -> list[Stage]:
    """The check's stages, cheapest first."""
    rows = str(out / "rows.jsonl")
    bench, test_run = bench_command(python, config, rows, quick), test_command(python, tests, quick)
    rest = [n for n in NORM_TYPES if n not in LAYERNORMS]
    norms = LAYERNORMS if quick else LAYERNORMS + rest
    stages = [
        Stage(
            "norms",
            "each norm layer alone, 12 x 1024 x 768, eager and compiled",
            [python, "-m", "gpt.commands.bench", "--norms-only", "--compile", "both", "--jsonl", rows],
            "bench.log",
            20,
            120,
            cut_ok=True,
        ),
        Stage(
            "eager",
            f"GPT-2 small, bf16, compile off: {', '.join(norms)}",
            [*bench, "--compile", "off", "--norm-types", *norms],
            "bench.log",
            45,
            240,
            cut_ok=True,
        ),
        Stage(
            "tests",
            "the CUDA tests" + (f" ({', '.join(QUICK_TESTS)})" if quick else ""),
            test_run,
            "tests.log",
            60 if quick else 120,
            360,
        ),
        Stage(
            "compiled",
            f"GPT-2 small, bf16, compiled: {', '.join(norms)}",
            [*bench, "--compile", "on", "--norm-types", *norms],
            "bench.log",
            60,
            None,
            cut_ok=True,
        ),
        Stage(
            "micro_batch",
            "the largest micro-batch of GPT-2 small on this GPU (each probe logged)",
            [python, "-m", "gpt.commands.train", str(config), "--set", "train.precision=bf16", "--find-micro-batch"],
            "micro_batch.log",
            60,
            150,
            cut_ok=True,
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


def check(out: Path, stages: list[Stage], budget_s: float, env: list[str], quick: bool = False, **run_options) -> int:
    """Run ``stages`` into ``out`` within ``budget_s``, rewriting the summary after each; the exit status."""
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:  # a rerun into the same folder starts clean: rows of two checks never mix
        (out / name).unlink(missing_ok=True)
    began = time.monotonic()

    def write(outcomes: list[Outcome], done: bool = False) -> None:
        text = summary(
            outcomes, stages, read_rows(out / "rows.jsonl"), env, budget_s, time.monotonic() - began, quick, done
        )
        write_atomically(out / "summary.txt", text)

    write([])
    outcomes = run_stages(stages, out, budget_s, on_stage=write, **run_options)
    write(outcomes, done=True)
    print((out / "summary.txt").read_text(), end="")
    return 1 if failed(outcomes, read_rows(out / "rows.jsonl")) else 0


def failed(outcomes: list[Outcome], rows: list[dict]) -> bool:
    return any(o.failed for o in outcomes) or any("error" in r for r in rows)


def summary(
    outcomes: list[Outcome],
    stages: list[Stage],
    rows: list[dict],
    env: list[str],
    budget_s: float,
    elapsed: float,
    quick: bool,
    done: bool,
) -> str:
    """The one table: every stage (ran, passed, skipped, with its time), then every row measured."""
    verdict = ("FAILED" if failed(outcomes, rows) else "passed") if done else "running"
    lines = [
        f"gpu_check{' --quick' if quick else ''}: {verdict}, {elapsed:.0f} s of a {budget_s:.0f} s budget",
        *env,
        "",
        f"{'stage':<12}{'status':<11}{'seconds':>8}{'limit s':>9}  what",
    ]
    for i, stage in enumerate(stages):
        o = outcomes[i] if i < len(outcomes) else None
        if o is None:
            lines.append(f"{stage.name:<12}{'waiting':<11}{'':>8}{'':>9}  {stage.what}")
        elif o.status == SKIPPED:
            lines.append(
                f"{stage.name:<12}{o.status:<11}{'-':>8}{'-':>9}  {stage.what} (needs {stage.min_s:.0f} s, "
                f"{o.limit_s:.0f} s were left)"
            )
        else:
            lines.append(f"{stage.name:<12}{o.status:<11}{o.seconds:>8.0f}{o.limit_s:>9.0f}  {stage.what}")
            if o.failed:
                lines += [f"    | {line}" for line in o.tail]
    return "\n".join(lines + [""] + row_lines(rows)) + "\n"


def row_lines(rows: list[dict]) -> list[str]:
    """Each benchmark row: tokens/s, ms, MFU, memory, and its time against hand-rolled LayerNorm's row."""
    if not rows:
        return ["rows.jsonl: no row measured yet"]
    base = {
        (r["mode"], r["compile"]): r["ms_per_step"]
        for r in rows
        if r["norm_type"] == "handrolled_layernorm" and "error" not in r
    }
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


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__, 2)
    parser.add_argument("out", type=Path, metavar="OUTDIR")
    parser.add_argument("--tests", type=Path, required=True, help="the CUDA test file (tests/test_cuda.py)")
    parser.add_argument("--config", type=Path, required=True, help="the benchmark's config (configs/gpt2-small.yaml)")
    parser.add_argument(
        "--budget-s", type=float, help=f"seconds for the whole check (default {BUDGET_S}; --quick: {QUICK_BUDGET_S})"
    )
    parser.add_argument("--stages", help="comma-separated stages to run, in the check's order (default: all)")
    parser.add_argument("--quick", action="store_true", help="the correctness tests and the two LayerNorms only")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    budget = args.budget_s if args.budget_s is not None else QUICK_BUDGET_S if args.quick else BUDGET_S
    if budget < 60:
        raise UserError(f"--budget-s {budget:g}: give the check at least 60 s (default {BUDGET_S})")
    stages = select(plan(args.out, args.tests, args.config, args.quick), args.stages)
    return check(args.out, stages, budget, environment(), args.quick)


def select(stages: list[Stage], names: str | None) -> list[Stage]:
    if names is None:
        return stages
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {s.name for s in stages}]
    if unknown or not wanted:
        raise UserError(
            f"--stages {names}: no stage {', '.join(unknown) or '(empty)'}; stages: {', '.join(s.name for s in stages)}"
        )
    return [s for s in stages if s.name in wanted]


if __name__ == "__main__":
    sys.exit(main())
