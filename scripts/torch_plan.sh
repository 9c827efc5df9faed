#!/usr/bin/env bash
# Which torch build runs on this machine's NVIDIA driver; sourced by scripts/setup.sh and
# setup_cloud.sh, or run alone to print the plan: bash scripts/torch_plan.sh
#
# torch 2.13's default (PyPI) Linux build needs CUDA 13, so an NVIDIA driver >= 580; its
# CUDA 12 build (cu126, the only one it publishes) runs on any driver >= 525.60.13 (CUDA
# minor-version compatibility) but has no Blackwell kernels, and the CUDA 13 builds have none
# for GPUs older than Turing (compute capability < 7.5). No driver: the default build.
#   TORCH_SPEC=torch==2.12.0      what to install (default torch==2.13.0)
#   TORCH_INDEX_URL=URL           where from, whatever the driver ("": the default index)
# nvidia_info sets NV_DRIVER, NV_CUDA (the driver's CUDA version), NV_GPUS, NV_CAP_MIN and
# NV_CAP_MAX (compute capabilities), or fails where no driver answers. torch_plan sets
# TORCH_PLAN (one line: the build and why) and TORCH_PIP_ARGS (pip install's arguments);
# it fails, with TORCH_PLAN saying why and what to do, where no build fits.
# shellcheck disable=SC2034  # the NV_* and TORCH_* variables are for the scripts that source this
TORCH_CUDA12_INDEX=https://download.pytorch.org/whl/cu126

version_ge() {  # version_ge A B: A >= B, as versions
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

nvidia_info() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || return 1
    local rows
    rows=$(nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader 2>/dev/null ||
        nvidia-smi --query-gpu=driver_version --format=csv,noheader) || return 1  # compute_cap: driver >= 510
    NV_DRIVER=$(echo "$rows" | head -n 1 | cut -d, -f1 | tr -d ' ')
    NV_GPUS=$(echo "$rows" | wc -l)
    NV_CAP_MIN=$(echo "$rows" | cut -s -d, -f2 | tr -d ' ' | grep -E '^[0-9.]+$' | sort -V | head -n 1 || true)
    NV_CAP_MAX=$(echo "$rows" | cut -s -d, -f2 | tr -d ' ' | grep -E '^[0-9.]+$' | sort -V | tail -n 1 || true)
    NV_CUDA=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
    NV_CUDA=${NV_CUDA:-unknown}
    [ -n "$NV_DRIVER" ]
}

torch_plan() {
    local spec=${TORCH_SPEC:-torch==2.13.0} index="" why="" gpu
    if ! nvidia_info; then
        NV_DRIVER="" NV_GPUS=0
        gpu="no NVIDIA driver (nvidia-smi missing or no GPU)"
        why="no GPU to fit"
    else
        gpu="NVIDIA driver $NV_DRIVER (CUDA $NV_CUDA)"
        if [ -n "${TORCH_INDEX_URL+set}" ]; then
            :
        elif ! version_ge "$NV_DRIVER" 525.60.13; then
            TORCH_PLAN="$gpu is too old for $spec: its oldest CUDA build (12.6) needs driver >= 525.60.13; upgrade the driver, or set TORCH_SPEC and TORCH_INDEX_URL to a build for CUDA $NV_CUDA"
            return 1
        elif [ -n "$NV_CAP_MAX" ] && version_ge "$NV_CAP_MAX" 10.0 && ! version_ge "$NV_DRIVER" 580; then
            TORCH_PLAN="$gpu with a Blackwell GPU (compute capability $NV_CAP_MAX): $spec's CUDA 12 build has no kernels for it and its CUDA 13 build needs driver >= 580; upgrade the driver to >= 580"
            return 1
        elif [ -n "$NV_CAP_MIN" ] && ! version_ge "$NV_CAP_MIN" 7.5; then
            index=$TORCH_CUDA12_INDEX why="compute capability $NV_CAP_MIN: the CUDA 13 builds have no kernels below 7.5"
        elif ! version_ge "$NV_DRIVER" 580; then
            index=$TORCH_CUDA12_INDEX why="the default build needs CUDA 13, driver >= 580"
        else
            why="its CUDA 13 build runs on driver >= 580"
        fi
    fi
    if [ -n "${TORCH_INDEX_URL+set}" ]; then
        index=$TORCH_INDEX_URL why="TORCH_INDEX_URL"
    fi
    TORCH_PIP_ARGS=("$spec")
    if [ -n "$index" ]; then
        TORCH_PIP_ARGS+=(--index-url "$index")
    fi
    TORCH_PLAN="$gpu: $spec from ${index:-the default index} ($why)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
    set -euo pipefail
    if torch_plan; then echo "$TORCH_PLAN"; else echo "$TORCH_PLAN" >&2; exit 1; fi
fi
