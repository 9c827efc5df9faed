"""Bounded inputs: a config, a --set or a record the package reads back that is huge, self-expanding or damaged
is refused in one short line within seconds, before anything heavy, and never read as empty."""

import json
import resource
import time
import warnings

import pytest
import torch
from conftest import ROOT
from safetensors.torch import load_file, save_file
from test_faults import files_of, finished, one_line_error, run_cli, same_weights, weights  # noqa: F401

from gpt.common.errors import QUOTED_LIMIT, clipped
from gpt.common.files import JSON_LIMIT
from gpt.config import ConfigError, load_config
from gpt.config.loader import CONFIG_LIMIT, OVERRIDE_LIMIT, YAML_LIMIT
from gpt.run.checkpoints import INFO_LIMIT, CheckpointError, read_info
from gpt.training.loop import train

GIB = 1 << 30


def alias_bomb(levels: int = 12) -> str:
    """A flow sequence whose anchors make 10 ** levels values of a few hundred characters of YAML."""
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return f"[{', '.join(parts)}]"


def sparse(path, size):
    """A file of ``size`` bytes that takes no disk (the size check must refuse it before reading a byte)."""
    with open(path, "wb") as f:
        f.truncate(size)


# --------------------------------------------------------------------------------------- configs


def test_an_alias_bomb_is_refused_before_it_is_built(train_yaml):
    cfg = train_yaml()
    began = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(cfg, [f"log.tags={alias_bomb()}"])
    said = f"--set log.tags: its anchors and aliases expand it past {YAML_LIMIT:,} values"
    assert str(e.value).startswith(said) and time.perf_counter() - began < 1.0
    bomb = cfg.with_name("bomb.yaml")
    bomb.write_text(cfg.read_text() + f"extra: {alias_bomb()}\n")
    with pytest.raises(ConfigError, match=f"^{bomb}: its anchors and aliases expand it past"):
        load_config(bomb)
    # anchors a config really uses stay welcome, and one that contains itself is a clear refusal
    shared = cfg.with_name("shared.yaml")
    shared.write_text(cfg.read_text().replace("lr: 1.0e-2, min_lr: 1.0e-3", "lr: &lr 1.0e-2, min_lr: *lr"))
    assert load_config(shared).optim.min_lr == 1.0e-2
    with pytest.raises(ConfigError, match="a YAML alias refers to a value that contains it"):
        load_config(cfg, ["log.tags=&x [a, *x]"])


@pytest.mark.slow
def test_an_alias_bomb_under_a_memory_limit_is_one_line_in_seconds(train_yaml):
    cfg = train_yaml()
    bomb = cfg.with_name("bomb.yaml")
    bomb.write_text(cfg.read_text() + f"log_extra: {alias_bomb(15)}\n")  # 10^15 values, as text 600 bytes

    def four_gib():
        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))

    for args in ([bomb], [cfg, "--set", f"log.tags={alias_bomb(15)}"]):
        began = time.perf_counter()
        out = run_cli(ROOT / "train.py", *args, preexec_fn=four_gib)
        assert time.perf_counter() - began < 10
        one_line_error(out, "its anchors and aliases expand it past 100,000 values")
        assert len(out.stderr) < 400


def test_a_huge_config_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("run: {name: " + "x" * (50 << 20) + "}\n")  # a 50 MB line
    began = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(big)
    assert time.perf_counter() - began < 1.0
    assert str(e.value) == (
        f"{big}: {big.stat().st_size:,} bytes, and a config file is at most {CONFIG_LIMIT:,} (the write-up's is "
        "about 2 KB); is it the right file?"
    )
    with pytest.raises(ConfigError, match=r"^--set run.name=...: 70,009 characters, and a --set is at most "):
        load_config(ROOT / "configs" / "tiny.yaml", ["run.name=" + "y" * 70_000])
    assert OVERRIDE_LIMIT < 70_000


