#!/usr/bin/env bash
# Fresh GPU VM -> ready to train. Idempotent: run it again after a pull.
#
#   bash setup_cloud.sh
#
# Uses scripts/setup.sh for the environment: a torch already installed on the image is
# kept (.venv sees the system site-packages); with none, torch==2.13.0 comes from PyPI,
# whose Linux x86_64 wheel is a CUDA build. Then it checks that torch sees the GPUs.
# Secrets stay out of the repository: export HF_TOKEN / WANDB_API_KEY, or run
# `huggingface-cli login` / `wandb login`, which keep them in your home directory.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup_cloud: nvidia-smi not found; this script is for GPU machines (use scripts/setup.sh elsewhere)" >&2
    exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader

bash scripts/setup.sh

.venv/bin/python - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"setup_cloud: torch {torch.__version__} does not see a GPU (a CPU build?); "
             "remove .venv and install a CUDA build of torch")
n = torch.cuda.device_count()
print(f"setup_cloud: torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s): "
      f"{torch.cuda.get_device_name(0)}; bf16 supported: {torch.cuda.is_bf16_supported()}")
print("check: bash scripts/gpu_check.sh gpu-check/   (CUDA tests and the benchmark, about 8 minutes)")
print(f"next: .venv/bin/torchrun --nproc_per_node={n} train.py configs/gpt2-small-pytorch-rmsnorm.yaml")
PY
