#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU (no network needed), the CUDA tests and the benchmark,
# budgeted to end inside one short loan of the machine (one 10-minute call), keeping every row it
# measured whenever it stops.
#
#   bash scripts/gpu_check.sh OUTDIR [--budget-s 540] [--stages norms,eager,tests,compiled,micro_batch] [--quick]
#   PYTHON=/path/to/python bash scripts/gpu_check.sh OUTDIR     # choose the interpreter
#
# It uses the interpreter's own torch (no scripts/setup.sh; the package is imported from this
# checkout) and only data it makes itself. Stages, cheapest first, each under a time limit sized
# from what is left: the norm layers alone, GPT-2 small eager (every norm type), tests/test_cuda.py,
# GPT-2 small compiled (the two LayerNorms first), the micro-batch search. --quick: the correctness
# tests and the two LayerNorms, under 4 minutes. OUTDIR gets summary.txt (rewritten after every
# stage), rows.jsonl (one line per benchmark row, as it is measured) and three logs: see
# `python -m gpt.commands.gpu_check --help`.
# Exit status: 0 when nothing failed, 1 otherwise (and when no GPU is visible).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:?usage: bash scripts/gpu_check.sh OUTDIR [--budget-s S] [--stages LIST] [--quick]}
shift
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    version=$("$PY" -c "import torch; print('torch ' + torch.__version__)" 2>/dev/null || echo "no torch")
    echo "gpu_check: no CUDA GPU is visible to $PY ($version); run it on a machine with one" >&2
    exit 1
fi
exec "$PY" -m gpt.commands.gpu_check "$OUT" --tests tests/test_cuda.py --config configs/gpt2-small.yaml "$@"
