"""sweep.py --lrs: learning rate as a declared axis of the grid, each norm type's rate chosen on validation loss and
its test loss reported at that rate; the cells' names, min_lr and the sweep's command line."""

import json
import shlex

import numpy as np
import pytest
import torch
import yaml
from analysis.test_compare import render_only
from scipy import stats as scipy_stats
from synthetic import sized_grid_yaml

from gpt.commands.sweep import build_parser
from gpt.commands.sweep import main as sweep_main
from gpt.common.errors import UserError
from gpt.run.directory import find_checkpoint
from gpt.sweep.cells import lay_out, lr_text
from gpt.sweep.launch import run_sweep
from gpt.sweep.spec import SweepSpec

# At 6 steps these rates put pytorch_layernorm's lowest validation loss at 3e-2 and dyt's at 1e-1 (by 0.2 or more)
NORMS, SEEDS, LRS = ["pytorch_layernorm", "dyt"], [0, 1], [3e-2, 1e-1, 3e-1]


@pytest.fixture
def grid_cfg(train_yaml):
    """The tiny CPU config (optim.lr 1e-2, min_lr 1e-3: a ratio of 0.1) cut to 6 steps, validated at the last on
    512 tokens and tested on 1024 (only the last validation chooses)."""
    config = sized_grid_yaml(train_yaml("grid"), steps=6, checkpoint_every=6, eval_every=6)
    text = (
        config.read_text()
        .replace("val_tokens: 2048", "val_tokens: 512")
        .replace("test_tokens: 4096", "test_tokens: 1024")
    )
    assert "val_tokens: 512" in text and "test_tokens: 1024" in text
    config.write_text(text)
    return config


def last_val_loss(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in records if "val_loss" in r][-1]


def test_lr_names():
    assert [lr_text(x) for x in (7e-4, 1.4e-3, 2.8e-3, 0.001, 1.0, 3e-10, 0.25)] == [
        "7e-4", "1.4e-3", "2.8e-3", "1e-3", "1e0", "3e-10", "2.5e-1",
    ]  # fmt: skip


def test_cells_of_a_learning_rate_sweep(grid_cfg, tmp_path):
    runs = tmp_path / "runs"
    cells = lay_out(grid_cfg, ["dyt"], [0, 1], runs, lrs=[7e-4, 1.4e-3])
    assert [c.name for c in cells] == ["grid-dyt-lr7e-4-s0", "grid-dyt-lr7e-4-s1", "grid-dyt-lr1.4e-3-s0",
                                       "grid-dyt-lr1.4e-3-s1"]  # fmt: skip
    assert [c.cfg.optim.lr for c in cells] == [7e-4, 7e-4, 1.4e-3, 1.4e-3]
    assert [c.cfg.optim.min_lr for c in cells] == [7e-5, 7e-5, 1.4e-4, 1.4e-4]  # the config's 1e-3 / 1e-2 followed
    assert cells[2].overrides[:2] == ["optim.lr=0.0014", "optim.min_lr=0.00014"]
    assert all(c.cfg.run.dir == str(runs / c.name) for c in cells)
    fixed = lay_out(grid_cfg, ["dyt"], [0], runs, ["optim.min_lr=1e-5"], lrs=[7e-4, 1.4e-3])
    assert [c.cfg.optim.min_lr for c in fixed] == [1e-5, 1e-5]  # --set optim.min_lr wins over the ratio
    assert [o for c in fixed for o in c.overrides if o.startswith("optim.min_lr")] == ["optim.min_lr=1e-5"] * 2
    crossed = lay_out(grid_cfg, ["dyt"], [0], runs, init_seeds=[0, 1], data_seeds=[3, 4], lrs=[1e-2])
    assert [c.name for c in crossed][-1] == "grid-dyt-lr1e-2-i1-s4"
    with pytest.raises(UserError, match=r"^--lrs 1e-3 1e-3 names a learning rate twice$"):
        lay_out(grid_cfg, ["dyt"], [0], runs, lrs=[1e-3, 0.001])
    with pytest.raises(UserError, match=r"^--lrs sets optim\.lr of every cell; drop --set optim\.lr=\.\.\.$"):
        lay_out(grid_cfg, ["dyt"], [0], runs, ["optim.lr=1e-3"], lrs=[1e-3])
    with pytest.raises(UserError, match=r"min_lr.*is above optim\.lr"):  # a fixed floor above a rate
        lay_out(grid_cfg, ["dyt"], [0], runs, ["optim.min_lr=5e-3"], lrs=[1e-3])


