"""A readable account of what a config builds: shapes, parameter counts, tokens per step."""

from __future__ import annotations

import math

from gpt.config import Config
from gpt.model import GPT


def model_summary(cfg: Config, model: GPT) -> str:
    m, t = cfg.model, cfg.train
    n_params = model.num_params()
    n_norm = sum(p.numel() for n, p in model.named_parameters() if n in model.norm_parameter_names())
    step_tokens = t.global_batch_size * m.context_length
    lines = [
        f"run {cfg.run.name} -> {cfg.run_dir}",
        f"model: {m.n_layers} layers x d_model {m.d_model} x {m.n_heads} heads, context {m.context_length}, "
        f"vocab {m.vocab_size}, norm {m.norm_type}, init {m.init} (seed {cfg.init_seed})",
        f"parameters: {n_params:,} ({n_norm:,} in norm layers)",
        f"batch: {t.global_batch_size} sequences = {step_tokens:,} tokens per optimizer step "
        f"(micro-batch {t.micro_batch_size}), precision {t.precision}",
    ]
    if t.tokens_per_param is not None or t.tokens is not None:
        tokens = t.tokens if t.tokens is not None else t.tokens_per_param * n_params
        lines.append(f"length: {tokens:,.0f} tokens = {math.ceil(tokens / step_tokens):,} steps")
    else:
        lines.append(f"length: {t.steps:,} steps = {t.steps * step_tokens:,} tokens")
    return "\n".join(lines)
