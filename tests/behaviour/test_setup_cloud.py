"""setup_cloud.sh, scripts/setup.sh and the other shell scripts: shellcheck-clean; dry runs on this (GPU-less) machine,
also with a stand-in nvidia-smi for the torch build each driver gets, and without a C compiler for the preflight."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

SCRIPTS = [ROOT / "setup_cloud.sh", *sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]
CU126 = "https://download.pytorch.org/whl/cu126"
CUDA12 = f"from {CU126} (the default build needs CUDA 13, driver >= 580)"
NO_DRIVER = "no NVIDIA driver (nvidia-smi missing or no GPU)"
PLANS = {  # (driver, its CUDA version): the plan line, as scripts/torch_plan.sh prints it
    ("535.129.03", "12.2"): f"NVIDIA driver 535.129.03 (CUDA 12.2): torch==2.13.0 {CUDA12}",
    ("570.133.20", "12.8"): f"NVIDIA driver 570.133.20 (CUDA 12.8): torch==2.13.0 {CUDA12}",
    ("580.65.06", "13.0"): "NVIDIA driver 580.65.06 (CUDA 13.0): torch==2.13.0 from the default index "
    "(its CUDA 13 build runs on driver >= 580)",
    None: f"{NO_DRIVER}: torch==2.13.0 from the default index (no GPU to fit)",
}
# this environment's torch, as scripts/setup.sh describes it
BUILD = f"torch {torch.__version__} ({'a CPU build' if torch.version.cuda is None else f'CUDA {torch.version.cuda}'})"
TORCH_IN_VENV = os.path.realpath(torch.__file__).startswith(os.path.realpath(sys.prefix) + os.sep)
COMPILERS = re.compile(r"(cc|c89|c99|c\+\+|gcc|g\+\+|clang|clang\+\+|x86_64-linux-gnu-(gcc|g\+\+|c\+\+))([-.].*)?$")


def fake_nvidia_smi(folder: Path, driver: str, cuda: str, cap: str | None = "9.0", gpus: int = 2) -> Path:
    """A stand-in nvidia-smi that answers what the scripts ask: -L, --query-gpu=FIELDS --format=csv,noheader
    (driver_version, compute_cap, index, name, memory.total), and the plain table's header line. cap None: a
    driver older than 510, which knows no compute_cap."""
    name = "NVIDIA H100 80GB HBM3"
    values = {"driver_version": driver, "compute_cap": cap, "name": name, "memory.total": "81559 MiB"}
    cases = ""
    for fields in ("driver_version" if cap is None else "driver_version,compute_cap", "index,name,memory.total"):
        rows = [", ".join(str(i) if f == "index" else values[f] for f in fields.split(",")) for i in range(gpus)]
        cases += f"    '--query-gpu={fields} --format=csv,noheader') printf '%s\\n' {' '.join(map(repr, rows))} ;;\n"
    gpu_list = " ".join(repr(f"GPU {i}: {name} (UUID: GPU-{i})") for i in range(gpus))
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        f"    -L) printf '%s\\n' {gpu_list} ;;\n"
        f"{cases}"
        f"    '') echo '| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}     |' ;;\n"
        '    *) echo "stand-in nvidia-smi: $*?" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return folder


def gpu_path(tmp_path, gpu) -> str:
    """PATH without nvidia-smi (gpu None), or with the stand-in for gpu = (driver, CUDA[, compute capability])."""
    return "/usr/bin:/bin" if gpu is None else f"{fake_nvidia_smi(tmp_path / 'gpu', *gpu)}:/usr/bin:/bin"


def bare_path(tmp_path) -> str:
    """A folder of this machine's commands less every C and C++ compiler."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for tool in Path(folder).iterdir():
            if not (bare / tool.name).exists() and not COMPILERS.match(tool.name):
                (bare / tool.name).symlink_to(tool)
    return str(bare)


