"""The learning rate: the warmup is what its words say."""

import math

import pytest

from gpt.config import OptimConfig
from gpt.schedule import lr_at, warmup_steps


def test_warmup_starts_at_lr_over_w_and_peaks_at_its_last_step():
    lr, min_lr, total = 1.4e-3, 1.4e-4, 200
    w = warmup_steps(total, 0.05)
    assert w == 10
    at = [lr_at(s, total, lr=lr, min_lr=min_lr, warmup_frac=0.05) for s in range(total)]
    assert at[0] == pytest.approx(lr / w) and at[0] > 0  # the first update is not at lr 0
    assert at[:w] == pytest.approx([lr * (s + 1) / w for s in range(w)])  # linear
    assert at[w - 1] == pytest.approx(lr) and at[w] == pytest.approx(lr)  # the peak, then the cosine from it
    assert at[-1] == pytest.approx(min_lr) and all(a >= b for a, b in zip(at[w:], at[w + 1:]))
    assert at[100] == pytest.approx(min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (100 - w) / (total - 1 - w))))


def test_the_words_say_what_the_code_does():
    import dataclasses

    import gpt.schedule

    doc = next(f for f in dataclasses.fields(OptimConfig) if f.name == "warmup_frac").metadata["doc"]
    assert "lr x (s + 1) / W" in doc and "first step uses lr / W" in doc and "from 0" not in doc
    assert "lr * (s + 1) / W" in gpt.schedule.__doc__ and "from 0" not in gpt.schedule.__doc__
