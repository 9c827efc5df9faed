"""What each norm does inside the model: per-block statistics every ``log.stats_every`` steps (rank 0).

On a stats step, after the backward pass and before the optimizer's update (``StepEngine.step``):

1. one extra forward pass of the first ``STATS_SEQUENCES`` sequences of the step's first micro-batch through
   the unwrapped model, without
   gradients, in eval mode (no dropout, so no random number is drawn) and under the run's autocast,
   with forward hooks that exist for that pass only: the residual stream entering each block, each
   norm's output (peri-norm's output norms too), DyT's saturation, the attention logits (q.k / sqrt(hs),
   recomputed on the first ``ATTENTION_SEQUENCES`` sequences from the q and k the attention reads: the qkv
   projection's output, or with QK-norm the outputs of q_norm and k_norm) and the output logits;
2. each block's gradient norm (the all-reduced gradients, before clipping), the embeddings' and the
   head's;
3. a copy of the weights, so that once the optimizer has stepped, ``||W_after - W_before|| / ||W_before||``:
   pooled over each block's parameters (dominated by its big matrices), the largest of its tensors'
   (``update_ratio_max``), and each norm tensor's own (``ln_1_weight_update_ratio``, ``q_norm_weight_...``,
   ``ln_f_bias_update_ratio``; null while the tensor is all zeros, a bias at its start).

A record of step t is measured with the weights step t's update starts from (the update ratio: the change that
update makes), so its activations and gradients are those of the model after t - 1 updates.

Nothing here touches the weights, the gradients or a random number generator, so a run computes the same
bits with stats on or off; a step that is not a stats step runs no hook and reads nothing back. The
numbers stay device tensors until ``StatsProbe.take`` reads them all back at once (one wait per stats step).

``EarlyWarning`` watches the records: a line, once per statistic and block, when a block's residual RMS
or attention-logit max grows past ``log.stats_warn_growth`` times its smallest value over the last
``log.stats_warn_window`` stats steps (from the first stats step on), or any value stops being finite;
``train.stop_on`` names the statistics whose warning also stops the run.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

import torch

STATS_SEQUENCES = 4  # the extra forward pass reads this many sequences of the micro-batch (its logits: B x T x V)
ATTENTION_SEQUENCES = 2  # the attention logits are (B, nh, T, T): measured on this many of those
SATURATION = 2.0  # DyT's tanh(alpha x) is saturated past |alpha x| > 2 (tanh(2) = 0.96)
# each block's norms (ln_1_out, ln_2_out: peri-norm's, on each sublayer's output); the final one is ln_f
NORMS = ("ln_1", "ln_2", "ln_1_out", "ln_2_out")
QK_NORMS = ("q_norm", "k_norm")  # QK-norm's, in a block's attention
WATCHED = ("resid_rms", "attn_logit_max")  # the statistics EarlyWarning compares with their recent values
# Growth is measured from at least this: near-uniform attention at initialisation has logits of ~1-3, and their
# first growth (to 20-30 within ten steps, as attention learns where to look) is training, not a blow-up.
FLOOR = {"attn_logit_max": 5.0}


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.float().pow(2).mean().sqrt()


def _norm_sq(tensors) -> torch.Tensor:
    return sum(t.float().pow(2).sum() for t in tensors)


def _ratio(p: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor's update ratio ||p - old|| / ||old|| (NaN where old is all zeros) and whether it was, on the
    device: read back with the rest."""
    before = old.float().norm()
    return (p.float() - old.float()).norm() / before, before == 0


def _ratio_value(pair) -> float | None:
    ratio, zero = pair
    return None if bool(zero) else float(ratio)


