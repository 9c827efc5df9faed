"""sweep.py --sizes: the size axis laid out and trained (each size on train.tokens_per_param x its parameters),
compared across sizes (compare.py --across-sizes): the fits checked against direct least squares on the runs' own
test losses, the gap's trend against a direct regression, and the refusals."""

import json
import math
import shlex

import numpy as np
import pytest
import torch
import yaml
from analysis.test_compare import render_only
from conftest import CONFIGS
from sweep.test_lr_axis import spec_of

from gpt.analysis.across_sizes import compare_sizes
from gpt.commands.compare import main as compare_main
from gpt.commands.prepare_data import main as prepare_main
from gpt.commands.sweep import main as sweep_main
from gpt.common.errors import UserError
from gpt.config.sizes import SIZES
from gpt.publish.sweep_source import read_sweep
from gpt.run.directory import RunDir, read_eval_result
from gpt.sweep import cell_job
from gpt.sweep.cells import lay_out
from gpt.sweep.launch import compare_command
from gpt.sweep.slurm import SweepFolder

# the study below is trained once: on one pytest-xdist worker (.ci/run: --dist loadgroup), not once on each
pytestmark = pytest.mark.xdist_group("size_axis_study")

SIZE_NAMES, NORMS, SEEDS = ["1x16", "2x32", "3x48"], ["pytorch_layernorm", "no_norm"], [0, 1]
TOKENS_PER_PARAM, TOKENS_PER_STEP = 2, 16 * 64


def smaller(data) -> list[str]:
    """configs/ladder.yaml (the CPU ladder's study, docs/studies.md) cut for the tests: 2 tokens per parameter
    instead of 20, validated only at the end, tested on 8,192 bytes, on the byte-level set in ``data``."""
    sets = [f"data.path={data}", "data.val_tokens=4096", "data.test_tokens=8192", "log.progress=false",
            f"train.tokens_per_param={TOKENS_PER_PARAM}", "train.eval_every=100000",
            "train.checkpoint_every=100000"]  # fmt: skip
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture
def config():
    return CONFIGS / "ladder.yaml"


def test_cells_of_a_size_sweep(config, tmp_path):
    cells = lay_out(config, ["no_norm"], [0, 1], tmp_path / "runs", sizes=["2x32", "1x16"])
    assert [c.name for c in cells] == ["ladder-2x32-no-norm-s0", "ladder-2x32-no-norm-s1", "ladder-1x16-no-norm-s0",
                                       "ladder-1x16-no-norm-s1"]  # fmt: skip
    dims = [(c.cfg.model.n_layers, c.cfg.model.d_model, c.cfg.model.n_heads) for c in cells[::2]]
    assert dims == [(2, 32, 2), (1, 16, 1)]
    assert cells[0].overrides[0] == "model.size=2x32"
    rated = lay_out(config, ["no_norm"], [0], tmp_path / "runs", lrs=[1e-2, 3e-2], sizes=["1x16"])
    assert [c.name for c in rated] == ["ladder-1x16-no-norm-lr1e-2-s0", "ladder-1x16-no-norm-lr3e-2-s0"]
    assert [c.name for c in lay_out(config, ["no_norm"], [0], tmp_path / "runs")] == ["ladder-no-norm-s0"]