# The checkout's .venv/bin/python in a copy of the scripts: this interpreter, but scripts/setup.sh's torch probe
# (an import of torch, ~2 s, in every dry run) runs once, in this interpreter, and its answer is replayed; pip
# installs nothing, it appends its arguments to .venv/bin/pip.log
PYTHON = """#!/bin/bash
case "${{2:-}}" in
    *torch.cuda.is_available*) [ -s {answer} ] || {python} "$@" >{answer}; cat {answer} ;;
    pip) echo "${{@:3}}" >>"$(dirname "$0")/pip.log" ;;  # what pip would install, written down instead
    *) exec {python} "$@" ;;
esac
"""


@pytest.fixture(scope="module")
def probe_answer(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("probe") / "answer"


@pytest.fixture
def checkout(tmp_path, probe_answer) -> Path:
    """setup_cloud.sh and the scripts it runs, copied as they are, beside a .venv whose python replays the torch
    probe's answer (and whose .torch-from marker is this test's own)."""
    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "setup_cloud.sh", copy)
    for script in ("setup.sh", "torch_plan.sh"):
        shutil.copy(ROOT / "scripts" / script, copy / "scripts")
    python = copy / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(PYTHON.format(answer=shlex.quote(str(probe_answer)), python=shlex.quote(sys.executable)))
    python.chmod(0o755)
    return copy


def setup_cloud(checkout, *args, path, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_") and k != "CC"}
    return subprocess.run(
        ["bash", str(checkout / "setup_cloud.sh"), *args],
        capture_output=True,
        text=True,
        env={**environment, "PATH": path, **env},
        cwd=checkout,
    )


def torch_plan(tmp_path, gpu, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "torch_plan.sh")],
        capture_output=True,
        text=True,
        env={**environment, "PATH": gpu_path(tmp_path, gpu), **env},
    )