class StatsProbe:
    """Rank 0's statistics of one stats step at a time (``measure``, ``after_update``, ``take``)."""

    def __init__(self, every: int):
        self.every = every
        self.pending: dict | None = None  # device tensors of the step being measured
        self.before: dict[str, list[torch.Tensor]] | None = None  # each group's weights before the update
        self.tensor_ratios: dict = {}  # each norm tensor's (update ratio, was it all zeros) of the step measured

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @staticmethod
    def groups(model) -> dict[str, list[torch.nn.Parameter]]:
        """The parameters each gradient norm and update ratio is over: each block, the embeddings, the head
        (with tied weights the head's matrix is the token embedding's: both groups hold it)."""
        out = {f"block{i}": list(b.parameters()) for i, b in enumerate(model.blocks)}
        out["embed"] = [model.wte.weight, model.wpe.weight]
        out["head"] = [model.lm_head.weight]
        out["ln_f"] = list(model.ln_f.parameters())  # per tensor only (no pooled ratio: it is one norm)
        return out

    @torch.no_grad()
    def measure(self, model, x: torch.Tensor, autocast, scaler) -> None:
        """Everything but the update ratios, before the update: activations of ``x`` (B, T; its first
        ``STATS_SEQUENCES`` sequences) and gradients."""
        stats: dict[str, list] = {}
        with ExitStack() as hooks:
            for h in self._hooks(model, stats):
                hooks.callback(h.remove)
            was_training = model.training
            model.eval()
            try:
                with autocast():
                    model(x[:STATS_SEQUENCES])
            finally:
                model.train(was_training)
        out = {k: torch.stack(v) if len(v) > 1 or k in _PER_BLOCK else v[0] for k, v in stats.items()}
        groups = self.groups(model)
        grads = {g: _norm_sq([p.grad for p in ps if p.grad is not None]).sqrt() for g, ps in groups.items() if ps}
        out["grad_norm"] = torch.stack([grads[f"block{i}"] for i in range(len(model.blocks))])
        out["embed_grad_norm"], out["head_grad_norm"] = grads["embed"], grads["head"]
        for name in ("ln_f",):
            self._gains(getattr(model, name), name, out)
        for i, block in enumerate(model.blocks):
            for name in block_norms(block):
                self._gains(getattr(block, name), name, out, i, len(model.blocks))
        # fp16's loss scale, as the device holds it (get_scale() would wait for the device)
        scale = getattr(scaler, "_scale", None) if scaler is not None and scaler.is_enabled() else None
        out["loss_scale"] = scale.detach().reshape(()).clone() if scale is not None else None
        self.pending = out
        self.before = {g: [p.detach().clone() for p in ps] for g, ps in groups.items()}

    @torch.no_grad()
    def after_update(self, model) -> None:
        """The update ratios, once the optimizer has stepped (a skipped step's are 0)."""
        ratios, blocks = {}, len(model.blocks)
        groups = self.groups(model)
        for g, ps in groups.items():
            if g == "ln_f":
                continue
            old = self.before[g]
            ratios[g] = _norm_sq([p - o for p, o in zip(ps, old, strict=True)]).sqrt() / _norm_sq(old).sqrt()
        self.pending["update_ratio"] = torch.stack([ratios[f"block{i}"] for i in range(blocks)])
        self.pending["embed_update_ratio"], self.pending["head_update_ratio"] = ratios["embed"], ratios["head"]
        # per tensor: the pooled ratio is the big matrices'; a norm's gain or bias moves at its own rate
        largest = []
        for i, block in enumerate(model.blocks):
            names = [name for name, _ in block.named_parameters()]
            per = [_ratio(p, o) for p, o in zip(groups[f"block{i}"], self.before[f"block{i}"], strict=True)]
            largest.append(torch.stack([torch.where(zero, 0.0, r) for r, zero in per]).max())  # of those defined
            for name, (ratio, zero) in zip(names, per, strict=True):
                if name.rsplit(".", 1)[0].split(".")[-1] in NORMS + QK_NORMS:
                    key = f"{name.rsplit('.', 2)[-2]}_{name.rsplit('.', 1)[-1]}_update_ratio"
                    self.tensor_ratios.setdefault(key, [None] * blocks)[i] = (ratio, zero)
        for name, p, o in zip(
            [n for n, _ in model.ln_f.named_parameters()], groups["ln_f"], self.before["ln_f"], strict=True
        ):
            self.tensor_ratios[f"ln_f_{name}_update_ratio"] = _ratio(p, o)
        self.pending["update_ratio_max"] = torch.stack(largest)
        self.before = None

    def take(self, step: int, tokens: int) -> dict:
        """The stats step's record (``stats.jsonl``'s line): the device tensors read back, at once."""
        pending, self.pending = self.pending, None
        record = {"step": step, "tokens": tokens}
        for key, value in pending.items():
            record[key] = value.tolist() if isinstance(value, torch.Tensor) else value
        for key, value in self.tensor_ratios.items():  # None where the tensor was all zeros (a bias at its start)
            record[key] = [_ratio_value(v) for v in value] if isinstance(value, list) else _ratio_value(value)
        self.tensor_ratios = {}
        return record

    # -------------------------------------------------------------- the hooks of the extra forward pass

    def _hooks(self, model, stats: dict[str, list]) -> list:
        def put(key, value):
            stats.setdefault(key, []).append(value.detach())

        def resid(module, args):
            put("resid_rms", _rms(args[0]))

        def norm_out(name):
            def hook(module, args, out):
                put(f"{name}_rms", _rms(out))
                put(f"{name}_max", out.detach().abs().max().float())
                if hasattr(module, "alpha"):  # DyT: how much of tanh(alpha x) sits on its flat tails
                    put(f"{name}_saturated", ((module.alpha * args[0]).abs() > SATURATION).float().mean())

            return hook

        def logits(q, k):
            logit_max, logit_mean = attention_logits(q, k)
            put("attn_logit_max", logit_max)
            put("attn_logit_mean", logit_mean)

        def attention(module, args, qkv):  # without QK-norm: q and k as the projection gives them
            logits(*split_heads(qkv[:ATTENTION_SEQUENCES], heads))

        def normalised(which):  # with QK-norm: q_norm's output, then k_norm's (the order attention calls them)
            def hook(module, args, out):
                out = out[:ATTENTION_SEQUENCES].to(args[0].dtype)  # the dtype attention reads them in
                if out.dim() == 3:  # QK-norm over the whole projection (B, T, C): then split into heads
                    out = out.view(*out.shape[:2], heads, -1).transpose(1, 2)
                if which == "q":
                    pending_q.append(out)
                else:
                    logits(pending_q.pop(), out)

            return hook

        pending_q: list[torch.Tensor] = []

        def head(module, args, logits):
            put("logits_max", logits[..., : model.cfg.vocab_size].detach().float().max())

        heads = model.cfg.n_heads
        handles = [model.ln_f.register_forward_pre_hook(resid), model.lm_head.register_forward_hook(head)]
        handles.append(model.ln_f.register_forward_hook(norm_out("ln_f")))
        for block in model.blocks:
            handles.append(block.register_forward_pre_hook(resid))
            handles += [getattr(block, n).register_forward_hook(norm_out(n)) for n in block_norms(block)]
            if block.attn.qk_norm != "none":
                handles.append(block.attn.q_norm.register_forward_hook(normalised("q")))
                handles.append(block.attn.k_norm.register_forward_hook(normalised("k")))
            else:
                handles.append(block.attn.qkv.register_forward_hook(attention))
        return handles

    @staticmethod
    def _gains(norm, name: str, out: dict, i: int | None = None, blocks: int = 0) -> None:
        """A norm's gain (mean, spread) and DyT's alpha, into ``out`` (per block lists built up by index)."""
        values = {}
        if isinstance(getattr(norm, "weight", None), torch.Tensor):
            w = norm.weight.detach().float()
            values["gain_mean"], values["gain_std"] = w.mean(), w.std(correction=0)
        if isinstance(getattr(norm, "alpha", None), torch.Tensor):
            values["alpha"] = norm.alpha.detach().float().reshape(())
        for key, v in values.items():
            if i is None:
                out[f"{name}_{key}"] = v
            else:
                out.setdefault(f"{name}_{key}", torch.zeros(blocks, device=v.device))[i] = v