def test_a_size_axis_that_cannot_be_one_is_refused_before_anything_runs(config, tmp_path, capsys):
    runs = tmp_path / "runs"
    base = [str(config), "--norm-types", "no_norm", "--seeds", "0", "1", "--runs-dir", str(runs)]
    for extra, message in (
        (["--sizes", "1x16", "1x16"], "--sizes 1x16 1x16 names a size twice"),
        (["--sizes", "1x16", "--set", "model.size=2x32"], "--sizes sets model.size of every cell; drop --set "
         "model.size=..."),
        (["--sizes", "1x16", "2x32", "--set", "train.tokens_per_param=null", "--set", "train.steps=50"],
         "--sizes trains each size on train.tokens_per_param x its own parameters (one rule for every size), and "
         "the config sets train.steps=50: add --set train.steps=null --set train.tokens_per_param=20 (Chinchilla's), "
         "or another number of tokens per parameter"),
        (["--predict-at", "124M"], "--predict-at predicts from a fit across sizes: give --sizes with 2 or more (4 "
         "or more for E + A*N^-alpha); 0 given"),
        (["--sizes", "1x16", "--predict-at", "124M"], "--predict-at predicts from a fit across sizes: give --sizes "
         "with 2 or more (4 or more for E + A*N^-alpha); 1 given"),
        (["--sizes", "1x16", "2x32", "--lrs", "1e-2", "3e-2", "--confirm-seeds", "4", "5"],
         "--confirm-seeds with --sizes: a confirmation stage per size is not built; sweep --sizes with --lrs (each "
         "size's rate chosen on validation, its intervals said optimistic), then train the chosen rates on fresh "
         "seeds with --set optim.lr=... per size"),
        (["--sizes", "1x16", "2x32", "1x64"], "--sizes 1x16 2x32 1x64: the sizes mix aspect ratios (d_model/n_layers "
         "16: 1x16 2x32; d_model/n_layers 64: 1x64): one curve across them mixes the shape's effect with the size's; "
         "take the sizes from one ladder (gpt.config.sizes)"),
    ):  # fmt: skip
        assert sweep_main([*base, *extra]) == 2
        assert capsys.readouterr().err == f"error: {message}\n" and not runs.exists()
    for extra, message in (
        (["--sizes", "5x5"], "argument --sizes: invalid choice: '5x5' (choose from '1x64', "),
        (["--sizes", "1x16", "--predict-at", "lots"], "argument --predict-at: 'lots': expected a positive count such "),
        (
            ["--sizes", "1x16", "2x32", "--predict-at", "0.5"],
            "argument --predict-at: '0.5': a model's parameter count, between 1k and 1000T",
        ),
        (
            ["--sizes", "1x16", "2x32", "--predict-at", "1e30"],
            "argument --predict-at: '1e30': a model's parameter count, between 1k and 1000T",
        ),
    ):
        with pytest.raises(SystemExit) as e:
            sweep_main([*base, *extra])
        assert e.value.code == 2 and message in capsys.readouterr().err and not runs.exists()


