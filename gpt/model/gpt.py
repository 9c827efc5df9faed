"""A GPT-2-style decoder whose every norm comes from ``make_norm(cfg)``.

Built from parts to whole: attention, MLP, block, model. Shapes: B batch, T sequence
length, C = d_model, V = vocab_size, nh heads of hs = C / nh features each.

Where the norms sit is ``cfg.norm_placement`` (pre, post, peri, reordered or mix; see ``Block``), which norm
type sits where is ``cfg.attn_norm_type`` / ``mlp_norm_type`` / ``final_norm_type`` (``cfg.norm_type`` where
None), whether a final norm ``ln_f`` reads the last block's output is ``cfg.final_norm``, and ``cfg.qk_norm``
(none, head, full) adds a norm of ``cfg.qk_norm_type`` over the queries and keys (see ``CausalSelfAttention``).
Every placement keeps the names ``ln_1``, ``ln_2`` and ``ln_f`` and every non-norm parameter's
name, so the placement changes no other weight's initial value. ``cfg.norm_compute_dtype`` float32 (the
default) makes every norm compute in fp32 under autocast (``normed``).

``cfg.block`` is the block's family: gpt2 (learned positions, a GELU MLP 4 x d_model wide, biases) or modern
(Llama's: rotary positions on the queries and keys, a SwiGLU MLP of the same weights, no biases in any linear
layer); the norms are the same factor in both.

Initialisation is per parameter, seeded by ``(seed, parameter name)`` (``init_weights``; why:
docs/model.md, "Initialisation does not depend on the norm").

Generation reuses the keys and values of the tokens already read (a ``KVCache``, or any of
transformers' ``Cache`` classes: both have ``update(k, v, layer_idx)``), and a batch of prompts
of different lengths is left-padded with an ``attention_mask`` (1 token, 0 padding). Training
passes neither and takes the plain causal path.

This file is shipped verbatim to the Hub beside ``norms.py`` and ``loss.py`` (the published
model's remote code wraps this very ``GPT``), so it imports torch and its two siblings only.
``cfg`` is a ``gpt.config.ModelConfig``, or any object with its fields: every option of
``gpt.config.architecture`` (a published config.json's, completed by its ``from_hub``).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .loss import cross_entropy
from .norms import is_norm, make_norm


class Context(NamedTuple):
    """What attention reads besides x, passed to every block by keyword: ``mask`` (B or 1, 1, T, S) True where a
    query may read a key (None: causal over x alone, or, after a cache's S - T tokens, one new token reading them
    all), and ``cache`` (a ``KVCache`` or a transformers ``Cache``: the tokens read before; None in training)."""

    mask: torch.Tensor | None = None
    cache: Any = None
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # the modern block's (cos, sin) at each query's position


ROPE_BASE = 10_000.0  # the rotary base of Llama 2 and GPT-NeoX


def rope_angles(positions: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles at ``positions`` ((T,) or (B, T)): (T, hs) or (B, 1, T, hs), each angle
    twice, at feature i and i + hs / 2, the pairs ``rotate`` turns (Llama's layout, transformers' rotate_half)."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, head_size, 2, device=positions.device).float() / head_size)
    angles = positions.float()[..., None] * inv_freq  # (..., T, hs / 2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., T, hs)
    if angles.dim() == 3:
        angles = angles[:, None]  # (B, 1, T, hs): broadcast over the heads
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hs) with each feature pair (i, i + hs / 2) turned by its angle, in x's dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


def normed(norm: nn.Module, x: torch.Tensor, upcast: bool) -> torch.Tensor:
    """``norm(x)``; with ``upcast`` (model.norm_compute_dtype: float32, the default) an x in 16 bits is computed in
    float32 and returned in x's dtype. Under autocast a hand-rolled norm otherwise takes its statistics in x's dtype
    (bf16 for an input that a matmul just wrote) while autocast runs PyTorch's in fp32: upcasting gives both the
    same input. An fp32 (or fp64) x, the residual stream's, is left as it is: the same bits either way."""
    return norm(x.float()).to(x.dtype) if upcast and x.dtype.itemsize < 4 else norm(x)


