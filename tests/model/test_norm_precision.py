"""The norms' precision under autocast, as CUDA runs it, checked on the CPU.

CUDA autocast runs matmuls in the low dtype and ``layer_norm`` / ``rms_norm`` in fp32 (its fp32 list), so a
PyTorch norm always normalises in fp32, while a hand-rolled norm's mean, variance and square root run in its
input's dtype. On the residual stream (pre, post, the final norm) that input is fp32; QK-norm's q and k and
peri's sublayer outputs are a matmul's bf16. ``model.norm_compute_dtype: float32`` (the default) upcasts those,
so both kinds compute the same function within fp32 rounding; ``input`` leaves the hand-rolled ones in bf16.

CPU autocast's lists differ from CUDA's, so ``CudaAutocast`` applies CUDA's policy to the ops the model runs
(tests/speed/test_cuda.py checks the same under real CUDA autocast on a GPU)."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gpt.model.gpt import GPT, normed
from gpt.model.norms import make_norm

LOW = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, F.scaled_dot_product_attention}  # to bf16
FP32 = {F.layer_norm, F.rms_norm, torch.layer_norm, torch.rms_norm}  # CUDA autocast's fp32 list: to fp32
PAIRS = [("handrolled_layernorm", "pytorch_layernorm"), ("handrolled_rmsnorm", "pytorch_rmsnorm")]


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast's bf16 policy for the model's ops: matmuls' floating inputs cast to bf16, the norms' to fp32,
    every other op in its inputs' dtypes (as autocast's unlisted ops)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        dtype = torch.bfloat16 if func in LOW else torch.float32 if func in FP32 else None
        if dtype is not None:
            cast = lambda a: a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa: E731
            args, kwargs = [cast(a) for a in args], {k: cast(v) for k, v in (kwargs or {}).items()}
        return func(*args, **(kwargs or {}))


def test_the_policy_is_cudas_for_the_ops_it_names():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with CudaAutocast():
        assert F.linear(x, w).dtype == torch.bfloat16
        assert F.layer_norm(x.bfloat16(), (8,)).dtype == torch.float32  # a bf16 input normalised in fp32
        assert (x.bfloat16() + x).dtype == torch.float32  # the residual sum promotes, as under autocast


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_a_bf16_input_is_normalised_alike_by_both_kinds_when_upcast(ours, theirs):
    cfg = {"norm_type": ours, "d_model": 64, "norm_eps": 1e-5}
    g = torch.Generator().manual_seed(0)
    a, b = make_norm(cfg), make_norm({**cfg, "norm_type": theirs})
    with torch.no_grad():
        a.weight.add_(0.3 * torch.randn(64, generator=g))
        b.load_state_dict(a.state_dict())
    x = (3 * torch.randn(8, 128, 64, generator=g) + 1).bfloat16()  # what a matmul writes: QK-norm's q, peri's input
    with torch.no_grad(), CudaAutocast():
        hand_fp32, fused_fp32 = a(x.float()), b(x.float())  # float32: both normalise the same fp32 values
        hand_bf16 = a(x)  # input: the hand-rolled statistics in bf16; PyTorch's upcast by the policy
        fused = b(x)
        upcast = [normed(n, x, upcast=True) for n in (a, b)]
    exact = a.double()(x.double())
    assert (hand_fp32 - fused_fp32).abs().max() < 2e-6 * exact.abs().max()  # fp32 rounding
    assert (fused.double() - exact).abs().max() < 1e-5 * exact.abs().max()
    assert (hand_bf16.double() - exact).abs().max() > 100 * (hand_fp32.double() - exact).abs().max()
    assert upcast[0].dtype == upcast[1].dtype == torch.bfloat16  # returned in the input's dtype
    assert (upcast[0] != upcast[1]).float().mean() < 0.01  # the same but for a rounding boundary's flip


@pytest.mark.parametrize("placement,qk_norm", [("peri", "none"), ("pre", "head"), ("peri", "full")])
def test_hand_rolled_and_pytorch_models_agree_by_default_under_cuda_autocast(tiny_model_cfg, placement, qk_norm):
    """The share of a tiny model's logits that differ between hand-rolled and PyTorch norms (the same weights):
    by default (float32) under 1%, as in fp32; with ``input`` the hand-rolled bf16 statistics show in most."""
    idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
    differ = {}
    for dtype in ("float32", "input"):
        for pair in PAIRS:
            kw = dict(norm_placement=placement, qk_norm=qk_norm, norm_compute_dtype=dtype)
            ours, theirs = (GPT(tiny_model_cfg(norm_type=n, qk_norm_type=n, **kw), seed=1).eval() for n in pair)
            with torch.no_grad():
                for p in ours.parameters():
                    if p.dim() == 1:
                        p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            theirs.load_state_dict(ours.state_dict())
            with torch.no_grad(), CudaAutocast():
                a, b = (m(idx)[0].float() for m in (ours, theirs))
            differ[dtype, pair[0]] = (a != b).float().mean().item()
    assert tiny_model_cfg().norm_compute_dtype == "float32"  # the default
    for (dtype, _), share in differ.items():
        assert (share < 0.01) if dtype == "float32" else (share > 0.2), differ