# the hooks' keys that hold a list per block, even of one block
_PER_BLOCK = {"resid_rms", "attn_logit_max", "attn_logit_mean"} | {
    f"{n}_{s}" for n in NORMS for s in ("rms", "max", "saturated")
}


def block_norms(block) -> list[str]:
    """The names of a block's norms (``NORMS``: two, four under peri-norm)."""
    return [n for n in NORMS if hasattr(block, n)]


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k (B, nh, T, hs) of the attention's input projection ``qkv`` (B, T, 3C), as ``CausalSelfAttention``
    splits it."""
    B, T, width = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    q, k, _ = qkv.split(width, dim=2)
    return tuple(t.view(B, T, heads, width // heads).transpose(1, 2) for t in (q, k))


def attention_logits(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The max and mean of q.k / sqrt(hs) over every head and causal (query, key) pair; q, k (B, nh, T, hs)."""
    B, heads, T, hs = q.shape
    logits = q.float() @ k.float().transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    pairs = B * heads * T * (T + 1) // 2  # the causal (query, key) pairs: a count, not read from the device
    return logits.masked_fill(~causal, -math.inf).max(), logits.masked_fill(~causal, 0.0).sum() / pairs


class EarlyWarning:
    """A line when a watched statistic of a block (``WATCHED``; the attention logits by magnitude) exceeds
    ``growth`` x its smallest value over the last ``window`` stats steps, or when any statistic is not finite; once
    per (statistic, block). Counted from the first stats step, warmup included: a run that blows up does it in a
    few steps, often before warmup ends, and what grows slowly in a healthy run (the residual stream of a
    pre-norm model, 20x and more over a run) does not grow ``growth``-fold within ``window`` stats steps.
    ``stop_on`` (``train.stop_on``: statistics, or ``nonfinite``) turns such a warning into a stop."""

    def __init__(self, growth: float, window: int, stop_on: list[str] = ()):
        self.growth, self.window, self.stop_on = growth, window, set(stop_on)
        self.recent: dict[tuple[str, int], list[tuple[int, float]]] = {}  # the last window (step, value) of each
        self.said: set[tuple[str, int]] = set()
        self.lines: list[str] = []  # every warning so far, for the summary
        self.stop: str | None = None  # the first warning of a statistic in stop_on

    def check(self, record: dict) -> list[str]:
        """The new warnings of a stats record (each also kept in ``lines``)."""
        new, step = [], record["step"]
        for key, value in record.items():
            values = value if isinstance(value, list) else [value]
            bad = [i for i, v in enumerate(values) if isinstance(v, float) and not math.isfinite(v)]
            if bad:
                what = f"{key} of {_where(key, bad[0], values)}" if isinstance(value, list) else key
                new += self._say("nonfinite", key, bad[0], f"{what} is {values[bad[0]]} at step {step}")
        for key in WATCHED:
            values = record.get(key) or []
            for i, v in enumerate(values):
                if not isinstance(v, (int, float)) or not math.isfinite(v):
                    continue
                v = abs(v)  # a run that blew up can have every logit hugely negative
                recent = self.recent.setdefault((key, i), [])
                if recent:
                    base_step, base = min(recent, key=lambda sv: sv[1])
                    since = f"step {base_step}"
                    if base < FLOOR.get(key, 0.0):
                        base, since = FLOOR[key], f"its floor {FLOOR[key]:g}"
                    if base > 0 and v > self.growth * base:
                        text = (
                            f"{key} of {_where(key, i, values)} grew {v / base:.1f}x since {since} "
                            f"({base:.4g} -> {v:.4g}) at step {step}"
                        )
                        new += self._say(key, key, i, text)
                recent.append((step, v))
                del recent[: -self.window]
        return new

    def _say(self, kind: str, key: str, i: int, text: str) -> list[str]:
        if (key, i) in self.said:
            return []
        self.said.add((key, i))
        line = f"early warning: {text}"
        self.lines.append(line)
        if kind in self.stop_on and self.stop is None:
            self.stop = f"{line} (train.stop_on: {kind})"
        return [line]


def _where(key: str, i: int, values: list) -> str:
    """Block ``i`` of a per-block list (the residual's last entry: the final norm's input)."""
    return "the final norm's input" if key == "resid_rms" and i == len(values) - 1 else f"block {i}"
