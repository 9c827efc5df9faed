"""Weight conversion between ``gpt.model.gpt.GPT`` and transformers' ``GPT2LMHeadModel`` (the config's
shape under GPT-2's names, and which values GPT-2 computes, come from ``gpt.config.architecture``).

Both directions come from one table of names. transformers' GPT-2 stores its linear
layers as ``Conv1D`` with weights of shape (in, out); ours are ``nn.Linear``, (out, in),
so those are transposed. Only the models whose every option has a value GPT-2 computes map onto it
(the spec's ``gpt2`` of each option: a pre-norm LayerNorm model without QK-norm; ``pytorch_layernorm``
and the hand-rolled LayerNorms compute the same function with the same parameter names).
"""

from __future__ import annotations

from typing import Any

import torch

from gpt.config import ModelConfig
from gpt.config.architecture import BY_KEY, gpt2_mismatch
from gpt.model.gpt import GPT, VOCAB_ROWS

# (our name, transformers' name, transpose?) for one block; i is the block index.
_BLOCK_KEYS = [
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("attn.qkv.weight", "attn.c_attn.weight", True),
    ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True),
    ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
]
_TOP_KEYS = [
    ("wte.weight", "transformer.wte.weight", False),
    ("wpe.weight", "transformer.wpe.weight", False),
    ("ln_f.weight", "transformer.ln_f.weight", False),
    ("ln_f.bias", "transformer.ln_f.bias", False),
    ("lm_head.weight", "lm_head.weight", False),
]
# the options GPT2Config names as this harness's config.json does (n_embd, n_layer, ...)
SHAPE = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "tie_weights")


def shape_to_hub(cfg) -> dict:
    """The shape's fields of a model config, under transformers' keys."""
    return {BY_KEY[k].hub: getattr(cfg, k) for k in SHAPE}


def shape_from_hub(config, **defaults) -> dict:
    """The shape's fields, by our names, of a transformers config; ``defaults`` by its key, where it may lack one."""
    keys = {k: BY_KEY[k].hub for k in SHAPE}
    return {
        k: getattr(config, key, defaults[key]) if key in defaults else getattr(config, key) for k, key in keys.items()
    }


def _key_table(n_layers: int) -> list[tuple[str, str, bool]]:
    return _TOP_KEYS + [
        (f"blocks.{i}.{ours}", f"transformer.h.{i}.{theirs}", t)
        for i in range(n_layers)
        for ours, theirs, t in _BLOCK_KEYS
    ]


def model_config_from_hf(hf_config: Any, norm_type: str = "pytorch_layernorm") -> ModelConfig:
    """Our ModelConfig for a transformers ``GPT2Config`` (OpenAI GPT-2: tied, QKV bias)."""
    if getattr(hf_config, "activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation {hf_config.activation_function!r} is not GPT-2's tanh GELU")
    shape = shape_from_hub(hf_config, tie_word_embeddings=True)  # OpenAI's GPT-2 is tied
    return ModelConfig(
        **{**shape, "tie_weights": bool(shape["tie_weights"])},
        dropout=0.0,
        qkv_bias=True,
        norm_type=norm_type,
        norm_eps=hf_config.layer_norm_epsilon,
    )


def hf_config_kwargs(cfg: ModelConfig) -> dict:
    """Keyword arguments of a transformers ``GPT2Config`` with the same shape as ``cfg``."""
    mismatch = gpt2_mismatch(cfg)
    if mismatch is not None:
        raise ValueError(mismatch)
    return dict(
        **shape_to_hub(cfg),
        layer_norm_epsilon=cfg.norm_eps,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
    )


def state_dict_from_hf(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a ``GPT2LMHeadModel`` state dict (buffers such as attn.bias ignored)."""
    out = {}
    for ours, theirs, transpose in _key_table(cfg.n_layers):
        if ours.endswith("attn.qkv.bias") and not cfg.qkv_bias:
            if theirs in hf_sd and hf_sd[theirs].any():
                raise ValueError(f"{theirs} is non-zero but model.qkv_bias is false; it cannot be dropped")
            continue
        if theirs not in hf_sd and theirs == "lm_head.weight" and cfg.tie_weights:
            theirs = "transformer.wte.weight"  # tied checkpoints may omit the head
        if theirs not in hf_sd:
            raise KeyError(f"GPT-2 state dict has no {theirs!r}")
        t = hf_sd[theirs]
        out[ours] = t.t().contiguous() if transpose else t.clone()
        if ours in VOCAB_ROWS and cfg.padded_vocab_size > len(t) and (ours == "lm_head.weight" or cfg.tie_weights):
            out[ours] = torch.cat([out[ours], out[ours].new_zeros(cfg.padded_vocab_size - len(t), t.shape[1])])
    return out


def state_dict_to_hf(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A ``GPT2LMHeadModel`` state dict from ours; a missing QKV bias becomes zeros."""
    hf_config_kwargs(cfg)  # refuses norms GPT-2 cannot express
    out = {}
    for ours, theirs, transpose in _key_table(cfg.n_layers):
        if ours not in sd and ours.endswith("attn.qkv.bias"):
            out[theirs] = torch.zeros(3 * cfg.d_model, dtype=sd["wte.weight"].dtype)
            continue
        t = sd[ours][: cfg.vocab_size] if ours in VOCAB_ROWS else sd[ours]  # vocabulary padding stays behind
        out[theirs] = t.t().contiguous() if transpose else t.clone()
    return out


def load_hf_gpt2(name_or_path: str, norm_type: str = "pytorch_layernorm"):
    """Build our GPT from a transformers GPT-2 checkpoint (a Hub name such as ``gpt2``, or a directory)."""
    from transformers import GPT2LMHeadModel  # a dev / reference dependency: import only when used

    hf = GPT2LMHeadModel.from_pretrained(name_or_path)
    cfg = model_config_from_hf(hf.config, norm_type=norm_type)
    model = GPT(cfg)
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), cfg))
    return model
