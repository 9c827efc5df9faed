"""The fits across sizes (gpt.analysis.scaling) against direct computations: scipy's curve_fit and numpy's
polyfit for the fits, numerical derivatives for the delta method's sensitivities, polyfit seed by seed for the
trend; and what is said instead of a number where a form cannot be fitted."""

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as scipy_stats

from gpt.analysis import across_sizes, scaling

N = np.array([1.2e4, 4.4e4, 1.1e5, 3.0e5, 8.0e5])
E0, A0, ALPHA0 = 1.5, 25.0, 0.25


def losses_at(n, seeds=3, sd=0.01, seed=0):
    """(1, seeds, sizes) losses around E0 + A0 n^-ALPHA0."""
    rng = np.random.default_rng(seed)
    return (E0 + A0 * n**-ALPHA0 + rng.normal(0, sd, (seeds, len(n))))[None]


def test_the_saturating_fit_is_scipys_least_squares_on_the_means():
    losses = losses_at(N)
    fit = scaling.first(scaling.fit_many(N, losses, "saturating", predict_at=1.24e8))
    means = losses[0].mean(0)
    (e, a, alpha), _ = optimize.curve_fit(lambda n, e, a, al: e + a * n**-al, N, means, p0=[1, 10, 0.3], maxfev=50_000)
    assert fit["E"] == pytest.approx(e, rel=1e-6)
    assert fit["A"] == pytest.approx(a, rel=1e-5)
    assert fit["alpha"]["mean"] == pytest.approx(alpha, rel=1e-6)
    assert fit["predicted"]["mean"] == pytest.approx(e + a * 1.24e8**-alpha, rel=1e-7)
    assert fit["fitted"] == pytest.approx(list(e + a * N**-alpha), rel=1e-7)
    assert fit["at_edge"] is False


def test_the_power_fit_is_the_log_log_line_of_the_reducible_loss():
    losses = losses_at(N[:3])
    for e0 in (0.0, 1.0):
        fit = scaling.first(scaling.fit_many(N[:3], losses, "power", irreducible=e0, predict_at=1e6))
        slope, intercept = np.polyfit(np.log(N[:3]), np.log(losses[0].mean(0) - e0), 1)
        assert fit["alpha"]["mean"] == pytest.approx(-slope, rel=1e-9)
        assert fit["A"] == pytest.approx(math.exp(intercept), rel=1e-9)
        assert fit["E"] == e0
        assert fit["predicted"]["mean"] == pytest.approx(e0 + math.exp(intercept) * 1e6**slope, rel=1e-9)


def numerical_gradient(form, x, means, quantity, step=1e-4):
    """d quantity / d means by central differences of the whole fit (the delta method's c, computed directly); a
    step of 1e-4: alpha is found to ~1e-9 (the sum of squares is flat at its minimum), so a smaller step is noise."""
    grad = []
    for s in range(len(means)):
        up, down = means.copy(), means.copy()
        up[s] += step
        down[s] -= step
        grad.append((quantity(scaling.fit_many(x, up[None, None], form)) - quantity(
            scaling.fit_many(x, down[None, None], form))) / (2 * step))  # fmt: skip
    return np.array(grad)[:, 0]


@pytest.mark.parametrize("form", ["saturating", "power"])
def test_the_intervals_are_the_t_intervals_of_each_seeds_combination(form):
    """The delta method seed by seed, directly: c from numerical derivatives of the fit, each seed's c . losses,
    Student's t over the seeds."""
    x = N if form == "saturating" else N[:3]
    losses = losses_at(x, seeds=4, sd=0.003)
    fit = scaling.first(scaling.fit_many(x, losses, form))
    c = numerical_gradient(form, x, losses[0].mean(0), lambda f: f["alpha"]["mean"])
    q = losses[0] @ c  # one value per seed
    se = q.std(ddof=1) / 2
    assert fit["alpha"]["se"] == pytest.approx(se, rel=2e-3)  # Gauss-Newton: exact at a perfect fit, close here
    assert fit["alpha"]["df"] == 3 and fit["alpha"]["method"] == scaling.SEED_BY_SEED
    half = scipy_stats.t.ppf(0.975, 3) * fit["alpha"]["se"]
    assert fit["alpha"]["low"] == pytest.approx(fit["alpha"]["mean"] - half, rel=1e-12)


