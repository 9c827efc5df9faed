"""The transformers config of a GPT from gpt-norm-harness (shipped to the Hub beside the weights).

Self-contained: it imports transformers only, never the harness, so that
``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` works anywhere.
"""

from transformers import PretrainedConfig


class GPTNormConfig(PretrainedConfig):
    """GPT-2-style decoder whose varying parts are its norm layer (``norm_type``), where the norms sit
    (``norm_placement``: pre, post, peri; ``final_norm``) and QK-norm (``qk_norm``: none, head, full, of
    ``qk_norm_type``; ``true`` / ``false`` in models published before: head-wise of ``norm_type``, or none).
    Keys a model was published without (``final_norm``, ``qk_norm_type``, ``norm_compute_dtype``) are read with
    the harness's defaults, the model they built."""

    model_type = "gpt_norm"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "n_positions",
    }

    def __init__(
        self,
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        norm_type="handrolled_layernorm",
        norm_placement="pre",
        qk_norm=False,
        qkv_bias=False,
        tie_word_embeddings=False,
        initializer_range=0.02,
        bos_token_id=50256,
        eos_token_id=50256,
        pad_token_id=50256,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        # one of norms.NORM_TYPES; its parameters (norms.NORM_PARAMS: norm_eps, dyt_alpha_init, ...) come as
        # keyword arguments and stay attributes: make_norm reads them, with its defaults where absent
        self.norm_type = norm_type
        self.norm_placement = norm_placement  # absent from models published before it: pre-norm
        self.qk_norm = qk_norm
        self.qkv_bias = qkv_bias
        self.initializer_range = initializer_range
        self.use_cache = kwargs.pop("use_cache", True)  # keep the keys and values of the tokens read
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
