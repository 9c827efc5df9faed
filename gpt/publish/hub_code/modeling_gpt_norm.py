"""The transformers model of a GPT from gpt-norm-harness (shipped to the Hub beside the weights).

A thin ``PreTrainedModel`` around the harness's own ``GPT``: ``gpt.py``, ``norms.py`` and
``loss.py`` beside this file are verbatim copies of the harness's ``gpt/model/`` files, so the
published network is the trained one, not a second implementation of it. The weights are the
harness's parameters under the prefix ``gpt.`` (``gpt.wte.weight``, ``gpt.blocks.0.ln_1.weight``).
Self-contained: it imports torch, transformers and its sibling files only.
"""

from types import SimpleNamespace

import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_gpt_norm import GPTNormConfig
from .gpt import GPT


def harness_model_config(config: GPTNormConfig) -> SimpleNamespace:
    """The fields ``GPT`` reads, from transformers' names (a published model has no vocabulary padding)."""
    return SimpleNamespace(
        vocab_size=config.vocab_size,
        padded_vocab_size=config.vocab_size,
        context_length=config.n_positions,
        d_model=config.n_embd,
        n_layers=config.n_layer,
        n_heads=config.n_head,
        dropout=0.0,
        qkv_bias=config.qkv_bias,
        tie_weights=config.tie_word_embeddings,
        init="gpt2",
        norm_type=config.norm_type,
        norm_eps=config.norm_eps,
        dyt_alpha_init=config.dyt_alpha_init,
    )


class GPTNormForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPTNormConfig
    base_model_prefix = "gpt"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(harness_model_config(config), seed=None)  # weights: from the checkpoint
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"gpt.lm_head.weight": "gpt.wte.weight"}
        self.post_init()

    def _init_weights(self, module):
        # Only for weights a checkpoint does not hold: the harness's own init draws per parameter.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()

    def get_input_embeddings(self):
        return self.gpt.wte

    def set_input_embeddings(self, value):
        self.gpt.wte = value

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def set_output_embeddings(self, value):
        self.gpt.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        """input_ids (B, T) -> logits (B, T, V); with labels, the mean next-token cross-entropy
        (labels are shifted inside, as transformers does; -100 is ignored). No KV cache, and no
        padding mask: left-padded batches are not supported."""
        logits, _ = self.gpt(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        # without a cache every step reads the whole sequence, cropped to the context
        return {"input_ids": input_ids[:, -self.config.n_positions :]}
