"""Every model option reaches a published config.json and comes back through transformers (remote code, offline,
from a local folder), or is on the spec's list of options a published model does not need, with the reason; and a
native GPT-2 export of any value GPT-2 does not compute is refused in one line.

The model published sets every exported option to a value that is neither its default nor what a config without
the key reads as, chosen from the spec alone (``other_value``): an option added to the spec, left out of the export
or misread by the Hub wrapper, fails here with no edit of this file.
"""

import json

import pytest
import torch
from synthetic import checkpoint

from gpt.config import Config, ModelConfig, config_from_dict, config_to_dict
from gpt.config.architecture import DEFAULT, NORM_TYPES, NOT_EXPORTED, OPTIONS, from_hub
from gpt.model.gpt import GPT
from gpt.model.norms import NORMS
from gpt.publish.export import export_checkpoint
from gpt.publish.hub_api import HubError
from gpt.publish.layouts import Layout, export_weights

SHAPE = dict(vocab_size=97, context_length=16, d_model=32, n_layers=2, n_heads=4)  # none of them the default
# Options whose values exclude each other's (a rule of ModelConfig.validate): the first model leaves these as they
# are said here, the second sets them; every exported option is away from its default in one of the two.
FIRST = {"mlp_norm_type": None, "final_norm_type": None, "norm_depth_scaling": "none", "block": "gpt2"}  # qkv_bias
SECOND = {
    "norm_placement": "reordered", "mix_post_layers": None, "final_norm": True, "final_norm_type": "dyt",
    "norm_depth_scaling": "inverse_sqrt", "attn_norm_type": None, "mlp_norm_type": "handrolled_layernorm_fast",
    "block": "modern", "qkv_bias": False,
}  # fmt: skip


def other_value(option):
    """A value of ``option`` that is neither its default nor what a config.json without it reads as."""
    avoid = {option.default, None if option.before is DEFAULT else option.before, "no_norm"}
    if option.key in SHAPE:
        return SHAPE[option.key]
    if option.type is bool:
        return not option.default
    if option.type is float:
        return option.default * 1.5 if option.default else 0.25
    if option.choices is None:  # a count: mix_post_layers, of SHAPE's 2 layers
        return 1
    listed = list(NORMS) if option.choices == NORM_TYPES else list(option.choices)
    others = [v for v in listed if v not in avoid] or [v for v in listed if v != option.default]
    # (where the default and the absent key's reading are all the choices: not the default); a site's norm type
    # another than the blocks' own (which would read as null)
    return others[-2 if option.key.endswith("_norm_type") and option.key != "qk_norm_type" else -1]


def published_config(then: dict) -> Config:
    cfg = Config()
    cfg.run.name, cfg.train.steps = "every-option", 10
    for option in OPTIONS:
        if option.hub is not None:
            setattr(cfg.model, option.key, other_value(option))
    for key, value in then.items():
        setattr(cfg.model, key, value)
    cfg = config_from_dict(config_to_dict(cfg))  # as a run saves and reads it: a norm parameter no norm reads, default
    cfg.validate(lambda key, msg: pytest.fail(f"the published model's options break a rule: {key}: {msg}"))
    return cfg


@pytest.fixture(scope="module")
def every_option(tmp_path_factory):
    """Two models with every exported option at a value of its own in one of them (FIRST, SECOND), each published
    as push_to_hub does and loaded back with transformers' Auto classes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = []
    for i, then in enumerate((FIRST, {**FIRST, **SECOND})):
        tmp = tmp_path_factory.mktemp(f"every-option-{i}")
        cfg = published_config(then)
        cfg.run.dir = str(tmp / "run")
        model = GPT(cfg.model, seed=5).eval()
        folder = tmp / f"every_option_export_{i}"  # a module name for transformers' remote-code cache
        export_checkpoint(checkpoint(cfg, model), folder, "me/every-option")
        hub_config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        hub_model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        out.append((cfg, model, json.loads((folder / "config.json").read_text()), hub_config, hub_model))
    return out


def test_every_option_is_exported_or_said_not_to_be():
    fields = {f for f in ModelConfig.__dataclass_fields__}
    exported = {o.key for o in OPTIONS if o.hub is not None}
    assert fields == exported | set(NOT_EXPORTED) and not exported & set(NOT_EXPORTED)
    assert all(NOT_EXPORTED.values())  # each with its reason


def test_every_exported_option_round_trips_through_transformers(every_option):
    for cfg, model, config_json, hub_config, hub_model in every_option:
        for option in OPTIONS:
            if option.hub is None:
                continue
            value = getattr(cfg.model, option.key)
            assert config_json[option.hub] == value, option.key  # written
            assert getattr(hub_config, option.hub) == value, option.key  # read by AutoConfig
            assert from_hub(hub_config)[option.key] == value, option.key  # and by the model the wrapper builds
            assert getattr(hub_model.gpt.cfg, option.key) == value, option.key
        idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert torch.allclose(hub_model(idx).logits, model(idx)[0], atol=1e-5, rtol=0)
    # every exported option is away from its default in one of the two
    away = {o.key for o in OPTIONS for c in every_option if getattr(c[0].model, o.key) != o.default}
    assert away == {o.key for o in OPTIONS if o.hub is not None} - set(SHAPE) | (away & set(SHAPE))


def test_a_config_json_without_an_option_reads_as_the_model_it_built():
    for option in OPTIONS:
        if option.hub is not None and option.before is not DEFAULT:
            assert from_hub({})[option.key] == option.before or option.key == "norm_compute_dtype"
    # input where every norm reads the fp32 residual stream is the float32 model, to the bit (architecture.upgrade)
    assert from_hub({})["norm_compute_dtype"] == "float32"
    assert from_hub({"norm_placement": "peri"})["norm_compute_dtype"] == "input"
    assert from_hub({"qk_norm": True, "norm_type": "dyt"})["qk_norm"] == "head"  # published before qk_norm_type
    assert from_hub({"qk_norm": True, "norm_type": "dyt"})["qk_norm_type"] == "dyt"


@pytest.mark.parametrize(
    "key,value",
    [
        (o.key, v)
        for o in OPTIONS
        if o.gpt2 is not None
        for v in (NORMS if o.choices == NORM_TYPES else o.choices or (True, False))
        if v not in o.gpt2
    ],
)
def test_a_native_gpt2_export_of_a_value_gpt2_does_not_compute_is_refused_in_one_line(tmp_path, key, value):
    cfg = Config()
    for k, v in SHAPE.items():
        setattr(cfg.model, k, v)
    cfg.model.norm_type = "pytorch_layernorm"
    setattr(cfg.model, key, value)
    cfg.model.mix_post_layers = 1 if value == "mix" else None
    with pytest.raises(HubError) as refused:
        export_weights(cfg, GPT(cfg.model).state_dict(), Layout.NATIVE_GPT2)
    message = str(refused.value)
    assert f"model.{key} {str(value).lower() if isinstance(value, bool) else value} (GPT-2: " in message
    assert "\n" not in message and message.endswith("publish it with remote code (without --native-gpt2)")
