"""The learning rate: the warmup is what its words say."""

import math

import pytest

from gpt.config import OptimConfig
from gpt.training.schedule import SCHEDULES, lr_at, warmup_steps


def test_warmup_starts_at_lr_over_w_and_peaks_at_its_last_step():
    lr, min_lr, total = 1.4e-3, 1.4e-4, 200
    w = warmup_steps(total, 0.05)
    assert w == 10
    at = [lr_at(s, total, lr=lr, min_lr=min_lr, warmup_frac=0.05) for s in range(total)]
    assert at[0] == pytest.approx(lr / w) and at[0] > 0  # the first update is not at lr 0
    assert at[:w] == pytest.approx([lr * (s + 1) / w for s in range(w)])  # linear
    assert at[w - 1] == pytest.approx(lr) and at[w] == pytest.approx(lr)  # the peak, then the cosine from it
    assert at[-1] == pytest.approx(min_lr) and all(a >= b for a, b in zip(at[w:], at[w + 1 :]))
    assert at[100] == pytest.approx(
        min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (100 - w) / (total - 1 - w)))
    )


def test_the_words_say_what_the_code_does():
    import dataclasses

    import gpt.training.schedule

    doc = next(f for f in dataclasses.fields(OptimConfig) if f.name == "warmup_frac").metadata["doc"]
    assert "lr x (s + 1) / W" in doc and "first step uses lr / W" in doc and "from 0" not in doc
    assert "lr * (s + 1) / W" in gpt.training.schedule.__doc__ and "from 0" not in gpt.training.schedule.__doc__


def test_constant_holds_the_peak_after_the_warmup():
    lr, total = 1e-3, 100
    at = [lr_at(s, total, lr=lr, min_lr=1e-5, warmup_frac=0.1, schedule="constant") for s in range(total)]
    assert at[:10] == pytest.approx([lr * (s + 1) / 10 for s in range(10)])
    assert at[9:] == [lr] * 91  # from the last warmup step to the last step, exactly lr


def test_wsd_is_stable_then_decays_linearly_to_min_lr_over_its_last_fraction():
    lr, min_lr, total = 1e-3, 1e-4, 100
    at = [lr_at(s, total, lr=lr, min_lr=min_lr, warmup_frac=0.1, schedule="wsd", decay_frac=0.2) for s in range(total)]
    assert at[0] == pytest.approx(lr / 10) and at[9] == pytest.approx(lr)  # the shared warmup
    assert at[10:80] == [lr] * 70  # stable up to the decay's start, step 100 - 20 = 80
    # decay: step 80 has taken one of its 20 steps, the last step reaches min_lr
    assert at[80] == pytest.approx(lr + (min_lr - lr) * 1 / 20)
    assert at[80:] == pytest.approx([lr + (min_lr - lr) * (s - 79) / 20 for s in range(80, 100)])
    assert at[-1] == pytest.approx(min_lr) and all(a > b for a, b in zip(at[79:], at[80:]))


def test_cosine_ends_exactly_at_min_lr_and_is_halfway_at_its_midpoint():
    lr, min_lr, total = 1e-3, 1e-4, 101
    w = warmup_steps(total, 0.0)
    assert w == 0
    at = [lr_at(s, total, lr=lr, min_lr=min_lr, warmup_frac=0.0) for s in range(total)]
    assert (
        at[0] == pytest.approx(lr) and at[50] == pytest.approx((lr + min_lr) / 2) and at[100] == pytest.approx(min_lr)
    )


def test_an_unknown_schedule_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=f"unknown schedule 'step'; valid: {', '.join(SCHEDULES)}$"):
        lr_at(50, 100, lr=1e-3, min_lr=0.0, warmup_frac=0.1, schedule="step")


def test_one_step_runs_and_a_warmup_of_the_whole_run_are_defined():
    assert lr_at(0, 1, lr=1e-3, min_lr=1e-4, warmup_frac=0.0) == pytest.approx(1e-3)
    assert lr_at(0, 1, lr=1e-3, min_lr=1e-4, warmup_frac=1.0) == pytest.approx(1e-3)  # W = 1: lr / 1


def test_the_config_reads_the_schedules_from_shapes_source(tmp_path):
    """gpt.config checks optim.schedule without importing this module: it reads SHAPES' keys from its source, so a
    schedule added there is a config choice with no other edit."""
    from gpt.config import schema

    assert schema.SCHEDULES == SCHEDULES
    source = schema.SCHEDULE_REGISTRY.read_text()
    assert source.count("SHAPES = {") == 1
    (tmp_path / "schedule.py").write_text(source.replace("SHAPES = {", 'SHAPES = {"extra": wsd, '))
    assert schema.declared_keys(tmp_path / "schedule.py", "SHAPES") == ("extra", *SCHEDULES)
