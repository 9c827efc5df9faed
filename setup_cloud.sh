#!/usr/bin/env bash
# A fresh GPU VM (Ubuntu, 8 GPUs, Lambda-style) -> ready to train, in one idempotent command.
#
#   bash setup_cloud.sh [--data fineweb-edu | fineweb | USER/TOKENS_REPO] [--dry-run]
#
# 1. Checks the NVIDIA driver and lists the GPUs (none: says so and sets up the CPU
#    environment instead).
# 2. scripts/setup.sh: .venv with this package; a torch already on the image is kept
#    (--system-site-packages), else torch==2.13.0 from PyPI, a CUDA build on Linux x86_64.
#    Then checks that torch sees the GPUs.
# 3. With HF_TOKEN / WANDB_API_KEY in the environment, logs in to the Hub and wandb without a
#    prompt; the tokens go only where those tools keep them (~/.cache/huggingface/token,
#    ~/.netrc), never on a command line or into this checkout.
# 4. --data: prepares FineWeb-Edu or FineWeb (3.5B training tokens, into data/<name>), or
#    fetches a pre-tokenised Hub set into the Hugging Face cache. Skipped when already there.
# 5. Prints the torchrun command to start.
# --dry-run prints each step instead of doing it. Run it again after a pull: done steps are quick.
set -euo pipefail
cd "$(dirname "$0")"

DATA=""
DRY_RUN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --data) DATA="${2:?--data needs fineweb-edu, fineweb or a Hub repo USER/NAME}"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
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
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L | wc -l)
    echo "setup_cloud: NVIDIA driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1), $GPUS GPU(s):"
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
else
    GPUS=0
    echo "setup_cloud: no NVIDIA GPU here (nvidia-smi missing or no driver): setting up the CPU environment"
fi

step bash scripts/setup.sh
if [ "$GPUS" -gt 0 ]; then
    step "$PY" -c "import sys, torch; ok = torch.cuda.is_available(); print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) visible' if ok else f'torch {torch.__version__} sees no GPU: a CPU build? remove .venv and install a CUDA build of torch'); sys.exit(0 if ok else 1)"
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
    echo "check:  bash scripts/gpu_check.sh gpu-check/   (CUDA tests and the benchmark, about 8 minutes)"
    echo "train:  .venv/bin/torchrun --nproc_per_node=$GPUS train.py $CONFIG$EXTRA"
else
    echo "train:  $PY train.py configs/tiny.yaml   (a CPU-sized model; the GPT-2 small configs need GPUs)"
fi
