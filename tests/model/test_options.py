"""Every value of every model option builds a model that runs: a forward pass, a training step and a stats step.

The values come from the architecture spec (``gpt.config.architecture.OPTIONS``): each choice of an option that has
choices (the norm registry's for the norm types, the size ladder's for ``size``), both values of a switch, and the
default of a number. So an option added to the spec (a recipe's, docs/extending.md) is built here in each of its
values with no edit of this file, and a value that the model, the statistics probe or the optimizer cannot follow
fails here rather than in a user's run.
"""

from contextlib import nullcontext

import pytest
import torch

from gpt.config import ModelConfig
from gpt.config.architecture import NORM_TYPES, OPTIONS, SIZES
from gpt.config.loader import ConfigError, config_from_dict
from gpt.config.sizes import SIZES as LADDER
from gpt.model.gpt import GPT
from gpt.model.norms import NORMS
from gpt.training.inside import StatsProbe

TINY = dict(vocab_size=97, context_length=16, d_model=32, n_layers=2, n_heads=4)
SMALL_WIDTH = 64  # a size wider than this runs on the meta device (shapes, no numbers): the same code, larger


def values(option) -> list:
    """The values of ``option`` a model is built with."""
    if option.choices == NORM_TYPES:
        return list(NORMS)  # the registry's, those registered at run time included
    if option.choices == SIZES:
        return list(LADDER)
    if option.choices is not None:
        return list(option.choices)
    if option.type is bool:
        return [False, True]
    return [TINY.get(option.key, option.default)]  # a number: its default (the shape's: the tiny model's)


def fitting(key: str, value) -> dict:
    """The model options of a valid config with ``key`` set to ``value`` (and only what its rules require)."""
    settings = {**TINY, key: value}
    if key == "qk_norm_type":  # a QK-norm type is built only with a QK-norm
        settings["qk_norm"] = "head" if value != "no_norm" else "none"
    if key == "size":
        settings = {"size": value}  # it sets the shape itself
    if value == "mix":  # Mix-LN's default share, 0.25 of the depth, is one post-norm block of four
        settings["n_layers"] = 4
    return settings


CASES = [(o.key, v) for o in OPTIONS for v in values(o)]


def build(settings: dict) -> tuple[ModelConfig, GPT]:
    cfg = config_from_dict({"model": settings, "run": {"name": "x"}, "train": {"steps": 1}}).model
    cfg.vocab_size = TINY["vocab_size"]  # a size keeps the vocabulary small too
    cfg.context_length = TINY["context_length"]
    if cfg.d_model > SMALL_WIDTH:
        with torch.device("meta"):
            return cfg, GPT(cfg, seed=None)
    return cfg, GPT(cfg, seed=0)


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_each_value_of_each_option_trains_and_is_measured(key, value):
    try:
        cfg, model = build(fitting(key, value))
    except ConfigError as e:  # a value the config's rules refuse alone: say which, rather than pass quietly
        pytest.fail(f"model.{key}={value}: tests/model/test_options.py's fitting() must give it a valid config: {e}")
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.context_length), generator=torch.Generator().manual_seed(0))
    idx = idx.to(next(model.parameters()).device)
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    assert logits.shape == (4, cfg.context_length - 1, cfg.vocab_size) and (idx.is_meta or torch.isfinite(loss))
    # a training step, with the statistics probe around it as a stats step of the trainer has it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss.backward()
    probe = StatsProbe(every=1)
    probe.measure(model, idx, nullcontext, None)
    head = model.lm_head.weight.detach().clone()
    optimizer.step()
    probe.after_update(model)
    if idx.is_meta:  # every statistic made, with one number per block where it should; none to read
        assert probe.pending["attn_logit_max"].shape == probe.pending["grad_norm"].shape == (cfg.n_layers,)
        return
    record = probe.take(step=1, tokens=idx.numel())
    assert not torch.equal(model.lm_head.weight, head)  # the step changed the weights
    blocks = cfg.n_layers
    assert len(record["resid_rms"]) == blocks + 1  # each block's input, and the final norm's
    assert len(record["attn_logit_max"]) == blocks and all(v > 0 for v in record["grad_norm"])
    assert all(torch.isfinite(torch.tensor(record[k])).all() for k in ("attn_logit_max", "update_ratio"))
    assert record["embed_grad_norm"] > 0 and record["head_update_ratio"] > 0
