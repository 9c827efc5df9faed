"""What each norm does inside the model: per-block statistics every ``log.stats_every`` steps (rank 0).

On a stats step, after the backward pass and before the optimizer's update (``StepEngine.step``):

1. one extra forward pass of the first ``STATS_SEQUENCES`` sequences of the step's first micro-batch through
   the unwrapped model, without
   gradients, in eval mode (no dropout, so no random number is drawn) and under the run's autocast,
   with forward hooks that exist for that pass only: the residual stream entering each block, each
   norm's output (peri-norm's output norms too), DyT's saturation, the attention logits (q.k / sqrt(hs),
   recomputed on the first ``ATTENTION_SEQUENCES`` sequences from the q and k the dot product reads: the input of
   each attention's ``Scores``, after whatever the attention did to them, QK-norm or an option's; an attention
   without one has its logits recorded as null, not measured) and the output logits;
2. each block's gradient norm (the all-reduced gradients, before clipping), the embeddings' (the tables the
   model's ``embeddings()`` names: positions only where it has a table of them) and the head's;
3. a copy of the weights, so that once the optimizer has stepped, ``||W_after - W_before|| / ||W_before||``:
   pooled over each block's parameters (dominated by its big matrices), the largest of its tensors'
   (``update_ratio_max``), and each norm tensor's own (``ln_1_weight_update_ratio``, ``q_norm_weight_...``,
   ``ln_f_bias_update_ratio``; null while the tensor is all zeros, a bias at its start).

A record of step t is measured with the weights step t's update starts from (the update ratio: the change that
update makes), so its activations and gradients are those of the model after t - 1 updates.

Nothing here touches the weights, the gradients or a random number generator, so a run computes the same
bits with stats on or off; a step that is not a stats step runs no hook and reads nothing back. The
numbers stay device tensors until ``StatsProbe.take`` reads them all back at once: one tensor, one
``.tolist()``, one wait per stats step. The per-tensor work is grouped: one ``torch._foreach_norm`` over every
gradient, one ``torch._foreach_copy_`` of every weight, and after the update one in-place subtraction and one
``torch._foreach_norm`` for every tensor's change; the per-block numbers are reductions of those per-tensor norms
(a pooled norm is the norm of its tensors' norms). ``gpt.speed.overheads.stats_step_cost`` counts what a
stats step costs.

``EarlyWarning`` watches the records: a line, once per statistic and block, when a block's residual RMS
or attention-logit max grows past ``log.stats_warn_growth`` times its smallest value over the last
``log.stats_warn_window`` stats steps (from the first stats step on), or any value stops being finite;
``train.stop_on`` names the statistics whose warning also stops the run.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

import torch

from gpt.model.gpt import Scores

STATS_SEQUENCES = 4  # the extra forward pass reads this many sequences of the micro-batch (its logits: B x T x V)
ATTENTION_SEQUENCES = 2  # the attention logits are (B, nh, T, T): measured on this many of those
SCALARS = ("alpha", "shift")  # a squashing norm's learnable scalars (DyT's alpha, Derf's alpha and shift)
# each block's norms (ln_1_out, ln_2_out: peri-norm's, on each sublayer's output); the final one is ln_f
BLOCK_NORMS = ("ln_1", "ln_2", "ln_1_out", "ln_2_out")
QK_NORM_LAYERS = ("q_norm", "k_norm")  # QK-norm's, in a block's attention
WATCHED = ("resid_rms", "attn_logit_max")  # the statistics EarlyWarning compares with their recent values
# Growth is measured from at least this: near-uniform attention at initialisation has logits of ~1-3, and their
# first growth (to 20-30 within ten steps, as attention learns where to look) is training, not a blow-up.
FLOOR = {"attn_logit_max": 5.0}


def _rms(t: torch.Tensor) -> torch.Tensor:
    """The root mean square of ``t``, its squares summed in float32: one reduction (on a GPU it reads ``t`` in its
    own dtype, with no float32 copy of it)."""
    return torch.linalg.vector_norm(t, dtype=torch.float32) / math.sqrt(t.numel())


def _abs_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| in float32 (exact: the largest magnitude in t's dtype, then widened); NaN if any element is."""
    return torch.linalg.vector_norm(t, math.inf).float()