def test_a_sweep_without_lrs_keeps_its_cells(grid_cfg, tmp_path):
    """Existing sweeps resume and skip as before: the same folder names, the same overrides."""
    runs = tmp_path / "runs"
    [cell] = lay_out(grid_cfg, ["pytorch_layernorm"], [3], runs, ["train.steps=4"])
    assert cell.name == "grid-pytorch-layernorm-s3"
    assert cell.overrides == ["train.steps=4", "model.norm_type=pytorch_layernorm", "train.seed=3",
                              "run.name=grid-pytorch-layernorm-s3", f"run.dir={runs / cell.name}"]  # fmt: skip
    assert (cell.cfg.optim.lr, cell.cfg.optim.min_lr) == (1e-2, 1e-3)
    spec = SweepSpec(grid_cfg, ["dyt"], [0])
    assert "--lrs" not in spec.argv()
    assert spec.compare_options() == {"baseline": None, "equivalence_margin": None, "allow_differ": []}


def spec_of(argv: list[str]) -> SweepSpec:
    args = build_parser().parse_args(argv)
    return SweepSpec.from_args(args, nproc=args.nproc or 1)


def test_the_sweeps_command_line_round_trips_its_rates(grid_cfg, tmp_path):
    spec = spec_of([str(grid_cfg), "--norm-types", "dyt", "--seeds", "0", "1", "--lrs", "7e-4", "1.4e-3",
                    "--runs-dir", str(tmp_path), "--allow-differ", "hardware.name"])  # fmt: skip
    assert spec.lrs == [7e-4, 1.4e-3]
    words = spec.argv()
    assert words[words.index("--lrs") : words.index("--lrs") + 3] == ["--lrs", "0.0007", "0.0014"]
    again = spec_of(words[3:])  # past "python -m gpt.commands.sweep"
    assert again == spec and [c.name for c in again.cells()] == [c.name for c in spec.cells()]
    assert spec.compare_options() == {
        "baseline": None,
        "equivalence_margin": None,
        "allow_differ": ["hardware.name", "optim.min_lr"],
        "vary": ["optim.lr"],
        "select_on": "val",
    }
    fixed = spec_of([*words[3:], "--set", "optim.min_lr=1e-5"])
    assert fixed.compare_options()["allow_differ"] == ["hardware.name"]  # the floor is the same in every cell