class Scores(nn.Module):
    """The queries and keys exactly as the attention's dot product reads them, (B, nh, T, hs) each: a no-op that
    names the place, so that what reads the attention logits (the statistics probe's hook) follows whatever the
    attention does to q and k first (QK-norm here; a rotation or a scale in an option of yours)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, layer: int = 0):
        super().__init__()
        self.n_heads, self.layer = cfg.n_heads, layer  # layer: this block's entry in a cache
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.qkv_bias)  # q, k, v at once (modern: no bias)
        self.qk_norm = cfg.qk_norm
        self.upcast = cfg.norm_compute_dtype == "float32"
        if self.qk_norm != "none":  # one norm of the queries, one of the keys: per head (hs wide) or over all C
            width = {"head": cfg.d_model // cfg.n_heads, "full": cfg.d_model}.get(self.qk_norm)
            if width is None:
                raise ValueError(f"qk_norm {self.qk_norm!r} has no attention; these have: none, head, full")
            self.q_norm = make_norm(cfg, width, norm_type=cfg.qk_norm_type)
            self.k_norm = make_norm(cfg, width, norm_type=cfg.qk_norm_type)
        self.scores = Scores()
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=block_of(cfg) == "gpt2")  # residual projection
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, *, ctx: Context) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        # QK-norm before the cache, so the cached keys are normalised ones; in v's dtype again, as autocast
        # computes some norms in float32
        if self.qk_norm == "full":  # over all C features of the projection (OLMo 2)
            q, k = normed(self.q_norm, q, self.upcast).to(v.dtype), normed(self.k_norm, k, self.upcast).to(v.dtype)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm == "head":  # over each head's hs features, one weight for all heads (Qwen3, Gemma 3)
            q, k = normed(self.q_norm, q, self.upcast).to(v.dtype), normed(self.k_norm, k, self.upcast).to(v.dtype)
        if ctx.rope is not None:  # the modern block: positions as rotations, after QK-norm (Qwen3, OLMo 2)
            q, k = rotate(q, *ctx.rope), rotate(k, *ctx.rope)
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v, self.layer)  # (B, nh, S, hs): the cached tokens', then these
        q, k = self.scores(q, k)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=ctx.mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=ctx.mask is None and k.shape[2] == T,
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_drop(self.proj(y))


class SwiGLU(nn.Module):
    """The modern block's MLP: proj(silu(gate(x)) * fc(x)), no biases, ``swiglu_width`` wide: three matrices with
    the weights of GPT-2's two (8 d_model^2, to the rounding of the width)."""

    def __init__(self, cfg):
        super().__init__()
        width = swiglu_width(cfg.d_model)
        self.gate = nn.Linear(cfg.d_model, width, bias=False)
        self.fc = nn.Linear(cfg.d_model, width, bias=False)  # the "up" projection
        self.proj = nn.Linear(width, cfg.d_model, bias=False)  # residual projection ("down")
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> 2 x (B, T, H) -> (B, T, C)
        return self.drop(self.proj(F.silu(self.gate(x)) * self.fc(x)))


def swiglu_width(d_model: int) -> int:
    """SwiGLU's hidden width: 8 d_model / 3 rounded down (2048 at GPT-2 small's 768), so 3 x d_model x width is
    GPT-2's 2 x d_model x 4 d_model."""
    return 8 * d_model // 3


