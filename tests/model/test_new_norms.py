"""The norms and placements added since the write-up: Derf and the parameter-free RMSNorm, OLMo 2's reordered norm
(against transformers' own OLMo 2 block), Mix-LN, LayerNorm Scaling (a constant no load can lose) and a norm type
per site; the settings that cannot differ refused in one line; the comparison's axis the tuple of site types.
Each block's formula by hand, under every placement and QK-norm, is tests/model/test_placement.py's."""

import contextlib
import io
import math

import pytest
import torch
import torch.nn as nn
from conftest import CONFIGS
from test_placement import jitter_norms

from gpt.analysis.grouping import group_runs
from gpt.analysis.runs import AXIS, Run, axis_view
from gpt.commands.sweep import main as sweep
from gpt.common.errors import UserError
from gpt.config import ConfigError, flatten, load_config, norm_order
from gpt.config.architecture import label_keys, norm_label
from gpt.model.gpt import GPT, Context
from gpt.model.norms import Derf, make_norm
from gpt.sweep.cells import cell_name
from gpt.training.inside import StatsProbe


def test_derf_is_the_paper_s_formula_with_its_initial_values_and_no_randomness():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    norm = make_norm({"norm_type": "derf", "d_model": 6})
    assert torch.equal(torch.random.get_rng_state(), state)  # nothing drawn at construction
    assert isinstance(norm, Derf) and (norm.alpha.item(), norm.shift.item()) == (0.5, 0.0)  # the paper's
    assert sorted(n for n, _ in norm.named_parameters()) == ["alpha", "bias", "shift", "weight"]
    custom = make_norm({"norm_type": "derf", "d_model": 6, "derf_alpha_init": 0.8, "derf_shift_init": -0.1})
    assert (custom.alpha.item(), custom.shift.item()) == pytest.approx((0.8, -0.1))
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        custom.double().weight.uniform_(0.5, 1.5), custom.bias.uniform_(-0.2, 0.2)
        alpha, shift = custom.alpha.item(), custom.shift.item()  # 0.8 and -0.1 as float32 held them
        erf = torch.tensor([[math.erf(alpha * v + shift) for v in row] for row in x.tolist()], dtype=torch.float64)
        assert torch.allclose(custom(x), custom.weight * erf + custom.bias, atol=1e-14, rtol=0)
    # its saturation point: where erf is as flat as DyT's tanh at |u| = 2
    assert math.erf(Derf.flat_beyond) == pytest.approx(math.tanh(2.0), abs=1e-12)


def test_the_parameter_free_rmsnorm_has_no_parameter_and_is_rmsnorm_at_unit_weight():
    free = make_norm({"norm_type": "rmsnorm_noweight", "d_model": 8, "norm_eps": 1e-5})
    weighted = make_norm({"norm_type": "pytorch_rmsnorm", "d_model": 8, "norm_eps": 1e-5})
    assert list(free.parameters()) == [] and free.eps == 1e-5
    x = torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(free(x), x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5), atol=1e-15, rtol=0)
    assert torch.equal(free(x), weighted.double()(x))  # nn.RMSNorm's weight starts at ones


# ------------------------------------------------------------------ OLMo 2, against transformers' block