def test_a_missing_run_takes_the_sizes_one_by_one():
    losses = losses_at(N, seeds=3)
    losses[0, 2, 1] = np.nan  # seed 2 has no loss at the second size
    fit = scaling.first(scaling.fit_many(N, losses, "saturating"))
    assert fit["alpha"]["method"] == scaling.BY_SIZE
    assert fit["means"][1] == pytest.approx(losses[0, :2, 1].mean(), rel=1e-12)  # the two seeds that ran
    c = numerical_gradient("saturating", N, np.nanmean(losses[0], 0), lambda f: f["alpha"]["mean"])
    n = np.array([3, 2, 3, 3, 3])
    terms = c**2 * np.nanvar(losses[0], 0, ddof=1) / n
    assert fit["alpha"]["se"] == pytest.approx(math.sqrt(terms.sum()), rel=2e-3)
    assert fit["alpha"]["df"] == pytest.approx(terms.sum() ** 2 / (terms**2 / (n - 1)).sum(), rel=5e-3)


def test_the_trend_is_the_slope_of_the_gap_against_log10_n_seed_by_seed():
    rng = np.random.default_rng(4)
    gaps = 0.02 + 0.01 * np.log10(N) + rng.normal(0, 0.004, (3, len(N)))
    trend = scaling.first(scaling.trend_many(N, gaps[None]))
    assert trend["mean"] == pytest.approx(np.polyfit(np.log10(N), gaps.mean(0), 1)[0], rel=1e-10)
    per_seed = [np.polyfit(np.log10(N), g, 1)[0] for g in gaps]
    assert trend["se"] == pytest.approx(np.std(per_seed, ddof=1) / math.sqrt(3), rel=1e-10)
    assert trend["df"] == 2
    expected = scipy_stats.ttest_1samp(per_seed, 0.0)
    assert trend["p"] == pytest.approx(expected.pvalue, rel=1e-8)


def test_a_form_with_too_few_sizes_says_so_instead_of_a_number():
    assert scaling.chosen_form("auto", 3) == "power" and scaling.chosen_form("auto", 4) == "saturating"
    assert scaling.not_fitted("saturating", ["1x16", "2x32", "3x48"]) == (
        "not fitted: E + A*N^-alpha has 3 parameters and these runs have 3 sizes (1x16, 2x32, 3x48): it needs 4 or "
        "more (one more than its parameters: three sizes fit any such curve exactly, so E is not identified); the "
        "log-log line of L - E0 (--form power) needs 2"
    )
    assert scaling.not_fitted("power", ["2x32"]) == (
        "not fitted: log(L - E0) = log A - alpha*log N has 2 parameters and these runs have 1 size (2x32): it needs "
        "2 or more (a line needs two points)"
    )
    assert scaling.not_fitted("power", ["1x16", "2x32"]) is None


def test_parameter_counts_read_as_written():
    assert [scaling.parse_count(t) for t in ("124M", "1.5B", "350k", "2e9", "7")] == [124e6, 1.5e9, 350e3, 2e9, 7.0]
    for bad in ("", "M", "-3M", "abc", "nan"):
        with pytest.raises(ValueError, match="expected a positive count such as 124M"):
            scaling.parse_count(bad)


def points_of(e, seeds=3):
    """Four sizes' points as a comparison across sizes holds them, losses from e + 25 N^-0.25 with seed noise."""
    losses = (e + A0 * N[:4] ** -ALPHA0)[None] + np.random.default_rng(5).normal(0, 0.002, (seeds, 4))
    return [
        {"size": f"s{i}", "n_params": float(n), "flops": None, "losses": {str(k): losses[k, i] for k in range(seeds)}}
        for i, n in enumerate(N[:4])
    ]


