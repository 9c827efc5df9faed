"""AdamW's weight-decay groups and the update skipped on a non-finite gradient."""

import pytest
import torch

from gpt.config import OptimConfig
from gpt.model.gpt import GPT
from gpt.model.norms import NORM_MODULES, NORM_TYPES
from gpt.training.optimizer import make_optimizer, step_unless_nonfinite


def by_module_type(model):
    """The rule the groups used to follow: norm-layer parameters and biases are not decayed."""
    norm_ids = {id(p) for m in model.modules() if isinstance(m, NORM_MODULES) for p in m.parameters()}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if id(p) in norm_ids or name.endswith("bias") else decay).append(p)
    return decay, no_decay


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("shape", [dict(), dict(qkv_bias=True, tie_weights=True)])
def test_decay_by_shape_gives_the_module_type_groups(tiny_model_cfg, norm_type, shape):
    model = GPT(tiny_model_cfg(norm_type=norm_type, **shape))
    groups = make_optimizer(model, OptimConfig(weight_decay=0.1, decay_norms_and_biases=False)).param_groups
    decay, no_decay = by_module_type(model)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert [id(p) for p in groups[0]["params"]] == [id(p) for p in decay]
    assert [id(p) for p in groups[1]["params"]] == [id(p) for p in no_decay]
    assert len(no_decay) > 0  # biases at least: the groups are not trivially empty
    everything = make_optimizer(model, OptimConfig(weight_decay=0.1)).param_groups
    assert len(everything) == 1 and len(everything[0]["params"]) == len(list(model.parameters()))


def test_nonfinite_gradient_skips_the_update_and_says_so():
    torch.manual_seed(0)
    w = torch.nn.Linear(4, 4)
    opt = make_optimizer(w, OptimConfig(lr=0.1))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    before = [p.detach().clone() for p in w.parameters()]
    for p in w.parameters():
        p.grad = torch.full_like(p, float("nan"))
    skipped = step_unless_nonfinite(opt, scaler, torch.tensor(float("nan")))
    assert skipped.item() is True
    assert all(torch.equal(a, b) for a, b in zip(before, w.parameters()))  # nothing moved, no NaN written
    assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")  # the hook is set for one call only
    for p in w.parameters():
        p.grad = torch.ones_like(p)
    assert step_unless_nonfinite(opt, scaler, torch.tensor(2.0)).item() is False
    assert not any(torch.equal(a, b) for a, b in zip(before, w.parameters()))  # a finite step updates
