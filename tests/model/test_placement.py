"""Where the norm sits (model.norm_placement: pre, post, peri, reordered, mix; model.final_norm) and QK-norm
(model.qk_norm: none, head, full, of model.qk_norm_type): each block computes its formula, no other weight moves,
the default is the model as it was, a config written with ``qk_norm: true`` builds what it built, and the published
model builds the same placement through transformers."""

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from synthetic import CONFIGS, checkpoint

from gpt.config import NORM_PLACEMENTS, QK_NORMS, Config, ConfigError, dump_config, load_config
from gpt.config.architecture import BY_KEY, OPTIONS, from_hub
from gpt.model.gpt import GPT, Context, KVCache
from gpt.model.norms import NORM_TYPES, DyT, is_norm, make_norm
from gpt.publish.export import export_checkpoint
from gpt.publish.hub_api import HubError
from gpt.publish.layouts import Layout, export_weights, hub_config, load_published

# the options of where and how the norms sit, each with what a config written before it reads as (the model it built)
LAYOUT = {
    k: BY_KEY[k].before for k in ("norm_placement", "final_norm", "qk_norm", "qk_norm_type", "norm_compute_dtype")
}
VARIANTS = [(p, qk) for p in NORM_PLACEMENTS for qk in QK_NORMS]  # every placement x QK-norm


def placed(placement: str) -> dict:
    """The model keys of ``placement``: mix with one post-norm block of the tiny models' two."""
    return {"norm_placement": placement, "mix_post_layers": 1 if placement == "mix" else None}


# a LayerNorm and an RMSNorm member, and the newest: Derf (a point-wise erf) and the parameter-free RMSNorm
FAMILY = {"handrolled_layernorm": "layer", "pytorch_rmsnorm": "rms", "derf": "derf", "rmsnorm_noweight": "rms0"}


def jitter_norms(model: GPT, seed: int = 0) -> GPT:
    """Norm gains and shifts away from ones and zeros, each its own, so a norm swapped for another shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in sorted(model.norm_parameter_names()):
            p = model.get_parameter(name)
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# ------------------------------------------------------------------ the formulas, by hand


def norm_by_hand(norm: nn.Module, x: torch.Tensor, family: str) -> torch.Tensor:
    """Each paper's formula: LayerNorm, RMSNorm (with its weight or none), Derf: gamma * erf(alpha x + s) + beta."""
    if family == "layer":
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
    if family == "derf":
        return norm.weight * torch.special.erf(norm.alpha * x + norm.shift) + norm.bias
    unit = x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps)
    return unit if family == "rms0" else unit * norm.weight


