"""The transformers config of a GPT from gpt-norm-harness (shipped to the Hub beside the weights).

Self-contained: it imports transformers only, never the harness, so that
``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` works anywhere.
"""

from transformers import PretrainedConfig


class GPTNormConfig(PretrainedConfig):
    """GPT-2-style decoder whose varying parts are its options (the norm type, where the norms sit, QK-norm, ...):
    every key of config.json is an attribute, as written. What they mean, and what a key a model was published
    without reads as (the model it built), is ``architecture.py``'s (``from_hub``), read when the model is made."""

    model_type = "gpt_norm"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "n_positions",
    }

    def __init__(self, initializer_range=0.02, bos_token_id=50256, eos_token_id=50256, pad_token_id=50256, **kwargs):
        self.initializer_range = initializer_range
        self.use_cache = kwargs.pop("use_cache", True)  # keep the keys and values of the tokens read
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=kwargs.pop("tie_word_embeddings", False),
            **kwargs,
        )