class _Tensors:
    """The parameters the gradient norms and update ratios read, each once (a tied matrix too), in the order the
    grouped reductions put their per-tensor norms: block 0's, block 1's, ... (every block has the same tensors),
    the embeddings', the head's unless tied, the final norm's; each group a range of that order."""

    def __init__(self, model):
        self.params: list[torch.nn.Parameter] = []
        self.ranges: dict[str, slice] = {}
        index: dict[int, int] = {}
        for group, ps in StatsProbe.groups(model).items():
            at = []
            for p in ps:
                if id(p) not in index:
                    index[id(p)] = len(self.params)
                    self.params.append(p)
                at.append(index[id(p)])
            if at != list(range(at[0], at[0] + len(at)) if at else []):
                raise ValueError(f"the stats probe's {group}: its tensors are not one range of the model's")
            self.ranges[group] = slice(at[0], at[-1] + 1) if at else slice(0, 0)
        self.blocks = len(model.blocks)
        self.per_block = self.ranges["block0"].stop
        if any(
            self.ranges[f"block{i}"] != slice(i * self.per_block, (i + 1) * self.per_block)
            for i in range(1, self.blocks)
        ):
            raise ValueError("the stats probe needs every block to hold the same tensors")
        # each norm tensor's record key -> its place in the order: one per block, or one (the final norm's)
        self.norm_keys: dict[str, list[int] | int] = {}
        for i, block in enumerate(model.blocks):
            for j, (name, _) in enumerate(block.named_parameters()):
                module, param = name.rsplit(".", 1)
                if module.split(".")[-1] in BLOCK_NORMS + QK_NORM_LAYERS:
                    key = f"{module.split('.')[-1]}_{param}_update_ratio"
                    self.norm_keys.setdefault(key, [0] * self.blocks)[i] = i * self.per_block + j
        for j, (name, _) in enumerate(model.ln_f.named_parameters()):
            self.norm_keys[f"ln_f_{name}_update_ratio"] = self.ranges["ln_f"].start + j

    def pooled(self, norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each group's norm from its tensors' ``norms`` (one per tensor, in this order): sqrt of their sum of
        squares, for the blocks (one each), the embeddings and the head."""
        blocks = norms[: self.blocks * self.per_block].view(self.blocks, self.per_block)
        embed, head = norms[self.ranges["embed"]], norms[self.ranges["head"]]
        return tuple(torch.linalg.vector_norm(v, dim=-1) for v in (blocks, embed, head))


class StatsProbe:
    """Rank 0's statistics of one stats step at a time (``measure``, ``after_update``, ``take``)."""

    def __init__(self, every: int):
        self.every = every
        self.pending: dict | None = None  # device tensors of the step being measured, by record key
        self.before: tuple[_Tensors, list[torch.Tensor]] | None = None  # the weights before the update
        self.tensor_ratios: tuple[_Tensors, torch.Tensor, torch.Tensor] | None = None  # each tensor's ratio, norm

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @staticmethod
    def groups(model) -> dict[str, list[torch.nn.Parameter]]:
        """The parameters each gradient norm and update ratio is over: each block, the embeddings, the head
        (with tied weights the head's matrix is the token embedding's: both groups hold it)."""
        out = {f"block{i}": list(b.parameters()) for i, b in enumerate(model.blocks)}
        out["embed"] = [p for table in model.embeddings() for p in table.parameters()]
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
        # every hook's number in one tensor; each key a view of its part
        flat, out, at = torch.stack([v for values in stats.values() for v in values]), {}, 0
        for key, values in stats.items():
            out[key] = flat[at : at + len(values)] if len(values) > 1 or key in _PER_BLOCK else flat[at]
            at += len(values)
        for key in ("attn_logit_max", "attn_logit_mean"):
            out.setdefault(key, None)  # an attention without Scores: not measured for this model
        tensors = _Tensors(model)
        # every tensor's gradient norm in one grouped op; a block's is the norm of its tensors' norms
        missing = [p for p in tensors.params if p.grad is None]
        zero = missing[0].new_zeros(()) if missing else None
        grads = [p.grad if p.grad is not None else zero for p in tensors.params]
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
        out["grad_norm"], out["embed_grad_norm"], out["head_grad_norm"] = tensors.pooled(norms)
        self._gains([model.ln_f], "ln_f", out, per_block=False)
        for name in block_norms(model.blocks[0]):
            self._gains([getattr(block, name) for block in model.blocks], name, out)
        if any(block.scale != 1.0 for block in model.blocks):  # LayerNorm Scaling: what each block's norms are
            out["depth_scale"] = [block.scale for block in model.blocks]  # multiplied by after the *_rms above
        # fp16's loss scale, as the device holds it (get_scale() would wait for the device)
        scale = getattr(scaler, "_scale", None) if scaler is not None and scaler.is_enabled() else None
        out["loss_scale"] = scale.detach().reshape(()).clone() if scale is not None else None
        self.pending = out
        # The weights before the update, every tensor of them: the pooled ratio and update_ratio_max need each
        # tensor's change, and W_after - W_before is exact for whatever the optimizer did (fused AdamW, a skipped
        # step, fp16's scaler), where recomputing AdamW's update from its state would read twice these bytes (m, v)
        # and only approximate its kernel's rounding. One grouped copy (a few kernels on a GPU); freed after the update
        # (kept across steps it would hold its 4 bytes a parameter through every step's forward and backward).
        before = [torch.empty_like(p) for p in tensors.params]
        torch._foreach_copy_(before, tensors.params)
        self.before = (tensors, before)

    @torch.no_grad()
    def after_update(self, model) -> None:
        """The update ratios, once the optimizer has stepped (a skipped step's are 0)."""
        (tensors, before), self.before = self.before, None
        weight = torch.stack(torch._foreach_norm(before, 2, dtype=torch.float32))  # each ||W_before||
        torch._foreach_sub_(before, tensors.params)  # W_before - W_after, in place: the change's norm, no new copy
        change = torch.stack(torch._foreach_norm(before, 2, dtype=torch.float32))
        del before
        ratios = [c / w for c, w in zip(tensors.pooled(change), tensors.pooled(weight), strict=True)]
        self.pending["update_ratio"], self.pending["embed_update_ratio"], self.pending["head_update_ratio"] = ratios
        # per tensor: the pooled ratio is the big matrices'; a norm's gain or bias moves at its own rate
        ratio = change / weight  # inf or NaN where a tensor was all zeros: null in the record, 0 for the largest
        defined = torch.where(weight == 0, 0.0, ratio)[: tensors.blocks * tensors.per_block]
        self.pending["update_ratio_max"] = defined.view(tensors.blocks, tensors.per_block).amax(dim=1)
        self.tensor_ratios = (tensors, ratio, weight)

    def take(self, step: int, tokens: int) -> dict:
        """The stats step's record (``stats.jsonl``'s line): the device tensors read back, at once."""
        pending, self.pending = self.pending, None
        tensor_ratios, self.tensor_ratios = self.tensor_ratios, None
        parts = [v.reshape(-1) for v in pending.values() if isinstance(v, torch.Tensor)]
        if tensor_ratios is not None:
            parts += tensor_ratios[1:]
        numbers = torch.cat(parts).tolist()  # the stats step's one read from the device
        record, at = {"step": step, "tokens": tokens}, 0
        for key, value in pending.items():
            if isinstance(value, torch.Tensor):
                n = value.numel()
                record[key] = numbers[at] if value.dim() == 0 else numbers[at : at + n]
                at += n
            else:
                record[key] = value
        if tensor_ratios is not None:  # None where the tensor was all zeros (a bias at its start)
            tensors, count = tensor_ratios[0], len(tensor_ratios[0].params)
            ratio, weight = numbers[at : at + count], numbers[at + count : at + 2 * count]
            value = lambda i: None if weight[i] == 0 else ratio[i]  # noqa: E731
            for key, where in tensors.norm_keys.items():
                record[key] = [value(i) for i in where] if isinstance(where, list) else value(where)
        return record

    # -------------------------------------------------------------- the hooks of the extra forward pass

    def _hooks(self, model, stats: dict[str, list]) -> list:
        def put(key, value):  # (under measure's no_grad: nothing to detach)
            stats.setdefault(key, []).append(value)

        def resid(module, args):
            put("resid_rms", _rms(args[0]))

        def norm_out(name):
            def hook(module, args, out):
                put(f"{name}_rms", _rms(out))
                put(f"{name}_max", _abs_max(out))
                if hasattr(module, "pre_activation"):  # DyT, Derf: how much of the squashing sits on its flat tails
                    saturated = module.pre_activation(args[0]).abs_().gt_(module.flat_beyond)  # 1 or 0, in place
                    put(f"{name}_saturated", saturated.mean(dtype=torch.float32))

            return hook

        def logits(q, k):
            T = q.shape[-2]
            if T not in future:  # the (query, key) pairs a causal attention never reads: made once a pass
                future[T] = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
            logit_max, logit_mean = attention_logits(q, k, future[T])
            put("attn_logit_max", logit_max)
            put("attn_logit_mean", logit_mean)

        def scores(module, args, out):  # q, k (B, nh, T, hs) as the dot product reads them
            logits(*(t[:ATTENTION_SEQUENCES] for t in out))

        future: dict[int, torch.Tensor] = {}

        def head(module, args, logits):  # the largest logit, in the logits' dtype (exact), then widened
            put("logits_max", logits[..., : model.cfg.vocab_size].max().float())

        handles = [model.ln_f.register_forward_pre_hook(resid), model.lm_head.register_forward_hook(head)]
        handles.append(model.ln_f.register_forward_hook(norm_out("ln_f")))
        for block in model.blocks:
            handles.append(block.register_forward_pre_hook(resid))
            handles += [getattr(block, n).register_forward_hook(norm_out(n)) for n in block_norms(block)]
            tap = next((m for m in block.modules() if isinstance(m, Scores)), None)  # None: not measured
            if tap is not None:
                handles.append(tap.register_forward_hook(scores))
        return handles

    @staticmethod
    def _gains(norms: list, name: str, out: dict, per_block: bool = True) -> None:
        """The gain (mean, spread) and the learnable scalars (``SCALARS``: DyT's and Derf's alpha, Derf's shift) of the
        norm ``name`` of each block (``norms``: one per block, a list in the record each), or of the final norm
        (``per_block`` False: a number each), into ``out``."""
        weights = [getattr(n, "weight", None) for n in norms]
        if all(isinstance(w, torch.Tensor) for w in weights):
            w = (torch.stack(weights) if per_block else weights[0]).float()  # (blocks, C) or (C,)
            out[f"{name}_gain_mean"], out[f"{name}_gain_std"] = w.mean(-1), w.std(-1, correction=0)
        for scalar in SCALARS:  # a copy: the record holds the value before the update
            values = [getattr(n, scalar, None) for n in norms]
            if all(isinstance(a, torch.Tensor) for a in values):
                out[f"{name}_{scalar}"] = (torch.stack(values) if per_block else values[0].clone()).float()


# the hooks' keys that hold a list per block, even of one block
_PER_BLOCK = {"resid_rms", "attn_logit_max", "attn_logit_mean"} | {
    f"{n}_{s}" for n in BLOCK_NORMS for s in ("rms", "max", "saturated")
}


def block_norms(block) -> list[str]:
    """The names of a block's norms (``BLOCK_NORMS``: two, four under peri-norm)."""
    return [n for n in BLOCK_NORMS if hasattr(block, n)]


def attention_logits(
    q: torch.Tensor, k: torch.Tensor, future: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The max and mean of q.k / sqrt(hs) over every head and causal (query, key) pair; q, k (B, nh, T, hs).
    ``future``: (T, T), True above the diagonal (the keys a query never reads), if already made."""
    B, heads, T, hs = q.shape
    logits = (q.float() @ k.float().transpose(-2, -1)).div_(math.sqrt(hs))  # (B, nh, T, T)
    if future is None:
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    pairs = B * heads * T * (T + 1) // 2  # the causal (query, key) pairs: a count, not read from the device
    largest = logits.masked_fill_(future, -math.inf).max()  # in place: no second (B, nh, T, T) tensor
    return largest, logits.masked_fill_(future, 0.0).sum() / pairs


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


# ---------------------------------------------------------------------------------- what a stats step costs