def test_reordered_with_pytorch_rmsnorm_and_full_qk_norm_is_olmo2_s_block(tiny_model_cfg):
    """transformers' Olmo2DecoderLayer (a test dependency: transformers is installed for the Hub export) given our
    block's weights: q, k, v projections the three thirds of ``attn.qkv`` (and its bias), ``o_proj`` our ``attn.proj``,
    q_norm / k_norm our whole-projection QK-norm's weights, post_attention_layernorm / post_feedforward_layernorm our
    ln_1 / ln_2; its rotary embedding at cos 1, sin 0 (the identity: GPT-2's positions are learned, added to the
    embedding) and its MLP our MLP (OLMo 2's is SwiGLU: the one part that is not the norms' business)."""
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer

    cfg = tiny_model_cfg(norm_type="pytorch_rmsnorm", norm_placement="reordered", qk_norm="full", qkv_bias=True)
    ours = jitter_norms(GPT(cfg, seed=2).eval()).blocks[1]
    C, nh = cfg.d_model, cfg.n_heads
    config = Olmo2Config(hidden_size=C, num_attention_heads=nh, num_key_value_heads=nh, intermediate_size=4 * C,
                         attention_bias=True, rms_norm_eps=cfg.norm_eps, attn_implementation="eager")  # fmt: skip
    theirs = Olmo2DecoderLayer(config, layer_idx=0).eval()
    a = theirs.self_attn
    with torch.no_grad():
        for i, proj in enumerate((a.q_proj, a.k_proj, a.v_proj)):
            proj.weight.copy_(ours.attn.qkv.weight[i * C : (i + 1) * C])
            proj.bias.copy_(ours.attn.qkv.bias[i * C : (i + 1) * C])
        a.o_proj.weight.copy_(ours.attn.proj.weight), a.o_proj.bias.copy_(ours.attn.proj.bias)
        a.q_norm.weight.copy_(ours.attn.q_norm.weight), a.k_norm.weight.copy_(ours.attn.k_norm.weight)
        theirs.post_attention_layernorm.weight.copy_(ours.ln_1.weight)
        theirs.post_feedforward_layernorm.weight.copy_(ours.ln_2.weight)
    theirs.mlp = ours.mlp
    B, T = 2, 16
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(3))
    causal = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)[None, None]
    identity = (torch.ones(B, T, C // nh), torch.zeros(B, T, C // nh))
    with torch.no_grad():
        got = theirs(x, attention_mask=causal, position_embeddings=identity)
        assert (ours(x, ctx=Context()) - got).abs().max().item() < 1e-5  # OLMo 2's RMSNorm computes in fp32


# ------------------------------------------------------------------ the same model, to the bit


def test_mix_at_its_ends_is_pre_and_post_and_depth_scaling_at_depth_one_changes_nothing(tiny_model_cfg):
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))

    def logits(**kw):
        with torch.no_grad():
            return GPT(tiny_model_cfg(norm_type="handrolled_layernorm", **kw), seed=7).eval()(idx)[0]

    assert torch.equal(logits(norm_placement="mix", mix_post_layers=0), logits(norm_placement="pre"))
    assert torch.equal(logits(norm_placement="mix", mix_post_layers=2), logits(norm_placement="post"))
    assert not torch.equal(logits(norm_placement="mix", mix_post_layers=1), logits(norm_placement="pre"))
    for placement in ("pre", "peri", "reordered"):
        one = {"n_layers": 1, "norm_placement": placement}
        assert torch.equal(logits(**one, norm_depth_scaling="inverse_sqrt"), logits(**one)), placement
    scaled = GPT(tiny_model_cfg(n_layers=3, norm_depth_scaling="inverse_sqrt"))
    assert [b.scale for b in scaled.blocks] == [1.0, 1 / math.sqrt(2), 1 / math.sqrt(3)]
    # a no_norm site has no norm to scale: with the attention's unnormed, only the MLP's norm is scaled
    kw = {"n_layers": 3, "attn_norm_type": "no_norm"}
    half, whole = logits(**kw, norm_depth_scaling="inverse_sqrt"), logits(**kw)
    block = GPT(tiny_model_cfg(**kw, norm_depth_scaling="inverse_sqrt"), seed=7).blocks[2]
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        h = x + block.attn(x, ctx=Context())  # no norm, no scale
        assert block.scale == 1 / math.sqrt(3)
        assert torch.equal(block(x, ctx=Context()), h + block.mlp(block.ln_2(h) * block.scale))
    assert not torch.equal(half, whole)


