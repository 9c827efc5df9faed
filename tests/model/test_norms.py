"""The hand-rolled norms compute the same functions as PyTorch's, and make_norm builds each type."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import CONFIGS

from gpt.config import architecture, load_config, schema
from gpt.model.norms import (
    NORM_MODULES,
    NORM_PARAMS,
    NORM_TYPES,
    NORMS,
    DyT,
    FastLayerNorm,
    LayerNorm,
    RMSNorm,
    is_norm,
    make_norm,
)

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
        # each parameter is per channel or one scalar (ScaleNorm's g): either way it fits the width
        assert all(p.shape in ((), (1,), (12,)) for p in norm.parameters())


def layer_norm(x, n):
    return F.layer_norm(x, x.shape[-1:], n.weight, n.bias, eps=n.eps)


def rms_norm(x, n):
    return F.rms_norm(x, x.shape[-1:], n.weight, eps=n.eps)


# The one table a new norm type adds a row to: the names of its parameters and the function it computes
# (with those parameters), written independently of its class. Everything else is read from the registry.
EXPECTED = {
    "handrolled_layernorm": ({"weight", "bias"}, layer_norm),
    "pytorch_layernorm": ({"weight", "bias"}, layer_norm),
    "handrolled_rmsnorm": ({"weight"}, rms_norm),
    "pytorch_rmsnorm": ({"weight"}, rms_norm),
    "no_norm": (set(), lambda x, n: x),
    "dyt": ({"alpha", "weight", "bias"}, lambda x, n: n.weight * torch.tanh(n.alpha * x) + n.bias),
    "handrolled_layernorm_fast": ({"weight", "bias"}, layer_norm),
    "derf": ({"alpha", "shift", "weight", "bias"}, lambda x, n: n.weight * torch.erf(n.alpha * x + n.shift) + n.bias),
    "rmsnorm_noweight": (set(), lambda x, n: F.rms_norm(x, x.shape[-1:], None, eps=n.eps)),
}


def test_every_registered_norm_type_has_a_row_of_expected_properties():
    missing = [t for t in NORM_TYPES if t not in EXPECTED]
    assert not missing, f"add a row for {missing} to EXPECTED in tests/model/test_norms.py"
    assert set(EXPECTED) <= set(NORM_TYPES), "EXPECTED names a norm type the registry does not have"


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_each_norm_type_builds_its_declared_modules_and_computes_its_function(norm_type):
    names, function = EXPECTED[norm_type]
    norm = make_norm({"norm_type": norm_type, "d_model": 16})
    assert isinstance(norm, NORMS[norm_type].modules) and is_norm(norm)
    assert {n for n, _ in norm.named_parameters()} == names
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # parameters away from their initial ones, so that each one counts
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(3, 5, 16, generator=g) * 2 + 1
    torch.testing.assert_close(norm(x), function(x, norm), rtol=1e-5, atol=1e-5)


def test_make_norm_defaults_and_the_write_up_dicts():
    assert not hasattr(make_norm({"norm_type": "handrolled_rmsnorm", "d_model": 4}), "bias")
    assert make_norm({"norm_type": "pytorch_rmsnorm", "d_model": 4}).eps == 1e-5  # the default eps
    # the write-up's dicts name the width emb_dim
    assert make_norm({"norm_type": "pytorch_layernorm", "emb_dim": 6}).normalized_shape == (6,)
    assert NORM_PARAMS["norm_eps"].default == 1e-5 and NORM_PARAMS["dyt_alpha_init"].default == 0.5
    assert make_norm({"norm_type": "pytorch_rmsnorm", "d_model": 4, "norm_eps": 1e-6}).eps == 1e-6  # set: it reaches it
    assert make_norm({"norm_type": "dyt", "d_model": 4, "dyt_alpha_init": 0.7}).alpha.item() == pytest.approx(0.7)


def field_line(param, field=None) -> str:
    """The spec's line (gpt/config/architecture.py, OPTIONS) that declares ``param`` (keeping the bounds of the
    field, if any)."""
    number = repr(param.default).replace("e-0", "e-")  # as written there: 1e-5
    bounds = {k: field.metadata[k] for k in ("ge", "gt", "le", "lt") if field and field.metadata[k] is not None}
    return (
        f"    Option({param.name!r}, {type(param.default).__name__}, {number}, {json.dumps(param.doc)}, "
        f"bounds={bounds!r}, hub={param.name!r}),"
    ).replace("'", '"')


def test_the_config_schema_reads_the_registry_s_names_and_holds_its_defaults():
    """gpt.config.schema imports no torch: it reads the norm types from the registry's source (each
    ``NormType("name", ...)`` there), and keeps a copy of each norm parameter (a ModelConfig field of the same
    name, default and doc); when that differs, this says what to paste."""
    assert schema.NORM_TYPES == NORM_TYPES, (
        "each NormType in gpt/model/norms.py must name its type as a literal first argument"
    )
    fields = {f.name: f for f in dataclasses.fields(schema.ModelConfig)}
    for param in NORM_PARAMS.values():
        field = fields.get(param.name)
        assert field is not None and (field.default, field.metadata["doc"]) == (param.default, param.doc), (
            f"gpt/config/architecture.py, OPTIONS: {'replace' if field else 'add'} its option with\n"
            f"{field_line(param, field)}"
        )
    spec = Path(schema.__file__).with_name("architecture.py").read_text()
    assert field_line(NORM_PARAMS["dyt_alpha_init"], fields["dyt_alpha_init"]) in spec  # the line it prints
    # exported under its own name: a published model builds its norms with it
    assert all(architecture.BY_KEY[name].hub == name for name in NORM_PARAMS)


def test_the_schema_sees_a_norm_type_added_to_the_registry_s_source(tmp_path):
    """A norm type declared in the registry's tuple is a config choice with no other edit, in source order."""
    source = schema.NORM_REGISTRY.read_text()
    anchor = '    NormType("handrolled_layernorm_fast", FastLayerNorm,'
    assert source.count(anchor) == 1
    added = '    NormType("added_norm", AddedNorm, "doc", (EPS,)),\n    NormType("z_added_second", Identity),\n'
    end = source.index("\n", source.index(anchor)) + 1
    (tmp_path / "norms.py").write_text(source[:end] + added + source[end:])
    after = NORM_TYPES.index("handrolled_layernorm_fast") + 1  # (a recipe's norm may follow it already)
    assert schema.declared_norm_types(tmp_path / "norms.py") == (
        *NORM_TYPES[:after],
        "added_norm",
        "z_added_second",
        *NORM_TYPES[after:],
    )
    declared = schema.declared_norm_params(tmp_path / "norms.py")  # each one's parameters, by their config keys
    assert declared == {
        **{name: tuple(p.name for p in NORMS[name].params) for name in NORM_TYPES},
        "added_norm": ("norm_eps",),
        "z_added_second": (),
    }


def test_a_norm_parameter_no_built_norm_reads_reads_as_its_default():
    """derf_alpha_init in a LayerNorm model changes nothing: one model, one config (a sweep setting it for every norm
    type does not train the LayerNorm twice); where a built norm reads it (any site, QK-norm), it is kept."""
    tiny = CONFIGS / "tiny.yaml"
    base = load_config(tiny)
    assert load_config(tiny, ["model.derf_alpha_init=0.8", "model.dyt_alpha_init=2"]) == base
    assert load_config(tiny, ["model.norm_type=no_norm", "model.norm_eps=1e-3"]).model.norm_eps == 1e-5
    for where in ("model.norm_type=derf", "model.final_norm_type=derf", "model.qk_norm=head"):
        qk = ["model.qk_norm_type=derf"] if where == "model.qk_norm=head" else []
        assert load_config(tiny, ["model.derf_alpha_init=0.8", where, *qk]).model.derf_alpha_init == 0.8, where
    assert load_config(tiny, ["model.qk_norm_type=dyt"]) == base  # no QK-norm: its type builds nothing


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
