"""What a run of tests reached, read from its log: which passed, failed or were skipped, which one was
running when the run was cut short, and which never ran.

Loaded as a pytest plugin (``pytest -p gpt.speed.progress_plugin``), this module writes each collected
test's id before any runs (``WILL_RUN``), so ``results_of_tests`` can tell from a ``pytest -v`` log which
tests a run cut short never reached. The GPU check's tests stage reads its log with it
(``gpt.speed.stages.Stage.findings``).
"""

from __future__ import annotations

import re

WILL_RUN = "== will run: "  # the plugin's line per collected test

# pytest -v: "tests/speed/test_cuda.py::test_x PASSED   [ 10%]"; the file run as a script: "PASSED test_x"
_RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)
_SCRIPT_RESULT = re.compile(r"^(PASSED|FAILED|SKIPPED) (test_\w+)", re.M)
_STARTED = re.compile(r"^(\S+::\S+)", re.M)  # pytest -v names a test as it starts it
_FAILURES = {"FAILED", "ERROR"}
_KINDS = {"passed": {"PASSED", "XFAIL", "XPASS"}, "failed": _FAILURES, "skipped": {"SKIPPED"}}


def results_of_tests(log: str) -> tuple[bool, list[str]]:
    """What a pytest ``-v`` log (or the test file's own runner's) says: whether a test failed, and the counts,
    the failed tests, the one running when the run was cut, and those never run (known with this plugin)."""
    results: dict[str, str] = {}
    found = [(m[1], m[2]) for m in _RESULT.finditer(log)] + [(m[2], m[1]) for m in _SCRIPT_RESULT.finditer(log)]
    for test, word in found:
        if results.get(_short(test)) not in _FAILURES:  # a teardown error after a pass: the error stands
            results[_short(test)] = word
    collected = [_short(line[len(WILL_RUN) :].strip()) for line in log.splitlines() if line.startswith(WILL_RUN)]
    if not results and not collected:
        return False, []
    started = {_short(m[1]) for m in _STARTED.finditer(log)} | set(results)
    count = {word: sum(1 for r in results.values() if r in words) for word, words in _KINDS.items()}
    failed = [t for t, r in results.items() if r in _FAILURES]
    notes = [", ".join(f"{n} {word}" for word, n in count.items()) + (f" of {len(collected)}" if collected else "")]
    for label, tests in [
        ("failed", failed),
        ("running when cut", [t for t in collected if t in started and t not in results]),
        ("not run", [t for t in collected if t not in started]),
    ]:
        if tests:
            notes.append(f"{label}: {', '.join(t.split('::', 1)[-1] for t in tests)}")
    return bool(failed), notes


def _short(test: str) -> str:
    """A test's name without its file's folder: -v names the file from the current folder, the plugin from
    pytest's rootdir."""
    path, _, name = test.partition("::")
    return f"{path.rsplit('/', 1)[-1]}::{name}" if name else test


def pytest_collection_finish(session) -> None:
    """pytest's hook, with this module loaded as a plugin: each collected test's id, before the first runs."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for item in session.items:
        line = WILL_RUN + item.nodeid
        reporter.write_line(line) if reporter is not None else print(line, flush=True)