def heads_by_hand(attn, h: torch.Tensor, family: str = "rms"):
    """q, k, v (B, nh, T, hs) of ``h``; with QK-norm (``family``: of model.qk_norm_type, RMSNorm by default) q and
    k normalised over the whole projection before the split (full, OLMo 2) or over each head's (head, Qwen3)."""
    B, T, C = h.shape
    qkv = h @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = qkv.split(C, dim=2)
    if attn.qk_norm == "full":
        q, k = norm_by_hand(attn.q_norm, q, family), norm_by_hand(attn.k_norm, k, family)
    q, k, v = (t.reshape(B, T, attn.n_heads, C // attn.n_heads).transpose(1, 2) for t in (q, k, v))
    if attn.qk_norm == "head":
        q, k = norm_by_hand(attn.q_norm, q, family), norm_by_hand(attn.k_norm, k, family)
    return q, k, v


def attention_by_hand(attn, h: torch.Tensor, family: str) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) v under the causal mask, heads merged, then the output projection."""
    B, T, C = h.shape
    q, k, v = heads_by_hand(attn, h)
    scores = q @ k.transpose(-2, -1) / math.sqrt(C // attn.n_heads)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return y @ attn.proj.weight.T + attn.proj.bias


def mlp_by_hand(mlp, h: torch.Tensor) -> torch.Tensor:
    a = h @ mlp.fc.weight.T + mlp.fc.bias
    a = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))  # GPT-2's tanh GELU
    return a @ mlp.proj.weight.T + mlp.proj.bias


def block_by_hand(block, x: torch.Tensor, placement: str, family: str, layer: int = 0, scaled=False) -> torch.Tensor:
    """The block's formula; ``placement`` mix is post in block 0 (layer 0) and pre after (mix_post_layers 1), and
    ``scaled`` multiplies every norm's output by 1 / sqrt(layer + 1) (LayerNorm Scaling)."""
    if placement == "mix":
        placement = "post" if layer < 1 else "pre"

    def n(norm, t):
        return norm_by_hand(norm, t, family) / (math.sqrt(layer + 1) if scaled else 1)

    def attn(t):
        return attention_by_hand(block.attn, t, family)

    def mlp(t):
        return mlp_by_hand(block.mlp, t)

    if placement == "pre":
        x = x + attn(n(block.ln_1, x))
        return x + mlp(n(block.ln_2, x))
    if placement == "post":
        x = n(block.ln_1, x + attn(x))
        return n(block.ln_2, x + mlp(x))
    if placement == "reordered":  # OLMo 2
        x = x + n(block.ln_1, attn(x))
        return x + n(block.ln_2, mlp(x))
    x = x + n(block.ln_1_out, attn(n(block.ln_1, x)))
    return x + n(block.ln_2_out, mlp(n(block.ln_2, x)))


@pytest.mark.parametrize("norm_type", sorted(FAMILY))
@pytest.mark.parametrize(
    "placement,qk_norm,scaling",
    [(p, qk, "none") for p, qk in VARIANTS]  # LayerNorm Scaling where it is defined (not with post's norms)
    + [(p, qk, "inverse_sqrt") for p, qk in VARIANTS if p not in ("post", "mix")],
)
def test_each_block_computes_its_placement_s_formula(tiny_model_cfg, norm_type, placement, qk_norm, scaling):
    cfg = tiny_model_cfg(
        norm_type=norm_type, **placed(placement), qk_norm=qk_norm, qkv_bias=True, norm_depth_scaling=scaling
    )
    model = jitter_norms(GPT(cfg, seed=4).double().eval())
    x = 2 * torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    scaled = scaling == "inverse_sqrt"
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            ours, by_hand = (
                block(x, ctx=Context()),
                block_by_hand(block, x, placement, FAMILY[norm_type], layer, scaled),
            )
            assert (ours - by_hand).abs().max().item() < 1e-10
        # the whole model too: embeddings, the blocks by hand, the final norm, the head
        idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(6))
        h = model.wte(idx) + model.wpe(torch.arange(16))
        for layer, b in enumerate(model.blocks):
            h = block_by_hand(b, h, placement, FAMILY[norm_type], layer, scaled)
        logits = norm_by_hand(model.ln_f, h, FAMILY[norm_type]) @ model.lm_head.weight.T
        assert (model(idx)[0] - logits).abs().max().item() < 1e-10


@pytest.mark.parametrize("qk_norm", ["head", "full"])
@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_qk_norm_sits_before_the_cache_so_cached_keys_are_normalised(tiny_model_cfg, placement, qk_norm):
    cfg = tiny_model_cfg(norm_type="handrolled_layernorm", **placed(placement), qk_norm=qk_norm, context_length=32)
    model = jitter_norms(GPT(cfg, seed=4).double().eval())
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(7))
    cache = KVCache()
    with torch.no_grad():
        model(idx, cache=cache)
        x = model.wte(idx) + model.wpe(torch.arange(10))
        h = (
            x if placement in ("post", "reordered", "mix") else model.blocks[0].ln_1(x)
        )  # what block 0's attention reads
        _, k, v = heads_by_hand(model.blocks[0].attn, h)
    assert (cache.layers[0][0] - k).abs().max().item() < 1e-12  # normalised keys: k_norm's output
    assert (cache.layers[0][1] - v).abs().max().item() < 1e-12
    # and with them, generation reads each token once and gives the tokens of reading all again
    start = idx[:, :3]
    assert torch.equal(
        model.generate(start, 25, temperature=0), model.generate(start, 25, temperature=0, use_cache=False)
    )


# ------------------------------------------------------------------ nothing else moves


