"""Training runs shared across test files: each trained once a session, in this process, and handed out as
copies (a copy is milliseconds, a training run is seconds). Imported by tests/conftest.py.

A copy is what training there would have left, but for where its records say it was trained: its config's
``run.name`` and ``run.dir`` are the original's, and a resume may change both (``run.*`` is ``RESUMABLE``).
"""

import shutil

import pytest
from synthetic import write_train_yaml

from gpt.config import load_config
from gpt.training.loop import train


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, token_set):
    """``write_train_yaml``'s run, completed (20 steps, checkpoints at 10 and 20, no hooks: no charts), named
    ``done``. Read it, never change it: ``tiny_run_copy`` gives a test its own."""
    folder = tmp_path_factory.mktemp("tiny-run")
    train(load_config(write_train_yaml(folder, token_set, "done")))
    return folder / "done"


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    """``tiny_run_copy(name="done", where=tmp_path)``: a copy of ``tiny_run`` at ``where / name``, where
    ``train_yaml(name)`` trains, for a test that changes it or continues it."""

    def make(name="done", where=None):
        return shutil.copytree(tiny_run, (where or tmp_path) / name)

    return make
