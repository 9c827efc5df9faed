"""A readable account of what a config builds: shapes, parameter counts, tokens per step."""

from __future__ import annotations

from gpt.config import Config
from gpt.config.architecture import phrases
from gpt.model.gpt import GPT
from gpt.training.optimizer import split_record


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
            optimizer_line(cfg, model),
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


def optimizer_line(cfg: Config, model: GPT) -> str:
    """The optimizer, and under Muon what each of its two halves updates."""
    o, split = cfg.optim, split_record(model, cfg.optim)
    if split["name"] == "adamw":
        return f"optimizer: AdamW on every parameter, lr {o.lr:g}"
    m, a = split["muon"], split["adamw"]
    return (
        f"optimizer: Muon (lr {o.muon_lr:g}, momentum {o.muon_momentum:g}, {o.muon_adjust_lr}) on the blocks' "
        f"{m['tensors']} weight matrices ({m['weights']:,} weights); AdamW (lr {o.lr:g}) on the other "
        f"{a['tensors']} tensors ({a['weights']:,}: embeddings, head, norms, biases)"
    )