@pytest.mark.parametrize("norm_type", ["handrolled_layernorm", "dyt", "no_norm"])
@pytest.mark.parametrize("init", ["pytorch", "gpt2"])
def test_non_norm_parameters_are_bitwise_the_same_in_every_placement_and_qk_norm(tiny_model_cfg, norm_type, init):
    states = {}
    for placement, qk_norm in VARIANTS:
        cfg = tiny_model_cfg(norm_type=norm_type, init=init, **placed(placement), qk_norm=qk_norm)
        model = GPT(cfg, seed=123)
        norms = model.norm_parameter_names()
        names = {n for n, _ in model.named_parameters()}
        # every norm is one of make_norm's (is_norm finds it), and they are all the norms there are
        owners = {n.rsplit(".", 1)[0] for n in names}
        expected = {o for o in owners if o.split(".")[-1] in ("ln_1", "ln_2", "ln_1_out", "ln_2_out", "ln_f")}
        expected |= {o for o in owners if o.split(".")[-1] in ("q_norm", "k_norm")}
        assert any(o.endswith("q_norm") for o in expected) == (qk_norm != "none")
        assert {n.rsplit(".", 1)[0] for n in norms} == expected
        assert all(is_norm(model.get_submodule(o)) for o in expected)
        states[placement, qk_norm] = {n: p.detach().clone() for n, p in model.named_parameters() if n not in norms}
    reference = states["pre", "none"]
    assert len(reference) == 2 + 2 * 7 + 1  # wte, wpe; 7 linear weights and biases per block; the head
    for variant, state in states.items():
        assert state.keys() == reference.keys(), variant
        for name, tensor in state.items():
            assert torch.equal(tensor, reference[name]), f"{variant}: {name} differs"


def test_the_norms_each_placement_and_qk_norm_add(tiny_model_cfg):
    C, L, hs = 32, 2, 8
    for norm_type in ("handrolled_layernorm", "pytorch_rmsnorm", "dyt", "no_norm"):
        base = GPT(tiny_model_cfg(norm_type=norm_type))
        per_norm = {"handrolled_layernorm": 2, "pytorch_rmsnorm": 1, "dyt": 2, "no_norm": 0}[norm_type]
        scalar = 1 if norm_type == "dyt" else 0  # DyT's alpha
        for placement, qk_norm in VARIANTS:
            model = GPT(tiny_model_cfg(norm_type=norm_type, **placed(placement), qk_norm=qk_norm))
            # QK-norm: two RMSNorms (model.qk_norm_type's default) per layer, a head wide or the whole projection
            extra = (2 * L * (per_norm * C + scalar) if placement == "peri" else 0) + (
                2 * L * {"none": 0, "head": hs, "full": C}[qk_norm]
            )
            assert model.num_params() - base.num_params() == extra, (norm_type, placement, qk_norm)
            assert model.num_params(norms=False) == base.num_params(norms=False)  # the same run length
            assert model.flops_per_token() == base.flops_per_token()  # norms are elementwise, not counted
    # the QK-norm's type is its own: RMSNorm whatever the blocks' norm (no_norm's model included), or as set
    attn = GPT(tiny_model_cfg(norm_type="dyt", qk_norm="head", qk_norm_type="dyt")).blocks[0].attn
    assert isinstance(attn.q_norm, DyT) and attn.q_norm.weight.shape == (hs,) and attn.k_norm.weight.shape == (hs,)
    attn = GPT(tiny_model_cfg(norm_type="no_norm", qk_norm="full")).blocks[0].attn
    assert type(attn.k_norm) is nn.RMSNorm and attn.k_norm.weight.shape == (C,)
    # without a final norm the head reads the last block: ln_f has no parameters (and no name in the state dict)
    model = GPT(tiny_model_cfg(norm_type="pytorch_layernorm", final_norm=False))
    base = GPT(tiny_model_cfg(norm_type="pytorch_layernorm"))
    assert model.num_params() == base.num_params() - 2 * C and not any(k.startswith("ln_f") for k in model.state_dict())


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_make_norm_takes_a_width(norm_type):
    cfg = {"norm_type": norm_type, "d_model": 32}
    norm = make_norm(cfg, 8)
    assert is_norm(norm) and norm(torch.randn(2, 8)).shape == (2, 8)
    assert all(p.shape in ((8,), ()) for p in norm.parameters())
    assert all(p.shape in ((32,), ()) for p in make_norm(cfg).parameters())


@pytest.mark.parametrize(
    "pair", [("handrolled_layernorm", "pytorch_layernorm"), ("handrolled_rmsnorm", "pytorch_rmsnorm")]
)
@pytest.mark.parametrize("placement,qk_norm", VARIANTS)
def test_hand_rolled_and_pytorch_norms_give_the_same_logits_in_every_placement(
    tiny_model_cfg, pair, placement, qk_norm
):
    ours, theirs = (GPT(tiny_model_cfg(norm_type=n, **placed(placement), qk_norm=qk_norm)).eval() for n in pair)
    jitter_norms(ours, seed=9)
    theirs.load_state_dict(ours.state_dict())  # the same weights: only the norm's implementation differs
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(idx)[0] - theirs(idx)[0]).abs().max().item() <= 1e-6


