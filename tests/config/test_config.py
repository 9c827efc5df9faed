"""YAML configs: inheritance, overrides, validation messages, round trip, and the shipped files."""

import dataclasses
import math

import pytest
from conftest import CONFIGS

from gpt.config import Config, ConfigError, config_from_dict, describe_fields, dump_config, load_config
from gpt.model.norms import NORM_TYPES

SHIPPED = sorted(CONFIGS.glob("*.yaml"))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def base(tmp_path):
    return write(
        tmp_path,
        "base.yaml",
        """
run: {name: base}
model: {d_model: 64, n_heads: 4, n_layers: 2, vocab_size: 300, context_length: 32}
train: {steps: 10, micro_batch_size: 2, global_batch_size: 4}
""",
    )


def error(path, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    msg = str(e.value)
    assert "\n" not in msg, "errors are one line"
    return msg


# ------------------------------------------------------------------ shipped files


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_load_and_round_trip(path, tmp_path):
    cfg = load_config(path)
    dumped = write(tmp_path, "resolved.yaml", dump_config(cfg))
    assert load_config(dumped) == cfg


def test_the_per_norm_gpt2_small_files_differ_from_it_only_in_norm():
    # conveniences, not a requirement: any norm type is `configs/gpt2-small.yaml --set model.norm_type=X`
    base = load_config(CONFIGS / "gpt2-small.yaml")
    files = sorted(CONFIGS.glob("gpt2-small-*.yaml"))
    assert files
    for path in files:
        cfg = load_config(path)
        assert cfg.model.norm_type.replace("_", "-") == path.stem.removeprefix("gpt2-small-")
        assert cfg.run.name == path.stem
        same = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, norm_type=base.model.norm_type), run=base.run
        )
        assert same == base, path.name


def test_the_placement_files_differ_from_gpt2_small_only_in_where_the_norms_sit():
    # docs/studies.md's placement study sweeps these: each changes one thing of the write-up's setup
    base = load_config(CONFIGS / "gpt2-small.yaml")
    expected = {  # (norm_placement, final_norm, qk_norm, qk_norm_type)
        "placement-post": ("post", False, "none", "pytorch_rmsnorm"),  # the original post-LN: no final norm
        "placement-peri": ("peri", True, "none", "pytorch_rmsnorm"),
        "placement-qknorm": ("pre", True, "head", "pytorch_rmsnorm"),  # Qwen3's and Gemma 3's QK-norm
    }
    files = sorted(CONFIGS.glob("placement-*.yaml"))
    assert sorted(p.stem for p in files) == sorted(expected)
    for path in files:
        cfg = load_config(path)
        m = cfg.model
        assert (m.norm_placement, m.final_norm, m.qk_norm, m.qk_norm_type) == expected[path.stem]
        assert cfg.run.name == path.stem
        model = dataclasses.replace(cfg.model, norm_placement="pre", final_norm=True, qk_norm="none")
        assert dataclasses.replace(cfg, model=model, run=base.run) == base, path.name


def test_gpt2_small_is_the_write_up_setup():
    cfg = load_config(CONFIGS / "gpt2-small.yaml")
    m, o, t = cfg.model, cfg.optim, cfg.train
    assert (m.vocab_size, m.context_length, m.d_model, m.n_layers, m.n_heads) == (50257, 1024, 768, 12, 12)
    assert (m.qkv_bias, m.tie_weights, m.dropout, m.norm_eps, m.init) == (False, False, 0.0, 1e-5, "pytorch")
    assert (o.lr, o.min_lr, o.warmup_frac, o.weight_decay, o.decay_norms_and_biases) == (
        1.4e-3,
        1.4e-4,
        0.05,
        0.1,
        True,
    )
    assert o.grad_clip is None
    assert t.micro_batch_size == 12 and t.global_batch_size == 8 * 12
    assert t.global_batch_size * m.context_length == 98_304  # tokens per optimizer step
    # 20 tokens per parameter of the 163,009,536-parameter model: about 3.26B tokens, ~33,165 steps
    tokens = t.tokens_per_param * 163_009_536
    assert round(tokens / 1e9, 2) == 3.26 and math.ceil(tokens / 98_304) == 33_165
    assert t.precision == "fp16"


