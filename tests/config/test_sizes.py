"""The size axis's declaration: the ladders' shape, model.size in a config, and its one-line refusals."""

import pytest
from conftest import CONFIGS

from gpt.config import ConfigError, config_from_dict, dump_config, load_config
from gpt.config.sizes import LADDERS, SIZE_KEYS, SIZES


def test_each_ladder_keeps_one_aspect_ratio_and_head_width_and_ends_at_gpt2_small():
    for name, rungs in LADDERS.items():
        assert len({s.d_model // s.n_layers for s in rungs}) == 1, name  # fixed aspect ratio
        assert all(s.d_model == s.n_layers * (s.d_model // s.n_layers) for s in rungs), name
        assert len({s.d_model // s.n_heads for s in rungs}) == 1, name  # fixed head width
        assert [s.n_layers for s in rungs] == sorted(s.n_layers for s in rungs)
    assert SIZES["12x768"].settings() == {"n_layers": 12, "d_model": 768, "n_heads": 12}  # GPT-2 small
    assert SIZES["1x64"].settings() == {"n_layers": 1, "d_model": 64, "n_heads": 1}
    assert SIZES["3x48"].settings() == {"n_layers": 3, "d_model": 48, "n_heads": 3}
    assert len(SIZES) == sum(len(r) for r in LADDERS.values())  # no name in two ladders
    assert SIZE_KEYS == ("model.size", "model.n_layers", "model.d_model", "model.n_heads")


def test_a_size_sets_the_three_keys_over_the_config_files(tmp_path):
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.size=2x128"])  # tiny.yaml: 4 x 128, 4 heads
    assert (cfg.model.size, cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads) == ("2x128", 2, 128, 2)
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {CONFIGS / 'tiny.yaml'}\nmodel: {{size: 3x48}}\n")
    cfg = load_config(child)
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads) == (3, 48, 3)
    assert load_config(child, ["model.n_layers=3"]) == cfg  # the size's own value: no contradiction
    saved = tmp_path / "saved.yaml"  # a run's resolved config reads back the same
    saved.write_text(dump_config(cfg))
    assert load_config(saved) == cfg
    assert (
        config_from_dict({"run": {"name": "x"}, "model": {"size": "1x16"}, "train": {"steps": 1}}).model.d_model == 16
    )
    assert load_config(CONFIGS / "tiny.yaml").model.size is None  # no size: the keys as given


def test_a_dimension_that_contradicts_the_size_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny.yaml", ["model.size=2x32", "model.d_model=48"])
    assert str(e.value) == (
        "--set: model.d_model: 48 contradicts model.size 2x32, which sets model.d_model=32 (n_layers x d_model); "
        "drop one of them"
    )
    both = tmp_path / "both.yaml"
    both.write_text(f"extends: {CONFIGS / 'tiny.yaml'}\nmodel: {{size: 2x32, n_heads: 4}}\n")
    with pytest.raises(ConfigError, match=r"both.yaml: model.n_heads: 4 contradicts model.size 2x32, which sets "):
        load_config(both)
    with pytest.raises(ConfigError, match=r"model.size: '5x5' is not one of: 1x64, 2x128, .*, 4x64$"):
        load_config(CONFIGS / "tiny.yaml", ["model.size=5x5"])


def test_the_dry_run_names_the_size_and_its_length_by_tokens_per_param(cli):
    out = cli("train", CONFIGS / "ladder.yaml", "--set", "model.size=4x64", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].startswith("model: size 4x64: 4 layers x d_model 64 x 4 heads, context 64, vocab 257, ")
    assert lines[4] == "length: 3,445 steps = 3,527,680 tokens (15 per parameter outside the norm layers: 235,136)"
