#!/usr/bin/env bash
# The GPU check: on a machine with one or more CUDA GPUs (no network needed), run the CUDA tests
# and the benchmark, print one short table, and write the full logs to OUTDIR.
#
#   bash scripts/gpu_check.sh OUTDIR          # PYTHON=/path/to/python to choose the interpreter
#
# It uses the interpreter's own torch (no scripts/setup.sh; the package is imported from this
# checkout) and only data it makes itself. Stages, in order:
#   1. tests/test_cuda.py: bf16 / fp16 training, every fast-path option computing the same function,
#      exact resume, no waiting for the GPU between log steps, flash attention, NCCL DDP on 2 GPUs
#      (when there are 2), the micro-batch search, the benchmark itself. With pytest where the
#      machine has it (pytest -m cuda), else as a script.
#   2. the benchmark: every norm type, compile off and on, GPT-2 small in bf16 on random tokens
#      (bench.jsonl), and each norm alone at 12 x 1024 x 768 (norms.jsonl).
#   3. time allowing (the whole check aims at 8 minutes on one H100), the largest micro-batch of
#      GPT-2 small on this GPU.
# Exit status: 0 when every stage passed, 1 otherwise (and when no GPU is visible).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:?usage: bash scripts/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    version=$("$PY" -c "import torch; print('torch ' + torch.__version__)" 2>/dev/null || echo "no torch")
    echo "gpu_check: no CUDA GPU is visible to $PY ($version); run it on a machine with one" >&2
    exit 1
fi
mkdir -p "$OUT"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
status=0
"$PY" - > "$OUT/environment.txt" <<'PY'
import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}")
PY
cat "$OUT/environment.txt"

echo "== 1. CUDA tests ($(elapsed) s)"
if "$PY" -c "import pytest" >/dev/null 2>&1; then
    "$PY" -m pytest tests/test_cuda.py -m cuda -p no:cacheprovider -q -ra > "$OUT/tests.log" 2>&1 || status=1
    tail -n 1 "$OUT/tests.log"
else
    "$PY" tests/test_cuda.py > "$OUT/tests.log" 2>&1 || status=1
    grep -E "^(PASSED|FAILED|SKIPPED)" "$OUT/tests.log"
fi

echo "== 2. benchmark: GPT-2 small, every norm type, compile off and on ($(elapsed) s)"
if "$PY" -m gpt.bench configs/gpt2-small.yaml --data synthetic --compile both --steps 20 --warmup 3 \
        --set train.precision=bf16 --json > "$OUT/bench.jsonl" 2> "$OUT/bench.log"; then
    "$PY" -c "import json, sys; from gpt.bench import table; print(table([json.loads(l) for l in open(sys.argv[1])]))" \
        "$OUT/bench.jsonl" | tee "$OUT/bench.txt"
else
    status=1
    echo "benchmark failed:"; tail -n 5 "$OUT/bench.log"
fi
if "$PY" -m gpt.bench --norms-only --compile both --json > "$OUT/norms.jsonl" 2> "$OUT/norms.log"; then
    "$PY" -c "import json, sys; from gpt.bench import table; print(table([json.loads(l) for l in open(sys.argv[1])]))" \
        "$OUT/norms.jsonl" | tee "$OUT/norms.txt"
else
    status=1
    echo "norm benchmark failed:"; tail -n 5 "$OUT/norms.log"
fi

if [ "$(elapsed)" -lt 390 ]; then
    echo "== 3. largest micro-batch of GPT-2 small ($(elapsed) s)"
    "$PY" train.py configs/gpt2-small.yaml --set train.precision=bf16 --find-micro-batch \
        > "$OUT/micro_batch.txt" 2>&1 || status=1
    cat "$OUT/micro_batch.txt"
else
    echo "== 3. skipped: $(elapsed) s gone, the micro-batch search would pass 8 minutes"
fi
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in $(elapsed) s; logs in $OUT"
exit $status