def test_auto_keeps_the_saturating_form_only_where_it_identifies_e():
    kept = across_sizes._fit(points_of(1.5), "n_params", "auto", 0.0, None)
    assert kept["form"] == "saturating" and kept["E"] == pytest.approx(1.5, abs=0.05)
    assert "instead_of_saturating" not in kept and "warning" not in kept
    fell = across_sizes._fit(points_of(-0.5), "n_params", "auto", 0.0, None)
    assert fell["form"] == "power" and fell["alpha"]["mean"] > 0
    assert fell["instead_of_saturating"].startswith("E + A*N^-alpha puts E at -0.5")
    assert fell["instead_of_saturating"].endswith(": these sizes do not show the loss levelling off")
    asked = across_sizes._fit(points_of(-0.5), "n_params", "saturating", 0.0, None)
    assert asked["form"] == "saturating" and asked["E"] < 0 and asked["warning"] == fell["instead_of_saturating"]
    line = across_sizes._fit_line(asked)
    assert line.endswith(f"; but {asked['warning']}")
    assert across_sizes._fit(points_of(1.5), "flops", "auto", 0.0, None)["not_fitted"].startswith(
        "not fitted: log(L - E0) = log A - alpha*log N has 2 parameters and these runs have 0 sizes (none)"
    )  # no FLOPs recorded


def test_a_size_with_one_seed_is_left_out_and_named_not_a_silent_nan():
    points = points_of(1.5, seeds=2)
    del points[2]["losses"]["1"]
    points[2]["absent"] = {"1": "ln-1x16-s1: diverged at step 40"}
    fit = across_sizes._fit(points, "n_params", "power", 0.0, 1e6)
    assert fit["sizes"] == ["s0", "s1", "s3"] and math.isfinite(fit["alpha"]["low"])
    assert math.isfinite(fit["predicted"]["low"]) and fit["predicted"]["low"] < fit["predicted"]["high"]
    assert fit["left_out"] == [
        "s2 left out: it has 1 seed(s), no spread; it lacks seed 1 (ln-1x16-s1: diverged at step 40)"
    ]
    for p in points:
        p["gaps"] = {k: v - 3.0 for k, v in p["losses"].items()}
    trend = across_sizes._trend(points, "rms", "ln")
    assert trend["sizes"] == ["s0", "s1", "s3"] and math.isfinite(trend["low"])
    assert trend["verdict"].endswith("; s2 left out: it has 1 seed(s), no spread; it lacks seed 1 (ln-1x16-s1: "
                                     "diverged at step 40)")  # fmt: skip
    one_seed = points_of(1.5, seeds=1)
    for p in one_seed:
        p["gaps"] = {"0": p["losses"]["0"] - 3.0}
    assert "(one seed at every size)" in across_sizes._trend(one_seed, "rms", "ln")["verdict"]


def comparison_of(size, n, losses):
    """One size's comparison as compare() leaves it: two norm types (group = norm), runs by seed; a None loss is
    a run left out (diverged)."""
    groups = []
    for norm, by_seed in losses.items():
        runs = [{"status": "completed", "seed": k, "test_loss": v, "path": f"runs/{norm}-{size}-s{k}"}
                for k, v in by_seed.items() if v is not None]  # fmt: skip
        left = [{"seed": k, "path": f"runs/{norm}-{size}-s{k}", "reason": "diverged (non-finite loss at step 7)"}
                for k, v in by_seed.items() if v is None]  # fmt: skip
        groups.append({"group": norm, "values": {"model.norm_type": norm}, "runs": runs, "left_out": left,
                       "vs_baseline": None})  # fmt: skip
    return {"size": size, "n_params": n, "tokens": 20 * n, "flops": None, "folder": f"sizes/{size}",
            "comparison": {"baseline": "ln", "groups": groups, "shared": {}}}  # fmt: skip


