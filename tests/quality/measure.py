"""What the test suite catches: line coverage of ``gpt/`` and a fixed sample of mutations of the product code.

    python tests/quality/measure.py coverage [--out DIR] [-- PYTEST ARGS]   # the whole suite under coverage
    python tests/quality/measure.py mutants [--out DIR] [--only ID ...]       # each mutation, one at a time
    python tests/quality/measure.py compare BEFORE_DIR AFTER_DIR              # nothing caught before is lost

Run it in a checkout with its ``.venv`` (``bash scripts/setup.sh``), nothing else running; the whole
suite under coverage takes about half an hour on 2 cores, the mutants about as long again. ``coverage`` runs
the suite (fast and slow together, unless PYTEST ARGS say otherwise) with ``tests/quality/coveragerc``
and the ``quality.contexts`` plugin, so every line knows which tests and fixtures ran it, in any Python
process they started; it writes ``coverage`` (the data), ``coverage.txt`` (the report), ``tests.json``
and ``summary.json`` into DIR (default ``.quality/``). ``mutants`` applies each entry of
``tests/quality/mutations.yaml`` to its file, runs the tests that ran the mutated lines (and every test
using a fixture that ran them; for a line run only at import, every test that ran any line of the file),
quickest first, stopping at the first failure, and puts the file back byte for byte; the result of each
(caught, survived, timeout, flaky, not run: no test ran the line; a failing test counts only if it fails
again with the mutation and passes without it, else it is set aside as flaky and proves nothing) goes into
DIR/mutants.json as it lands, so an interrupted measurement continues where it stopped. ``compare`` exits 1
if coverage fell or a mutation caught before survives after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
CAUGHT = {"caught", "timeout"}  # a mutant that makes a test hang has been noticed too


def coverage(out: Path, pytest_args: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("coverage*"):
        old.unlink()
    (out / "tests.json").unlink(missing_ok=True)
    env = {**os.environ, "GPT_QUALITY_OUT": str(out)}
    rc = ["--rcfile", str(HERE / "coveragerc")]
    start = time.monotonic()
    cmd = [PYTHON, "-m", "coverage", "run", *rc, "-m", "pytest", "-p", "quality.contexts", "-p", "no:cacheprovider"]
    code = subprocess.call([*cmd, *pytest_args], cwd=ROOT, env=env)
    seconds = time.monotonic() - start
    subprocess.run([PYTHON, "-m", "coverage", "combine", "-q", *rc], cwd=ROOT, env=env, check=True)
    report = subprocess.run(
        [PYTHON, "-m", "coverage", "report", *rc, "--include", f"{ROOT}/gpt/*"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    (out / "coverage.txt").write_text(report.stdout)
    total = report.stdout.strip().splitlines()[-1].split()  # TOTAL statements missed percent
    summary = {
        "statements": int(total[1]), "missed": int(total[2]), "percent": float(total[3].rstrip("%")),
        "pytest_exit": code, "seconds": round(seconds), "pytest_args": pytest_args,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"line coverage of gpt/: {summary['percent']}% ({summary['statements'] - summary['missed']} of "
          f"{summary['statements']} statements); pytest exit {code} in {summary['seconds']} s")  # fmt: skip
    return 0


def load_mutations() -> list[dict]:
    mutations = yaml.safe_load((HERE / "mutations.yaml").read_text())
    ids = [m["id"] for m in mutations]
    assert len(ids) == len(set(ids)), "mutation ids must be unique"
    return mutations


def locate(m: dict) -> tuple[Path, str, int, int]:
    """The mutated file, its text, and the first and last line the ``find`` text spans (it must occur once)."""
    path = ROOT / m["file"]
    text = path.read_text()
    count = text.count(m["find"])
    if count != 1:
        raise SystemExit(f"mutation {m['id']}: its find text occurs {count} times in {m['file']} (must be once)")
    first = text[: text.index(m["find"])].count("\n") + 1
    return path, text, first, first + m["find"].count("\n")


def tests_for(data, tests: dict, path: Path, first: int, last: int) -> list[str]:
    """The tests that ran lines first..last of ``path``, or used a fixture that did; quickest first."""
    by_line = data.contexts_by_lineno(str(path))
    contexts = {c for line in range(first, last + 1) for c in by_line.get(line, [])}
    if contexts <= {""}:  # run only at import (or by nobody): whoever runs this file at all
        contexts = {c for cs in by_line.values() for c in cs} if contexts else set()
    chosen = {c.removeprefix("test:") for c in contexts if c.startswith("test:")}
    fixtures = {c for c in contexts if c.startswith("fixture:")}
    chosen |= {t for t, info in tests.items() if fixtures & set(info["fixtures"])}
    return sorted((t for t in chosen if t in tests), key=lambda t: (tests[t]["seconds"], t))


def run_tests(ids: list[str], env: dict, timeout: float) -> tuple[str, str | None]:
    """Run ``ids`` stopping at the first failure: ("passed" | "failed" | "timeout", the first failed test)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listed:  # hundreds of ids: not on the command line
        listed.write("\n".join(ids))
        listed.flush()
        cmd = [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", f"@{listed.name}"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
        try:
            log, _ = proc.communicate(timeout=timeout)
            outcome = {0: "passed", 1: "failed", 2: "failed"}.get(proc.returncode, "error")  # 2: collection errors
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            log, _ = proc.communicate()
            outcome = "timeout"
        except BaseException:  # stopped (SIGTERM, Ctrl-C): its tests stop too, and the mutated file is put back
            os.killpg(proc.pid, 9)
            raise
    failed = [
        line.split(" ", 1)[1].split(" - ", 1)[0] for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))
    ]
    if outcome == "failed" and not failed:  # killed, or misused: no test said anything
        outcome = "error"
    return outcome, (failed[0] if failed else None)