def test_the_depth_scale_is_a_constant_no_meta_init_or_checkpoint_round_trip_loses(tiny_model_cfg, tmp_path):
    """OLMo-core's LayerNorm Scaling lost its scale when a meta-device init erased the buffer holding it (#698): here
    the scale is a float of the architecture, in no state dict, rebuilt with the model."""
    cfg = tiny_model_cfg(n_layers=3, norm_depth_scaling="inverse_sqrt")
    model = GPT(cfg, seed=4).eval()
    assert not any("scale" in k for k in model.state_dict()) and not list(model.buffers())
    torch.save(model.state_dict(), tmp_path / "model.pt")
    with torch.device("meta"):
        empty = GPT(cfg, seed=None)  # as a checkpoint loader builds it: no memory, no init
    empty = empty.to_empty(device="cpu").eval()
    empty.load_state_dict(torch.load(tmp_path / "model.pt"))
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(empty(idx)[0], model(idx)[0])
        unscaled = GPT(tiny_model_cfg(n_layers=3), seed=None).eval()
        unscaled.load_state_dict(model.state_dict())
        assert not torch.equal(unscaled(idx)[0], model(idx)[0])  # the scale is in the loaded model, not the file
    assert [b.scale for b in empty.blocks] == [b.scale for b in model.blocks]


# ------------------------------------------------------------------ a norm type per site


def test_each_site_builds_its_own_norm_type_and_no_other_weight_moves(tiny_model_cfg):
    cfg = tiny_model_cfg(
        norm_type="handrolled_layernorm", attn_norm_type="pytorch_rmsnorm", mlp_norm_type="derf",
        final_norm_type="rmsnorm_noweight", norm_placement="peri",
    )  # fmt: skip
    model = GPT(cfg, seed=3)
    for block in model.blocks:
        assert type(block.ln_1) is type(block.ln_1_out) is nn.RMSNorm and block.ln_1.weight is not None
        assert type(block.ln_2) is type(block.ln_2_out) is Derf
    assert type(model.ln_f) is nn.RMSNorm and model.ln_f.weight is None
    # every non-norm weight bit-identical across norm types, sites and placements (one seed)
    variants = [cfg, tiny_model_cfg(norm_type="derf", norm_placement="reordered", norm_depth_scaling="inverse_sqrt")]
    variants += [tiny_model_cfg(norm_type="rmsnorm_noweight", norm_placement="mix", mix_post_layers=1, qk_norm="full")]
    states = []
    for c in variants:
        m = GPT(c, seed=3)
        states.append({n: p for n, p in m.named_parameters() if n not in m.norm_parameter_names()})
    assert all(s.keys() == states[0].keys() and all(torch.equal(s[k], states[0][k]) for k in s) for s in states)


