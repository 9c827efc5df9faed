"""model.block modern: rotary positions, a SwiGLU MLP, no biases. Its attention and MLP equal transformers' Llama
ones given the same weights (an outside implementation); the model's parameters, positions and cache behave."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRotaryEmbedding

from gpt.config import ConfigError, load_config
from gpt.model.gpt import GPT, CausalSelfAttention, Context, SwiGLU, rope_angles, swiglu_width

C, NH, T = 64, 4, 12


def model_cfg(*sets: str):
    return load_config("configs/ladder.yaml", ["model.size=4x64", "model.block=modern", *sets]).model


def llama_config() -> LlamaConfig:
    cfg = LlamaConfig(
        hidden_size=C, num_attention_heads=NH, num_key_value_heads=NH, intermediate_size=swiglu_width(C),
        attention_bias=False, mlp_bias=False, max_position_embeddings=64, rope_parameters={"rope_theta": 10_000.0,
        "rope_type": "default"},
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def test_rope_angles_equal_llamas_rotary_embedding():
    pos = torch.tensor([[0, 1, 2, 3, 7, 40]])
    cos, sin = LlamaRotaryEmbedding(llama_config())(torch.zeros(1, 6, C), pos)
    ours_cos, ours_sin = rope_angles(pos, C // NH)  # (1, 1, 6, hs)
    torch.testing.assert_close(ours_cos[:, 0], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_sin[:, 0], sin, rtol=0, atol=1e-6)


def test_attention_equals_llama_attention_with_mapped_weights():
    torch.manual_seed(0)
    ours = CausalSelfAttention(model_cfg(), layer=0).double()
    theirs = LlamaAttention(llama_config(), layer_idx=0).double()
    q, k, v = ours.qkv.weight.split(C, dim=0)
    with torch.no_grad():
        for lin, w in ((theirs.q_proj, q), (theirs.k_proj, k), (theirs.v_proj, v), (theirs.o_proj, ours.proj.weight)):
            lin.weight.copy_(w)
    x = torch.randn(2, T, C, dtype=torch.float64)
    pos = torch.arange(T)[None].expand(2, T)
    cos, sin = LlamaRotaryEmbedding(llama_config())(x, pos)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    expected = theirs(x, position_embeddings=(cos, sin), attention_mask=causal)[0]
    got = ours(x, ctx=Context(rope=rope_angles(torch.arange(T), C // NH)))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # both take the angles in float32
    assert ours.qkv.bias is None and ours.proj.bias is None


def test_swiglu_equals_llama_mlp_with_mapped_weights():
    torch.manual_seed(1)
    ours = SwiGLU(model_cfg()).double()
    theirs = LlamaMLP(llama_config()).double()
    with torch.no_grad():
        theirs.gate_proj.weight.copy_(ours.gate.weight)
        theirs.up_proj.weight.copy_(ours.fc.weight)
        theirs.down_proj.weight.copy_(ours.proj.weight)
    x = torch.randn(2, T, C, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


def test_the_modern_model_has_no_biases_no_position_table_and_gpt2s_matrix_weights():
    modern, gpt2 = GPT(model_cfg()), GPT(model_cfg("model.block=gpt2"))
    names = dict(modern.named_parameters())
    assert "wpe.weight" not in names and not any(n.endswith(".bias") for n in names if "ln_" not in n)
    assert swiglu_width(768) == 2048 and swiglu_width(64) == 170
    blocks = lambda m: sum(p.numel() for n, p in m.named_parameters() if n.startswith("blocks.") and p.dim() == 2)  # noqa: E731
    # 4 x (4 x 64^2 attention + 3 x 64 x 170 SwiGLU) against 4 x (4 x 64^2 + 8 x 64^2): 128 weights fewer per block
    assert blocks(modern) == blocks(gpt2) - 4 * (8 * 64 * 64 - 3 * 64 * 170) == 4 * (4 * 4096 + 3 * 64 * 170)


def test_positions_matter_and_the_cache_and_left_padding_agree():
    torch.manual_seed(2)
    model = GPT(model_cfg(), seed=3).eval()
    x = torch.randint(0, 257, (1, 16))
    logits = model(x)[0]
    # a token's logits depend on where it sits: rotations, not a table, carry the positions
    shifted = model(torch.cat([x[:, :1], x], dim=1))[0][:, 1:]
    assert (shifted[:, -1] - logits[:, -1]).abs().max() > 1e-3
    cached = model.generate(x[:, :6], 8, temperature=0)
    assert torch.equal(cached, model.generate(x[:, :6], 8, temperature=0, use_cache=False))
    # a left-padded row reads as the same tokens unpadded: positions from the mask
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x[:, :8]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 8)], dim=1).long()
    torch.testing.assert_close(model(padded, attention_mask=mask)[0][:, 3:], model(x[:, :8])[0], atol=1e-5, rtol=0)


def test_a_modern_block_with_a_qkv_bias_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        model_cfg("model.qkv_bias=true")
    assert "modern block has no biases" in str(e.value) and "\n" not in str(e.value)
