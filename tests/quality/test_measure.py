"""tests/quality/measure.py: every mutation still applies to today's code, and a test run's verdict is read right
(a run that ends without one, killed or misused, is never counted as a caught mutation)."""

import os
import textwrap

from conftest import ROOT
from quality import measure


def test_every_mutation_applies_once_and_stays_python():
    mutations = measure.load_mutations()
    wings = {p.name for p in (ROOT / "gpt").iterdir() if (p / "__init__.py").is_file()}
    assert len(mutations) >= 40 and {m["file"].split("/")[1] for m in mutations} == wings
    for m in mutations:
        path, text, first, last = measure.locate(m)  # its find text occurs exactly once, or it says which
        assert m["replace"] != m["find"] and first <= last, m["id"]
        compile(text.replace(m["find"], m["replace"]), str(path), "exec")


def test_a_run_is_passed_failed_or_no_verdict(tmp_path):
    module = tmp_path / "test_verdicts.py"
    module.write_text(
        textwrap.dedent("""
            import os
            def test_passes(): pass
            def test_fails(): assert False
            def test_killed(): os.kill(os.getpid(), 9)
        """)
    )
    verdict = lambda name: measure.run_tests([f"{module}::{name}"], dict(os.environ), timeout=120)  # noqa: E731
    assert verdict("test_passes") == ("passed", None)
    outcome, first = verdict("test_fails")
    assert outcome == "failed" and first.endswith("test_verdicts.py::test_fails")
    assert verdict("test_killed") == ("error", None)  # pytest killed: no test failed, nothing is caught