# ------------------------------------------------------------------ what cannot differ is refused or collapsed


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.norm_placement=mix", "model.n_layers=1"],
         "model.norm_placement: 0 of 1 post-norm blocks builds the pre-norm model; set norm_placement: pre"),
        (["model.norm_placement=mix", "model.n_layers=2", "model.mix_post_layers=2"],
         "model.mix_post_layers: 2 of 2 post-norm blocks builds the post-norm model; set norm_placement: post"),
        (["model.norm_placement=mix", "model.n_layers=2", "model.mix_post_layers=5"],
         "model.mix_post_layers: 5 is more than model.n_layers=2; choose 1 to 1 (null: 0)"),
        (["model.mix_post_layers=1"], "model.mix_post_layers: applies to norm_placement mix only (this is pre)"),
        (["model.norm_depth_scaling=inverse_sqrt", "model.norm_placement=post"],
         "model.norm_placement: inverse_sqrt: norm_placement post's norms write the residual stream itself"),
        (["model.norm_placement=mix", "model.mix_post_layers=1", "model.norm_depth_scaling=inverse_sqrt"],
         "model.norm_depth_scaling: inverse_sqrt: norm_placement mix's norms write the residual stream itself"),
        (["model.norm_type=no_norm", "model.norm_depth_scaling=inverse_sqrt"],
         "model.norm_depth_scaling: inverse_sqrt: no block has a norm to scale"),
        (["model.n_layers=1", "model.norm_depth_scaling=inverse_sqrt"],
         "inverse_sqrt: a model of one layer scales by 1 / sqrt(1): the same model as none"),
        (["model.attn_norm_type=no_norm", "model.mlp_norm_type=no_norm", "model.norm_placement=reordered"],
         "norm_placement reordered with norm_type no_norm in every block builds the pre-norm no_norm model"),
        (["model.attn_norm_type=dyt", "model.mlp_norm_type=derf", "model.final_norm_type=pytorch_rmsnorm"],
         "model.final_norm_type: handrolled_layernorm is not built anywhere"),
        (["model.final_norm=false", "model.final_norm_type=dyt"],
         "model.final_norm_type: final_norm false builds no final norm; drop model.final_norm_type"),
        (["model.norm_type=no_norm", "model.attn_norm_type=dyt", "model.final_norm=false"],
         "model.final_norm: final_norm false with a no_norm final norm builds the same model: drop it"),
        (["model.norm_type=derff"], "model.norm_type: 'derff' is not one of:"),
    ],
)  # fmt: skip
def test_labels_that_would_build_one_model_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIGS / "tiny.yaml", overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_spellings_of_one_model_collapse_to_one_config():
    tiny = CONFIGS / "tiny.yaml"
    same = load_config(tiny, ["model.norm_type=dyt", "model.mlp_norm_type=dyt", "model.final_norm_type=dyt"])
    assert same == load_config(tiny, ["model.norm_type=dyt"]) and same.model.mlp_norm_type is None
    four = ["model.n_layers=4", "model.norm_placement=mix"]
    assert load_config(tiny, four).model.mix_post_layers == 1  # floor(0.25 x 4), stored as the number
    assert load_config(tiny, four) == load_config(tiny, [*four, "model.mix_post_layers=1"])
    assert load_config(tiny, ["model.n_layers=7", "model.norm_placement=mix"]).model.mix_post_layers == 1  # 1.75
    # norms reading the fp32 stream only (mix, no QK-norm): norm_compute_dtype input is the float32 model
    assert load_config(tiny, [*four, "model.norm_compute_dtype=input"]) == load_config(tiny, four)


# ------------------------------------------------------------------ the comparison's axis: the tuple of sites


def test_the_axis_is_the_norm_type_with_each_site_s_own(tmp_path):
    tiny = CONFIGS / "tiny.yaml"
    cfg = load_config(tiny, ["model.norm_type=pytorch_rmsnorm", "model.mlp_norm_type=handrolled_layernorm"])
    label = norm_label(cfg.model)
    assert label == "pytorch_rmsnorm+mlp:handrolled_layernorm" and norm_label(load_config(tiny).model) == (
        "handrolled_layernorm"
    )
    assert label_keys(label) == {"norm_type": "pytorch_rmsnorm", "mlp_norm_type": "handrolled_layernorm"}
    with pytest.raises(ValueError, match="each \\+SITE:NORM_TYPE names one of attn, mlp, final"):
        label_keys("dyt+head:derf")
    view = axis_view(flatten({"model": vars(cfg.model), "train": {"seed": 0}}))
    assert view[AXIS] == label and "model.mlp_norm_type" not in view
    runs = [
        Run(tmp_path / str(i), {AXIS: n, "train.seed": s}, "completed", {}, [], {"loss": 1.0})
        for i, (n, s) in enumerate([(label, 0), ("dyt", 0), ("pytorch_rmsnorm", 0), (label, 1)])
    ]
    assert [g.label for g in group_runs(runs)] == ["pytorch_rmsnorm", label, "dyt"]  # registry order, sites after
    assert norm_order(label) > norm_order("pytorch_rmsnorm")
    name = cell_name(tiny, label, 2)
    assert name == "tiny-pytorch-rmsnorm-mlp-handrolled-layernorm-s2"


