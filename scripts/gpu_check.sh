#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU (no network needed), GPT-2 small's benchmark with compile
# off and on and the CUDA tests, in a time budget you choose (--budget-s; the default, 480 s, is a fresh VM's
# first minutes before a long run is paid for), keeping every row it measured whenever it stops (a kill, a
# preempted VM).
#
#   bash scripts/gpu_check.sh OUTDIR [--budget-s 480] [--stages eager,compiled,tests,...] [--quick]
#                            [--cache-dir DIR]
#   bash scripts/gpu_check.sh OUTDIR [--quick] --plan          # the plan only: no GPU needed, nothing run
#   PYTHON=/path/to/python bash scripts/gpu_check.sh OUTDIR     # choose the interpreter
#   bash scripts/gpu_check.sh --help
#
# The interpreter: $PYTHON, else the checkout's .venv/bin/python (what setup_cloud.sh makes), else
# python3; its own torch is used (no scripts/setup.sh; the package is imported from this checkout),
# and only data the check makes itself. Stages, each under a time limit sized from what is left (the
# plan, with each stage's expected seconds, is printed first): GPT-2 small eager (the two LayerNorms
# first, then every norm type), GPT-2 small compiled (the two LayerNorms: two cold compiles, given their
# time even when every stage before runs to its cap), tests/speed/test_cuda.py, then on time left over
# the norm layers alone, the micro-batch search and the other norm types compiled. All compile into one
# cache in the checkout (--cache-dir, default .cache/compile, git-ignored) that a rerun on the same
# machine reuses. --quick: one eager and one compiled row of PyTorch's LayerNorm and the correctness
# tests, in 220 s: a second look after a fix.
# OUTDIR gets summary.txt (rewritten as each row lands and after every stage), rows.jsonl (one line per
# benchmark row, as it is measured) and three logs: see `python -m gpt.commands.gpu_check --help`.
# Exit status: 0 when nothing failed, 1 otherwise (and when no GPU is visible), 2 for a usage
# mistake; stopped by SIGTERM or SIGINT, 143 or 130, within 10 s, the running stage's processes ended.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SELF="scripts/${0##*/}"
USAGE="usage: bash $SELF OUTDIR [--budget-s S] [--stages LIST] [--quick] [--cache-dir DIR] [--plan] (--help: more)"
if [[ -n "${PYTHON:-}" ]]; then
    PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    PY="$PWD/.venv/bin/python"
else
    PY=python3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

for arg in "$@"; do
    if [[ $arg == -h || $arg == --help ]]; then
        # this header; then the command's own help where the interpreter can import it (it needs torch)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"
        if help=$("$PY" -m gpt.commands.gpu_check --help 2>/dev/null); then
            printf '\nThe command it runs (the script gives --tests and --config):\n\n%s\n' "$help"
        fi
        exit 0
    fi
done
OUT=${1:-}
if [[ -z $OUT || $OUT == -* ]]; then
    echo "$USAGE" >&2
    exit 2
fi
shift

plan_only=0
for arg in "$@"; do
    [[ $arg == --plan ]] && plan_only=1
done
if ((!plan_only)) && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    version=$("$PY" -c "import torch; print('torch ' + torch.__version__)" 2>/dev/null || echo "no torch")
    echo "gpu_check: no CUDA GPU is visible to $PY ($version); run it on a machine with one" >&2
    exit 1
fi
exec "$PY" -m gpt.commands.gpu_check "$OUT" --tests tests/speed/test_cuda.py --config configs/gpt2-small.yaml "$@"
