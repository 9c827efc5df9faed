"""Where the norm sits (model.norm_placement: pre, post, peri) and QK-norm (model.qk_norm): each block computes
its formula, no other weight moves, the default is the model as it was, and the published model builds the same
placement through transformers."""

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from synthetic import CONFIGS

from gpt.config import Config, ConfigError, dump_config, load_config
from gpt.model.gpt import GPT, NORM_PLACEMENTS, KVCache
from gpt.model.norms import NORM_TYPES, DyT, is_norm, make_norm
from gpt.publish.export import export_checkpoint
from gpt.publish.hub_api import HubError
from gpt.publish.layouts import Layout, export_weights, hub_config, load_published
from gpt.run.checkpoints import save_checkpoint

VARIANTS = [(p, qk) for p in NORM_PLACEMENTS for qk in (False, True)]  # every placement x QK-norm
FAMILY = {"handrolled_layernorm": "layer", "pytorch_rmsnorm": "rms"}  # a LayerNorm and an RMSNorm member


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
    if family == "layer":
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps) * norm.weight


def heads_by_hand(attn, h: torch.Tensor, family: str):
    """q, k, v (B, nh, T, hs) of ``h``; q and k normalised per head with QK-norm."""
    B, T, C = h.shape
    qkv = h @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = (t.reshape(B, T, attn.n_heads, C // attn.n_heads).transpose(1, 2) for t in qkv.split(C, dim=2))
    if attn.qk_norm:
        q, k = norm_by_hand(attn.q_norm, q, family), norm_by_hand(attn.k_norm, k, family)
    return q, k, v


def attention_by_hand(attn, h: torch.Tensor, family: str) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) v under the causal mask, heads merged, then the output projection."""
    B, T, C = h.shape
    q, k, v = heads_by_hand(attn, h, family)
    scores = q @ k.transpose(-2, -1) / math.sqrt(C // attn.n_heads)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return y @ attn.proj.weight.T + attn.proj.bias


def mlp_by_hand(mlp, h: torch.Tensor) -> torch.Tensor:
    a = h @ mlp.fc.weight.T + mlp.fc.bias
    a = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))  # GPT-2's tanh GELU
    return a @ mlp.proj.weight.T + mlp.proj.bias


def block_by_hand(block, x: torch.Tensor, placement: str, family: str) -> torch.Tensor:
    def n(norm, t):
        return norm_by_hand(norm, t, family)

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
    x = x + n(block.ln_1_out, attn(n(block.ln_1, x)))
    return x + n(block.ln_2_out, mlp(n(block.ln_2, x)))


@pytest.mark.parametrize("norm_type", sorted(FAMILY))
@pytest.mark.parametrize("placement,qk_norm", VARIANTS)
def test_each_block_computes_its_placement_s_formula(tiny_model_cfg, norm_type, placement, qk_norm):
    cfg = tiny_model_cfg(norm_type=norm_type, norm_placement=placement, qk_norm=qk_norm, qkv_bias=True)
    model = jitter_norms(GPT(cfg, seed=4).double().eval())
    x = 2 * torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    block = model.blocks[1]
    with torch.no_grad():
        ours, by_hand = block(x), block_by_hand(block, x, placement, FAMILY[norm_type])
        assert (ours - by_hand).abs().max().item() < 1e-10
        # the whole model too: embeddings, the blocks by hand, the final norm, the head
        idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(6))
        h = model.wte(idx) + model.wpe(torch.arange(16))
        for b in model.blocks:
            h = block_by_hand(b, h, placement, FAMILY[norm_type])
        logits = norm_by_hand(model.ln_f, h, FAMILY[norm_type]) @ model.lm_head.weight.T
        assert (model(idx)[0] - logits).abs().max().item() < 1e-10


@pytest.mark.parametrize("placement", NORM_PLACEMENTS)
def test_qk_norm_sits_before_the_cache_so_cached_keys_are_normalised(tiny_model_cfg, placement):
    cfg = tiny_model_cfg(norm_type="handrolled_layernorm", norm_placement=placement, qk_norm=True, context_length=32)
    model = jitter_norms(GPT(cfg, seed=4).double().eval())
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(7))
    cache = KVCache()
    with torch.no_grad():
        model(idx, cache=cache)
        x = model.wte(idx) + model.wpe(torch.arange(10))
        h = x if placement == "post" else model.blocks[0].ln_1(x)  # what block 0's attention reads
        _, k, v = heads_by_hand(model.blocks[0].attn, h, "layer")
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
        cfg = tiny_model_cfg(norm_type=norm_type, init=init, norm_placement=placement, qk_norm=qk_norm)
        model = GPT(cfg, seed=123)
        norms = model.norm_parameter_names()
        names = {n for n, _ in model.named_parameters()}
        # every norm is one of make_norm's (is_norm finds it), and they are all the norms there are
        owners = {n.rsplit(".", 1)[0] for n in names}
        expected = {o for o in owners if o.split(".")[-1] in ("ln_1", "ln_2", "ln_1_out", "ln_2_out", "ln_f")}
        expected |= {o for o in owners if o.split(".")[-1] in ("q_norm", "k_norm")}
        assert {n.rsplit(".", 1)[0] for n in norms} == expected
        assert all(is_norm(model.get_submodule(o)) for o in expected)
        states[placement, qk_norm] = {n: p.detach().clone() for n, p in model.named_parameters() if n not in norms}
    reference = states["pre", False]
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
            model = GPT(tiny_model_cfg(norm_type=norm_type, norm_placement=placement, qk_norm=qk_norm))
            extra = (2 * L * (per_norm * C + scalar) if placement == "peri" else 0) + (
                2 * L * (per_norm * hs + scalar) if qk_norm else 0
            )
            assert model.num_params() - base.num_params() == extra, (norm_type, placement, qk_norm)
            assert model.num_params(norms=False) == base.num_params(norms=False)  # the same run length
            assert model.flops_per_token() == base.flops_per_token()  # norms are elementwise, not counted
    attn = GPT(tiny_model_cfg(norm_type="dyt", qk_norm=True)).blocks[0].attn
    assert isinstance(attn.q_norm, DyT) and attn.q_norm.weight.shape == (hs,) and attn.k_norm.weight.shape == (hs,)
    assert isinstance(GPT(tiny_model_cfg(norm_type="no_norm", qk_norm=True)).blocks[0].attn.k_norm, nn.Identity)


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
    ours, theirs = (GPT(tiny_model_cfg(norm_type=n, norm_placement=placement, qk_norm=qk_norm)).eval() for n in pair)
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
    assert (cfg.norm_placement, cfg.qk_norm) == ("pre", False)
    model = jitter_norms(GPT(cfg, seed=11).eval())
    assert list(model.state_dict()) == BEFORE_KEYS
    # a config without the two fields (as every config was) builds the same model, to the bit
    fields = {k: v for k, v in vars(cfg).items() if k not in ("norm_placement", "qk_norm")}
    before = GPT(SimpleNamespace(**fields, padded_vocab_size=cfg.padded_vocab_size), seed=11).eval()
    before.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before(idx)[0])
        x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
        b = model.blocks[0]
        h = x + b.attn(b.ln_1(x))  # the pre-norm block as it was written, to the bit
        assert torch.equal(b(x), h + b.mlp(b.ln_2(h)))


def test_a_placement_not_known_is_refused(tiny_model_cfg):
    with pytest.raises(ConfigError, match="model.norm_placement: 'middle' is not one of: pre, post, peri"):
        load_config(CONFIGS / "tiny.yaml", ["model.norm_placement=middle"])
    with pytest.raises(ValueError, match="unknown norm_placement 'middle'; valid: pre, post, peri"):
        GPT(tiny_model_cfg(norm_placement="middle"))  # a config built in code, not checked by the loader


def test_the_dry_run_names_placement_and_qk_norm(tmp_path):
    from gpt.model.inventory import model_summary

    for overrides, words in (
        ([], "(pre-norm, QK-norm off)"),
        (["model.norm_placement=peri", "model.qk_norm=true"], "(peri-norm, QK-norm on)"),
    ):
        cfg = load_config(CONFIGS / "tiny.yaml", [f"run.dir={tmp_path / 'run'}", "train.steps=7", *overrides])
        line = model_summary(cfg, GPT(cfg.model, seed=0)).splitlines()[1]
        assert f"norm {cfg.model.norm_type} {words}" in line


# ------------------------------------------------------------------ published


def run_config(tmp_path, norm_type="handrolled_layernorm", placement="pre", qk_norm=False, vocab_size=97) -> Config:
    cfg = Config()
    cfg.run.name, cfg.run.dir, cfg.train.steps = f"{placement}-{qk_norm}", str(tmp_path / "run"), 10
    m = cfg.model
    m.vocab_size, m.context_length, m.d_model, m.n_layers, m.n_heads = vocab_size, 48, 32, 2, 4
    m.norm_type, m.norm_placement, m.qk_norm = norm_type, placement, qk_norm
    return cfg


def checkpoint(cfg: Config, model: GPT):
    """A checkpoint folder of ``model`` as a run writes it (weights, config, record), in the run's folder."""
    info = {"step": 10, "tokens": 100, "segments": []}
    root = cfg.run_dir / "checkpoints"
    return save_checkpoint(
        root, 10, model, state={}, config_yaml=dump_config(cfg), info=info, keep_last=1, is_best=False
    )


@pytest.mark.parametrize("placement,qk_norm", [("post", False), ("peri", False), ("pre", True), ("post", True)])
def test_native_gpt2_export_refuses_all_but_pre_norm_without_qk_norm(tmp_path, capsys, placement, qk_norm):
    from gpt.commands.push_to_hub import main as push_to_hub

    cfg = run_config(tmp_path, "pytorch_layernorm", placement, qk_norm)
    ckpt = checkpoint(cfg, GPT(cfg.model))
    folder = tmp_path / "export"
    with pytest.raises(HubError) as refused:
        export_checkpoint(ckpt, folder, "me/native", layout=Layout.NATIVE_GPT2)
    message = str(refused.value)
    assert message == (
        f"--native-gpt2: GPT2LMHeadModel is pre-norm without QK-norm, and this model has norm_placement {placement} "
        f"and qk_norm {str(qk_norm).lower()}; publish it with remote code (without --native-gpt2); native: "
        "norm_placement pre and qk_norm false"
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
    ``old_config``, its config.json without the two keys, as models published before them."""
    folder = tmp_path / f"{cfg.run.name}-export{'-old' if old_config else ''}"
    export_checkpoint(checkpoint(cfg, model), folder, f"me/{cfg.run.name}")
    if old_config:
        config = json.loads((folder / "config.json").read_text())
        del config["norm_placement"], config["qk_norm"]
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_a_peri_norm_qk_norm_model_reloads_through_transformers_and_generates_the_same(tmp_path):
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(8))
    cfg = run_config(tmp_path, "dyt", "peri", True)
    model = jitter_norms(GPT(cfg.model, seed=3).eval())
    pre_cfg = run_config(tmp_path / "pre", "pytorch_rmsnorm")
    pre = jitter_norms(GPT(pre_cfg.model, seed=3).eval())
    folders = [published(tmp_path, cfg, model), published(tmp_path / "pre", pre_cfg, pre, old_config=True)]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", HF_LOAD, json.dumps([str(f) for f in folders]), json.dumps(ids.tolist())]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    for folder, ours, placement, qk_norm in ((folders[0], model, "peri", True), (folders[1], pre, "pre", False)):
        got = results[str(folder)]
        assert (got["placement"], got["qk_norm"]) == (placement, qk_norm)  # the same placement was built
        with torch.no_grad():
            assert (torch.tensor(got["logits"]) - ours(ids)[0]).abs().max().item() <= 1e-5
        cached, uncached = (ours.generate(ids, 30, temperature=0, use_cache=c).tolist() for c in (True, False))
        assert got["cached"] == got["uncached"] == cached == uncached  # ours and transformers', cache or not


def test_a_published_model_carries_its_placement_in_config_and_card_and_reloads(tmp_path):
    cfg = run_config(tmp_path, "pytorch_rmsnorm", "peri", True)
    model = jitter_norms(GPT(cfg.model, seed=3).eval())
    folder = published(tmp_path, cfg, model)
    config = json.loads((folder / "config.json").read_text())
    assert (config["norm_placement"], config["qk_norm"]) == ("peri", True)
    assert hub_config(cfg, Layout.REMOTE_CODE)["norm_placement"] == "peri"
    card = (folder / "README.md").read_text()
    assert "this one uses `pytorch_rmsnorm`, peri-norm, QK-norm." in card
    assert "peri-norm (each block: x + norm(f(norm(x))), a norm before and after each sublayer)" in card
    assert "QK-norm: the same norm over each head's queries and keys." in card
    reloaded = load_published(folder)
    assert reloaded.blocks[0].placement == "peri" and reloaded.blocks[0].attn.qk_norm
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(reloaded(idx)[0], model(idx)[0])
    pre = run_config(tmp_path / "pre")
    card = (published(tmp_path / "pre", pre, GPT(pre.model)) / "README.md").read_text()
    assert "pre-norm (each block: x + f(norm(x)), as GPT-2), and before the head; no QK-norm." in card
    assert "this one uses `handrolled_layernorm`." in card


def test_weight_conversion_to_gpt2_refuses_what_gpt2_cannot_compute(tiny_model_cfg):
    from gpt.model.gpt2_weights import hf_config_kwargs, state_dict_to_hf

    cfg = tiny_model_cfg(norm_type="pytorch_layernorm", norm_placement="peri", qk_norm=True)
    with pytest.raises(ValueError, match="norm_placement peri and qk_norm true; convertible: norm_placement pre and"):
        state_dict_to_hf(GPT(cfg).state_dict(), cfg)
    assert hf_config_kwargs(tiny_model_cfg(norm_type="pytorch_layernorm"))["n_embd"] == 32
