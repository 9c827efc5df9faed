"""A readable account of what a config builds: shapes, parameter counts, tokens per step."""

from __future__ import annotations

from gpt.config import Config
from gpt.config.architecture import phrases
from gpt.model.gpt import GPT


def model_summary(cfg: Config, model: GPT) -> str:
    m, t = cfg.model, cfg.train
    n_params, outside_norms = model.num_params(), model.num_params(norms=False)
    steps = cfg.total_steps(outside_norms)
    return "\n".join(
        [
            f"run {cfg.run.name} -> {cfg.run_dir}",
            f"model: {f'size {m.size}: ' if m.size else ''}{m.n_layers} layers x d_model {m.d_model} x "
            f"{m.n_heads} heads, context {m.context_length}, vocab {m.vocab_size}, "
            f"norm {m.norm_type} ({', '.join(phrases(m) or ['pre-norm'])}), init {m.init} (seed {cfg.init_seed})",
            f"parameters: {n_params:,} ({n_params - outside_norms:,} in norm layers)",
            f"batch: {t.global_batch_size} sequences = {cfg.tokens_per_step:,} tokens per optimizer step "
            f"(micro-batch {t.micro_batch_size}), precision {t.precision}",
            f"length: {steps:,} steps = {steps * cfg.tokens_per_step:,} tokens"
            + (
                f" ({t.tokens_per_param:g} per parameter outside the norm layers: {outside_norms:,})"
                if t.tokens_per_param is not None
                else ""
            ),
        ]
    )