def test_the_plan_says_what_the_seeds_detect_and_runs_nothing(config, tmp_path, capsys):
    runs = tmp_path / "runs"
    base = [str(config), "--norm-types", "pytorch_layernorm", "no_norm", "--seeds", "0", "1", "2",
            "--runs-dir", str(runs)]  # fmt: skip
    assert sweep_main([*base, "--sizes", "1x16", "2x32", "3x48", "4x64", "--plan", "--noise", "0.01",
                       "--detect", "0.02", "--detect-trend", "0.05"]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    counts = [int(c.split()[-1].replace(",", "")) for c in out[1].removeprefix("# sizes").split(", ")[0:]]
    from gpt.analysis import power

    p = power.plan(0.01, 3, counts, detect=0.02, detect_trend=0.05)
    assert out[0] == "# plan: 24 cell(s); nothing run" and not runs.exists()
    assert out[1].startswith("# sizes (parameters outside the norms): 1x16 ") and len(counts) == 4
    assert out[3] == "Power (80%, two-sided 5% tests) at sd 0.01 nats of one seed's paired difference (given by " \
        "--noise), 3 seed(s):"  # fmt: skip
    assert out[4] == f"- the difference at one size: detects {p['difference']['resolvable']:.4f} nats or more"
    assert out[5] == (f"  - a difference of 0.0200 nats: power {p['difference']['power']:.0%} with 3 seeds; "
                      f"{p['difference']['seeds_needed']} seeds reach 80%")  # fmt: skip
    assert out[6] == (f"- the gap's trend across 4 sizes: detects a change of {p['trend']['resolvable']:.4f} nats "
                      "per 10x parameters or more (independent sizes)")  # fmt: skip
    assert sweep_main([*base, "--lrs", "1e-3", "2e-3", "--confirm-seeds", "7", "8", "--plan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# plan: 12 cell(s), then 4 confirmation cell(s); nothing run" and "2 seed(s):" in out[2]
    for extra, message in (
        (["--noise", "0.01"], "--noise without --plan: they set the plan's noise and targets; add --plan"),
        (["--plan", "--noise", "0.01", "--noise-from", str(tmp_path)], "--noise-from and --noise: give one"),
        (["--plan", "--noise-from", str(tmp_path)], f"--noise-from {tmp_path}: no comparison.json there"),
        (["--plan", "--init-seeds", "0", "1", "--data-seeds", "0", "1"], "--plan with --init-seeds/--data-seeds: "
         "the plan is of independent seeds"),
    ):  # fmt: skip
        assert sweep_main([*base, *extra]) == 2
        assert capsys.readouterr().err.startswith(f"error: {message}") and not runs.exists()
    for bad in ("nan", "-0.01", "0", "inf"):
        with pytest.raises(SystemExit):
            sweep_main([*base, "--plan", "--noise", bad])
        assert f"argument --noise: '{bad}': a finite number above 0, in nats" in capsys.readouterr().err


def test_the_sweeps_command_line_round_trips_its_sizes_and_compares_across_them(config, tmp_path, capsys):
    base = [str(config), "--norm-types", "no_norm", "--seeds", "0", "--runs-dir", str(tmp_path / "r")]
    spec = spec_of([*base, "--sizes", "1x16", "2x32", "--predict-at", "124M"])
    assert spec.sizes == ["1x16", "2x32"] and spec.predict_at == 124e6
    words = spec.argv()
    assert words[words.index("--sizes") : words.index("--sizes") + 3] == ["--sizes", "1x16", "2x32"]
    assert spec_of(words[3:]) == spec and [c.name for c in spec.cells()] == ["ladder-1x16-no-norm-s0",
                                                                             "ladder-2x32-no-norm-s0"]  # fmt: skip
    options = spec.compare_options()
    assert options["across_sizes"] is True and options["predict_at"] == 124e6
    command = compare_command(spec.cells(), spec.comparison, options)
    assert shlex.join(command).endswith("--across-sizes --predict-at 124000000.0")
    assert sweep_main([*base, "--sizes", "1x16", "2x32", "--predict-at", "124M", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("--across-sizes --predict-at 124000000.0")


def test_a_size_longer_than_the_data_is_refused_before_any_cell_trains(config, token_set, tmp_path, capsys):
    """The trainer would refuse 4x64 only when its turn came, after every smaller size had trained."""
    runs = tmp_path / "runs"
    argv = [str(config), "--norm-types", "no_norm", "--seeds", "0", "--runs-dir", str(runs), "--sizes", "1x16", "4x64",
            "--set", f"data.path={token_set}", "--set", "train.tokens_per_param=1"]  # fmt: skip
    assert sweep_main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: ladder-4x64-no-norm-s0 (and the cells of its size): {token_set / 'train.bin'}: 200,000 tokens are "
        "195 steps of 16 x 64 tokens, but the run asks for 230 steps (235,520 tokens); use a larger data set or "
        "fewer tokens\n"
    )
    assert not runs.exists()


def test_slurm_jobs_lay_out_the_sizes_and_the_comparison_job_compares_across_them(config, tmp_path, capsys,
                                                                                  monkeypatch):  # fmt: skip
    runs = tmp_path / "r"
    base = [str(config), "--norm-types", "no_norm", "--seeds", "0", "--runs-dir", str(runs), "--sizes", "1x16", "2x32"]
    assert sweep_main([*base, "--predict-at", "2M", "--launcher", "slurm", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "#SBATCH --array=0,1" in printed and not runs.exists()
    job = next(line for line in printed.splitlines() if line.startswith("exec ") and "cell:" in line)
    words = shlex.split(job)[4:-2]  # past "exec python -m gpt.commands.sweep", before "--in-job cell:$TASK"
    spec = spec_of(words)
    assert spec == spec_of([*base, "--predict-at", "2M"]) and spec.sizes == ["1x16", "2x32"]
    for cell in spec.cells():  # each cell's job has left a finished run (compare_grid is not run on them)
        cell.run.path.mkdir(parents=True)
        cell.run.config_file.write_text("run: {}\n")
        cell.run.metrics_file.write_text('{"step": 1, "train_loss": 5.0}\n')
        (cell.run.path / "summary.json").write_text(json.dumps({"status": "completed"}))
    compared = {}
    monkeypatch.setattr(cell_job, "compare_grid", lambda present, out, failed, **options: compared.update(options))
    cell_job.compare_sweep(spec, SweepFolder.of(spec.config, spec.runs_dir))
    assert compared["across_sizes"] is True and compared["predict_at"] == 2e6


def test_a_sweep_across_sizes_is_published_size_by_size(config, tmp_path, capsys):
    runs = tmp_path / "r"
    argv = [str(config), "--norm-types", "no_norm", "--seeds", "0", "--runs-dir", str(runs), "--sizes", "1x16",
            "2x32", "--push-to-hub", "me"]  # fmt: skip
    assert sweep_main(argv) == 2
    assert capsys.readouterr().err == (
        "error: --push-to-hub with --sizes: publish each size's comparison when the sweep has run: scripts/"
        "publish_sweep.py RUNS_DIR --namespace USER --comparison RUNS_DIR/<config>-comparison/sizes/SIZE\n"
    )
    comparison = runs / "ladder-comparison"
    comparison.mkdir(parents=True)
    (comparison / "comparison.json").write_text(json.dumps({"sizes": [{"size": "1x16"}], "norms": {}}))
    with pytest.raises(UserError) as e:
        read_sweep(runs)
    assert str(e.value) == (
        f"{comparison}: a comparison across sizes, which names no runs itself; publish each size's: --comparison "
        f"{comparison / 'sizes' / '1x16'} (and the other sizes in {comparison / 'sizes'})"
    )


# ---------------------------------------------------------------- the study, trained once for the tests below


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    """The Shakespeare set at byte level, as configs/ladder.yaml reads it (4 s)."""
    data = tmp_path_factory.mktemp("bytes") / "shakespeare-bytes"
    assert prepare_main(["shakespeare", "--tokenizer", "bytes", "--out", str(data), "--quiet"]) == 0
    return data


@pytest.fixture(scope="module")
def study(tmp_path_factory, byte_level):
    """3 sizes x 2 norm types x 2 seeds of the CPU ladder, swept and compared across sizes (about 30 s)."""
    folder = tmp_path_factory.mktemp("ladder")
    config = CONFIGS / "ladder.yaml"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        render_only(monkeypatch, "scaling.png")
        argv = [str(config), "--sizes", *SIZE_NAMES, "--norm-types", *NORMS, "--seeds", *map(str, SEEDS),
                "--runs-dir", str(folder / "runs"), "--baseline", "pytorch_layernorm",
                "--predict-at", "1M", *smaller(byte_level)]  # fmt: skip
        assert sweep_main(argv) == 0
    torch.set_num_threads(threads)
    out = folder / "runs" / "ladder-comparison"
    return {
        "folder": folder,
        "runs": folder / "runs",
        "out": out,
        "result": json.loads((out / "comparison.json").read_text()),
    }


def run_dir(study, size, norm, seed):
    return study["runs"] / f"ladder-{size}-{norm.replace('_', '-')}-s{seed}"


def own_losses(study, norm):
    """(seeds, sizes) test losses of ``norm``, read from each run's own evaluation file (not the comparison)."""
    out = []
    for seed in SEEDS:
        row = []
        for size in SIZE_NAMES:
            run = RunDir(run_dir(study, size, norm, seed))
            row.append(read_eval_result(run.checkpoint("final"), "test", "fp32")["loss"])
        out.append(row)
    return np.array(out)


def own_scale(study, size):
    summary = json.loads((run_dir(study, size, NORMS[0], 0) / "summary.json").read_text())
    return summary


@pytest.mark.slow
def test_each_size_trains_its_own_parameters_times_tokens_per_param(study):
    for size in SIZE_NAMES:
        for norm in NORMS:
            config = yaml.safe_load((run_dir(study, size, norm, 1) / "config.yaml").read_text())
            assert config["train"]["tokens_per_param"] == TOKENS_PER_PARAM and config["model"]["context_length"] == 64
            assert {k: config["model"][k] for k in ("size", "n_layers", "d_model", "n_heads")} == {
                "size": size, **SIZES[size].settings()}  # fmt: skip
            summary = json.loads((run_dir(study, size, norm, 1) / "summary.json").read_text())
            n = summary["n_params_outside_norms"]
            assert summary["total_steps"] == math.ceil(TOKENS_PER_PARAM * n / TOKENS_PER_STEP)
            assert summary["status"] == "completed"
    counts = [own_scale(study, s)["n_params_outside_norms"] for s in SIZE_NAMES]
    assert counts == sorted(counts) and counts[-1] > 8 * counts[0]
    sizes = study["result"]["sizes"]
    assert [s["size"] for s in sizes] == SIZE_NAMES and [s["n_params"] for s in sizes] == counts
    for s in sizes:
        summary = own_scale(study, s["size"])
        assert s["tokens"] == summary["total_steps"] * TOKENS_PER_STEP
        assert s["flops"] == summary["flops_per_token"] * s["tokens"]
        each = json.loads((study["out"] / "sizes" / s["size"] / "comparison.json").read_text())
        assert [g["group"] for g in each["groups"]] == NORMS and all(g["n_evaluated"] == 2 for g in each["groups"])


@pytest.mark.slow
def test_the_fits_are_direct_least_squares_on_the_runs_own_test_losses(study):
    sizes = study["result"]["sizes"]
    n = np.array([s["n_params"] for s in sizes], float)
    flops = np.array([s["flops"] for s in sizes], float)
    for norm in NORMS:
        losses = own_losses(study, norm)
        fits = study["result"]["norms"][norm]
        for fit, x in ((fits["fit_n_params"], n), (fits["fit_flops"], flops)):
            assert fit["form"] == "power" and fit["sizes"] == SIZE_NAMES  # 3 sizes: E not identified
            slope, intercept = np.polyfit(np.log(x), np.log(losses.mean(0)), 1)
            assert fit["alpha"]["mean"] == pytest.approx(-slope, rel=1e-9)
            assert fit["A"] == pytest.approx(math.exp(intercept), rel=1e-9)
            seeds = [-np.polyfit(np.log(x), np.log(losses.mean(0)) + (row - losses.mean(0)) / losses.mean(0), 1)[0]
                     for row in losses]  # each seed's linearised alpha  # fmt: skip
            assert fit["alpha"]["se"] == pytest.approx(np.std(seeds, ddof=1) / math.sqrt(2), rel=1e-6)
            assert fit["alpha"]["method"] == "seed by seed" and fit["alpha"]["df"] == 1
        predicted = fits["fit_n_params"]["predicted"]
        slope, intercept = np.polyfit(np.log(n), np.log(losses.mean(0)), 1)
        assert predicted["mean"] == pytest.approx(math.exp(intercept) * 1e6**slope, rel=1e-9)
        assert predicted["at"] == 1e6 and predicted["extrapolation"] is True  # beyond 3x48's ~0.1M
        assert predicted["low"] < predicted["mean"] < predicted["high"]
    md = (study["out"] / "comparison.md").read_text()
    assert "predicted test loss at N = 1M by log(L - E0) = log A - alpha*log N: " in md
    assert "(an extrapolation beyond the sizes fitted; the interval is over seeds for this form and does not " in md


@pytest.mark.slow
def test_the_gaps_trend_is_a_direct_regression_on_the_paired_differences(study):
    gaps = own_losses(study, "no_norm") - own_losses(study, "pytorch_layernorm")  # (seeds, sizes), paired by seed
    n = np.array([s["n_params"] for s in study["result"]["sizes"]], float)
    trend = study["result"]["norms"]["no_norm"]["trend"]
    assert trend["mean"] == pytest.approx(np.polyfit(np.log10(n), gaps.mean(0), 1)[0], rel=1e-9)
    per_seed = [np.polyfit(np.log10(n), g, 1)[0] for g in gaps]
    assert trend["se"] == pytest.approx(np.std(per_seed, ddof=1) / math.sqrt(2), rel=1e-9)
    assert study["result"]["norms"]["pytorch_layernorm"]["trend"] is None  # the baseline
    points = study["result"]["norms"]["no_norm"]["points"]
    assert [p["gap"]["diff"] for p in points] == pytest.approx(list(gaps.mean(0)), rel=1e-9)  # each size's, as today
    md = (study["out"] / "comparison.md").read_text()
    verdict = trend["verdict"]
    assert verdict.startswith(("the gap grows with size: ", "the gap shrinks with size: ", "no trend detected: "))
    assert f"  - {verdict}" in md and verdict.endswith("3 sizes, seed by seed)")
    assert (study["out"] / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def copy_runs(study, tmp_path, edit=None, sizes=SIZE_NAMES):
    """Copies of the study's runs (``edit(config dict, run name)`` changes each one's config.yaml)."""
    import shutil

    paths = []
    for size in sizes:
        for norm in NORMS:
            for seed in SEEDS:
                src = run_dir(study, size, norm, seed)
                dst = tmp_path / src.name
                shutil.copytree(src, dst)
                if edit is not None:
                    config = yaml.safe_load((dst / "config.yaml").read_text())
                    edit(config, dst.name)
                    (dst / "config.yaml").write_text(yaml.safe_dump(config))
                paths.append(dst)
    return paths


@pytest.mark.slow
def test_sizes_that_differ_in_anything_else_are_refused_naming_the_key(study, tmp_path):
    def other_decay(config, name):
        if "-3x48-" in name:
            config["optim"]["weight_decay"] = 0.05

    paths = copy_runs(study, tmp_path / "runs", other_decay)
    with pytest.raises(UserError) as e:
        compare_sizes(paths, tmp_path / "out", "pytorch_layernorm", plots=False)
    message = str(e.value)
    assert message.startswith("these runs differ in more than the norm, the seeds and the size, so a difference ")
    assert "optim.weight_decay: 0.1 (ladder-1x16-" in message and "; 0.05 (ladder-3x48-" in message
    assert "model.d_model" not in message and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_runs_without_a_size_are_refused(study, tmp_path):
    def unsized(config, name):
        if name.endswith("no-norm-s1"):
            config["model"]["size"] = None

    paths = copy_runs(study, tmp_path / "runs", unsized, sizes=["1x16"])
    with pytest.raises(UserError, match=r"needs every run's model.size .*; ladder-1x16-no-norm-s1 have none: train"):
        compare_sizes(paths, tmp_path / "out", plots=False)


@pytest.mark.slow
def test_a_fit_with_fewer_sizes_than_it_needs_says_so_instead_of_a_number(study, tmp_path, capsys):
    paths = [str(run_dir(study, s, norm, seed)) for s in SIZE_NAMES for norm in NORMS for seed in SEEDS]
    out = tmp_path / "saturating"
    argv = [*paths, "--across-sizes", "--form", "saturating", "--out", str(out), "--no-plots", "--predict-at", "1M"]
    assert compare_main(argv) == 0
    printed = capsys.readouterr().out
    fit = json.loads((out / "comparison.json").read_text())["norms"]["no_norm"]["fit_n_params"]
    assert "alpha" not in fit and "predicted" not in fit
    assert fit["not_fitted"].startswith("not fitted: E + A*N^-alpha has 3 parameters and these runs have 3 sizes "
                                        "(1x16, 2x32, 3x48): it needs 4 or more")  # fmt: skip
    assert f"- **no_norm** against N (E + A*N^-alpha): {fit['not_fitted']}" in printed
    one = tmp_path / "one"
    assert compare_main([*paths[:4], "--across-sizes", "--out", str(one), "--no-plots"]) == 0
    result = json.loads((one / "comparison.json").read_text())
    assert result["norms"]["no_norm"]["fit_n_params"]["not_fitted"].startswith(
        "not fitted: log(L - E0) = log A - alpha*log N has 2 parameters and these runs have 1 size (1x16): it needs 2"
    )
    assert result["norms"]["no_norm"]["trend"]["verdict"] == (
        "no trend: no_norm is paired with pytorch_layernorm at 1 size(s); it needs 2 or more"
    )
    with pytest.raises(SystemExit) as e:
        compare_main([*paths, "--predict-at", "1M", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--predict-at predicts from a fit across sizes: add --across-sizes" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as e:
        compare_main([*paths, "--form", "power", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "--form and --irreducible fit a curve: add --across-sizes, or --ladder" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_rate_chosen_per_size_is_the_one_each_size_fits(byte_level, tmp_path, monkeypatch, capsys):
    """--sizes with --lrs: each size chooses each norm type's rate on validation (its own comparison's selection),
    and the fit across sizes is of the chosen rates' runs, said optimistic."""
    render_only(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = tmp_path / "runs"
    argv = [str(CONFIGS / "ladder.yaml"), "--sizes", "1x16", "2x32", "--norm-types", *NORMS, "--seeds", "0", "1",
            "--lrs", "1e-2", "3e-2", "--runs-dir", str(runs), "--baseline", "pytorch_layernorm",
            *smaller(byte_level), "--set", "train.tokens_per_param=1"]  # fmt: skip
    try:
        assert sweep_main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    result = json.loads((runs / "ladder-comparison" / "comparison.json").read_text())
    assert [s["size"] for s in result["sizes"]] == ["1x16", "2x32"]
    for s in result["sizes"]:
        own = json.loads((runs / "ladder-comparison" / "sizes" / s["size"] / "comparison.json").read_text())
        chosen = {f["family"]: f["chosen_value"] for f in own["selection"]["families"]}
        assert s["chosen_rates"] == chosen and set(chosen) == set(NORMS) and set(chosen.values()) <= {1e-2, 3e-2}
        for norm in NORMS:
            point = next(p for p in result["norms"][norm]["points"] if p["size"] == s["size"])
            assert point["group"] == f"{norm}, optim.lr={chosen[norm]}"
            lr = "1e-2" if chosen[norm] == 1e-2 else "3e-2"
            losses = [
                read_eval_result(RunDir(runs / f"ladder-{s['size']}-{norm.replace('_', '-')}-lr{lr}-s{seed}")
                                 .checkpoint("final"), "test", "fp32")["loss"]
                for seed in (0, 1)
            ]  # fmt: skip
            assert point["mean"] == pytest.approx(np.mean(losses), rel=1e-12)
    assert "learning rate was chosen on validation loss at each size" in printed
    assert "every interval here is optimistic by that choice" in printed


@pytest.mark.slow
def test_a_baseline_that_changes_with_size_is_refused(study, tmp_path):
    """Without the baseline's runs at one size, the default rule would choose another norm type there: refused,
    naming each size's; a size its comparison refuses is named too."""
    paths = [run_dir(study, s, n, seed) for s in SIZE_NAMES for n in NORMS for seed in SEEDS]
    missing = [p for p in paths if not p.name.startswith("ladder-3x48-pytorch")]
    with pytest.raises(UserError) as e:
        compare_sizes(missing, tmp_path / "out", plots=False)
    assert str(e.value) == (
        "the baseline is another norm type at another size (1x16: pytorch_layernorm, 2x32: pytorch_layernorm, "
        "3x48: no_norm): give --baseline NORM_TYPE, one that every size has"
    )
    with pytest.raises(UserError, match=r"^model.size 3x48: --baseline 'pytorch_layernorm' is not a group; groups: "):
        compare_sizes(missing, tmp_path / "out2", "pytorch_layernorm", plots=False)


@pytest.mark.slow
def test_the_size_ladder_s_effective_speedup_is_read_off_the_baseline_s_curve_against_flops(study):
    """At each size, no_norm's ES over pytorch_layernorm from the log-log line of the baseline's mean losses
    against its training FLOPs (numpy's polyfit on the runs' own losses and summaries, not the module's code)."""
    s = study["result"]["effective_speedup"]
    assert s["route"] == "size ladder" and s["form"] == "power" and s["baseline"] == "pytorch_layernorm"
    flops = np.array([own_scale(study, size)["flops_per_token"] for size in SIZE_NAMES], float)
    flops *= np.array([own_scale(study, size)["total_steps"] * TOKENS_PER_STEP for size in SIZE_NAMES])
    base, variant = own_losses(study, "pytorch_layernorm").mean(0), own_losses(study, "no_norm").mean(0)
    slope, intercept = np.polyfit(np.log(flops), np.log(base), 1)
    for i, size in enumerate(SIZE_NAMES):
        got = s["norms"][f"no_norm at {size}"]
        log_es = (math.log(variant[i]) - math.log(base[i])) / slope  # both read off the line: anchored
        assert math.log(got["compute"]["es"]) == pytest.approx(log_es, abs=1e-9)
        assert got["pair"] == f"pytorch_layernorm at {size}"
    md = (study["out"] / "comparison.md").read_text()
    assert "## Effective speedup" in md and "(size ladder: its sizes;" in md
    for i, size in enumerate(SIZE_NAMES):  # every mean in bits per byte too: byte-level tokens, one byte each or none
        test = json.loads((study["out"] / "sizes" / size / "comparison.json").read_text())["test_range"]
        point = study["result"]["norms"]["no_norm"]["points"][i]
        expected = variant[i] * test["targets_scored"] / (test["bytes_scored"] * math.log(2))
        assert point["mean_bits_per_byte"] == pytest.approx(expected, rel=1e-9)
        assert f"| no_norm | {size} | no_norm | 2 | {variant[i]:.6f} | {expected:.4f} |" in md
    assert "- no_norm at 1x16 reaches its test loss with" in md