def test_a_nan_loss_and_a_norm_type_with_no_run_at_a_size_are_named_not_fitted():
    sizes = [comparison_of(f"s{i}", float(n), {"ln": {"0": 3.0 - i / 10, "1": 3.01 - i / 10},
                                               "none": {"0": 3.2 - i / 10, "1": 3.22 - i / 10}})
             for i, n in enumerate(N[:4])]  # fmt: skip
    sizes[1]["comparison"]["groups"][1]["runs"][1]["test_loss"] = math.nan
    sizes[3] = comparison_of("s3", float(N[3]), {"ln": {"0": 2.7, "1": 2.71}, "none": {"0": None, "1": None}})
    result = across_sizes._result(sizes, None, "power", 0.0)
    none = result["norms"]["none"]
    assert [p["size"] for p in none["points"]] == ["s0", "s1", "s2"]
    assert none["points"][1]["losses"] == {"0": pytest.approx(3.1)}  # the NaN is no loss, and fits nothing
    assert none["fit_n_params"]["left_out"] == [
        "s1 left out: it has 1 seed(s), no spread; it lacks seed 1 (none-s1-s1: test loss nan)"
    ]
    assert none["sizes_without"] == [
        "s3 left out: no run with a finite test loss (seed 0: none-s3-s0: diverged (non-finite loss at step 7); "
        "seed 1: none-s3-s1: diverged (non-finite loss at step 7))"
    ]
    md = across_sizes.markdown(result)
    assert md.count("s3 left out: no run with a finite test loss") == 2  # under its fit and under its trend
    assert "s1 left out: it has 1 seed(s)" in md and "nan" not in md.replace("test loss nan", "")
    assert result["mixed_shapes"] is None and "Not one ladder" not in md
    for s, name in zip(sizes, ("1x16", "2x32", "3x48", "1x64")):  # runs trained before sweeps refused such ladders
        s["size"] = name
    md = across_sizes.markdown(across_sizes._result(sizes, None, "power", 0.0))
    assert ("**Not one ladder:** the sizes mix aspect ratios (d_model/n_layers 16: 1x16 2x32 3x48; d_model/n_layers "
            "64: 1x64): one curve across them mixes the shape's effect with the size's") in md  # fmt: skip


def test_the_prediction_names_its_form_and_shows_the_other_where_they_disagree():
    fit = across_sizes._fit(points_of(1.5), "n_params", "auto", 0.0, 1e9)
    assert fit["form"] == "saturating" and fit["other_form"]["form"] == "power"
    lines = across_sizes._prediction_lines(fit)
    assert lines[0].startswith("  - predicted test loss at N = 1B by E + A*N^-alpha: ")
    assert lines[0].endswith("(an extrapolation beyond the sizes fitted; the interval is over seeds for this form "
                             "and does not cover the choice of form)")  # fmt: skip
    other = fit["other_form"]["predicted"]
    assert other["high"] < fit["predicted"]["low"]  # the line through L (E0 = 0) falls far below E = 1.5 at 1B
    assert lines[1].startswith("  - **the forms disagree**: log(L - E0) = log A - alpha*log N predicts ")
    fit["other_form"]["predicted"] = {**other, "high": fit["predicted"]["low"]}  # intervals that touch: agree
    assert len(across_sizes._prediction_lines(fit)) == 1


def test_a_form_and_an_irreducible_loss_that_cannot_go_together_are_refused(tmp_path):
    import argparse

    from gpt.common.errors import UserError

    with pytest.raises(UserError, match=r"^--irreducible 1 with --form saturating: E \+ A\*N\^-alpha fits its own E; "
                       "drop --irreducible, or fit the log-log line of L - E0 with --form power$"):  # fmt: skip
        across_sizes.compare_sizes([tmp_path / "a-run"], tmp_path / "out", form="saturating", irreducible=1.0)
    assert not (tmp_path / "out").exists()
    parser = argparse.ArgumentParser()
    scaling.add_arguments(parser)
    for bad in ("nan", "-1", "inf", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--irreducible", bad])
    assert parser.parse_args(["--irreducible", "1.2"]).irreducible == 1.2
    assert parser.parse_args([]).irreducible is None
