"""The transformers model of a GPT from gpt-norm-harness (shipped to the Hub beside the weights).

The same network as the harness's ``gpt/model.py``, with the same parameter names, so its
``model.safetensors`` loads as it is: learned token and position embeddings, pre-norm
blocks ``x + attn(norm(x))``, ``x + mlp(norm(x))`` with causal
``scaled_dot_product_attention`` and a tanh-GELU MLP, a final norm and an output head.
Every norm comes from ``make_norm`` in ``norms.py``, a verbatim copy of the harness's.
Self-contained: it imports torch, transformers and its two sibling files only.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_gpt_norm import GPTNormConfig
from .norms import make_norm


def _norm_cfg(config):
    return {"norm_type": config.norm_type, "d_model": config.n_embd, "norm_eps": config.norm_eps,
            "dyt_alpha_init": config.dyt_alpha_init}


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.qkv_bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(_norm_cfg(config))
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(_norm_cfg(config))
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTNormForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPTNormConfig
    base_model_prefix = "gpt_norm"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = make_norm(_norm_cfg(config))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "wte.weight"}
        self.post_init()

    def _init_weights(self, module):
        # Only for weights a checkpoint does not hold: the harness's own init draws per parameter.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, value):
        self.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        """input_ids (B, T) -> logits (B, T, V); with labels, the mean next-token cross-entropy
        (labels are shifted inside, as transformers does; -100 is ignored). No KV cache, and no
        padding mask: left-padded batches are not supported."""
        T = input_ids.shape[1]
        if T > self.config.n_positions:
            raise ValueError(f"sequence length {T} exceeds n_positions={self.config.n_positions}")
        x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        # without a cache every step reads the whole sequence, cropped to the context
        return {"input_ids": input_ids[:, -self.config.n_positions:]}
