"""The fast path: what each speed option of ``train`` resolves to on this device.

On a CUDA GPU every option is on unless the config turns it off: bf16 autocast
(``precision: auto``), ``torch.compile`` (``compile: null``), TF32 for the matmuls left
in fp32, batches read one step ahead into pinned memory. Fused AdamW and flash attention
(``scaled_dot_product_attention`` picks the flash kernel for bf16 / fp16 causal
attention) need no switch. On the CPU each GPU-only option is skipped: the step computes
the same function, only slower.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FastPath:
    """The speed options as they apply on one device (see ``resolve``)."""

    precision: str  # fp32, bf16 or fp16: train.precision with auto decided
    compile: bool  # torch.compile the model
    tf32: bool  # fp32 matmuls in TF32 (CUDA only)
    prefetch: bool  # read step s + 1's batches in a background thread during step s
    pin_memory: bool  # batches land in pinned memory, so host-to-device copies do not wait (CUDA only)


def auto_precision(device: torch.device) -> str:
    """``precision: auto``: bf16 on a GPU with bf16 arithmetic, else fp32."""
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def resolve(train, device: torch.device) -> FastPath:
    """The fast path of a ``TrainConfig`` on ``device``."""
    cuda = device.type == "cuda"
    return FastPath(
        precision=auto_precision(device) if train.precision == "auto" else train.precision,
        compile=cuda if train.compile is None else train.compile,
        tf32=cuda and train.tf32,
        prefetch=train.prefetch,
        pin_memory=cuda and train.prefetch,
    )


def apply_tf32(enabled: bool) -> None:
    """Let CUDA fp32 matmuls use TF32 (or not). Process-wide, as torch has it.

    Through ``torch.set_float32_matmul_precision`` ("high": TF32, "highest": IEEE), which sets torch's new
    ``fp32_precision`` and its legacy flags together, so both stay readable: once ``fp32_precision`` is set
    directly, the legacy readers (``allow_tf32``, ``get_float32_matmul_precision()``) raise, and inductor's
    autotuning of a bmm calls them (tested). The model has no convolution, so cuDNN's flag is left alone."""
    set_fp32_precision({"cuda.matmul": "tf32" if enabled else "ieee"})


MATMUL_PRECISION = {"tf32": "high", "ieee": "highest"}  # cuda.matmul's fp32_precision -> set_float32_matmul_precision
FP32_BACKENDS = ("cuda.matmul", "cudnn.conv", "mkldnn.matmul", "mkldnn.conv")  # where an fp32 op may run reduced


def _backend(name: str):
    node = torch.backends
    for part in name.split("."):
        node = getattr(node, part)
    return node


def fp32_precision() -> dict[str, str]:
    """How each backend computes fp32 matmuls and convolutions now: ``ieee``, ``tf32`` (CUDA), ``bf16`` (oneDNN on a
    CPU with bf16 units) or ``none`` (the default: IEEE unless a parent setting says otherwise)."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch < 2.9: the legacy flags
        return {
            "cuda.matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
            "cudnn.conv": "tf32" if torch.backends.cudnn.allow_tf32 else "ieee",
        }
    return {name: _backend(name).fp32_precision for name in FP32_BACKENDS}


def set_fp32_precision(modes: dict[str, str]) -> None:
    """Set how backends compute fp32 matmuls and convolutions (``fp32_precision()``'s form; on torch < 2.9 the
    legacy flags, where only ``tf32`` or not counts)."""
    for name, mode in modes.items():
        if name == "cuda.matmul" and mode in MATMUL_PRECISION:  # both APIs set: the legacy readers stay usable
            torch.set_float32_matmul_precision(MATMUL_PRECISION[mode])
        elif hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            _backend(name).fp32_precision = mode
        else:
            (torch.backends.cuda.matmul if name == "cuda.matmul" else torch.backends.cudnn).allow_tf32 = mode == "tf32"


@contextlib.contextmanager
def ieee_fp32():
    """Every fp32 matmul and convolution in IEEE fp32 while inside, whatever the process set before (the
    trainer's TF32 on a GPU, a bf16 setting on a CPU), and the settings as they were afterwards. An evaluation
    computes in here, so its numbers never depend on what ran before it in the process."""
    before = fp32_precision()
    try:
        set_fp32_precision(dict.fromkeys(before, "ieee"))
        yield
    finally:
        set_fp32_precision(before)