# -------------------------------------------------------------- extends, overrides


def test_extends_deep_merges_and_resolves_relative_paths(base, tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    child = write(sub, "child.yaml", "extends: ../base.yaml\nrun: {name: child}\nmodel: {norm_type: dyt}\n")
    grandchild = write(sub, "grandchild.yaml", "extends: child.yaml\nmodel: {n_layers: 3}\n")
    monkeypatch.chdir(tmp_path.parent)  # relative to the file, not the working directory
    cfg = load_config(grandchild)
    assert (cfg.run.name, cfg.model.norm_type, cfg.model.n_layers, cfg.model.d_model) == ("child", "dyt", 3, 64)
    assert cfg.train.steps == 10
    assert load_config(child).model.n_layers == 2


def test_set_overrides_parse_yaml_scalars(base):
    cfg = load_config(
        base,
        [
            "model.norm_type=pytorch_rmsnorm",
            "optim.lr=1e-4",
            "optim.min_lr=1e-5",
            "model.qkv_bias=true",
            "optim.grad_clip=1.0",
            "train.seed=7",
            "log.tags=[a, b]",
            "data.path=null",
        ],
    )
    assert cfg.model.norm_type == "pytorch_rmsnorm"
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.model.qkv_bias is True and cfg.optim.grad_clip == 1.0 and cfg.train.seed == 7
    assert cfg.log.tags == ["a", "b"] and cfg.data.path is None
    assert load_config(base, ["train.seed=1", "train.seed=2"]).train.seed == 2  # the last one wins


def test_dump_and_reload_with_overrides_is_equal(base, tmp_path):
    cfg = load_config(base, ["model.norm_type=handrolled_layernorm_fast", "optim.eps=1e-6", "log.tags=[x]"])
    again = load_config(write(tmp_path, "again.yaml", dump_config(cfg)))
    assert again == cfg and again.optim.eps == 1e-6


def test_exponent_without_dot_is_a_float(base, tmp_path):
    # PyYAML reads 1e-5 as a string; a float field takes it as the number it means
    path = write(tmp_path, "c.yaml", "extends: base.yaml\nmodel: {norm_eps: 1e-6}\noptim: {lr: 3e-4}\n")
    cfg = load_config(path)
    assert cfg.model.norm_eps == 1e-6 and cfg.optim.lr == 3e-4


def test_derived_values(base):
    cfg = load_config(base, ["train.seed=4"])
    assert str(cfg.run_dir) == "runs/base" and cfg.init_seed == 4
    cfg = load_config(base, ["run.dir=/tmp/x", "model.init_seed=9"])
    assert str(cfg.run_dir) == "/tmp/x" and cfg.init_seed == 9


# --------------------------------------------------------------------------- errors


def test_unknown_key_suggests_the_closest(base, tmp_path):
    path = write(tmp_path, "typo.yaml", "extends: base.yaml\nmodel: {nheads: 4}\n")
    msg = error(path)
    assert msg.startswith(f"{path}: model.nheads: unknown key; did you mean 'model.n_heads'?")
    assert "valid keys in model: vocab_size, context_length" in msg


def test_unknown_section(base):
    msg = error(base, ["optimizer.lr=1"])
    assert msg.startswith("--set: optimizer: unknown key; did you mean 'optim'?")
    assert "model, data, optim, train, run, log, hub" in msg


def test_unknown_key_from_set_names_set(base):
    assert error(base, ["model.norm_typ=dyt"]).startswith(
        "--set: model.norm_typ: unknown key; did you mean 'model.norm_type'?"
    )


def test_wrong_type_names_file_key_and_type(base, tmp_path):
    path = write(tmp_path, "t.yaml", "extends: base.yaml\nmodel: {d_model: sixty-four}\n")
    assert error(path) == f"{path}: model.d_model: expected an integer, got 'sixty-four'"
    assert error(base, ["model.qkv_bias=1"]) == "--set: model.qkv_bias: expected true/false, got 1"
    assert error(base, ["optim.lr=fast"]) == "--set: optim.lr: expected a number, got 'fast'"
    assert error(base, ["model.n_layers=2.5"]) == "--set: model.n_layers: expected an integer, got 2.5"
    assert error(base, ["optim.grad_clip=[1]"]) == "--set: optim.grad_clip: expected a number or null, got [1]"


def test_missing_required_value(tmp_path):
    path = write(tmp_path, "noname.yaml", "train: {steps: 1}\n")
    msg = error(path)
    assert msg.startswith(f"{path}: run.name: missing required value")
    path = write(tmp_path, "nolength.yaml", "run: {name: x}\n")
    assert error(path) == (
        f"{path}: train.steps: missing required value: set one of train.tokens, train.steps, train.tokens_per_param"
    )


def test_out_of_range_values(base, tmp_path):
    assert error(base, ["optim.lr=-0.001"]) == "--set: optim.lr: -0.001 is out of range; allowed: > 0"
    assert error(base, ["model.dropout=1.0"]) == "--set: model.dropout: 1.0 is out of range; allowed: < 1"
    assert error(base, ["optim.warmup_frac=1.5"]) == "--set: optim.warmup_frac: 1.5 is out of range; allowed: <= 1"
    path = write(tmp_path, "heads.yaml", "extends: base.yaml\nmodel: {n_heads: 5}\n")
    assert error(path) == (
        f"{path}: model.n_heads: 5 does not divide model.d_model=64; choose n_heads that divides d_model"
    )
    assert error(base, ["optim.min_lr=0.01", "optim.lr=0.001"]).startswith(
        "--set: optim.min_lr: 0.01 is above optim.lr=0.001"
    )
    assert error(base, ["train.global_batch_size=5"]) == (
        "--set: train.global_batch_size: 5 is not a multiple of train.micro_batch_size=2"
    )
    assert error(base, ["train.tokens=1000"]) == (
        "--set: train.tokens: set only one of train.tokens, train.steps, train.tokens_per_param "
        "(got train.tokens, train.steps; set the others to null)"
    )
    assert load_config(base, ["train.tokens=1000", "train.steps=null"]).train.tokens == 1000


def test_unknown_norm_type_lists_every_choice(base):
    msg = error(base, ["model.norm_type=layernorm"])
    assert msg.startswith("--set: model.norm_type: 'layernorm' is not one of: ")
    assert msg.endswith(", ".join(NORM_TYPES))


def test_file_errors(tmp_path, base):
    assert error(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: no such config file"
    bad = write(tmp_path, "bad.yaml", "model: {d_model: 64\n")
    assert error(bad).startswith(f"{bad}: invalid YAML at line")
    listy = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    assert error(listy) == f"{listy}: a config file must be a mapping of sections, got list"
    orphan = write(tmp_path, "orphan.yaml", "extends: missing.yaml\n")
    assert error(orphan).startswith(f"{orphan}: extends: missing.yaml: no such file")
    loop_a = write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    assert "extends: circular inheritance" in error(loop_a)
    section = write(tmp_path, "sec.yaml", "extends: base.yaml\nmodel: 3\n")
    assert error(section) == f"{section}: model: expected a mapping of keys, got 3"
    assert error(base, ["model.d_model.x=1"]) == "--set: model.d_model.x: model.d_model is not a section"
    assert error(base, ["lr"]).startswith("--set: expected SECTION.KEY=VALUE")


def test_key_errors_name_the_file_that_set_the_key(base, tmp_path):
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nrun: {name: c}\n")
    write(tmp_path, "base.yaml", base.read_text() + "optim: {lr: -1.0}\n")
    assert error(child) == f"{base}: optim.lr: -1.0 is out of range; allowed: > 0"


def test_config_from_dict_and_field_docs():
    cfg = config_from_dict({"run": {"name": "d"}, "train": {"steps": 3}})
    assert cfg == Config(run=cfg.run, train=cfg.train) and cfg.train.steps == 3
    with pytest.raises(ConfigError, match=r"^<dict>: model.d_modle: unknown key; did you mean 'model.d_model'"):
        config_from_dict({"run": {"name": "d"}, "train": {"steps": 3}, "model": {"d_modle": 3}})
    docs = describe_fields()
    for section in ("model:", "data:", "optim:", "train:", "run:", "log:", "hub:"):
        assert f"\n{section}" in "\n" + docs
    assert "norm_type: handrolled_layernorm  # a string (one of: handrolled_layernorm," in docs


def test_schedule_holes_and_infinite_numbers(base, tmp_path):
    assert error(base, ["optim.schedule=wsd", "optim.warmup_frac=0.5", "optim.decay_frac=0.6"]) == (
        "--set: optim.decay_frac: warmup_frac 0.5 + decay_frac 0.6 is more than the whole run: the decay would start "
        "inside the warmup and the learning rate jump; keep their sum <= 1"
    )
    assert (
        load_config(base, ["optim.schedule=wsd", "optim.warmup_frac=0.5", "optim.decay_frac=0.5"]).optim.schedule
        == "wsd"
    )
    assert error(base, ["optim.warmup_frac=1"]) == (
        "--set: optim.warmup_frac: 1 leaves no steps after warmup, so the learning rate never decays; choose a "
        "fraction below 1 (the write-up: 0.05)"
    )
    path = write(tmp_path, "inf.yaml", "extends: base.yaml\noptim: {lr: .inf}\n")
    assert error(path) == f"{path}: optim.lr: inf is not a finite number"
    assert error(base, ["optim.weight_decay=.nan"]) == "--set: optim.weight_decay: nan is not a finite number"
    assert error(base, ["optim.grad_clip=-.inf"]) == "--set: optim.grad_clip: -inf is not a finite number"


def test_every_norm_type_trains_the_same_steps_and_tokens(monkeypatch):
    import torch

    from gpt.model.gpt import GPT

    monkeypatch.setattr(GPT, "init_weights", lambda self, seed: None)  # counting needs no values
    lengths = {}
    for norm_type in NORM_TYPES:
        cfg = load_config(CONFIGS / "gpt2-small.yaml", [f"model.norm_type={norm_type}"])
        with torch.device("meta"):  # shapes only: a 163M-parameter model in no memory
            model = GPT(cfg.model)
        steps = cfg.total_steps(model.num_params(norms=False))
        lengths[norm_type] = (steps, steps * cfg.tokens_per_step)
        assert model.num_params() - model.num_params(norms=False) == sum(
            p.numel() for n, p in model.named_parameters() if n in model.norm_parameter_names()
        )
    assert set(lengths.values()) == {(33_157, 3_259_465_728)}, lengths  # 20 x 162,971,136 tokens, rounded up


def test_the_newest_norms_study_is_the_ladder_at_its_top_rung():
    # docs/studies.md's study of the newest norms and placements: configs/ladder.yaml at 4x64, where Mix-LN's
    # default share (floor(0.25 x 4)) is one post-norm block; its sweeps give the rest by --norm-types and --set
    base, cfg = load_config(CONFIGS / "ladder.yaml"), load_config(CONFIGS / "newest.yaml")
    assert (cfg.model.size, cfg.model.n_layers, cfg.run.name) == ("4x64", 4, "newest")
    assert dataclasses.replace(cfg, run=base.run) == load_config(CONFIGS / "ladder.yaml", ["model.size=4x64"])
    assert load_config(CONFIGS / "newest.yaml", ["model.norm_placement=mix"]).model.mix_post_layers == 1
