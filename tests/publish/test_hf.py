"""Weights convert to and from transformers' GPT2LMHeadModel and give the same logits."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gpt.model.gpt import GPT
from gpt.model.gpt2_weights import hf_config_kwargs, model_config_from_hf, state_dict_from_hf, state_dict_to_hf


def random_hf_model(seed=0, **kw):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=101,
        n_positions=32,
        n_embd=48,
        n_layer=3,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **kw,
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # make the norms and biases non-trivial, so a mix-up shows
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def tokens(seed=1):
    return torch.randint(0, 101, (2, 32), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("norm_type", ["pytorch_layernorm", "handrolled_layernorm", "handrolled_layernorm_fast"])
def test_hf_gpt2_weights_give_the_same_logits(norm_type):
    hf = random_hf_model()
    cfg = model_config_from_hf(hf.config, norm_type=norm_type)
    assert (cfg.qkv_bias, cfg.tie_weights, cfg.dropout, cfg.norm_eps) == (True, True, 0.0, 1e-5)
    model = GPT(cfg).eval()
    result = model.load_state_dict(state_dict_from_hf(hf.state_dict(), cfg))
    assert not result.missing_keys and not result.unexpected_keys
    idx = tokens()
    with torch.no_grad():
        ours = model(idx)[0]
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_tied_checkpoint_without_lm_head_key_loads():
    hf = random_hf_model()
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    cfg = model_config_from_hf(hf.config)
    converted = state_dict_from_hf(sd, cfg)
    assert torch.equal(converted["lm_head.weight"], hf.state_dict()["transformer.wte.weight"])


def test_write_up_shape_exports_to_transformers():
    # untied, no QKV bias: the write-up's model. Exported, transformers computes the same logits.
    hf_ref = random_hf_model(tie_word_embeddings=False)
    cfg = model_config_from_hf(hf_ref.config)
    cfg.qkv_bias = False
    assert cfg.tie_weights is False
    model = GPT(cfg, seed=3).eval()
    hf = GPT2LMHeadModel(GPT2Config(**hf_config_kwargs(cfg))).eval()
    hf.load_state_dict(state_dict_to_hf(model.state_dict(), cfg))
    assert torch.count_nonzero(hf.transformer.h[0].attn.c_attn.bias) == 0
    assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
    idx = tokens(2)
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    back = state_dict_from_hf(hf.state_dict(), cfg)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("tie", [False, True])
def test_a_padded_vocabulary_exports_without_its_padding_and_loads_back(tie):
    hf_ref = random_hf_model(tie_word_embeddings=tie)
    cfg = model_config_from_hf(hf_ref.config)
    cfg.vocab_pad_multiple = 64  # 101 tokens -> 128 rows of the head
    model = GPT(cfg, seed=3).eval()
    assert model.lm_head.weight.shape == (128, 48) and model.wte.weight.shape[0] == (128 if tie else 101)
    hf = GPT2LMHeadModel(GPT2Config(**hf_config_kwargs(cfg))).eval()
    hf.load_state_dict(state_dict_to_hf(model.state_dict(), cfg))
    assert hf.lm_head.weight.shape == (101, 48)
    idx = tokens(2)
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    back = state_dict_from_hf(hf.state_dict(), cfg)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], tensor), name  # the padding rows come back as the zeros they are


def test_rmsnorm_models_do_not_pretend_to_be_gpt2():
    cfg = model_config_from_hf(random_hf_model().config, norm_type="pytorch_rmsnorm")
    with pytest.raises(
        ValueError, match="cannot compute this model: model.norm_type pytorch_rmsnorm \\(GPT-2: pytorch_layernorm or"
    ):
        hf_config_kwargs(cfg)


def test_nonzero_qkv_bias_is_not_dropped_silently():
    hf = random_hf_model()
    cfg = model_config_from_hf(hf.config)
    cfg.qkv_bias = False
    with pytest.raises(ValueError, match="c_attn.bias is non-zero but model.qkv_bias is false"):
        state_dict_from_hf(hf.state_dict(), cfg)
