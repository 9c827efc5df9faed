"""The GPT model: shapes, loss, causality, parameter count, init invariance, GPT-2 compatibility."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import CONFIGS

from gpt.config import load_config
from gpt.model.gpt import GPT, RESIDUAL_PROJECTIONS, param_seed
from gpt.model.loss import cross_entropy
from gpt.model.norms import NORM_TYPES


def test_forward_shapes_and_loss_is_mean_cross_entropy(tiny_model_cfg):
    cfg = tiny_model_cfg()
    model = GPT(cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (3, 16), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (3, 16), generator=g)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, cfg.vocab_size)
    manual = -torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None]).mean()
    assert loss.item() == pytest.approx(manual.item(), rel=1e-6)
    assert model(idx)[1] is None
    # an untrained model with PyTorch's default init is not far from uniform
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 1.5


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_attention_is_causal(tiny_model_cfg, norm_type):
    model = GPT(tiny_model_cfg(norm_type=norm_type), seed=1).eval()
    idx = torch.randint(0, 97, (2, 12))
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 97  # change only the future of position 7
    a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_norms_sit_in_all_three_places(tiny_model_cfg):
    model = GPT(tiny_model_cfg(norm_type="handrolled_rmsnorm", n_layers=3), seed=0)
    expected = {f"blocks.{i}.{n}.weight" for i in range(3) for n in ("ln_1", "ln_2")} | {"ln_f.weight"}
    assert model.norm_parameter_names() == expected


def test_sequence_longer_than_context_is_refused(tiny_model_cfg):
    model = GPT(tiny_model_cfg(context_length=8), seed=0)
    with pytest.raises(ValueError, match="sequence length 9 exceeds model.context_length=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("norm_type", ["handrolled_layernorm", "pytorch_layernorm"])
def test_gpt2_small_parameter_count(norm_type):
    cfg = load_config(CONFIGS / "gpt2-small.yaml", [f"model.norm_type={norm_type}"])
    with torch.device("meta"):  # a count of shapes: no weights drawn (seconds for 163M)
        assert GPT(cfg.model, seed=None).num_params() == 163_009_536


def test_parameter_count_formula(tiny_model_cfg):
    # V*C (tokens) + T*C (positions) + L * block + final norm + C*V (untied head)
    V, T, C, L = 97, 16, 32, 2
    block = 2 * 2 * C + 3 * C * C + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * block + 2 * C + C * V
    assert GPT(tiny_model_cfg(norm_type="pytorch_layernorm")).num_params() == expected
    assert GPT(tiny_model_cfg(norm_type="pytorch_rmsnorm")).num_params() == expected - (2 * L + 1) * C
    assert GPT(tiny_model_cfg(norm_type="no_norm")).num_params() == expected - 2 * (2 * L + 1) * C
    assert GPT(tiny_model_cfg(qkv_bias=True)).num_params() == expected + L * 3 * C
    assert GPT(tiny_model_cfg(tie_weights=True)).num_params() == expected - C * V


@pytest.mark.parametrize("init", ["pytorch", "gpt2"])
@pytest.mark.parametrize("extra", [{}, {"qkv_bias": True, "tie_weights": True}])
def test_init_does_not_depend_on_norm_type(tiny_model_cfg, init, extra):
    states = {}
    for norm_type in NORM_TYPES:
        model = GPT(tiny_model_cfg(norm_type=norm_type, init=init, **extra), seed=123)
        norm_names = model.norm_parameter_names()
        states[norm_type] = {n: p.detach().clone() for n, p in model.named_parameters() if n not in norm_names}
    reference = states[NORM_TYPES[0]]
    # wte, wpe; per block 7 linear weights / biases (+ QKV bias); the head unless tied
    assert len(reference) == 2 + 2 * (7 + (1 if extra else 0)) + (0 if extra else 1)
    for norm_type, state in states.items():
        assert state.keys() == reference.keys(), norm_type
        for name, tensor in state.items():
            assert torch.equal(tensor, reference[name]), f"{norm_type}: {name} differs"


def test_init_is_per_parameter_and_seeded(tiny_model_cfg):
    a = GPT(tiny_model_cfg(), seed=5)
    b = GPT(tiny_model_cfg(), seed=5)
    c = GPT(tiny_model_cfg(), seed=6)
    deeper = GPT(tiny_model_cfg(n_layers=3), seed=5)  # an extra block shifts nothing else
    for name, p in a.named_parameters():
        assert torch.equal(p, b.state_dict()[name])
        assert torch.equal(p, deeper.state_dict()[name]), name
        if "ln_" not in name:
            assert not torch.equal(p, c.state_dict()[name]), name
    assert param_seed(5, "wte.weight") != param_seed(6, "wte.weight")


def test_model_construction_leaves_global_rng_alone(tiny_model_cfg):
    state = torch.get_rng_state()
    GPT(tiny_model_cfg(), seed=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_pytorch_init_distributions(tiny_model_cfg):
    model = GPT(tiny_model_cfg(d_model=64, n_layers=1, init="pytorch"), seed=0)
    sd = model.state_dict()
    assert 0.9 < sd["wte.weight"].std().item() < 1.1  # nn.Embedding: normal(0, 1)
    bound = 1 / math.sqrt(64)  # nn.Linear: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w = sd["blocks.0.attn.qkv.weight"]
    assert w.abs().max().item() <= bound and w.abs().max().item() > 0.95 * bound
    assert sd["blocks.0.mlp.proj.bias"].abs().max().item() <= 1 / math.sqrt(256)
    assert torch.equal(sd["blocks.0.ln_1.weight"], torch.ones(64))
    assert torch.equal(sd["blocks.0.ln_1.bias"], torch.zeros(64))


def test_gpt2_init_distributions(tiny_model_cfg):
    n_layers = 8
    model = GPT(tiny_model_cfg(d_model=128, n_layers=n_layers, init="gpt2"), seed=0)
    for name, p in model.named_parameters():
        if "ln_" in name:
            continue
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
            continue
        expected = 0.02 / math.sqrt(2 * n_layers) if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
        assert p.mean().abs().item() < 0.1 * expected + 1e-3, name
        assert p.std().item() == pytest.approx(expected, rel=0.08), name


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_every_init_starts_near_the_uniform_loss_with_no_subnormal_gradient(tiny_model_cfg, norm_type):
    # GPT-2's full vocabulary, where a too-wide head saturates the softmax: a tied matrix drawn by the
    # embedding's normal(0, 1) started at a loss of ~86 with 41% of the logits' gradients subnormal (16x
    # slower steps on the CPU). Every (tie_weights, init) pair starts within 0.45 of ln V; nothing a step
    # multiplies is subnormal.
    V, tiny = 50257, torch.finfo(torch.float32).tiny
    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, V, (2, 32), generator=g), torch.randint(0, V, (2, 32), generator=g)
    for tie_weights in (False, True):
        for init in ("pytorch", "gpt2"):
            cfg = dict(vocab_size=V, context_length=32, d_model=128, tie_weights=tie_weights, init=init)
            model = GPT(tiny_model_cfg(norm_type=norm_type, **cfg), seed=0)
            logits = model(idx)[0]
            logits.retain_grad()
            loss = cross_entropy(logits, targets)
            loss.backward()
            assert abs(loss.item() - math.log(V)) < 0.45, (tie_weights, init, loss.item())
            for name, grad in [("logits", logits.grad)] + [(n, p.grad) for n, p in model.named_parameters()]:
                subnormal = int(((grad != 0) & (grad.abs() < tiny)).sum())
                assert subnormal == 0, (tie_weights, init, name, subnormal)


def test_a_tied_matrix_takes_the_heads_rule(tiny_model_cfg):
    tied = GPT(tiny_model_cfg(d_model=64, tie_weights=True), seed=0).wte.weight
    bound = 1 / math.sqrt(64)  # nn.Linear(64, V)'s uniform(-1/sqrt(64), 1/sqrt(64)), not the embedding's normal(0, 1)
    assert bound * 0.95 < tied.abs().max().item() <= bound
    gpt2 = GPT(tiny_model_cfg(tie_weights=True, init="gpt2"), seed=0).wte.weight
    untied = GPT(tiny_model_cfg(init="gpt2"), seed=0).wte.weight
    assert torch.equal(gpt2, untied)  # gpt2's rule is one normal(0, 0.02) for both: drawn as before


def test_tied_weights_share_storage(tiny_model_cfg):
    model = GPT(tiny_model_cfg(tie_weights=True), seed=0)
    assert model.lm_head.weight is model.wte.weight


def test_dropout_only_in_training(tiny_model_cfg):
    model = GPT(tiny_model_cfg(dropout=0.5), seed=0)
    idx = torch.randint(0, 97, (2, 16))
    model.eval()
    torch.testing.assert_close(model(idx)[0], model(idx)[0], rtol=0, atol=0)
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])


def test_loss_falls_when_fitting_a_batch(tiny_model_cfg):
    torch.manual_seed(0)
    model = GPT(tiny_model_cfg(), seed=0)
    idx = torch.randint(0, 97, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_the_inventory_states_what_the_config_builds(tmp_path):
    from gpt.model.inventory import model_summary

    cfg = load_config(CONFIGS / "tiny.yaml", [f"run.dir={tmp_path / 'run'}", "train.steps=7"])
    model = GPT(cfg.model, seed=cfg.init_seed)
    text = model_summary(cfg, model).splitlines()
    norms = model.num_params() - model.num_params(norms=False)
    assert norms == (2 * cfg.model.n_layers + 1) * 2 * cfg.model.d_model  # weight and bias of every LayerNorm
    assert text[0] == f"run {cfg.run.name} -> {cfg.run_dir}"
    assert text[2] == f"parameters: {model.num_params():,} ({norms:,} in norm layers)"
    assert text[4] == f"length: 7 steps = {7 * cfg.tokens_per_step:,} tokens"
    from gpt.training.optimizer import optimizer_line

    assert optimizer_line(cfg.optim, model) == "optimizer: AdamW on every parameter, lr 0.001"
    line = optimizer_line(load_config(CONFIGS / "tiny.yaml", ["optim.name=muon"]).optim, model)
    # 4 blocks x (qkv, attn.proj, mlp.fc, mlp.proj); the rest: 2 embeddings, the head, 9 norms x 2, 4 x 3 biases
    assert line.startswith("optimizer: Muon (lr 0.02, momentum 0.95, original) on the blocks' 16 weight matrices")
    assert f"({4 * 12 * 128 * 128:,} weights); AdamW (lr 0.001) on the other 33 tensors" in line


def test_the_loss_is_float32_cross_entropy_whatever_the_logits_dtype():
    from gpt.model.loss import autocast_for, cross_entropy

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(2, 3, 11, generator=g), torch.randint(0, 11, (2, 3), generator=g)
    by_hand = -torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert cross_entropy(logits, targets).item() == pytest.approx(by_hand.mean().item(), abs=1e-6)
    per_token = cross_entropy(logits.bfloat16(), targets, reduction="none")
    assert per_token.dtype == torch.float32 and per_token.shape == (6,)
    assert per_token.double() == pytest.approx(by_hand.flatten().tolist(), abs=0.05)  # bf16 logits, fp32 softmax
    with autocast_for("fp32", torch.device("cpu"))():
        assert not torch.is_autocast_enabled("cpu")  # fp32: no autocast at all
    with autocast_for("bf16", torch.device("cpu"))():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_the_loss_is_one_chunk_under_compile_and_chunked_eagerly(monkeypatch):
    """Eagerly TokenLoss takes CHUNK_ELEMENTS logits at a time (its float32 copy bounded); traced by torch.compile
    it is one chunk: inductor fuses the upcast, and chunks would be unrolled into the graph. The same losses."""
    from gpt.model import loss

    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 4 * 11)  # 4 rows of 11 logits a chunk: 3 chunks of 12 rows
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(12, 11, generator=g, requires_grad=True), torch.randint(0, 11, (12,), generator=g)
    graphs = []

    def count(gm, example_inputs):  # a torch.compile backend: how many log-softmaxes the traced graph holds
        graphs.append(  # the autograd.Function's forward and backward are subgraphs
            sum("log_softmax" in str(n.target) for m in gm.modules() if hasattr(m, "graph") for n in m.graph.nodes)
        )
        return gm.forward

    def per_token(x, t):
        return loss.TokenLoss.apply(x, t)

    eager = per_token(logits, targets)
    torch._dynamo.reset()
    compiled = torch.compile(per_token, backend=count, fullgraph=True)(logits, targets)
    assert len(loss._chunks(logits)) == 3 and graphs == [1]
    assert torch.allclose(compiled, eager) and torch.allclose(eager, F.cross_entropy(logits, targets, reduction="none"))
