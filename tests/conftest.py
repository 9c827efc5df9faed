import os

# No test may wait on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# One thread per process, read by torch when it loads (after this) and by every process a test starts: the
# tests' models are tiny (a second thread costs more than it gives), and the slow tier runs two pytest
# workers on two cores. A run compared bit for bit with a subprocess's therefore computes as that one does.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import importlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hubserver import HubServer  # noqa: E402
from runs import tiny_run, tiny_run_copy  # noqa: E402, F401
from sweep.slurm_fixtures import slurm_cluster, slurm_installed  # noqa: E402, F401
from synthetic import CONFIGS, ROOT, VOCAB, write_meta, write_token_set, write_train_yaml  # noqa: E402, F401

from gpt.config import ModelConfig  # noqa: E402


@pytest.fixture
def tiny_model_cfg():
    """A model small enough to build in milliseconds: vocab 97, width 32, 2 layers."""

    def make(**kw):
        base = dict(vocab_size=97, context_length=16, d_model=32, n_layers=2, n_heads=4)
        base.update(kw)
        return ModelConfig(**base)

    return make


@pytest.fixture(scope="session")
def token_set(tmp_path_factory):
    return write_token_set(tmp_path_factory.mktemp("tokens") / "synthetic")


@pytest.fixture
def train_yaml(tmp_path, token_set):
    """A tiny CPU training config (vocab 256, fp32) writing into tmp_path/run."""

    def make(name="run"):
        return write_train_yaml(tmp_path, token_set, name)

    return make


def require(module: str, install: str = "bash scripts/setup.sh --full"):
    """``module`` imported for a test that needs an extra the default setup leaves out: the test is skipped,
    naming ``install``, where it is missing, except in CI (``CI`` set), which installs every extra: there a
    missing one fails the test."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed, and CI installs every extra: {install}")
        pytest.skip(f"needs {module}, which the default setup leaves out: {install}")


FAKE_TOKEN = "hf_FAKEtokenNeverWrittenAnywhere0123456789"


@pytest.fixture
def hub(tmp_path):
    """A Hub on 127.0.0.1 (tests/hubserver.py); ``hub.env`` points a fresh process at it, with a fake token
    that must reach the server and appear in no file."""
    with HubServer() as server:
        server.env = {
            **os.environ,
            "HF_ENDPOINT": server.url,
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": FAKE_TOKEN,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "OMP_NUM_THREADS": "1",
        }
        yield server


@dataclass
class Ran:
    """What a command did, as ``subprocess.run(..., capture_output=True, text=True)`` reports it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


# A fresh interpreter's warning filters: what a user sees on stderr (pytest's own would record them instead)
FRESH_FILTERS = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def show_warning(message, category, filename, lineno, file=None, line=None):
    """A warning on stderr, as a fresh interpreter prints it (pytest's own hook would record it instead)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@pytest.fixture
def cli(capfd, monkeypatch):
    """``cli(command, *args, env=None, cwd=None)``: the command's ``main(argv)`` run in this process as its
    front door runs it in a fresh one, returning its exit status and what it wrote to the file descriptors
    1 and 2 (so torch's C++ warnings and Python's warnings, with a fresh interpreter's filters, too). The
    command is its name (``"train"``) or its front door (``ROOT / "train.py"``, ``scripts/compare.py``).
    An exception that escapes ``main`` is printed as a traceback with status 1, as Python would. The
    environment, working directory, stop signals' handlers and ``sys.argv`` are put back afterwards.

    What only a process shows (an exit without exit hooks, a resource limit, a signal, an import of torch)
    is tested with the real front doors in a subprocess: a few per command."""

    def run(command, *args, env: dict | None = None, cwd=None) -> Ran:
        name = Path(str(command)).stem
        main = importlib.import_module(f"gpt.commands.{name}").main
        argv = [str(a) for a in args]
        environ, handlers = dict(os.environ), {s: signal.getsignal(s) for s in STOP_SIGNALS}
        from gpt.common import bounded

        given_up = len(bounded.abandoned())
        with monkeypatch.context() as mp:
            for key, value in (env or {}).items():
                mp.setenv(key, str(value))
            if cwd is not None:
                mp.chdir(cwd)
            mp.setattr(sys, "argv", [str(command), *argv])
            mp.setattr("gpt.commands.cli.leave", lambda code: None)  # its os._exit would end pytest: see below
            capfd.readouterr()
            try:
                with warnings.catch_warnings():
                    warnings.resetwarnings()
                    for action, category, module in reversed(FRESH_FILTERS):
                        warnings.filterwarnings(action, category=category, module=module or "")
                    warnings.showwarning = show_warning
                    try:
                        code = main(argv)
                    except SystemExit as e:  # argparse: --help, or a usage error
                        code = e.code if isinstance(e.code, int) else int(e.code is not None)
                    except Exception:
                        traceback.print_exc()
                        code = 1
            finally:
                os.environ.clear()
                os.environ.update(environ)
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = capfd.readouterr()
        assert len(bounded.abandoned()) == given_up, "a call given up on ends a process: test it in a subprocess"
        return Ran([str(command), *argv], code, out, err)

    return run
