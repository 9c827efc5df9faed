"""A crossed sweep: sweep.py --vary optim.name=adamw,muon crosses the optimizer with the norm types and seeds; the
comparison's groups, each norm type's effect within a level and the interaction equal a direct computation from the
runs' test losses. Trained once (a module fixture), asserted many times."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from gpt.commands.sweep import build_parser
from gpt.common.errors import UserError
from gpt.config import load_config
from gpt.sweep.cells import lr_text, parse_factors
from gpt.sweep.launch import run_sweep
from gpt.sweep.spec import SweepSpec

NORMS, SEEDS = ["pytorch_layernorm", "pytorch_rmsnorm"], [0, 1, 2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def crossed(tmp_path_factory, token_set):
    """2 norm types x adamw, muon x 3 seeds of the tiny config cut to 6 steps, compared with the interaction."""
    from synthetic import write_train_yaml

    folder = tmp_path_factory.mktemp("crossed")
    text = write_train_yaml(folder, token_set, "grid").read_text()
    text = text.replace("steps: 20", "steps: 6").replace("checkpoint_every: 10", "checkpoint_every: 6")
    config = folder / "crossed.yaml"
    config.write_text(
        text.replace("eval_every: 10", "eval_every: 6").replace("data: {path:", "data: {test_tokens: 1024, path:")
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_sweep(
            config,
            NORMS,
            SEEDS,
            folder / "runs",
            factors=["optim.name=adamw,muon"],
            log=lambda _: None,
            **SweepSpec(config, NORMS, SEEDS, factors=["optim.name=adamw,muon"]).compare_options(),
        )
    finally:
        torch.set_num_threads(threads)
    return folder / "runs", result


def losses(result) -> dict:
    """Test loss by (norm type, optimizer, seed), from the comparison's runs table."""
    out = {}
    for g in result["groups"]:
        norm, _, level = g["group"].partition(", optim.name=")
        for r in g["runs"]:
            out[norm, level, int(r["seed"])] = r["test_loss"]
    return out


def t_interval(values):
    values = np.asarray(values)
    half = scipy_stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return values.mean(), values.mean() - half, values.mean() + half


def test_the_cells_are_named_by_level_and_train_their_optimizer(crossed):
    runs, _ = crossed
    names = sorted(p.name for p in runs.iterdir() if p.name != "crossed-comparison")
    assert names == [
        f"crossed-{n.replace('_', '-')}-{o}-s{s}" for n in sorted(NORMS) for o in ("adamw", "muon") for s in SEEDS
    ]
    summary = json.loads((runs / "crossed-pytorch-rmsnorm-muon-s1" / "summary.json").read_text())
    assert summary["optimizer"]["name"] == "muon" and summary["optimizer"]["muon"]["tensors"] == 8
    assert json.loads((runs / "crossed-pytorch-rmsnorm-adamw-s1" / "summary.json").read_text())["optimizer"] == {
        "name": "adamw"
    }


def test_groups_effects_and_the_interaction_equal_a_direct_computation(crossed):
    _, result = crossed
    assert [g["group"] for g in result["groups"]] == [f"{n}, optim.name={o}" for n in NORMS for o in ("adamw", "muon")]
    assert result["baseline"] == "pytorch_layernorm, optim.name=adamw"  # the baseline norm at the reference level
    y = losses(result)
    assert len(set(y.values())) == 12  # every run its own result: the optimizer and the seed each change it
    section = result["crossed"]
    assert (section["by"], section["baseline"], section["levels"]) == (
        ["optim.name"],
        "pytorch_layernorm",
        ["adamw", "muon"],
    )
    [row] = section["rows"]
    assert row["norm"] == "pytorch_rmsnorm"
    d = {o: [y["pytorch_rmsnorm", o, s] - y["pytorch_layernorm", o, s] for s in SEEDS] for o in ("adamw", "muon")}
    for effect, level in zip(row["effects"], ("adamw", "muon")):
        mean, low, high = t_interval(d[level])
        assert (effect["level"], effect["method"], effect["n"]) == (level, "paired", 3)
        assert effect["diff"] == pytest.approx(mean, abs=1e-12)
        assert (effect["low"], effect["high"]) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
        assert effect["holm_p"] == effect["p"]  # one norm type against the baseline: a family of one
    [inter] = row["interactions"]
    mean, low, high = t_interval(np.subtract(d["muon"], d["adamw"]))
    assert (inter["level"], inter["reference"], inter["method"]) == ("muon", "adamw", "paired")
    assert inter["diff"] == pytest.approx(mean, abs=1e-12)
    assert (inter["low"], inter["high"]) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    t = mean / (np.std(np.subtract(d["muon"], d["adamw"]), ddof=1) / math.sqrt(3))
    assert inter["p"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), 2), rel=1e-9) and inter["holm_p"] == inter["p"]
    assert "between adamw and muon" in inter["verdict"] and "pytorch_rmsnorm vs pytorch_layernorm" in inter["verdict"]
    assert inter["verdict"].endswith(f"by {mean:+.4f} [{low:+.4f}, {high:+.4f}] (Holm p {inter['p']:.3g})")