# ------------------------------------------------------------------ the default is the model as it was


BEFORE_KEYS = ["wte.weight", "wpe.weight"]  # the state dict's keys before placements existed, in order
BEFORE_KEYS += [
    f"blocks.{i}.{k}"
    for i in range(2)
    for k in (
        "ln_1.weight",
        "ln_1.bias",
        "attn.qkv.weight",
        "attn.proj.weight",
        "attn.proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.fc.weight",
        "mlp.fc.bias",
        "mlp.proj.weight",
        "mlp.proj.bias",
    )
]
BEFORE_KEYS += ["ln_f.weight", "ln_f.bias", "lm_head.weight"]


def test_the_default_is_pre_norm_without_qk_norm_bitwise_as_before(tiny_model_cfg):
    cfg = tiny_model_cfg()
    # norms compute in fp32 now (LAYOUT's input was the default before): pre-norm reads the fp32 residual stream,
    # so the model is the same to the bit (below)
    assert {k: getattr(cfg, k) for k in LAYOUT} == {**LAYOUT, "norm_compute_dtype": "float32"}
    assert (cfg.norm_placement, cfg.final_norm, cfg.qk_norm, cfg.norm_compute_dtype) == ("pre", True, "none", "float32")
    model = jitter_norms(GPT(cfg, seed=11).eval())
    assert list(model.state_dict()) == BEFORE_KEYS
    # a config without the fields (as every config was) builds the same model, to the bit
    published = {o.hub: getattr(cfg, o.key) for o in OPTIONS if o.hub is not None and o.key not in LAYOUT}
    options = from_hub(published)  # a config.json published before them: the keys absent
    before = GPT(SimpleNamespace(**options, padded_vocab_size=cfg.padded_vocab_size), seed=11).eval()
    before.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before(idx)[0])
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
        b = model.blocks[0]
        h = x + b.attn(b.ln_1(x), ctx=Context())  # the pre-norm block as it was written, to the bit
        assert torch.equal(b(x, ctx=Context()), h + b.mlp(b.ln_2(h)))


def test_a_placement_not_known_is_refused(tiny_model_cfg):
    with pytest.raises(ConfigError, match="model.norm_placement: 'middle' is not one of: pre, post, peri"):
        load_config(CONFIGS / "tiny.yaml", ["model.norm_placement=middle"])
    with pytest.raises(ValueError, match="norm_placement 'middle' has no block; these have: pre, post, peri"):
        GPT(tiny_model_cfg(norm_placement="middle"))  # a config built in code, not checked by the loader


def test_the_dry_run_names_placement_and_qk_norm(tmp_path):
    from gpt.model.inventory import model_summary

    for overrides, words in (
        ([], "(pre-norm)"),
        (["model.norm_placement=peri", "model.qk_norm=head"], "(peri-norm, QK-norm (head, pytorch_rmsnorm))"),
        # as written before qk_norm_type: a head-wise norm of the norm type, what it built then
        (["model.qk_norm=true", "model.norm_type=dyt"], "(QK-norm (head, dyt))"),
        (
            ["model.final_norm=false", "model.norm_placement=peri", "model.norm_compute_dtype=input"],
            "(peri-norm, no final norm, norms in their input dtype)",
        ),
    ):
        cfg = load_config(CONFIGS / "tiny.yaml", [f"run.dir={tmp_path / 'run'}", "train.steps=7", *overrides])
        line = model_summary(cfg, GPT(cfg.model, seed=0)).splitlines()[1]
        assert f"norm {cfg.model.norm_type} {words}" in line


# ------------------------------------------------------------------ published


def run_config(tmp_path, norm_type="handrolled_layernorm", placement="pre", qk_norm="none", vocab_size=97) -> Config:
    cfg = Config()
    cfg.run.name, cfg.run.dir, cfg.train.steps = f"{placement}-{qk_norm}", str(tmp_path / "run"), 10
    m = cfg.model
    m.vocab_size, m.context_length, m.d_model, m.n_layers, m.n_heads = vocab_size, 48, 32, 2, 4
    m.norm_type, m.norm_placement, m.qk_norm = norm_type, placement, qk_norm
    return cfg


