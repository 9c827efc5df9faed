"""A pytest plugin for ``tests/quality/measure.py``: which test (or fixture) ran each line of ``gpt/``.

Loaded with ``-p quality.contexts`` under ``coverage run`` (the rc file beside this one). Each test's
setup, call and teardown run under the coverage context ``test:<node id>``, each fixture's setup under
``fixture:<where it is defined>::<name>``, and Python processes started meanwhile (``patch =
subprocess``: train.py under torchrun, the Hub's loader, sweeps) record under the same context, because
the serialised config they inherit is rewritten with it (also in an ``env`` copied before the test began).
``measure.py mutants`` then runs, for a line it mutates, the tests that ran it and every test that uses a
fixture that ran it.

It writes ``tests.json`` into ``$GPT_QUALITY_OUT``: per test its duration and the fixtures it uses.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

_tests: dict[str, dict] = {}
_current = ""  # the running test's context: a fixture's setup returns to it


def _coverage():
    import coverage

    return coverage.Coverage.current()


def _switch(context: str) -> None:
    """This process and the Python processes it starts from now on record under ``context``."""
    cov = _coverage()
    if cov is None:
        return
    cov.switch_context(context)
    serialised = os.environ.get("COVERAGE_PROCESS_CONFIG")
    if serialised:
        config = json.loads(base64.b64decode(serialised))
        config["context"] = context  # a subprocess's static context
        os.environ["COVERAGE_PROCESS_CONFIG"] = base64.b64encode(json.dumps(config).encode()).decode()


def _popen_with_context(popen_init):
    """``subprocess.Popen.__init__`` that hands the running test's context to a child whose ``env`` was copied
    from ``os.environ`` earlier (a test module's ``ENV = {**os.environ, ...}``, made at import): the copy's
    serialised config names the context of its making, not of the test that starts the child."""

    def init(self, *args, **kwargs):
        env, current = kwargs.get("env"), os.environ.get("COVERAGE_PROCESS_CONFIG")
        if env is not None and current and "COVERAGE_PROCESS_CONFIG" in env:
            kwargs["env"] = {**env, "COVERAGE_PROCESS_CONFIG": current}
        popen_init(self, *args, **kwargs)

    return init


def pytest_configure(config):
    subprocess.Popen.__init__ = _popen_with_context(subprocess.Popen.__init__)


def fixture_context(fixturedef) -> str:
    return f"fixture:{fixturedef.baseid}::{fixturedef.argname}"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _switch(fixture_context(fixturedef))
    try:
        yield
    finally:
        _switch(_current)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = f"test:{item.nodeid}"
    _switch(_current)
    start = time.perf_counter()
    yield
    info = item._fixtureinfo
    fixtures = sorted(
        {fixture_context(defs[-1]) for name, defs in info.name2fixturedefs.items() if defs and name != "request"}
    )
    _tests[item.nodeid] = {"seconds": round(time.perf_counter() - start, 3), "fixtures": fixtures}
    _current = ""
    _switch("")


def pytest_sessionfinish(session):
    out = os.environ.get("GPT_QUALITY_OUT")
    if out and _tests:
        path = Path(out) / "tests.json"
        known = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**known, **_tests}, indent=1, sort_keys=True))