def block_of(cfg) -> str:
    """``cfg.block``, gpt2 where a config has none (one written before the option)."""
    return getattr(cfg, "block", "gpt2")


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)  # residual projection
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> (B, T, 4C) -> (B, T, C); GPT-2's GELU is the tanh approximation
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """Attention, then MLP, each on the residual stream; ``cfg.norm_placement`` says where the norms sit:

    pre:       x = x + attn(ln_1(x));            x = x + mlp(ln_2(x))            (GPT-2; the default)
    post:      x = ln_1(x + attn(x));            x = ln_2(x + mlp(x))            (the original Transformer)
    peri:      x = x + ln_1_out(attn(ln_1(x)));  x = x + ln_2_out(mlp(ln_2(x)))  (Peri-LN: before and after)
    reordered: x = x + ln_1(attn(x));            x = x + ln_2(mlp(x))            (OLMo 2: after, inside the residual)
    mix:       post in the first ``cfg.mix_post_layers`` blocks, pre in the rest  (Mix-LN)

    ln_1 (and ln_1_out) is of ``cfg.attn_norm_type``, ln_2 (and ln_2_out) of ``cfg.mlp_norm_type``, each
    ``cfg.norm_type`` where None. With ``cfg.norm_depth_scaling`` inverse_sqrt every norm's output (a no_norm site
    has none) is multiplied by 1 / sqrt(layer + 1) (LayerNorm Scaling): a Python float fixed at construction, part
    of the architecture like the placement, so no state dict, meta-device init or checkpoint round trip can lose or
    change it.
    """

    def __init__(self, cfg, layer: int = 0):
        super().__init__()
        self.placement = cfg.norm_placement
        if self.placement == "mix":  # each block is one of the two
            if cfg.mix_post_layers is None:
                raise ValueError("norm_placement mix needs model.mix_post_layers (a config gives it a number)")
            self.placement = "post" if layer < cfg.mix_post_layers else "pre"
        if self.placement not in PLACEMENTS:  # the ones forward builds
            raise ValueError(
                f"norm_placement {self.placement!r} has no block; these have: {', '.join(PLACEMENTS)}, mix"
            )
        self.upcast = cfg.norm_compute_dtype == "float32"
        self.scale = 1 / math.sqrt(layer + 1) if getattr(cfg, "norm_depth_scaling", "none") == "inverse_sqrt" else 1.0
        attn_type, mlp_type = site_norm_type(cfg, "attn"), site_norm_type(cfg, "mlp")
        self.ln_1 = make_norm(cfg, norm_type=attn_type)
        self.attn = CausalSelfAttention(cfg, layer)
        if self.placement == "peri":
            self.ln_1_out = make_norm(cfg, norm_type=attn_type)  # on the attention's output, before the stream
        self.ln_2 = make_norm(cfg, norm_type=mlp_type)
        self.mlp = MLP(cfg) if block_of(cfg) == "gpt2" else SwiGLU(cfg)
        if self.placement == "peri":
            self.ln_2_out = make_norm(cfg, norm_type=mlp_type)  # on the MLP's output

    def forward(self, x: torch.Tensor, *, ctx: Context) -> torch.Tensor:
        def n(norm, t):
            out = normed(norm, t, self.upcast)
            if self.scale == 1.0 or isinstance(norm, nn.Identity):  # depth 1, none, a no_norm site: no multiply
                return out
            return out * self.scale

        def attn(t):
            return self.attn(t, ctx=ctx)

        if self.placement == "post":  # the residual stream itself is normalised after each sum
            x = n(self.ln_1, x + attn(x))
            return n(self.ln_2, x + self.mlp(x))
        if self.placement == "peri":  # what each sublayer adds is normalised; the stream never is
            x = x + n(self.ln_1_out, attn(n(self.ln_1, x)))
            return x + n(self.ln_2_out, self.mlp(n(self.ln_2, x)))
        if self.placement == "reordered":  # the sublayer reads the raw stream; its output is normalised
            x = x + n(self.ln_1, attn(x))
            return x + n(self.ln_2, self.mlp(x))
        x = x + attn(n(self.ln_1, x))
        return x + self.mlp(n(self.ln_2, x))


PLACEMENTS = ("pre", "post", "peri", "reordered")  # a block's own; mix makes each block pre or post


def site_norm_type(cfg, site: str) -> str:
    """The norm type at ``site`` (attn, mlp, final): ``cfg.<site>_norm_type``, else ``cfg.norm_type``."""
    return getattr(cfg, f"{site}_norm_type", None) or cfg.norm_type