@pytest.mark.parametrize("placement,qk_norm", [("post", "none"), ("peri", "none"), ("pre", "head"), ("post", "full")])
def test_native_gpt2_export_refuses_all_but_pre_norm_without_qk_norm(tmp_path, capsys, placement, qk_norm):
    from gpt.commands.push_to_hub import main as push_to_hub

    cfg = run_config(tmp_path, "pytorch_layernorm", placement, qk_norm)
    ckpt = checkpoint(cfg, GPT(cfg.model))
    folder = tmp_path / "export"
    with pytest.raises(HubError) as refused:
        export_checkpoint(ckpt, folder, "me/native", layout=Layout.NATIVE_GPT2)
    message = str(refused.value)
    wrong = [f"model.norm_placement {placement} (GPT-2: pre)"] if placement != "pre" else []
    wrong += [f"model.qk_norm {qk_norm} (GPT-2: none)"] if qk_norm != "none" else []
    assert message == (
        f"--native-gpt2: GPT2LMHeadModel cannot compute this model: {', '.join(wrong)}; publish it with remote code "
        "(without --native-gpt2)"
    )
    assert "\n" not in message and not folder.exists()  # nothing written
    # the command says it in one line, before any request to the Hub (offline here: none could be made)
    assert push_to_hub([str(ckpt), "--repo", "me/native", "--native-gpt2"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    pre = run_config(tmp_path, "pytorch_layernorm")
    assert export_weights(pre, GPT(pre.model).state_dict(), Layout.NATIVE_GPT2)  # pre-norm itself goes through


HF_LOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
ids = torch.tensor(json.loads(sys.argv[2]))
out = {}
for folder in json.loads(sys.argv[1]):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    out[folder] = {
        "placement": model.gpt.blocks[0].placement,
        "qk_norm": model.gpt.blocks[0].attn.qk_norm,
        "logits": model(ids).logits.tolist(),
        "cached": model.generate(ids, use_cache=True, **kw).tolist(),
        "uncached": model.generate(ids, use_cache=False, **kw).tolist(),
    }
print(json.dumps(out))
"""


def published(tmp_path, cfg: Config, model: GPT, old_config=False):
    """``model`` exported in the remote-code layout (through a checkpoint, as push_to_hub does); with
    ``old_config``, its config.json without the keys of where the norms are, as models published before them."""
    folder = tmp_path / f"{cfg.run.name}-export{'-old' if old_config else ''}"
    export_checkpoint(checkpoint(cfg, model), folder, f"me/{cfg.run.name}")
    if old_config:
        config = json.loads((folder / "config.json").read_text())
        for key in LAYOUT:
            del config[key]
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_peri_reordered_and_qk_norm_models_reload_through_transformers_and_generate_the_same(tmp_path):
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(8))
    cfg = run_config(tmp_path, "dyt", "peri", "full")
    model = jitter_norms(GPT(cfg.model, seed=3).eval())
    pre_cfg = run_config(tmp_path / "pre", "pytorch_rmsnorm")
    pre = jitter_norms(GPT(pre_cfg.model, seed=3).eval())
    # the newest: OLMo 2's reordered norm of Derf, LayerNorm Scaling, a parameter-free RMSNorm at the MLP
    new_cfg = run_config(tmp_path / "new", "derf", "reordered", "full")
    new_cfg.model.norm_depth_scaling, new_cfg.model.mlp_norm_type = "inverse_sqrt", "rmsnorm_noweight"
    new = jitter_norms(GPT(new_cfg.model, seed=3).eval())
    folders = [published(tmp_path, cfg, model), published(tmp_path / "pre", pre_cfg, pre, old_config=True)]
    folders.append(published(tmp_path / "new", new_cfg, new))
    # the modern block: rotary positions through transformers' generation loop, cache or not
    modern_cfg = run_config(tmp_path / "modern", "pytorch_rmsnorm")
    modern_cfg.model.block = "modern"
    modern = jitter_norms(GPT(modern_cfg.model, seed=3).eval())
    folders.append(published(tmp_path / "modern", modern_cfg, modern))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", HF_LOAD, json.dumps([str(f) for f in folders]), json.dumps(ids.tolist())]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    built = ((model, "peri", "full"), (pre, "pre", "none"), (new, "reordered", "full"), (modern, "pre", "none"))
    for folder, (ours, placement, qk_norm) in zip(folders, built, strict=True):
        got = results[str(folder)]
        assert (got["placement"], got["qk_norm"]) == (placement, qk_norm)  # the same placement was built
        with torch.no_grad():
            assert (torch.tensor(got["logits"]) - ours(ids)[0]).abs().max().item() <= 1e-5
        cached, uncached = (ours.generate(ids, 30, temperature=0, use_cache=c).tolist() for c in (True, False))
        assert got["cached"] == got["uncached"] == cached == uncached  # ours and transformers', cache or not


def test_a_published_model_carries_its_placement_in_config_and_card_and_reloads(tmp_path):
    cfg = run_config(tmp_path, "pytorch_rmsnorm", "peri", "head")
    cfg.model.qk_norm_type, cfg.model.final_norm = "handrolled_layernorm", False
    model = jitter_norms(GPT(cfg.model, seed=3).eval())
    folder = published(tmp_path, cfg, model)
    config = json.loads((folder / "config.json").read_text())
    assert {k: config[k] for k in LAYOUT} == {
        "norm_placement": "peri", "final_norm": False, "qk_norm": "head", "qk_norm_type": "handrolled_layernorm",
        "norm_compute_dtype": "float32",
    }  # fmt: skip
    assert hub_config(cfg, Layout.REMOTE_CODE)["norm_placement"] == "peri"
    card = (folder / "README.md").read_text()
    assert "this one uses `pytorch_rmsnorm`, peri-norm, no final norm, QK-norm (head, handrolled_layernorm)." in card
    assert "peri-norm (each block: x + norm(f(norm(x))), a norm before and after each sublayer); none before" in card
    assert "QK-norm: `handrolled_layernorm` over each head's queries and keys, one weight shared by the heads" in card
    reloaded = load_published(folder)
    assert reloaded.blocks[0].placement == "peri" and reloaded.blocks[0].attn.qk_norm == "head"
    assert isinstance(reloaded.ln_f, nn.Identity) and type(reloaded.blocks[0].attn.q_norm).__name__ == "LayerNorm"
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(reloaded(idx)[0], model(idx)[0])
    pre = run_config(tmp_path / "pre")
    card = (published(tmp_path / "pre", pre, GPT(pre.model)) / "README.md").read_text()
    assert "pre-norm (each block: x + f(norm(x)), as GPT-2); a norm before the head; no QK-norm" in card
    assert "this one uses `handrolled_layernorm`." in card


def test_weight_conversion_to_gpt2_refuses_what_gpt2_cannot_compute(tiny_model_cfg):
    from gpt.model.gpt2_weights import hf_config_kwargs, state_dict_to_hf

    cfg = tiny_model_cfg(norm_type="pytorch_layernorm", norm_placement="peri", qk_norm="head")
    with pytest.raises(
        ValueError,
        match=r"model: model.norm_placement peri \(GPT-2: pre\), model.qk_norm head \(GPT-2: none\)$",
    ):
        state_dict_to_hf(GPT(cfg).state_dict(), cfg)
    assert hf_config_kwargs(tiny_model_cfg(norm_type="pytorch_layernorm"))["n_embd"] == 32


# ------------------------------------------------------------------ settings that say what they are


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.norm_type=no_norm", "model.norm_placement=post"],
            "model.norm_placement: norm_placement post with norm_type no_norm in every block builds the pre-norm "
            "no_norm model (no norm to place); train no_norm with norm_placement: pre (a sweep of its own)",
        ),
        (
            ["model.norm_placement=peri", "model.norm_type=no_norm"],
            "model.norm_type: norm_placement peri with norm_type no_norm in every block builds the pre-norm no_norm",
        ),
        (
            ["model.norm_type=no_norm", "model.final_norm=false"],
            "model.final_norm: final_norm false with a no_norm final norm builds the same model: drop it",
        ),
        (
            ["model.qk_norm=head", "model.qk_norm_type=no_norm"],
            "model.qk_norm_type: qk_norm_type no_norm builds no QK-norm; set model.qk_norm: none",
        ),
        (["model.qk_norm=both"], "model.qk_norm: 'both' is not one of: none, head, full"),
    ],
)
def test_settings_that_cannot_change_the_model_are_refused_in_one_line(overrides, message):
    """Five labels, one model: no_norm under post, peri, without a final norm, or a QK-norm of no_norm,
    would train the same model under another name (a sweep would compare it with itself)."""
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIGS / "tiny.yaml", overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    # what they would have built is the default no_norm model: the same parameters, bitwise the same logits
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.norm_type=no_norm"]).model
    idx = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    for changed in ({"norm_placement": "post"}, {"norm_placement": "peri"}, {"final_norm": False}):
        with torch.no_grad():
            assert torch.equal(GPT(cfg, seed=1)(idx)[0], GPT(replace(cfg, **changed), seed=1)(idx)[0]), changed


def test_a_config_written_with_qk_norm_true_builds_what_it_built(tmp_path):
    """Before qk_norm_type, ``qk_norm: true`` meant a head-wise norm of model.norm_type: it still does (and false,
    none); the resolved config a run writes says it in today's words, and reads back the same."""
    old = tmp_path / "old.yaml"
    old.write_text(f"extends: {CONFIGS / 'tiny.yaml'}\nmodel:\n  norm_type: dyt\n  qk_norm: true\n")
    cfg = load_config(old)
    assert (cfg.model.qk_norm, cfg.model.qk_norm_type) == ("head", "dyt")
    assert isinstance(GPT(cfg.model).blocks[0].attn.q_norm, DyT)
    written = tmp_path / "resolved.yaml"
    written.write_text(dump_config(cfg))
    assert "qk_norm: head" in written.read_text() and load_config(written) == cfg
    assert load_config(old, ["model.qk_norm=false"]).model.qk_norm == "none"
    # a qk_norm_type set beside it is kept
    assert load_config(old, ["model.qk_norm_type=pytorch_rmsnorm"]).model.qk_norm_type == "pytorch_rmsnorm"


@pytest.mark.parametrize(
    "placement,qk_norm", [("pre", "none"), ("peri", "none"), ("reordered", "none"), ("pre", "head"), ("peri", "full")]
)
def test_norm_compute_dtype_float32_removes_the_hand_rolled_vs_fused_difference_under_bf16_autocast(
    tiny_model_cfg, placement, qk_norm
):
    """Under autocast a hand-rolled norm takes its statistics in its input's dtype: fp32 on the residual stream
    (pre, post, the final norm), bf16 where a matmul wrote it (peri's output norms, QK-norm), while PyTorch's fused
    norms compute in fp32. model.norm_compute_dtype float32 gives both the same fp32 input."""
    differ = {}
    for dtype in ("input", "float32"):
        for pair in (("handrolled_layernorm", "pytorch_layernorm"), ("handrolled_rmsnorm", "pytorch_rmsnorm")):
            kw = dict(norm_placement=placement, qk_norm=qk_norm, norm_compute_dtype=dtype)
            ours, theirs = (GPT(tiny_model_cfg(norm_type=n, qk_norm_type=n, **kw), seed=1).eval() for n in pair)
            theirs.load_state_dict(jitter_norms(ours).state_dict())  # the same weights: only the kernels differ
            idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
                a, b = (m(idx)[0].float() for m in (ours, theirs))
            differ[dtype, pair[0]] = (a != b).float().mean().item()  # the share of logits that differ
    bf16_inputs = placement in ("peri", "reordered") or qk_norm != "none"  # a norm reads a sublayer's output
    for (dtype, _), share in differ.items():
        assert (share > 0.2) if (bf16_inputs and dtype == "input") else (share < 0.01), differ


def test_norms_compute_in_fp32_by_default_and_input_where_it_builds_the_same_model_reads_as_fp32():
    """``norm_compute_dtype: input`` was the default: where every norm reads the fp32 residual stream (pre or post,
    no QK-norm) it builds the float32 model to the bit, so such a config (an earlier run's) reads as float32 and
    stays comparable with today's runs; where a norm reads a bf16 sublayer output it keeps its meaning."""
    read = lambda *o: load_config(CONFIGS / "tiny.yaml", list(o)).model.norm_compute_dtype  # noqa: E731
    assert read() == "float32"
    for placement in ("pre", "post"):
        assert read(f"model.norm_placement={placement}", "model.norm_compute_dtype=input") == "float32"
    assert read("model.norm_placement=peri", "model.norm_compute_dtype=input") == "input"
    assert read("model.qk_norm=head", "model.norm_compute_dtype=input") == "input"
    assert read("model.norm_type=no_norm", "model.norm_compute_dtype=input") == "float32"  # one no_norm model
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.norm_type=handrolled_layernorm"]).model
    idx = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        a, b = (GPT(replace(cfg, norm_compute_dtype=d), seed=1)(idx)[0] for d in ("input", "float32"))
    assert torch.equal(a, b)
