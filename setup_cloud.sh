#!/usr/bin/env bash
# A fresh GPU VM (Ubuntu, 8 GPUs, Lambda-style) -> ready to train, in one idempotent command.
#
#   bash setup_cloud.sh [--data fineweb-edu | fineweb | USER/TOKENS_REPO] [--dry-run]
#
# 1. Checks the NVIDIA driver, lists the GPUs (none: says so and sets up the CPU environment
#    instead) and picks the torch build the driver runs (scripts/torch_plan.sh: below driver 580,
#    torch 2.13's CUDA 12 build; TORCH_SPEC / TORCH_INDEX_URL override), or says why none does.
# 2. Preflight: python3-venv, a C compiler and the Python headers (torch.compile's Triton needs
#    both); the missing ones are installed with apt-get as root or with passwordless sudo, else
#    one line names them.
# 3. scripts/setup.sh: .venv with this package; a torch already on the image is kept
#    (--system-site-packages) where it sees the GPUs, else that build goes into .venv.
# 4. On GPUs, scripts/preflight.py: torch sees them, torch.compile runs on one and an NCCL
#    all-reduce goes through across all of them (about a minute), before any download.
# 5. With HF_TOKEN / WANDB_API_KEY in the environment, logs in to the Hub and wandb without a
#    prompt; the tokens go only where those tools keep them (~/.cache/huggingface/token,
#    ~/.netrc), never on a command line or into this checkout.
# 6. --data: prepares FineWeb-Edu or FineWeb (3.5B training tokens, into data/<name>), or
#    fetches a pre-tokenised Hub set into the Hugging Face cache. Skipped when already there.
# 7. Prints the torchrun command to start.
# --dry-run prints the plan and each step instead of doing it. Run it again after a pull: done
# steps are quick.
set -euo pipefail
cd "$(dirname "$0")"

DATA=""
DRY_RUN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --data) DATA="${2:?--data needs fineweb-edu, fineweb or a Hub repo USER/NAME}"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "setup_cloud: unknown argument $1 (allowed: --data NAME, --dry-run)" >&2; exit 2 ;;
    esac
done

case "$DATA" in  # checked before anything is done
    ""|fineweb|fineweb-edu|*/*) ;;
    *) echo "setup_cloud: --data $DATA: use fineweb-edu, fineweb, or a Hub repo USER/NAME" >&2; exit 2 ;;
esac

step() {  # run a step, or with --dry-run print it
    if [ "$DRY_RUN" = 1 ]; then
        echo "would run: $*"
    else
        echo "+ $*"
        "$@"
    fi
}

PY=.venv/bin/python
# shellcheck source=/dev/null  # scripts/torch_plan.sh, checked on its own
. scripts/torch_plan.sh
PLANNED=1
torch_plan || PLANNED=0  # reads the driver once (NV_*); no build for it is said below, before anything is installed
GPUS=$NV_GPUS
if [ "$GPUS" -gt 0 ]; then
    echo "setup_cloud: NVIDIA driver $NV_DRIVER (CUDA $NV_CUDA), $GPUS GPU(s):"
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
else
    echo "setup_cloud: no NVIDIA GPU here (nvidia-smi missing or no driver): setting up the CPU environment"
fi
if [ "$PLANNED" = 0 ]; then
    echo "setup_cloud: $TORCH_PLAN" >&2
    exit 1
fi

preflight() {  # what a bare Ubuntu lacks: python3-venv, a C compiler (Triton: $CC, gcc or clang), Python.h
    local py=${PYTHON:-python3} missing=() why=() as_root=()
    if [ ! -x "$PY" ] && ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
        missing+=(python3-venv) why+=("$py -m venv (no ensurepip)")
    fi
    if [ -z "${CC:-}" ] && ! command -v gcc >/dev/null && ! command -v clang >/dev/null; then
        missing+=(build-essential) why+=("a C compiler (no gcc or clang)")
    fi
    [ ! -x "$PY" ] || py=$PY  # Triton builds against the headers of the interpreter it runs in
    if ! "$py" -c "import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" 2>/dev/null; then
        missing+=(python3-dev) why+=("the Python headers (no Python.h for $py)")
    fi
    if [ "${#missing[@]}" = 0 ]; then
        echo "setup_cloud: preflight: python3-venv, a C compiler and the Python headers are there"
        return
    fi
    local what="missing ${why[0]}" w
    for w in "${why[@]:1}"; do what+=", $w"; done
    if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        as_root=(sudo)
    elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "setup_cloud: $what: install ${missing[*]} as root (sudo apt-get install -y ${missing[*]}), then run this again" >&2
        [ "$DRY_RUN" = 1 ] && return
        exit 1
    fi
    echo "setup_cloud: preflight: $what: installing ${missing[*]}"
    step "${as_root[@]}" apt-get update -qq
    step "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}
preflight

if [ "$DRY_RUN" = 1 ]; then
    echo "would run: bash scripts/setup.sh, whose plan is:"
    bash scripts/setup.sh --dry-run
else
    step bash scripts/setup.sh
fi
if [ "$GPUS" -gt 0 ]; then  # torch sees the GPUs, compiles, and NCCL talks across them: before any download
    step "$PY" scripts/preflight.py --driver "$NV_DRIVER" --driver-cuda "$NV_CUDA" --cuda12-index "$TORCH_CUDA12_INDEX"
fi

# Logins: the token is read from the environment inside Python, so it never shows in `ps` or a log.
if [ -n "${HF_TOKEN:-}" ]; then
    step "$PY" -c "import os; from huggingface_hub import login; login(token=os.environ['HF_TOKEN'], add_to_git_credential=False)"
else
    echo "setup_cloud: HF_TOKEN not set: no Hub login (needed only to publish: scripts/push_to_hub.py, hub.repo_id)"
fi
if [ -n "${WANDB_API_KEY:-}" ]; then
    step "$PY" -c "import os, wandb; wandb.login(key=os.environ['WANDB_API_KEY'], relogin=True)"
else
    echo "setup_cloud: WANDB_API_KEY not set: no wandb login (log.wandb: true then logs offline)"
fi

CONFIG=configs/gpt2-small-pytorch-rmsnorm.yaml
EXTRA=""
case "$DATA" in
    "") echo "setup_cloud: no --data: prepare a set before training (scripts/prepare_data.py, or --data)" ;;
    fineweb|fineweb-edu)
        if [ -f "data/$DATA/meta.json" ]; then
            echo "setup_cloud: data/$DATA is already prepared"
        else
            step "$PY" scripts/prepare_data.py "$DATA" --max-tokens 3.5B --out "data/$DATA"
        fi
        [ "$DATA" = fineweb ] || EXTRA=" --set data.path=data/$DATA" ;;
    */*)
        step "$PY" -c "import sys; from gpt.data.tokens import resolve_data_dir; print(resolve_data_dir(None, sys.argv[1]))" "$DATA"
        EXTRA=" --set data.path=null --set data.hub_repo=$DATA" ;;
esac

if [ "$GPUS" -gt 0 ]; then
    echo "check:  bash scripts/gpu_check.sh gpu-check/   (the benchmark compiled and not, the CUDA tests: 8 minutes)"
    echo "train:  .venv/bin/torchrun --nproc_per_node=$GPUS train.py $CONFIG$EXTRA"
else
    echo "train:  $PY train.py configs/tiny.yaml   (a CPU-sized model; the GPT-2 small configs need GPUs)"
fi