def test_the_report_and_chart_show_the_crossed_design(crossed):
    runs, result = crossed
    md = (runs / "crossed-comparison" / "comparison.md").read_text()
    assert "## Does the effect depend on optim.name?" in md
    assert result["crossed"]["rows"][0]["interactions"][0]["verdict"] in md
    assert (runs / "crossed-comparison" / "interaction.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((runs / "crossed-comparison" / "comparison.json").read_text())
    assert saved["crossed"]["levels"] == ["adamw", "muon"]


@pytest.mark.parametrize(
    "factor, message",
    [
        ("optim.name=adamw", "give KEY=A,B"),
        ("optim.name=adamw,adamw", "give KEY=A,B"),
        ("model.norm_type=a,b", "the grid has --norm-types for that"),
        ("train.seed=1,2", "the grid has --seeds for that"),
        ("run.dir=a,b", "the grid has its own run names for that"),
    ],
)
def test_a_factor_that_cannot_be_one_is_refused_in_one_line(factor, message):
    with pytest.raises(UserError) as e:
        parse_factors([factor])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_factor_also_set_is_refused_and_the_command_line_round_trips(tmp_path):
    with pytest.raises(UserError, match="named twice"):
        parse_factors(["optim.name=adamw,muon"], ["optim.name=muon"])
    argv = ["cfg.yaml", "--norm-types", *NORMS, "--vary", "optim.name=adamw,muon", "--vary", "model.block=gpt2,modern"]
    spec = SweepSpec.from_args(build_parser().parse_args(argv), nproc=1)
    assert spec.factors == ["optim.name=adamw,muon", "model.block=gpt2,modern"]
    again = SweepSpec.from_args(build_parser().parse_args(spec.argv()[3:]), nproc=1)
    assert again.factors == spec.factors and again.compare_options()["by"] == ["optim.name", "model.block"]


def test_rates_are_chosen_per_norm_type_and_level_then_confirmed_crossed(tmp_path, token_set):
    """--lrs with --vary and --confirm-seeds: each norm type x optimizer chooses its rate on the selection seeds
    (Muon's rate moving with it at the config's ratio), then the chosen rates train on fresh seeds and that
    comparison is the crossed one."""
    from synthetic import write_train_yaml

    text = write_train_yaml(tmp_path, token_set, "grid").read_text().replace("steps: 20", "steps: 4")
    config = tmp_path / "lr.yaml"
    text = text.replace("eval_every: 10", "eval_every: 4").replace("checkpoint_every: 10", "checkpoint_every: 4")
    config.write_text(text
                      .replace("data: {path:", "data: {test_tokens: 1024, path:"))  # fmt: skip
    spec = SweepSpec(config, NORMS, [0, 1], runs_dir=tmp_path / "runs", lrs=[1e-2, 4e-2], confirm_seeds=[2, 3],
                     factors=["optim.name=adamw,muon"])  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_sweep(**spec.run_options(), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    selection = json.loads((tmp_path / "runs" / "lr-comparison-selection" / "comparison.json").read_text())["selection"]
    chosen = {f["family"]: f["chosen_value"] for f in selection["families"]}
    assert sorted(chosen) == sorted(f"{n}, optim.name={o}" for n in NORMS for o in ("adamw", "muon"))
    confirmed = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name.endswith(("-s2", "-s3")))
    assert len(confirmed) == 8 and all(f"-lr{lr_text(chosen[f'{n}, optim.name={o}'])}-s" in name
               for name in confirmed for n in NORMS for o in ("adamw", "muon")
               if name.startswith(f"lr-{n.replace('_', '-')}-{o}-"))  # fmt: skip
    muon_cell = next(p for p in (tmp_path / "runs").iterdir() if "-muon-lr" in p.name and p.name.endswith("-s2"))
    cfg = load_config(muon_cell / "config.yaml")
    assert cfg.optim.name == "muon" and cfg.optim.muon_lr == pytest.approx(cfg.optim.lr * 0.02 / 1e-2)
    section = result["crossed"]
    assert section["levels"] == ["adamw", "muon"] and section["rows"][0]["interactions"][0]["n"] == 2
    assert {r["seed"] for g in result["groups"] for r in g["runs"]} == {"2", "3"}


def test_compare_by_a_key_the_runs_share_is_one_line(crossed, cli, tmp_path):
    runs, _ = crossed
    cells = sorted(str(p) for p in runs.iterdir() if p.name != "crossed-comparison")
    out = cli("compare", *cells, "--by", "model.block", "--vary", "optim.name", "--out", tmp_path / "c", "--no-plots")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--by model.block: these runs hold one level (gpt2)" in out.stderr
    again = cli("compare", *cells, "--by", "optim.name", "--out", tmp_path / "d", "--no-plots")
    assert again.returncode == 0 and "## Does the effect depend on optim.name?" in again.stdout
