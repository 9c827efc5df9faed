"""A model's config as a Hub ``config.json`` holds it, both ways: the one owner of that mapping.

transformers' GPT-2 names the shape's fields its own way (``d_model`` is ``n_embd``); a model of this harness
adds its norm type, where and how its norms sit (``NORM_LAYOUT``) and each norm parameter of the registry.
The export writes these keys (``gpt.publish.layouts``), the GPT-2 conversion reads and writes the shape's
(``gpt.model.gpt2_weights``), and the Hub wrapper reads them back: this file is shipped beside it as it is, so
it imports its siblings only.
"""

from types import SimpleNamespace

from .gpt import NORM_LAYOUT
from .norms import norm_param_values

# our field -> transformers' GPT2Config key
SHAPE_KEYS = {
    "vocab_size": "vocab_size",
    "context_length": "n_positions",
    "d_model": "n_embd",
    "n_layers": "n_layer",
    "n_heads": "n_head",
    "tie_weights": "tie_word_embeddings",
}


def shape_to_hub(cfg) -> dict:
    """The shape's fields of a model config, under transformers' keys."""
    return {theirs: getattr(cfg, ours) for ours, theirs in SHAPE_KEYS.items()}


def shape_from_hub(config, **defaults) -> dict:
    """The shape's fields, by our names, of a transformers config (any object with its keys as attributes);
    ``defaults`` by transformers' key, for a config that may lack one."""
    shape = {}
    for ours, theirs in SHAPE_KEYS.items():
        shape[ours] = getattr(config, theirs, defaults[theirs]) if theirs in defaults else getattr(config, theirs)
    return shape


def model_to_hub(cfg) -> dict:
    """The model keys of a published config.json: the shape, the norm type, its layout and parameters."""
    return {
        **shape_to_hub(cfg),
        "norm_type": cfg.norm_type,
        **{key: getattr(cfg, key) for key in NORM_LAYOUT},  # where and how the norms are applied
        **norm_param_values(cfg),  # every norm parameter of the registry (norm_eps, dyt_alpha_init, ...)
        "qkv_bias": cfg.qkv_bias,
    }


def model_from_hub(config) -> SimpleNamespace:
    """The fields ``GPT`` reads, from a published config (a published model has no vocabulary padding and
    trains no more: no dropout). A key that a model was published without reads as its default, the model it
    built."""
    return SimpleNamespace(
        **shape_from_hub(config),
        padded_vocab_size=config.vocab_size,
        dropout=0.0,
        qkv_bias=config.qkv_bias,
        init="gpt2",
        norm_type=config.norm_type,
        **{key: getattr(config, key, None) for key in NORM_LAYOUT},
        **norm_param_values(config),
    )