def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    out = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dry_run_without_a_gpu_prints_the_cpu_path_and_no_token(checkout):
    out = setup_cloud(
        checkout,
        "--dry-run",
        "--data",
        "fineweb-edu",
        path="/usr/bin:/bin",  # no nvidia-smi
        HF_TOKEN="hf_FAKEsetupToken42",
        WANDB_API_KEY="FAKEwandbKey42",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == [
        "setup_cloud: no NVIDIA GPU here (nvidia-smi missing or no driver): setting up the CPU environment",
        "setup_cloud: preflight: python3-venv, a C compiler and the Python headers are there",
        "would run: bash scripts/setup.sh, whose plan is:",
        f"setup: {PLANS[None]}",
        f"setup: keeping {BUILD}, already importable",  # as before: the torch there is used as it is
    ]
    assert lines[5].startswith("would run: .venv/bin/python -c import os; from huggingface_hub import login")
    assert lines[6].startswith("would run: .venv/bin/python -c import os, wandb; wandb.login(")
    assert lines[7] == (
        "would run: .venv/bin/python scripts/prepare_data.py fineweb-edu --max-tokens 3.5B --out data/fineweb-edu"
    )
    assert lines[8].startswith("train:  .venv/bin/python train.py configs/tiny.yaml")
    assert len(lines) == 9
    assert "FAKE" not in out.stdout + out.stderr  # the tokens are read inside Python, never printed


@pytest.mark.parametrize("gpu", [g for g in PLANS if g], ids=lambda g: g[0])
def test_the_dry_run_shows_the_torch_build_for_the_driver_and_the_gpu_preflight(tmp_path, checkout, gpu):
    out = setup_cloud(checkout, "--dry-run", path=gpu_path(tmp_path, gpu))
    assert out.returncode == 0, out.stderr
    driver, cuda = gpu
    if torch.cuda.is_available():  # a real GPU that this torch sees: it is kept
        torch_steps = [f"setup: keeping {BUILD}, which sees the GPU"]
    else:  # blind to the (stand-in) GPU: the plan's build replaces it in .venv
        install = " ".join(["torch==2.13.0", *(["--index-url", CU126] if int(driver[:3]) < 580 else [])])
        torch_steps = [
            f"setup: {BUILD} cannot see the GPU with NVIDIA driver {driver}: that build goes into .venv, in its place",
            *(["would run: .venv/bin/python -m pip uninstall --quiet -y torch"] if TORCH_IN_VENV else []),
            f"would run: .venv/bin/python -m pip install --quiet {'' if TORCH_IN_VENV else '--ignore-installed '}"
            + install,
        ]
    assert out.stdout.splitlines() == [
        f"setup_cloud: NVIDIA driver {driver} (CUDA {cuda}), 2 GPU(s):",
        "0, NVIDIA H100 80GB HBM3, 81559 MiB",
        "1, NVIDIA H100 80GB HBM3, 81559 MiB",
        "setup_cloud: preflight: python3-venv, a C compiler and the Python headers are there",
        "would run: bash scripts/setup.sh, whose plan is:",
        f"setup: {PLANS[gpu]}",
        *torch_steps,
        # torch sees the GPUs, compiles, and NCCL talks across them: before any download
        f"would run: .venv/bin/python scripts/preflight.py --driver {driver} --driver-cuda {cuda} "
        f"--cuda12-index {CU126}",
        "setup_cloud: HF_TOKEN not set: no Hub login (needed only to publish: scripts/push_to_hub.py, hub.repo_id)",
        "setup_cloud: WANDB_API_KEY not set: no wandb login (log.wandb: true then logs offline)",
        "setup_cloud: no --data: prepare a set before training (scripts/prepare_data.py, or --data)",
        "check:  bash scripts/gpu_check.sh gpu-check/   (the benchmark compiled and not, the CUDA tests: 8 minutes)",
        "train:  .venv/bin/torchrun --nproc_per_node=2 train.py configs/gpt2-small-pytorch-rmsnorm.yaml",
    ]


def test_a_build_this_plan_installed_is_not_installed_again_but_one_from_before_the_driver_is(tmp_path, checkout):
    # .venv/.torch-from names the plan's build and the driver it was for: a rerun on the same driver keeps the
    # build (the check after it says why it is blind); a torch a driverless setup installed (CI's) is replaced
    marker = checkout / ".venv" / ".torch-from"
    path = gpu_path(tmp_path, ("535.129.03", "12.2"))
    outcomes = []
    for written in (f"torch==2.13.0 --index-url {CU126} for driver 535.129.03", "torch==2.13.0 for driver none"):
        marker.write_text(written + "\n")
        out = setup_cloud(checkout, "--dry-run", path=path)
        outcomes.append([line for line in out.stdout.splitlines() if line.startswith("setup: ")][1])
    if torch.cuda.is_available():  # a torch that sees a GPU is kept, whatever the marker says
        assert outcomes == [f"setup: keeping {BUILD}, which sees the GPU"] * 2
        return
    blind = f"setup: keeping {BUILD}, installed by this plan before though it cannot see the GPU"
    assert outcomes == [
        f"{blind} (the check after says why)",
        f"setup: {BUILD} cannot see the GPU with NVIDIA driver 535.129.03: that build goes into .venv, in its place",
    ]


@pytest.mark.slow  # six runs of setup.sh, each ending in an import of torch: ~10 s
def test_setup_installs_again_only_what_changed_and_a_full_install_serves_the_default(tmp_path, checkout):
    shutil.copy(ROOT / "pyproject.toml", checkout)
    log = checkout / ".venv" / "bin" / "pip.log"

    def setup(*args) -> list[str]:  # the pip installs one setup.sh run made
        log.unlink(missing_ok=True)
        out = subprocess.run(["bash", "scripts/setup.sh", *args], capture_output=True, text=True, cwd=checkout,
                             env={**os.environ, "PATH": gpu_path(tmp_path, None)})  # fmt: skip
        assert out.returncode == 0, out.stderr
        return log.read_text().splitlines() if log.exists() else []

    project = "install --quiet -e .[{}]"
    assert setup()[0] == project.format("dev")
    assert setup() == []  # nothing changed: nothing installed
    assert setup("--full")[0] == project.format("dev,eval")
    assert setup() == [] and setup("--full") == []  # the full install holds the default one's extras
    with (checkout / "pyproject.toml").open("a") as f:
        f.write("\n# a changed dependency list\n")
    assert setup()[0] == project.format("dev")


@pytest.mark.parametrize(
    "gpu, env, plan",
    [
        (None, {}, PLANS[None]),
        (
            ("535.129.03", "12.2"),
            {"TORCH_INDEX_URL": "https://example.org/whl/cu130"},
            "NVIDIA driver 535.129.03 (CUDA 12.2): torch==2.13.0 from https://example.org/whl/cu130 (TORCH_INDEX_URL)",
        ),
        (
            ("535.129.03", "12.2"),
            {"TORCH_SPEC": "torch==2.12.1"},
            f"NVIDIA driver 535.129.03 (CUDA 12.2): torch==2.12.1 {CUDA12}",
        ),
        (
            ("580.65.06", "13.0"),
            {"TORCH_INDEX_URL": ""},  # set but empty: the default index, whatever the driver
            "NVIDIA driver 580.65.06 (CUDA 13.0): torch==2.13.0 from the default index (TORCH_INDEX_URL)",
        ),
        (
            None,
            {"TORCH_SPEC": "torch==2.13.0+cpu", "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"},
            f"{NO_DRIVER}: torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu (TORCH_INDEX_URL)",
        ),
        (
            ("580.65.06", "13.0", "7.0"),  # a V100: the CUDA 13 builds have no kernels for it
            {},
            f"NVIDIA driver 580.65.06 (CUDA 13.0): torch==2.13.0 from {CU126} "
            "(compute capability 7.0: the CUDA 13 builds have no kernels below 7.5)",
        ),
        (
            ("590.44.01", "13.1", "10.0"),  # a B200 on a driver for CUDA 13
            {},
            "NVIDIA driver 590.44.01 (CUDA 13.1): torch==2.13.0 from the default index "
            "(its CUDA 13 build runs on driver >= 580)",
        ),
    ],
)
def test_the_plan_follows_the_overrides_and_the_gpu(tmp_path, gpu, env, plan):
    out = torch_plan(tmp_path, gpu, **env)
    assert (out.returncode, out.stdout, out.stderr) == (0, plan + "\n", "")


@pytest.mark.parametrize(
    "gpu, error",
    [
        (
            ("470.223.02", "11.4", None),
            "NVIDIA driver 470.223.02 (CUDA 11.4) is too old for torch==2.13.0: its oldest CUDA build (12.6) needs "
            "driver >= 525.60.13; upgrade the driver, or set TORCH_SPEC and TORCH_INDEX_URL to a build for CUDA 11.4",
        ),
        (
            ("570.133.20", "12.8", "10.0"),
            "NVIDIA driver 570.133.20 (CUDA 12.8) with a Blackwell GPU (compute capability 10.0): torch==2.13.0's CUDA "
            "12 build has no kernels for it and its CUDA 13 build needs driver >= 580; upgrade the driver to >= 580",
        ),
    ],
)
def test_a_driver_no_build_runs_on_is_one_line_before_anything_is_done(tmp_path, checkout, gpu, error):
    assert torch_plan(tmp_path, gpu).stderr == error + "\n"
    out = setup_cloud(checkout, "--dry-run", path=gpu_path(tmp_path, gpu))
    assert out.returncode == 1 and out.stderr == f"setup_cloud: {error}\n"
    assert "preflight" not in out.stdout and "would run" not in out.stdout


def test_the_preflight_installs_what_a_bare_vm_lacks(tmp_path, checkout):
    out = setup_cloud(checkout, "--dry-run", path=bare_path(tmp_path))  # python3 and its headers are there, gcc is not
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1:5] == [
        "setup_cloud: preflight: missing a C compiler (no gcc or clang): installing build-essential",
        "would run: apt-get update -qq",  # as root, as here; else with passwordless sudo, else one line: see below
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential",
        "would run: bash scripts/setup.sh, whose plan is:",
    ]


