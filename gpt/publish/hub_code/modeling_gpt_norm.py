"""The transformers model of a GPT from gpt-norm-harness (shipped to the Hub beside the weights).

A thin ``PreTrainedModel`` around the harness's own ``GPT``: ``gpt.py``, ``norms.py`` and
``loss.py`` beside this file are verbatim copies of the harness's ``gpt/model/`` files, so the
published network is the trained one, not a second implementation of it; ``architecture.py``, of its
``gpt/config/architecture.py``, reads the model's options from config.json. The weights are the
harness's parameters under the prefix ``gpt.`` (``gpt.wte.weight``, ``gpt.blocks.0.ln_1.weight``).
``generate()`` works as with any causal LM of transformers 5: a key-value cache (transformers'
``Cache`` classes, the argument and output field ``cache``; ``use_cache``) and left-padded batches
with an ``attention_mask``.
Self-contained: it imports torch, transformers and its sibling files only.
"""

from types import SimpleNamespace

import torch.nn as nn
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .architecture import from_hub
from .configuration_gpt_norm import GPTNormConfig
from .gpt import GPT


class GPTNormForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPTNormConfig
    base_model_prefix = "gpt"
    _no_split_modules = ["Block"]

    def __init__(self, config):
        super().__init__(config)
        options = from_hub(config)  # every option the model reads (no vocabulary padding: the export dropped it)
        self.gpt = GPT(SimpleNamespace(**options, padded_vocab_size=options["vocab_size"]), seed=None)
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

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        use_cache=None,
        labels=None,
        **kwargs,
    ):
        """input_ids (B, T) -> logits (B, T, V); with labels, the mean next-token cross-entropy
        (labels are shifted inside, as transformers does; -100 is ignored). ``cache`` holds the
        tokens read before (a new ``DynamicCache`` when ``use_cache`` and none is given; the older
        name ``past_key_values`` is taken too); ``attention_mask`` (B, cached + T), 0 on left padding."""
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        elif not use_cache:
            cache = None
        logits, _ = self.gpt(input_ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
