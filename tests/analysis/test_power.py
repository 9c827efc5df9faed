"""A study's power before it runs (gpt.analysis.power) against simulations of the tests the comparison runs:
the gap's trend by gpt.analysis.scaling.trend_many and the difference at one size by stats.difference_many, on
seeded normal noise, vectorised; and sweep.py --plan's lines, noise sources and refusals."""

import json
import math
import re

import numpy as np
import pytest

from gpt.analysis import power, scaling, stats
from gpt.common.errors import UserError

GPU_SIZES = [13_391_616, 29_145_600, 49_621_248, 77_177_856, 162_971_136]  # 2x128 ... 12x768 (sweep.py --plan)
CPU_SIZES = [3_328, 13_824, 31_680, 56_832]  # an illustrative 4-rung ladder
REPLICATES = 40_000  # the simulated power's sd <= 0.25 pp at 80%: 3 pp is 12 of them


def simulated_trend_power(n, seeds, sd, slope, seed):
    """The share of replicates whose trend_many interval excludes 0, with gaps slope * log10 N + normal noise."""
    rng = np.random.default_rng(seed)
    x = np.log10(np.asarray(n, float))
    gaps = slope * (x - x.mean()) + rng.normal(0, sd, (REPLICATES, seeds, len(n)))
    t = scaling.trend_many(np.asarray(n, float), gaps)
    return float(np.mean((t["low"] > 0) | (t["high"] < 0)))


@pytest.mark.parametrize(
    "n, seeds, sd, slope",
    [
        (GPU_SIZES, 3, 0.02, 0.02),  # the GPU study at the default noise: low power
        (CPU_SIZES, 2, 0.01, None),  # at its own 80% trend: the two-seed ladder
        (GPU_SIZES[:3], 5, 0.03, 0.05),  # three sizes, five seeds
    ],
)
def test_the_printed_trend_power_is_the_simulated_trend_tests(n, seeds, sd, slope):
    p = power.plan(sd, seeds, n, detect_trend=slope)["trend"]
    if slope is None:
        slope = p["resolvable"]
        p = power.plan(sd, seeds, n, detect_trend=slope)["trend"]
        assert p["power"] == pytest.approx(0.80, abs=1e-6)
    simulated = simulated_trend_power(n, seeds, sd, slope, seed=seeds)
    assert abs(p["power"] - simulated) <= 0.03, (p["power"], simulated)
    assert 0.05 < p["power"] < 0.95  # a design where power is a question


def test_the_seeds_needed_reach_the_target_and_one_fewer_does_not():
    p = power.plan(0.02, 3, GPU_SIZES, detect=0.01, detect_trend=0.02)
    for q in (p["difference"], p["trend"]):
        k = q["seeds_needed"]
        assert (
            power.question(q["sd"], k, q["detect"])["power"]
            >= 0.80
            > power.question(q["sd"], k - 1, q["detect"])["power"]
        )
    d = p["difference"]
    rng = np.random.default_rng(7)
    a = 3.0 + d["resolvable"] + rng.normal(0, 0.02, (REPLICATES, 3))
    est = stats.difference_many(a, np.full_like(a, 3.0))
    assert abs(float(np.mean((est["low"] > 0) | (est["high"] < 0))) - 0.80) <= 0.03  # the paired t it plans for
    assert p["trend"]["sd"] == pytest.approx(
        0.02 * math.sqrt(1 / ((np.log10(GPU_SIZES) - np.log10(GPU_SIZES).mean()) ** 2).sum())
    )