def test_the_preflight_without_root_names_the_packages_in_one_line(tmp_path, checkout):
    bare = Path(bare_path(tmp_path))
    for name in ("id", "sudo"):  # a user who is not root and has no sudo
        (bare / name).unlink(missing_ok=True)
    (bare / "id").write_text("#!/bin/sh\necho 1000\n")
    (bare / "id").chmod(0o755)
    out = setup_cloud(checkout, "--dry-run", path=str(bare))
    assert out.returncode == 0 and "apt-get" not in out.stdout  # a dry run goes on; a real one stops there
    assert out.stderr == (
        "setup_cloud: missing a C compiler (no gcc or clang): install build-essential as root "
        "(sudo apt-get install -y build-essential), then run this again\n"
    )


def test_the_gpu_preflight_says_in_one_line_what_a_cpu_build_lacks(cli):
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU")
    out = cli(ROOT / "scripts" / "preflight.py", "--driver", "535.129.03", "--driver-cuda", "12.2")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        f"error: preflight: torch {torch.__version__} is a CPU build (torch.version.cuda None), on NVIDIA driver "
        "535.129.03 "
        "(CUDA 12.2): remove .venv and run bash setup_cloud.sh again without TORCH_SPEC/TORCH_INDEX_URL "
        "(it installs the build for this driver)\n"
    )


