"""Speed arithmetic: step-time statistics, model FLOPs utilisation, and the chips' peaks.

MFU = model FLOPs per token x tokens/s / (peak FLOP/s per GPU x GPUs); solved for the time,
it estimates a run's hours before a GPU has measured its tokens/s (``train_hours``). The model FLOPs
are ``GPT.flops_per_token`` (the useful work of the model, whatever the kernels do
besides); the peak is the chip's dense bf16 tensor-core peak from its data sheet, looked
up by the name torch reports. A chip not in the table gets no MFU (``--peak-tflops``
supplies one): never another chip's peak, which is how other harnesses came to report
MFU above 100%.
"""

from __future__ import annotations

import statistics

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s per GPU, from NVIDIA's data sheets.
# Matched in order against the lower-cased device name: the first pattern found wins.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("h200 nvl", 835.0),
    ("h200", 989.4),  # H200 SXM (also GH200)
    ("h100 nvl", 835.0),
    ("h100 pcie", 756.0),
    ("h100", 989.4),  # H100 SXM5 ("NVIDIA H100 80GB HBM3")
    ("a100", 312.0),  # SXM4 and PCIe, 40 and 80 GB
)


def peak_tflops(device: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device``, or None if it is not in the table."""
    name = device.lower()
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS if pattern in name), None)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None, n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation (0..1) against ``peak`` TFLOP/s per device; None without a peak."""
    if peak is None:
        return None
    return flops_per_token * tokens_per_s / (peak * 1e12 * n_devices)


def train_hours(tokens: float, flops_per_token: float, peak: float, n_devices: int, mfu: float) -> float:
    """Hours to train ``tokens`` on ``n_devices`` of ``peak`` TFLOP/s at model FLOPs utilisation ``mfu``:
    the MFU formula solved for the time. An estimate, until bench.py measures tokens/s (its h/run)."""
    return tokens * flops_per_token / (mfu * peak * 1e12 * n_devices) / 3600


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between the closest ranks."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def step_stats(seconds: list[float]) -> dict:
    """Median and spread (10th and 90th percentiles) of step times, in milliseconds."""
    return {
        "ms_per_step": 1e3 * statistics.median(seconds),
        "ms_p10": 1e3 * percentile(seconds, 10),
        "ms_p90": 1e3 * percentile(seconds, 90),
    }