def test_the_noise_is_read_from_a_named_comparison(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    (one / "comparison.json").write_text(json.dumps({"groups": [
        {"group": "ln", "vs_baseline": None},
        {"group": "rms", "vs_baseline": {"method": "paired", "sd": 0.013}},
        {"group": "none", "vs_baseline": {"method": "paired", "sd": 0.031}},
        {"group": "odd", "vs_baseline": {"method": "welch", "sd": 9.0}},
    ]}))  # fmt: skip
    assert power.noise_from(one) == (0.031, f"{one / 'comparison.json'} (none, the noisiest of 2)")
    sizes = tmp_path / "sizes.json"
    gaps = {"s0": {"0": 0.01, "1": 0.03}, "s1": {"0": 0.0, "1": 0.04, "2": 0.02}}
    sizes.write_text(json.dumps({"norms": {"rms": {"points": [{"gaps": g} for g in gaps.values()]}}}))
    pooled = math.sqrt((np.var([0.01, 0.03], ddof=1) * 1 + np.var([0.0, 0.04, 0.02], ddof=1) * 2) / 3)
    assert power.noise_from(sizes)[0] == pytest.approx(pooled)
    for bad, message in (
        (tmp_path / "nowhere", "no comparison.json there; name a comparison folder (compare.py --out)"),
        (tmp_path / "empty.json", "no norm type there has two or more seeds paired with the baseline"),
        (tmp_path / "shape.json", "no norm type there has two or more seeds paired with the baseline"),
        (tmp_path / "norms.json", "no norm type there has two or more seeds paired with the baseline"),
    ):
        (tmp_path / "norms.json").write_text(json.dumps({"norms": {"rms": 5, "ln": {"points": [{"gaps": 3}]}}}))
        (tmp_path / "list.json").write_text("[1, 2]")
        (tmp_path / "empty.json").write_text(json.dumps({"groups": [{"group": "ln", "vs_baseline": None}]}))
        (tmp_path / "shape.json").write_text(json.dumps({"groups": 5}))
        with pytest.raises(UserError, match="^" + re.escape(f"--noise-from {bad}: {message}")):
            power.noise_from(bad)
    with pytest.raises(UserError, match=re.escape("list.json: damaged the comparison (a JSON list, not an object)")):
        power.noise_from(tmp_path / "list.json")


def test_the_gpu_studys_power_in_the_docs_is_the_plans():
    from pathlib import Path

    docs = " ".join((Path(__file__).parents[2] / "docs" / "studies.md").read_text().split())
    p = power.plan(power.DEFAULT_SD, 3, GPU_SIZES, detect=0.01, detect_trend=0.02)
    d, t = p["difference"], p["trend"]
    assert f"a difference of {d['resolvable']:.4f} nats or more at one size" in docs
    assert f"a change in the gap of {t['resolvable']:.4f} nats or more per 10x parameters" in docs
    assert f"detected {t['power']:.0%} of the time ({t['seeds_needed']} seeds reach 80%)" in docs
    assert f"a difference of 0.01 nats at one size {d['power']:.0%} of the time ({d['seeds_needed']} seeds)" in docs


@pytest.mark.parametrize("seeds, sd", [(3, 0.02), (5, 0.01)])
def test_the_planned_interaction_power_is_the_simulated_interaction_tests(seeds, sd):
    """At the smallest interaction the plan says the seeds detect, the comparison's own interaction test
    (``interaction_many``, shared seeds, each level's paired difference of sd ``sd``) rejects 80% of the time."""
    from gpt.analysis.interaction import interaction_many

    p = power.plan(sd, seeds, None, crossed=True)
    delta = p["interaction"]["resolvable"]
    assert delta == pytest.approx(p["difference"]["resolvable"] * math.sqrt(2), rel=1e-6)
    rng = np.random.default_rng(seeds)
    reps = 20000
    d_ref, d_level = rng.normal(0, sd, (reps, seeds)), rng.normal(delta, sd, (reps, seeds))
    zero = np.zeros((reps, seeds))
    rejected = np.mean(interaction_many(d_level, zero, d_ref, zero, shared=True)["p"] < 0.05)
    assert rejected == pytest.approx(stats.POWER, abs=0.015)
    assert any("the interaction with the crossed factor" in line for line in power.lines(p, "given"))