def test_the_nodes_preflight_refuses_a_rendezvous_or_node_count_it_cannot_use(cli):
    out = cli(ROOT / "scripts" / "preflight.py", "--nodes", "2", "--rendezvous", "node0")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "error: preflight: --rendezvous 'node0': expected HOST:PORT, e.g. node0:29500\n"
    for args, said in [
        (
            ["--nodes", "0", "--rendezvous", "node0:29500"],
            "error: --nodes 0: the job's node count must be >= 1",
        ),
        (["--nodes", "2"], "error: --nodes needs --rendezvous HOST:PORT (torchrun's --rdzv-endpoint)"),
        (["--timeout", "nan"], "error: argument --timeout: nan: seconds, a finite number above 0"),
        (["--timeout", "inf"], "error: argument --timeout: inf: seconds, a finite number above 0"),
        (["--timeout", "0"], "error: argument --timeout: 0.0: seconds, a finite number above 0"),
    ]:
        out = cli(ROOT / "scripts" / "preflight.py", *args)
        assert out.returncode == 2 and out.stderr.splitlines()[-1].endswith(said), out.stderr


@pytest.mark.slow
def test_the_gpu_preflight_compiles_and_all_reduces_on_the_cpu(tmp_path):
    """The GPU checks' code on the CPU, gloo in place of NCCL; then without a C++ compiler, its one line."""
    command = [sys.executable, str(ROOT / "scripts" / "preflight.py"), "--device", "cpu", "--nproc", "2"]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line.split(" (")[0] for line in out.stdout.splitlines()] == [
        "preflight: torch.compile ran on cpu",
        "preflight: gloo all-reduce across 2 processes: ok",
    ]
    env = {**env, "PATH": bare_path(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-2")}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith("error: preflight: torch.compile failed on cpu (") and out.stderr.count("\n") == 1
    assert out.stderr.endswith(
        "): it needs a C compiler and the Python headers (sudo apt-get install -y build-essential python3-dev)\n"
    )


def test_a_wrong_argument_is_one_line(checkout):
    out = setup_cloud(checkout, "--data", "nonsense", "--dry-run", path="/usr/bin:/bin")
    assert out.returncode == 2 and out.stdout == ""  # before anything is done
    assert out.stderr == "setup_cloud: --data nonsense: use fineweb-edu, fineweb, or a Hub repo USER/NAME\n"
    out = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--nonsense"], capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (2, "setup: unknown argument --nonsense (allowed: --full, --dry-run)\n")


@pytest.mark.parametrize("script", ["setup_cloud.sh", "scripts/setup.sh"])
def test_help_prints_the_whole_header_comment(script):
    lines = (ROOT / script).read_text().splitlines()
    header = lines[1 : next(i for i, line in enumerate(lines[1:], 1) if not line.startswith("#"))]
    out = subprocess.run(["bash", str(ROOT / script), "--help"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "\n".join(header) + "\n")