def test_a_sweep_takes_a_site_label_as_a_norm_type_and_refuses_a_wrong_one_in_one_line(tmp_path, capsys):
    argv = [str(CONFIGS / "tiny.yaml"), "--runs-dir", str(tmp_path), "--dry-run", "--seeds", "0"]
    assert sweep([*argv, "--norm-types", "dyt", "dyt+attn:derf"]) == 0
    out = capsys.readouterr().out
    assert "--set model.norm_type=dyt --set model.attn_norm_type=derf" in out and "tiny-dyt-attn-derf-s0" in out
    for wrong, said in (("dyt+attn:derff", "'derff' is not a norm type"), ("dyt+qk:derf", "names one of attn")):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
            sweep([*argv, "--norm-types", wrong])
        last = err.getvalue().strip().splitlines()[-1]  # after argparse's usage, the one line
        assert ": error: argument --norm-types: " in last and said in last


# ------------------------------------------------------------------ the statistics probe


def test_the_probe_records_derf_s_scalars_and_saturation_and_the_depth_scale(tiny_model_cfg):
    model = GPT(tiny_model_cfg(norm_type="derf", n_layers=3, norm_depth_scaling="inverse_sqrt"), seed=1)
    with torch.no_grad():
        for block in model.blocks:
            block.ln_1.alpha.fill_(3.0), block.ln_1.shift.fill_(0.4)  # some of it saturated
    x = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(0))
    model(x, x)[1].backward()
    probe = StatsProbe(every=1)
    probe.measure(model, x, contextlib.nullcontext, None)
    record = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in probe.pending.items()}
    assert record["ln_1_alpha"] == [3.0] * 3 and record["ln_1_shift"] == pytest.approx([0.4] * 3)
    assert record["ln_f_alpha"] == 0.5 and record["ln_f_shift"] == 0.0
    assert record["depth_scale"] == [1.0, 1 / math.sqrt(2), 1 / math.sqrt(3)]
    with torch.no_grad():
        h = model.wte(x) + model.wpe(torch.arange(16))
        for i, block in enumerate(model.blocks):
            flat = ((3.0 * h + 0.4).abs() > Derf.flat_beyond).float().mean().item()
            assert 0 < record["ln_1_saturated"][i] == pytest.approx(flat)
            h = block(h, ctx=Context())


def test_the_default_baseline_of_a_placement_comparison_is_the_plain_layernorm(tmp_path):
    """With --vary keys, the write-up's hand-rolled LayerNorm at every varied key's config default is the baseline
    (no --baseline to spell out); where no group or two are at the defaults, --baseline is still asked for."""
    from gpt.analysis.grouping import choose_baseline

    def run(i, placement, scaling, seed):
        view = {"model.norm_placement": placement, "model.norm_depth_scaling": scaling}
        return Run(tmp_path / str(i), {AXIS: "handrolled_layernorm", "train.seed": seed}, "completed", {}, [], {}, view)

    cells = [("reordered", "none"), ("pre", "none"), ("pre", "inverse_sqrt")]
    runs = [run(3 * i + s, p, d, s) for i, (p, d) in enumerate(cells) for s in range(2)]
    vary = ["model.norm_placement", "model.norm_depth_scaling"]
    label, why = choose_baseline(group_runs(runs, vary), None)
    assert label == "handrolled_layernorm, model.norm_depth_scaling=none, model.norm_placement=pre"
    assert why == "the default, handrolled_layernorm with every --vary model key at its default"
    with pytest.raises(UserError, match="no default baseline among groups that differ in more than the norm"):
        choose_baseline(group_runs(runs[:2] + runs[4:], vary), None)  # reordered and depth-scaled: neither plain