def test_dry_runs_name_the_rates(grid_cfg, tmp_path, capsys):
    runs = tmp_path / "r"
    base = [str(grid_cfg), "--norm-types", "dyt", "--seeds", "0", "1", "--lrs", "3e-3", "1e-2", "--runs-dir", str(runs)]
    assert sweep_main([*base, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    trains = [line for line in lines if "-m gpt.commands.train" in line]
    assert len(trains) == 4 and not runs.exists()
    assert "--set optim.lr=0.003 --set optim.min_lr=0.0003 --set model.norm_type=dyt --set train.seed=0 " in trains[0]
    assert "--set run.name=grid-dyt-lr3e-3-s0" in trains[0] and "run.name=grid-dyt-lr1e-2-s1" in trains[3]
    assert lines[-1].endswith("--vary optim.lr --allow-differ optim.min_lr --select-on val")
    assert sweep_main([*base, "--launcher", "slurm", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --array=0,1,2,3" in printed and not runs.exists()
    job = next(line for line in printed.splitlines() if line.startswith("exec ") and "cell:" in line)
    words = shlex.split(job)[4:-2]  # past "exec python -m gpt.commands.sweep", before "--in-job cell:$TASK"
    assert spec_of(words) == spec_of(base)  # a cell job lays out the very same cells
    assert sweep_main([*base, "--lrs", "1e-2", "0.01"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --lrs 1e-2 1e-2 names a learning rate twice\n" and not runs.exists()


@pytest.fixture
def one_thread():
    """Tiny models train several times faster on one thread than on two contending for two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CONFIRM = [2, 3]  # the confirmation seeds: fresh, so the chosen rates' luck is not in their runs


@pytest.mark.slow
def test_a_two_stage_learning_rate_sweep_chooses_on_validation_and_compares_fresh_seeds(
    grid_cfg, tmp_path, monkeypatch, one_thread
):
    """2 norm types x 3 rates x 2 seeds, trained: each norm type's rate is the argmin of its mean last validation
    loss, read here from the run folders, and the selection's test loss is the chosen rate's (its interval marked
    optimistic). Then each chosen rate alone trains on the confirmation seeds, and the comparison is of those runs
    alone: its interval is the paired t interval of their differences. (Run as sweep.py runs it, but without each
    run's own charts: test_dry_runs_name_the_rates shows the command's options reach run_sweep; and the
    comparison's charts drawn, not rendered.)"""
    render_only(monkeypatch)
    runs = tmp_path / "runs"
    argv = [str(grid_cfg), "--norm-types", *NORMS, "--seeds", *map(str, SEEDS), "--lrs", *map(str, LRS)]
    spec = spec_of([*argv, "--runs-dir", str(runs), "--confirm-seeds", *map(str, CONFIRM)])
    run_sweep(spec.config, spec.norm_types, spec.seeds, spec.runs_dir, lrs=spec.lrs, confirm_seeds=spec.confirm_seeds,
              log=lambda line: None, **spec.compare_options())  # fmt: skip
    selection_folder = runs / "grid-comparison-selection"
    result = json.loads((selection_folder / "comparison.json").read_text())
    rows = {g["group"]: g for g in result["groups"]}
    assert len(rows) == len(NORMS)
    assert len({f["chosen_value"] for f in result["selection"]["families"]}) == 2  # each norm type its own rate
    chosen_by_norm = {}
    for norm, family in zip(NORMS, result["selection"]["families"], strict=True):
        folders = {lr: [runs / f"grid-{norm.replace('_', '-')}-lr{lr_text(lr)}-s{s}" for s in SEEDS] for lr in LRS}
        means = {lr: np.mean([last_val_loss(run) for run in folders[lr]]) for lr in LRS}
        chosen = chosen_by_norm[norm] = min(LRS, key=means.get)
        assert family["family"] == norm and family["chosen_value"] == chosen
        assert [r["val_loss_mean"] for r in family["rates"]] == pytest.approx([means[lr] for lr in LRS])
        for lr in LRS:
            config = yaml.safe_load((folders[lr][0] / "config.yaml").read_text())
            assert (config["optim"]["lr"], config["optim"]["min_lr"]) == pytest.approx((lr, lr / 10))
        tests = [
            json.loads((find_checkpoint(run) / "eval-test-fp32.json").read_text())["loss"] for run in folders[chosen]
        ]
        assert rows[f"{norm}, optim.lr={chosen}"]["test_loss_mean"] == pytest.approx(np.mean(tests))
        # a rate at an end of the grid is flagged (at 6 steps pytorch_layernorm's best is the lowest, 3e-2)
        assert family["edge"] == ("lowest" if chosen == LRS[0] else "highest" if chosen == LRS[-1] else None)
    assert chosen_by_norm["pytorch_layernorm"] == LRS[0] and chosen_by_norm["dyt"] not in (LRS[0], LRS[-1])
    assert result["baseline"] == f"pytorch_layernorm, optim.lr={result['selection']['families'][0]['chosen_value']}"
    assert result["allowed_to_differ"]["optim.min_lr"]  # the floor followed the rate
    selection_md = (selection_folder / "comparison.md").read_text()
    assert "## Learning rate chosen on validation" in selection_md
    assert "vs baseline (nominal 95% CI, optimistic: rates chosen on these runs)" in selection_md
    assert "- pytorch_layernorm: the chosen optim.lr 0.03 is the grid's lowest: its best rate may lie below it" in (
        selection_md
    )
    assert (selection_folder / "lr_sensitivity.png").is_file()

    # the confirmation: each chosen rate on the fresh seeds alone, and nothing else
    confirmed = sorted(p.name for p in runs.iterdir() if p.name.endswith(tuple(f"-s{s}" for s in CONFIRM)))
    assert confirmed == sorted(
        f"grid-{norm.replace('_', '-')}-lr{lr_text(lr)}-s{s}" for norm, lr in chosen_by_norm.items() for s in CONFIRM
    )
    final = json.loads((runs / "grid-comparison" / "comparison.json").read_text())
    groups = {g["group"]: g for g in final["groups"]}
    assert sorted(groups) == sorted(NORMS) and final["selection"] is None
    test_losses = {}
    for norm, lr in chosen_by_norm.items():
        folders = [runs / f"grid-{norm.replace('_', '-')}-lr{lr_text(lr)}-s{s}" for s in CONFIRM]
        for folder, seed in zip(folders, CONFIRM, strict=True):
            config = yaml.safe_load((folder / "config.yaml").read_text())
            assert (config["optim"]["lr"], config["train"]["seed"]) == (pytest.approx(lr), seed)
        test_losses[norm] = [
            json.loads((find_checkpoint(f) / "eval-test-fp32.json").read_text())["loss"] for f in folders
        ]
        assert groups[norm]["seeds"] == [str(s) for s in CONFIRM]
        assert groups[norm]["test_loss_mean"] == pytest.approx(np.mean(test_losses[norm]))
    # the interval is the paired t interval of the confirmation runs' differences, and of nothing else
    d = np.array(test_losses["dyt"]) - np.array(test_losses["pytorch_layernorm"])
    half = scipy_stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    versus = groups["dyt"]["vs_baseline"]
    assert (versus["method"], versus["n"]) == ("paired", len(CONFIRM))
    assert (versus["low"], versus["high"]) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
    confirmation = final["confirmation"]
    assert (confirmation["selection_seeds"], confirmation["confirm_seeds"]) == (SEEDS, CONFIRM)
    assert {f["family"]: f["chosen_value"] for f in confirmation["families"]} == chosen_by_norm
    final_md = (runs / "grid-comparison" / "comparison.md").read_text()
    assert "## Learning rates chosen on other seeds" in final_md and "vs baseline (95% CI)" in final_md
    assert "optimistic" not in final_md
    assert "- pytorch_layernorm: the chosen optim.lr 0.03 is the grid's lowest" in final_md


def test_confirmation_seeds_are_refused_in_one_line_where_they_cannot_confirm(grid_cfg, tmp_path, capsys):
    runs = tmp_path / "r"
    base = [str(grid_cfg), "--norm-types", "dyt", "--seeds", "0", "1", "--runs-dir", str(runs)]
    for extra, message in (
        (["--lrs", "3e-3", "1e-2", "--confirm-seeds", "1", "2"],
         "--confirm-seeds 1 also chose the rates (--seeds): confirmation seeds must be fresh, or their runs carry "
         "the choice's luck"),
        (["--confirm-seeds", "2", "3"],
         "--confirm-seeds trains the rates chosen among --lrs on fresh seeds; give --lrs two or more rates"),
        (["--lrs", "3e-3", "1e-2", "--confirm-seeds", "2", "2"],
         "--confirm-seeds needs two or more different seeds for an interval (got 2 2)"),
        (["--lrs", "3e-3", "1e-2", "--confirm-seeds", "-1", "2"],
         "--confirm-seeds -1: a seed is an integer from 0 to 4294967295 (train.seed)"),
        (["--lrs", "3e-3", "1e-2", "--confirm-seeds", "4294967296", "2"],
         "--confirm-seeds 4294967296: a seed is an integer from 0 to 4294967295 (train.seed)"),
        (["--seeds", "4294967296", "--lrs", "3e-3", "1e-2"],
         "--set: train.seed: 4294967296 is out of range; allowed: <= 4294967295"),
    ):  # fmt: skip
        assert sweep_main([*base, *extra]) == 2
        assert capsys.readouterr().err == f"error: {message}\n" and not runs.exists()


def test_a_two_stage_dry_run_names_both_stages_and_the_command_line_round_trips(grid_cfg, tmp_path, capsys):
    runs = tmp_path / "r"
    base = [str(grid_cfg), "--norm-types", "dyt", "--seeds", "0", "1", "--lrs", "3e-3", "1e-2", "--runs-dir", str(runs)]
    spec = spec_of([*base, "--confirm-seeds", "4", "5"])
    words = spec.argv()
    assert words[words.index("--confirm-seeds") : words.index("--confirm-seeds") + 3] == ["--confirm-seeds", "4", "5"]
    assert spec_of(words[3:]) == spec and spec.cells() == spec.grid_cells() != []  # no rate chosen yet
    assert sweep_main([*base, "--confirm-seeds", "4", "5", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"--out {runs / 'grid-comparison-selection'} " in lines[-2] and lines[-2].endswith("--select-on val")
    assert lines[-1].startswith("# then each norm type's rate chosen there, on seeds 4 5: trained, evaluated and ")
    assert sweep_main([*base, "--confirm-seeds", "4", "5", "--launcher", "slurm", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --array=0,1,2,3" in printed and not runs.exists()
    assert "then: the comparison job chooses each norm type's rate and submits its cells on seeds 4 5" in printed


def test_a_confirmation_on_other_seeds_never_replaces_the_one_kept(grid_cfg, tmp_path, capsys):
    runs = tmp_path / "r"
    kept = runs / "grid-comparison" / "comparison.json"
    kept.parent.mkdir(parents=True)
    record = {"groups": [{"group": "dyt", "runs": [{"seed": "2"}, {"seed": "3"}], "left_out": []}]}
    kept.write_text(json.dumps(record))
    before = kept.read_bytes()
    base = [str(grid_cfg), "--norm-types", "dyt", "--seeds", "0", "1", "--lrs", "3e-3", "1e-2", "--runs-dir", str(runs)]
    for launcher in ([], ["--launcher", "slurm", "--time", "01:00:00"]):
        assert sweep_main([*base, "--confirm-seeds", "4", "5", *launcher]) == 2
        assert capsys.readouterr().err == (
            f"error: {runs / 'grid-comparison'} holds the comparison of seeds 2 3; --confirm-seeds 4 5 would replace "
            "it: give --out another folder (or move it aside), or rerun with --confirm-seeds 2 3\n"
        )
        assert kept.read_bytes() == before and sorted(p.name for p in runs.iterdir()) == ["grid-comparison"]
    assert sweep_main([*base, "--confirm-seeds", "2", "3", "--dry-run"]) == 0  # the same seeds: resumed as before
    assert sweep_main([*base, "--confirm-seeds", "4", "5", "--out", str(tmp_path / "other"), "--dry-run"]) == 0