def test_no_message_quotes_more_than_a_few_hundred_characters_of_a_value(train_yaml, tmp_path):
    cfg = train_yaml()
    long = "z" * 60_000
    for overrides, said in (
        ([f"train.steps={long}"], "train.steps: expected an integer or null, got 'zzz"),
        ([f"model.norm_type={long}"], "model.norm_type: 'zzz"),
        ([f"run.name=a/{long}"], "run.name: 'a/zzz"),
        ([f"log.tags={alias_bomb(4)}", "train.steps=[1, 2]"], "train.steps: expected an integer or null, got [1, 2]"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(cfg, overrides)
        assert said in str(e.value) and len(str(e.value)) < 2 * QUOTED_LIMIT + 200, str(e.value)[:300]
    wide = tmp_path / "wide.yaml"  # a value too deep and wide to print: cut before it is formatted
    wide.write_text(cfg.read_text() + "data_extra: " + alias_bomb(4) + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(wide)
    assert "data_extra: unknown key" in str(e.value) and len(str(e.value)) < 2 * QUOTED_LIMIT + 200


# ---------------------------------------------------------------------------- records read back


def test_a_damaged_or_huge_record_is_one_line_never_an_empty_one(finished, tmp_path, capsys):  # noqa: F811
    from gpt.commands.compare import main as compare
    from gpt.commands.evaluate import main as evaluate

    ckpt = finished / "checkpoints" / "step-00000020"
    assert evaluate([str(finished), "--quiet"]) == 0
    capsys.readouterr()
    for path, what, limit, command in (
        (finished / "summary.json", "summary", JSON_LIMIT, (evaluate, finished, "--quiet")),
        (ckpt / "eval-test-fp32.json", "evaluation result", JSON_LIMIT, (compare, finished, "--out", tmp_path / "c")),
        (ckpt / "checkpoint.json", "checkpoint record", INFO_LIMIT, (evaluate, finished, "--quiet")),
    ):
        original = path.read_bytes()
        sparse(path, GIB)
        began = time.perf_counter()
        assert command[0]([str(a) for a in command[1:]]) == 2
        err = capsys.readouterr().err
        assert time.perf_counter() - began < 5
        assert err == (
            f"error: {path}: damaged {what} (1,073,741,824 bytes, and no {what} is over {limit:,}); "
            "restore it or delete it\n"
        )
        path.write_bytes(original)
    with pytest.raises(CheckpointError, match=r"checkpoint.json: damaged checkpoint record \(step 'ten', segments"):
        (ckpt / "checkpoint.json").write_text(json.dumps({"step": "ten"}))
        read_info(ckpt)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b"\x00garbage!"),  # 9 bytes
        lambda p: sparse(p, GIB),  # 1 GB
        pytest.param(lambda p: p.write_text('{"step": 20, "segments": "not a list"}'), marks=pytest.mark.slow),
        pytest.param(lambda p: p.unlink(), marks=pytest.mark.slow),
    ],
    ids=["garbage", "1GB", "wrong-shape", "missing"],
)
def test_a_damaged_checkpoint_record_is_a_damaged_checkpoint(finished, train_yaml, capsys, damage):  # noqa: F811
    straight = weights(finished)
    (finished / "summary.json").unlink()  # killed after step 20's checkpoint, before its summary
    damage(finished / "checkpoints" / "step-00000020" / "checkpoint.json")
    summary = train(load_config(train_yaml("done")), resume="auto")
    err = capsys.readouterr().err
    assert err.startswith(
        ("skipped checkpoint step-00000020: checkpoint.json", "skipped checkpoint step-00000020: no checkpoint.json")
    ), err
    assert err.count("\n") == 1
    assert summary["status"] == "completed" and [s["from_step"] for s in summary["segments"]] == [0, 10]
    assert same_weights(weights(finished), straight)


def test_weights_of_another_shape_in_the_latest_checkpoint_fall_back_to_the_one_before(finished, train_yaml, capsys):  # noqa: F811
    straight = weights(finished)
    (finished / "summary.json").unlink()
    model = finished / "checkpoints" / "step-00000020" / "model.safetensors"
    tensors = load_file(str(model))
    tensors["wpe.weight"] = torch.zeros(16, 32)  # another model's positions (context 16, not 32)
    save_file(tensors, str(model))
    summary = train(load_config(train_yaml("done")), resume="auto")
    err = capsys.readouterr().err
    assert err == (
        "skipped checkpoint step-00000020: model.safetensors does not fit the model its config.yaml describes "
        "(1 of another shape: wpe.weight [16, 32], model [32, 32])\n"
    )
    assert summary["status"] == "completed" and [s["from_step"] for s in summary["segments"]] == [0, 10]
    assert same_weights(weights(finished), straight)
    tensors.pop("wpe.weight")  # and one that lacks a tensor: the explicit resume refuses it in one line
    save_file(tensors, str(model))
    with pytest.raises(
        CheckpointError, match=r"cannot resume from it: model.safetensors does not fit .*\(1 missing: wpe.weight\)"
    ):
        train(load_config(train_yaml("other")), resume=str(model.parent))


# ------------------------------------------------------------------------------- small findings


def test_overwrite_of_a_name_with_no_run_yet_moves_nothing(train_yaml, tmp_path, capsys):
    summary = train(load_config(train_yaml("fresh")), overwrite=True)
    assert summary["status"] == "completed" and "moved the earlier run" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["fresh"]
    before = files_of(tmp_path / "fresh")
    train(load_config(train_yaml("fresh")), overwrite=True)  # a run there: moved aside whole, as before
    (aside,) = tmp_path.glob("fresh.replaced-*")
    assert "moved the earlier run to " in capsys.readouterr().err
    assert {k: v for k, v in files_of(aside).items() if k.name != ".lock"} == {
        k: v for k, v in before.items() if k.name != ".lock"
    }


def test_a_run_named_in_another_script_draws_its_charts_without_warnings(train_yaml, tmp_path):
    from gpt.commands.cli import standard_hooks

    name = "规范化-实验"  # CJK: not in matplotlib's default font
    cfg = load_config(train_yaml(name))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert train(cfg, hooks=standard_hooks(cfg))["status"] == "completed"
    assert [str(w.message) for w in seen if "Glyph" in str(w.message)] == []
    assert all((tmp_path / name / f).stat().st_size > 1000 for f in ("loss.png", "lr.png", "grad_norm.png"))


def test_a_quoted_text_is_cut_to_its_limit_exactly():
    assert clipped("x" * QUOTED_LIMIT) == "x" * QUOTED_LIMIT  # at the limit: whole
    cut = clipped("x" * (QUOTED_LIMIT + 1))
    assert len(cut) == QUOTED_LIMIT and cut == "x" * (QUOTED_LIMIT - 3) + "..."
