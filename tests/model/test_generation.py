"""Generation with a key-value cache and left-padded batches: the harness's GPT, and the published model
through transformers' own ``generate()``, for every norm type."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from gpt.config import Config
from gpt.model.gpt import GPT, KVCache
from gpt.model.norms import NORM_TYPES
from gpt.publish.export import write_tokenizer
from gpt.publish.layouts import Layout, export_weights, hub_config, write_code

PROMPTS = ["The king", "Good morrow, my lord, what news from the court", "O"]  # three lengths


def tiny(norm_type, vocab_size=97, context_length=48, seed=3):
    cfg = Config()
    cfg.run.name = f"tiny-{norm_type}"
    m = cfg.model
    m.vocab_size, m.context_length, m.d_model, m.n_layers, m.n_heads = vocab_size, context_length, 32, 2, 4
    m.norm_type = norm_type
    return cfg, GPT(m, seed=seed).eval()


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_greedy_with_the_cache_equals_without_it(norm_type):
    _, model = tiny(norm_type)
    idx = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(0))
    # 9 + 60 tokens run past the 48-token context: the cache gives way to the sliding window there
    with_cache = model.generate(idx, 60, temperature=0, use_cache=True)
    without = model.generate(idx, 60, temperature=0, use_cache=False)
    assert torch.equal(with_cache, without)
    # step by step, the cache's logits are the whole sequence's
    cache, full = KVCache(), model(with_cache[:, :40])[0]
    steps = [model(with_cache[:, :30], cache=cache)[0]] + [
        model(with_cache[:, t : t + 1], cache=cache)[0] for t in range(30, 40)
    ]
    assert cache.get_seq_length() == 40
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_a_left_padded_batch_gives_each_prompt_its_own_logits(norm_type):
    _, model = tiny(norm_type)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [40, 41, 42, 43]]
    width = max(map(len, prompts))
    batch = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # 0: any id, never read
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    logits = model(batch, attention_mask=mask)[0]
    for row, p in enumerate(prompts):
        alone = model(torch.tensor([p]))[0][0]
        assert (logits[row, width - len(p) :] - alone).abs().max().item() < 1e-5, row
    assert torch.isfinite(logits).all()  # padding rows read themselves: no empty softmax


def test_positions_past_the_context_are_refused():
    _, model = tiny("pytorch_layernorm", context_length=8)
    cache = KVCache()
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence length 9 exceeds model.context_length=8"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


HF_GENERATE = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
prompts = json.loads(sys.argv[2])
out = {}
for folder in json.loads(sys.argv[1]):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tok(prompts, padding=True, return_tensors="pt")
    kw = dict(max_new_tokens=12, do_sample=False)
    padded = model.generate(**batch, **kw)[:, batch.input_ids.shape[1]:].tolist()
    alone, uncached = [], []
    for p in prompts:
        ids = tok(p, return_tensors="pt")
        alone.append(model.generate(**ids, **kw)[0, ids.input_ids.shape[1]:].tolist())
        uncached.append(model.generate(**ids, use_cache=False, **kw)[0, ids.input_ids.shape[1]:].tolist())
    legacy = model(batch.input_ids, use_cache=True)
    out[folder] = {"padded": padded, "alone": alone, "uncached": uncached, "left": tok.padding_side,
                   "cache": type(legacy.cache).__name__, "mask": batch.attention_mask.tolist()}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_published_models_generate_with_a_cache_and_left_padding(tmp_path):
    """model.generate(**tokenizer(prompts, padding=True, return_tensors="pt")) as with any Hub model, every norm
    type: each prompt of a left-padded batch continues as it does alone, with the cache as without it."""
    folders = []
    for norm_type in NORM_TYPES:
        cfg, model = tiny(norm_type, vocab_size=50257, context_length=64)
        folder = tmp_path / norm_type
        folder.mkdir()
        weights = export_weights(cfg, model.state_dict(), Layout.REMOTE_CODE)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(hub_config(cfg, Layout.REMOTE_CODE)))
        write_tokenizer(folder, cfg.model.context_length)
        write_code(folder)
        folders.append(str(folder))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", HF_GENERATE, json.dumps(folders), json.dumps(PROMPTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    for folder in folders:
        got = results[folder]
        assert got["left"] == "left" and got["cache"] == "DynamicCache"
        assert got["mask"][0][0] == 0 and got["mask"][1][0] == 1  # the batch really was left-padded
        assert got["padded"] == got["alone"], folder
        assert got["uncached"] == got["alone"], folder
        assert all(len(tokens) == 12 for tokens in got["alone"])