class KVCache:
    """The keys and values of the tokens read so far, a (B, nh, S, hs) pair per block. Its two methods are
    those of transformers' ``Cache``, so the model takes either."""

    def __init__(self):
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's k, v (B, nh, T, hs) to block ``layer_idx``'s; return all of them."""
        if layer_idx == len(self.layers):
            self.layers.append((k, v))
        else:
            past_k, past_v = self.layers[layer_idx]
            self.layers[layer_idx] = (torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2))
        return self.layers[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx][0].shape[2] if layer_idx < len(self.layers) else 0


def visible_keys(T: int, past: int, keep: torch.Tensor | None, device) -> torch.Tensor | None:
    """Which keys each of T new queries may read (B or 1, 1, T, past + T), after ``past`` cached tokens:
    the ones at or before it, and not padding (``keep`` (B, past + T): 1 token, 0 padding). None where
    attention needs no mask: causal over the new tokens alone, or one new token reading everything."""
    if keep is None and (past == 0 or T == 1):
        return None
    q = torch.arange(past, past + T, device=device)[:, None]  # (T, 1) the queries' places in the sequence
    k = torch.arange(past + T, device=device)[None, :]  # (1, S) the keys'
    allowed = (k <= q)[None, None]  # (1, 1, T, S)
    if keep is not None:
        # a padding query reads itself, so that no row is empty (NaN); a token never reads padding
        allowed = (allowed & keep.bool()[:, None, None, :]) | (k == q)
    return allowed


# The parameters with one row per token: model.vocab_pad_multiple pads them (a tied embedding
# with the head), and every export leaves the padding behind.
VOCAB_ROWS = ("wte.weight", "lm_head.weight")

# Parameters whose GPT-2 init is scaled by 1 / sqrt(2 * n_layers): the projections
# that write into the residual stream, two per block.
RESIDUAL_PROJECTIONS = ("attn.proj.weight", "mlp.proj.weight")


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one parameter, from the run's seed and the parameter's name."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class GPT(nn.Module):
    def __init__(self, cfg, seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        # Construction draws (nn.Linear's default init) are overwritten by init_weights;
        # fork_rng keeps them from advancing the global RNG that dropout uses later.
        # vocab_pad_multiple pads the head (and a tied embedding) with rows past vocab_size: they start
        # at zero, no token id reaches them, and forward drops their logits
        rows = cfg.padded_vocab_size
        with torch.random.fork_rng(devices=[]):
            self.wte = nn.Embedding(rows if cfg.tie_weights else cfg.vocab_size, cfg.d_model)  # token embeddings
            self.modern = block_of(cfg) == "modern"
            if not self.modern:  # the modern block rotates its queries and keys instead
                self.wpe = nn.Embedding(cfg.context_length, cfg.d_model)  # learned positions
            self.drop = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
            # the norm before the output head (model.final_norm), in every placement: after post-norm it
            # normalises the last block's normalised output again; without it the head reads that output
            self.ln_f = make_norm(cfg, norm_type=site_norm_type(cfg, "final")) if cfg.final_norm else nn.Identity()
            self.upcast = cfg.norm_compute_dtype == "float32"
            self.lm_head = nn.Linear(cfg.d_model, rows, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        if seed is not None:  # None: the weights come from a checkpoint (and may live on the meta device)
            self.init_weights(seed)

    # ------------------------------------------------------------------ init

    def norm_parameter_names(self) -> set[str]:
        """Names of the parameters that belong to norm layers (built by make_norm)."""
        return {
            f"{mname}.{pname}"
            for mname, module in self.named_modules()
            if is_norm(module)
            for pname, _ in module.named_parameters()
        }

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Draw every non-norm parameter from its own generator, seeded by (seed, name).

        ``init: pytorch`` reproduces PyTorch's default distributions (what the write-up
        trained with); ``init: gpt2`` is the GPT-2 paper's. Norm layers keep the
        deterministic values they were built with. A tied matrix is drawn once, under its first
        name (``wte.weight``), by the output head's rule: what PyTorch gives when the head's
        weight is shared into the embedding. The embedding's normal(0, 1) would make the head's
        logits sqrt(d_model) wide: an initial loss of ~86 at d_model 128 instead of ~ln(V), a
        saturated softmax and subnormal gradients.
        """
        gpt2 = self.cfg.init == "gpt2"
        std = 0.02
        done: set[int] = set()  # a tied weight is initialised once, by its first owner
        for mname, module in self.named_modules():
            if is_norm(module) or not list(module.parameters(recurse=False)):
                continue
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in done:
                    continue
                done.add(id(p))
                name = f"{mname}.{pname}"
                rule = self.lm_head if p is self.lm_head.weight else module  # tied: the head's rule
                g = torch.Generator(device=p.device).manual_seed(param_seed(seed, name))
                if p.shape[0] > self.cfg.vocab_size and name in VOCAB_ROWS:
                    p[self.cfg.vocab_size :] = 0.0  # padding rows: drawn for no one, so the real rows
                    p = p[: self.cfg.vocab_size]  # are what an unpadded model draws
                if isinstance(rule, nn.Embedding):
                    nn.init.normal_(p, 0.0, std if gpt2 else 1.0, generator=g)
                elif isinstance(rule, nn.Linear) and pname == "weight":
                    if gpt2:
                        scale = 1 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(RESIDUAL_PROJECTIONS) else 1.0
                        nn.init.normal_(p, 0.0, std * scale, generator=g)
                    else:  # nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5))
                        nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=g)
                elif isinstance(rule, nn.Linear) and pname == "bias":
                    if gpt2:
                        nn.init.zeros_(p)
                    else:
                        bound = 1 / math.sqrt(rule.in_features)
                        nn.init.uniform_(p, -bound, bound, generator=g)
                else:
                    raise TypeError(f"init_weights has no rule for parameter {name} of {type(rule).__name__}")

    # --------------------------------------------------------------- forward

    def embeddings(self) -> list[nn.Module]:
        """The tables the input is looked up in: the tokens', and the learned positions' (gpt2 block)."""
        return [self.wte] if self.modern else [self.wte, self.wpe]

    def num_params(self, norms: bool = True) -> int:
        """Parameter count, a tied weight counted once, vocabulary padding not at all. ``norms=False``
        leaves out the norm layers: the count that sets a run's length (``train.tokens_per_param``),
        the same for every norm type."""
        skip = set() if norms else self.norm_parameter_names()
        padding = (self.cfg.padded_vocab_size - self.cfg.vocab_size) * self.cfg.d_model  # rows that predict nothing
        return sum(p.numel() for name, p in self.named_parameters() if name not in skip) - padding

    def flops_per_token(self) -> int:
        """Training FLOPs per token of the model's matmuls (forward + backward):
        6 x (weights of every linear layer, the output head included, its vocabulary padding not;
        the two embeddings are lookups) + 12 x n_layers x context_length x d_model (attention's
        scores and weighted sum at full context, causal masking not discounted, as in PaLM). Norms,
        QK-norm included, are elementwise and not counted: every placement has the same count."""
        c = self.cfg
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        matmul -= (c.padded_vocab_size - c.vocab_size) * c.d_model
        return 6 * matmul + 12 * c.n_layers * c.context_length * c.d_model

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        loss_only: bool = False,
    ):
        """idx (B, T) token ids -> logits (B, T, V), and the mean cross-entropy if targets (B, T).
        ``loss_only`` (training) returns (None, loss): the logits are not kept alive through backward
        (1.15 GiB in bf16 at 12 x 1024 x 50,257), nor made an output of a compiled graph.

        For generation: ``cache`` (a ``KVCache`` or a transformers ``Cache``) holds the tokens read
        before idx and takes idx's; ``attention_mask`` (B, cached + T) is 1 for a token and 0 for
        padding (left padding: each row's tokens start at position 0); ``position_ids`` (B, T)
        overrides the positions that follow from the two."""
        B, T = idx.shape
        past = cache.get_seq_length() if cache is not None else 0
        keep = attention_mask if attention_mask is not None and not bool(attention_mask.all()) else None
        if position_ids is None and keep is not None:
            position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]  # padding sits at 0, unread
        if position_ids is None:  # the common case, checked without reading a tensor back from the device
            if self.cfg.context_length < past + T:
                raise ValueError(f"sequence length {past + T} exceeds model.context_length={self.cfg.context_length}")
            position_ids = torch.arange(past, past + T, device=idx.device)
        elif int(position_ids.max()) >= self.cfg.context_length:
            raise ValueError(
                f"position {int(position_ids.max())} is past the model's last, model.context_length - 1 = "
                f"{self.cfg.context_length - 1}"
            )
        mask = visible_keys(T, past, keep, idx.device)
        if self.modern:  # positions enter as rotations of each block's queries and keys
            ctx = Context(mask, cache, rope_angles(position_ids, self.cfg.d_model // self.cfg.n_heads))
            x = self.drop(self.wte(idx))  # (B, T, C)
        else:
            ctx = Context(mask, cache)
            x = self.drop(self.wte(idx) + self.wpe(position_ids))  # (B, T, C)
        for block in self.blocks:
            x = block(x, ctx=ctx)
        logits = self.lm_head(normed(self.ln_f, x, self.upcast))  # (B, T, V), or (B, T, padded V)
        if logits.shape[-1] > self.cfg.vocab_size:
            logits = logits[..., : self.cfg.vocab_size]  # padded logits are never predicted nor scored
        loss = cross_entropy(logits, targets) if targets is not None else None
        return (None, loss) if loss_only else (logits, loss)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to idx (B, T); the context is cropped to context_length.
        ``temperature`` 0 takes the most likely token; ``top_k`` samples among the k most likely.
        ``use_cache`` reads each token once (a ``KVCache``) until the context is full; from then on, and
        without it, every step reads the whole (cropped) context again."""
        cache = KVCache() if use_cache else None
        for _ in range(max_new_tokens):
            if cache is not None and idx.shape[1] > self.cfg.context_length:
                cache = None  # the positions ran out: the window slides, and every step reads it whole
            past = cache.get_seq_length() if cache is not None else 0
            logits = self(idx[:, past - idx.shape[1] if past else -self.cfg.context_length :], cache=cache)[0]
            logits = logits[:, -1, :].float()  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, -math.inf)
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
