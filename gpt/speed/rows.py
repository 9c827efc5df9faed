"""A benchmark's rows as a reader sees them: the table ``bench.py`` prints (one header naming what the rows
share, then a line per row, an error row as its error) and the JSON-lines file each row is appended to the
moment it is measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gpt.common.files import write_atomically
from gpt.run.distributed import PEAK_MEMORY, peak_memory_of


def append_to(path: Path):
    """A row sink that adds each row to ``path`` as one JSON line, the file rewritten whole
    (``gpt.common.files``): a full disk leaves the rows before as they were, with no torn line."""

    def emit(row: dict) -> None:
        before = path.read_text() if path.is_file() else ""
        write_atomically(path, before + ("" if before.endswith("\n") or not before else "\n") + json.dumps(row) + "\n")

    return emit


def _num(value, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def table(rows: list[dict]) -> str:
    """The rows as a readable table, with a header naming what they share (from the first row measured)."""
    measured = [r for r in rows if "error" not in r]
    if not measured:
        return "\n".join(_error_line(r) for r in rows)
    r0 = measured[0]
    ratio = "vs handrolled_layernorm"
    if r0["mode"] == "generate":
        lines = [
            f"greedy generation of {r0['new_tokens']} tokens after a {r0['prompt_tokens']}-token prompt, batch 1, "
            f"{r0['device']}, median of {r0['repeats']}; torch {torch.__version__}",
            f"{'norm_type':<28}{'cache':>6}{'tokens/s':>12}{'s':>9}{'speed-up':>10}{'same tokens':>13}",
        ]
        lines += [
            _error_line(r)
            if "error" in r
            else f"{r['norm_type']:<28}{'on' if r['cache'] else 'off':>6}{r['tokens_per_s']:>12,.1f}"
            f"{r['seconds']:>9.2f}{_num(r.get('speedup'), '.1f'):>10}{_num(r.get('same_tokens'), ''):>13}"
            for r in rows
        ]
        return "\n".join(lines)
    if r0["mode"] == "norm":
        lines = [
            f"norm layer alone, forward + backward of {tuple(r0['shape'])} fp32 under {r0['precision']} "
            f"autocast, {r0['device']}, median of {r0['steps']}; torch {torch.__version__}",
            f"{'norm_type':<28}{'compile':>8}{'ms':>10}{'p10-p90 ms':>18}{ratio:>25}",
        ]
        lines += [
            _error_line(r)
            if "error" in r
            else f"{r['norm_type']:<28}{'on' if r['compile'] else 'off':>8}{r['ms_per_step']:>10.3f}"
            f"{r['ms_p10']:>8.3f} - {r['ms_p90']:<7.3f}{_num(r['time_vs_handrolled_layernorm'], '.3f'):>25}"
            for r in rows
        ]
        return "\n".join(lines)
    peak = f"{r0['peak_tflops']:g} TFLOP/s bf16 peak" if r0["peak_tflops"] else "no known peak: no MFU"
    memory_key, _ = peak_memory_of(r0)  # every measured row has one
    short, meaning = PEAK_MEMORY[memory_key]
    lines = [
        f"{r0['config']}: {r0['device']} x {r0['world_size']} ({peak}), {r0['precision']}, "
        f"{r0['tokens_per_step']:,} tokens/step (micro-batch {r0['micro_batch']}), {r0['data']} data, "
        f"median of {r0['steps']} steps after {r0['warmup']}; {r0['flops_per_token'] / 1e9:.4g} GFLOP/token; "
        f"{short} GiB: {meaning}; h/run: hours a whole run of {r0['run_tokens']:,} tokens takes at this speed; "
        f"torch {torch.__version__}",
        f"{'norm_type':<28}{'compile':>8}{'tokens/s':>12}{'ms/step':>10}{'p10-p90 ms':>20}{'MFU':>7}"
        f"{short + ' GiB':>15}{'compile s':>11}{'h/run':>9}{ratio:>25}",
    ]
    lines += [
        _error_line(r)
        if "error" in r
        else f"{r['norm_type']:<28}{'on' if r['compile'] else 'off':>8}{r['tokens_per_s']:>12,.0f}"
        f"{r['ms_per_step']:>10.1f}{r['ms_p10']:>9.1f} - {r['ms_p90']:<8.1f}{_num(r['mfu'], '.1%'):>7}"
        f"{r[memory_key] / 2**30:>15.2f}{_num(r['compile_s'], '.1f'):>11}{r['run_hours']:>9.2f}"
        f"{_num(r['time_vs_handrolled_layernorm'], '.3f'):>25}"
        for r in rows
    ]
    return "\n".join(lines)


def _error_line(r: dict) -> str:
    return f"{r['norm_type']:<28}{'on' if r['compile'] else 'off':>8}  failed: {r['error']}"