def run_mutant(m: dict, data, tests: dict) -> dict:
    """Apply ``m``, run its tests, put the file back. A catch counts when the first test that failed fails again
    with the mutation and passes without it; one that does not (a flaky test, a broken one) proves nothing, and
    the mutant's tests go on without it (after three such, the mutant is "flaky": not caught)."""
    path, text, first, last = locate(m)
    selected = tests_for(data, tests, path, first, last)
    if not selected:
        return {"result": "not run", "tests": 0, "seconds": 0, "first": None, "flaky": []}
    stat, flaky = path.stat(), []
    timeout = 120 + 3 * sum(tests[t]["seconds"] for t in selected)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    mutated = text.replace(m["find"], m["replace"])
    compile(mutated, str(path), "exec")  # a mutant must still be Python

    def mutant_runs(ids: list[str]) -> tuple[str, str | None]:
        try:
            path.write_text(mutated)
            return run_tests(ids, env, timeout)
        finally:
            path.write_text(text)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the cached bytecode of the original fits again

    while True:
        outcome, failed = mutant_runs([t for t in selected if t not in flaky])
        if outcome != "failed":
            break
        if mutant_runs([failed])[0] == "failed" and run_tests([failed], env, timeout)[0] == "passed":
            break
        flaky.append(failed)
        if len(flaky) == 3:
            outcome = "flaky"
            break
    if outcome == "error":
        raise SystemExit(f"mutation {m['id']}: pytest ended without a verdict (killed or misused); nothing recorded")
    result = {"passed": "survived", "failed": "caught", "timeout": "timeout", "flaky": "flaky"}[outcome]
    seconds = round(time.monotonic() - start)
    return {"result": result, "tests": len(selected), "seconds": seconds, "first": failed, "flaky": flaky}


def mutants(out: Path, only: list[str]) -> int:
    from coverage import CoverageData

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the finally that puts the file back

    data = CoverageData(basename=str(out / "coverage"))
    data.read()
    tests = json.loads((out / "tests.json").read_text())
    done_path = out / "mutants.json"
    done = json.loads(done_path.read_text()) if done_path.exists() else {}
    for m in load_mutations():
        locate(m)  # every mutation applies before any runs
    for m in load_mutations():
        if (only and m["id"] not in only) or (not only and m["id"] in done):
            continue
        done[m["id"]] = {**run_mutant(m, data, tests), "wing": m["file"].split("/")[1]}
        done_path.write_text(json.dumps(done, indent=1, sort_keys=True))
        r = done[m["id"]]
        print(f"{m['id']:<36} {r['result']:<9} {r['tests']:>4} tests {r['seconds']:>5} s  {r['first'] or ''}"[:160])
    caught = sum(r["result"] in CAUGHT for r in done.values())
    print(f"{caught} of {len(done)} mutations caught")
    return 0


def compare(before: Path, after: Path) -> int:
    b, a = (json.loads((d / "summary.json").read_text()) for d in (before, after))
    mb, ma = (json.loads((d / "mutants.json").read_text()) for d in (before, after))
    lost = sorted(k for k, r in mb.items() if r["result"] in CAUGHT and ma.get(k, {}).get("result") not in CAUGHT)
    print(f"coverage: {b['percent']}% -> {a['percent']}% ({b['statements'] - b['missed']} / {b['statements']} -> "
          f"{a['statements'] - a['missed']} / {a['statements']} statements)")  # fmt: skip
    count = lambda m: sum(r["result"] in CAUGHT for r in m.values())
    print(f"mutations caught: {count(mb)} of {len(mb)} -> {count(ma)} of {len(ma)}")
    for k in lost:
        print(f"lost: {k} ({mb[k]['result']} before, {ma.get(k, {}).get('result', 'not measured')} after)")
    return int(bool(lost) or a["percent"] < b["percent"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    cov = sub.add_parser("coverage")
    cov.add_argument("--out", type=Path, default=ROOT / ".quality")
    cov.add_argument("pytest_args", nargs="*")
    mut = sub.add_parser("mutants")
    mut.add_argument("--out", type=Path, default=ROOT / ".quality")
    mut.add_argument("--only", nargs="+", default=[])
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.what == "coverage":
        return coverage(args.out.resolve(), args.pytest_args)
    if args.what == "mutants":
        return mutants(args.out.resolve(), args.only)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
