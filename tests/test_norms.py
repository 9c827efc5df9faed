"""The hand-rolled norms compute the same functions as PyTorch's, and make_norm builds each type."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.model.norms import NORM_MODULES, NORM_TYPES, DyT, FastLayerNorm, LayerNorm, RMSNorm, make_norm

SHAPES = [(7, 16), (3, 5, 64), (2, 9, 768)]  # (N, D) and (N, L, D), GPT-2's width included


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b|: elementwise error on the scale of the output."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def inputs(shape, dtype, seed, mean=0.0, std=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * std + mean
    w = torch.randn(shape[-1], generator=g)
    b = torch.randn(shape[-1], generator=g)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def with_params(module, w, b=None):
    with torch.no_grad():
        module.weight.copy_(w)
        if b is not None:
            module.bias.copy_(b)
    return module


CASES = [(shape, mean, std) for shape in SHAPES for mean, std in ((0.0, 1.0), (3.0, 2.0))]
TOL = {torch.float32: 1e-6, torch.bfloat16: 2e-2}  # bf16 keeps 8 bits: 2^-8 = 0.4% per rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,mean,std", CASES)
def test_layernorms_match_pytorch(shape, mean, std, dtype):
    x, w, b = inputs(shape, dtype, seed=len(shape) * 100 + int(mean), mean=mean, std=std)
    d = shape[-1]
    ref = F.layer_norm(x, (d,), w, b, eps=1e-5)
    for cls in (LayerNorm, FastLayerNorm):
        out = with_params(cls(d, eps=1e-5).to(dtype), w, b)(x)
        assert out.dtype == dtype and out.shape == x.shape
        assert rel_err(out, ref) < TOL[dtype], cls.__name__
    plain = with_params(LayerNorm(d).to(dtype), w, b)(x)
    fast = with_params(FastLayerNorm(d).to(dtype), w, b)(x)
    assert rel_err(fast, plain) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,mean,std", CASES)
def test_rmsnorm_matches_pytorch(shape, mean, std, dtype):
    x, w, _ = inputs(shape, dtype, seed=len(shape) * 10 + int(mean), mean=mean, std=std)
    d = shape[-1]
    ref = F.rms_norm(x, (d,), w, eps=1e-5)
    out = with_params(RMSNorm(d, eps=1e-5).to(dtype), w)(x)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) < TOL[dtype]


def test_eps_sits_inside_the_square_root():
    # On a near-zero vector eps dominates: x / sqrt(ms + eps), not x / (sqrt(ms) + eps).
    x = torch.full((1, 4), 1e-3)
    out = RMSNorm(4, eps=1e-5)(x)
    expected = 1e-3 / (1e-6 + 1e-5) ** 0.5
    assert out[0, 0].item() == pytest.approx(expected, rel=1e-5)
    assert F.rms_norm(x, (4,), eps=1e-5)[0, 0].item() == pytest.approx(expected, rel=1e-5)


def test_dyt_formula_and_alpha_init():
    x, w, b = inputs((3, 5, 8), torch.float32, seed=1)
    norm = make_norm({"norm_type": "dyt", "d_model": 8, "dyt_alpha_init": 0.7})
    assert isinstance(norm, DyT) and norm.alpha.shape == () and norm.alpha.item() == pytest.approx(0.7)
    with_params(norm, w, b)
    torch.testing.assert_close(norm(x), w * torch.tanh(0.7 * x) + b, rtol=0, atol=0)
    assert make_norm({"norm_type": "dyt", "d_model": 8}).alpha.item() == 0.5
    assert {n for n, _ in norm.named_parameters()} == {"alpha", "weight", "bias"}


class Cfg:  # a config object, as opposed to a dict
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_make_norm_accepts_dict_and_object(norm_type):
    for cfg in (
        {"norm_type": norm_type, "d_model": 12, "norm_eps": 1e-6},
        Cfg(norm_type=norm_type, d_model=12, norm_eps=1e-6),
    ):
        norm = make_norm(cfg)
        assert isinstance(norm, NORM_MODULES)
        assert norm(torch.randn(2, 3, 12)).shape == (2, 3, 12)
        if hasattr(norm, "eps"):
            assert norm.eps == 1e-6
        if norm_type != "no_norm":
            assert norm.weight.shape == (12,)


def test_make_norm_builds_the_documented_classes():
    built = {t: type(make_norm({"norm_type": t, "d_model": 4})) for t in NORM_TYPES}
    assert built == {
        "handrolled_layernorm": LayerNorm,
        "pytorch_layernorm": nn.LayerNorm,
        "handrolled_rmsnorm": RMSNorm,
        "pytorch_rmsnorm": nn.RMSNorm,
        "no_norm": nn.Identity,
        "dyt": DyT,
        "handrolled_layernorm_fast": FastLayerNorm,
    }
    assert not hasattr(make_norm({"norm_type": "handrolled_rmsnorm", "d_model": 4}), "bias")
    assert make_norm({"norm_type": "pytorch_rmsnorm", "d_model": 4}).eps == 1e-5  # the default eps
    # the write-up's dicts name the width emb_dim
    assert make_norm({"norm_type": "pytorch_layernorm", "emb_dim": 6}).normalized_shape == (6,)


def test_unknown_norm_type_names_every_valid_type():
    with pytest.raises(ValueError) as e:
        make_norm({"norm_type": "batchnorm", "d_model": 4})
    msg = str(e.value)
    assert "'batchnorm'" in msg and "\n" not in msg
    for t in NORM_TYPES:
        assert t in msg


def test_norms_draw_no_randomness():
    state = torch.get_rng_state()
    for t in NORM_TYPES:
        make_norm({"norm_type": t, "d_model": 16})
    assert torch.equal(torch.get_rng_state(), state)
