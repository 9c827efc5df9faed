"""HellaSwag: which of four endings a model finds most likely after a context, scored by our own code.

Data: the official validation set (10,042 items, one JSON object per line with ``ctx``,
``endings`` (4), ``label``, ``ind``, ``activity_label``, ...), from a local JSONL file or
the cache (``hellaswag_cache()``), where it is fetched once from its public home when a
network exists (``fetch_validation``).

Scoring, per item: each ending is appended to the context with a space, both in GPT-2 BPE
(the context tokens, then the ending's), and the context is cut from the left so that the
whole fits the model's context (the model reads the last ``context_length`` tokens before each
token it predicts). The model's log-probability of each ending's tokens gives
three choices, each named for what it is:

- ``acc``: the ending with the highest summed log-probability;
- ``acc_norm``: the highest summed log-probability divided by the ending's length in
  characters (lm-evaluation-harness's ``acc_norm``);
- ``acc_token_mean``: the lowest mean per-token loss of the ending (llm.c's and
  build-nanogpt's HellaSwag; OpenAI's GPT-2 124M scores 0.2955 on it, 2967 of 10042).

Items go into fixed chunks in order, and ranks take whole chunks round robin; a chunk is
scored the same way on any world size, so the results are identical on one process or many.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt.common.errors import UserError, first_line
from gpt.common.files import WriteError, write_atomically
from gpt.model.gpt import GPT
from gpt.run.checkpoints import checkpoint_config, checkpoint_identity, load_weights
from gpt.run.directory import write_eval_result
from gpt.run.distributed import Dist
from gpt.run.fastpath import ieee_fp32
from gpt.run.fingerprint import evaluation_fingerprint

VALIDATION_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VALIDATION_FILE = "hellaswag_val.jsonl"
N_VALIDATION = 10_042
RESULT = "hellaswag"  # its result file beside a checkpoint: eval-hellaswag-<precision>.json
GPT2_VOCAB = 50_257  # the items are read in GPT-2 BPE: a model needs at least this vocabulary
METRICS = {
    "acc": "highest summed log-probability of the ending",
    "acc_norm": "highest summed log-probability per character of the ending (lm-evaluation-harness)",
    "acc_token_mean": "lowest mean per-token loss of the ending (llm.c, build-nanogpt)",
}


@dataclass(frozen=True)
class Item:
    ctx: str  # the context
    endings: tuple[str, ...]  # the candidate endings
    label: int  # the index of the right one
    ind: int  # the item's id in the data set


def hellaswag_cache() -> Path:
    """Where the fetched validation set is kept: $GPT_NORM_CACHE, else ~/.cache/gpt-norm-harness, /hellaswag."""
    root = os.environ.get("GPT_NORM_CACHE") or Path.home() / ".cache" / "gpt-norm-harness"
    return Path(root) / "hellaswag"


def fetch_validation(dest: Path, url: str | None = None, timeout: float = 60.0) -> Path:
    """Download the validation set (from ``url``, default ``VALIDATION_URL``) into ``dest`` once, whole or
    not at all; one line if it cannot."""
    url = url or VALIDATION_URL
    if dest.is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(dest, e) from e
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except OSError as e:
        raise UserError(
            f"HellaSwag: no {VALIDATION_FILE} in {dest.parent}, and fetching {url} failed ({first_line(e)}); "
            f"download that file into {dest.parent} (or $GPT_NORM_CACHE/hellaswag), or pass --hellaswag FILE"
        ) from None
    write_atomically(dest, data)  # whole or not at all: a full disk leaves no half file to be taken for the set
    return dest


def read_items(path: Path) -> list[Item]:
    """The items of a HellaSwag-format JSONL file; one line naming the file and line if one is not."""
    items = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UserError(f"HellaSwag: cannot read {path} ({first_line(e)})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            item = Item(d["ctx"], tuple(d["endings"]), int(d["label"]), int(d.get("ind", n - 1)))
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{path}:{n}: not a HellaSwag item ({first_line(e)}); each line is a JSON object with "
                "ctx, endings and label"
            ) from None
        if not 0 <= item.label < len(item.endings):
            raise UserError(f"{path}:{n}: label {item.label} names no ending (there are {len(item.endings)})")
        items.append(item)
    return items


def load_items(path: Path | None = None, fetch: bool = True) -> list[Item]:
    """The items of ``path``, or of the cached validation set (fetched once when ``fetch``)."""
    if path is not None:
        return read_items(path)
    dest = hellaswag_cache() / VALIDATION_FILE
    if not dest.is_file() and not fetch:
        raise UserError(
            f"HellaSwag: no {VALIDATION_FILE} in {dest.parent}; download {VALIDATION_URL} there, "
            "or pass --hellaswag FILE"
        )
    return read_items(fetch_validation(dest))


def encode_item(item: Item, encode, context_length: int) -> tuple[list[list[int]], list[int]]:
    """Each ending's token sequence (context then ending, the last ``context_length + 1`` tokens: the model
    reads all but the last and predicts all but the first, as lm-evaluation-harness cuts it) and the number of
    its last tokens that are the ending's."""
    ctx = encode(item.ctx)
    rows, ends = [], []
    for ending in item.endings:
        tail = encode(" " + ending)
        seq = (ctx + tail)[-(context_length + 1) :]
        rows.append(seq)
        ends.append(min(len(tail), len(seq) - 1))  # the first token has no prediction: it cannot be scored
    return rows, ends


@torch.no_grad()
def ending_logprobs(model, rows: list[list[int]], ends: list[int], device) -> list[list[float]]:
    """Per sequence, the log-probability of each of its last ``ends[i]`` tokens (right-padded batch: a
    causal model's earlier positions never see the padding)."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    ids = ids.to(device)
    logits = model(ids[:, :-1])[0].float()  # (N, W-1, V): each position predicts the next token
    logp = F.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0].cpu().double()  # (N, W-1)
    return [logp[i, len(row) - 1 - ends[i] : len(row) - 1].tolist() for i, row in enumerate(rows)]


def choices(item: Item, logps: list[list[float]]) -> dict:
    """The three answers for one item from its endings' token log-probabilities."""
    sums = [sum(lp) for lp in logps]
    per_char = [s / len(e) for s, e in zip(sums, item.endings)]
    mean_loss = [-s / len(lp) for s, lp in zip(sums, logps)]
    return {
        "ind": item.ind,
        "label": item.label,
        "acc": max(range(len(sums)), key=sums.__getitem__),
        "acc_norm": max(range(len(per_char)), key=per_char.__getitem__),
        "acc_token_mean": min(range(len(mean_loss)), key=mean_loss.__getitem__),
        "sum_logprob": sums,
        "n_tokens": [len(lp) for lp in logps],
    }


def score_items(
    model,
    items: list[Item],
    encode,
    dist: Dist,
    *,
    context_length: int,
    chunk: int = 8,
    autocast=contextlib.nullcontext,
) -> list[dict]:
    """Each item's answers (``choices``), in item order, on every rank. Chunks of ``chunk`` items go to the
    ranks round robin and are scored the same way on any world size."""
    was_training = model.training
    model.eval()
    mine = {}  # item index -> its answers
    for c in range(dist.rank, math.ceil(len(items) / chunk), dist.world_size):
        first = c * chunk
        part = items[first : first + chunk]
        encoded = [encode_item(item, encode, context_length) for item in part]
        rows = [r for rs, _ in encoded for r in rs]
        ends = [e for _, es in encoded for e in es]
        with autocast():
            logps = ending_logprobs(model, rows, ends, dist.device)
        at = 0
        for i, item in enumerate(part, first):
            mine[i] = choices(item, logps[at : at + len(item.endings)])
            at += len(item.endings)
    model.train(was_training)
    merged = {}
    for part in dist.gather_objects(mine):
        merged.update(part)
    return [merged[i] for i in range(len(items))]


def summarise(per_item: list[dict]) -> dict:
    """The accuracy of each form over the items, with how many were right."""
    n = len(per_item)
    out = {"n_items": n, "metrics": dict(METRICS)}
    for key in METRICS:
        right = sum(r[key] == r["label"] for r in per_item)
        out[key] = right / n if n else math.nan
        out[f"{key}_correct"] = right
    return out


def score_model(model, items: list[Item], dist: Dist, *, precision: str = "fp32", chunk: int = 8) -> dict:
    """``model`` (on ``dist.device``) on ``items``: the three accuracies, and every item's answers (so two
    models can be compared item by item), as the JSON record evaluate.py keeps."""
    from gpt.data.tokenizer import get_tokenizer
    from gpt.model.loss import autocast_for

    start = time.perf_counter()
    with ieee_fp32():  # its own matmul precision, never what the process set before (a trainer's TF32)
        per_item = score_items(
            model,
            items,
            get_tokenizer().encode_ordinary,
            dist,
            context_length=model.cfg.context_length,
            chunk=chunk,
            autocast=autocast_for(precision, dist.device),
        )
        fingerprint = evaluation_fingerprint(dist, precision, chunk)
    seconds = time.perf_counter() - start
    return {
        "split": RESULT,
        "precision": precision,
        **summarise(per_item),
        "labels": [r["label"] for r in per_item],
        "answers": {key: [r[key] for r in per_item] for key in METRICS},
        "world_size": dist.world_size,
        "seconds": seconds,
        "items_per_s": len(items) / seconds if seconds else None,
        "fingerprint": fingerprint,
    }


def evaluate_checkpoint(
    ckpt: Path, dist: Dist, items: list[Item], source: Path | None, precision: str = "fp32"
) -> dict:
    """HellaSwag of one checkpoint on ``items`` (read from ``source``; None: the cached validation set), kept
    as ``eval-hellaswag-<precision>.json`` beside it."""
    cfg = checkpoint_config(ckpt)
    if cfg.model.vocab_size < GPT2_VOCAB:
        raise UserError(
            f"{ckpt}: HellaSwag is read in GPT-2 BPE ({GPT2_VOCAB:,} tokens), and this model's vocabulary "
            f"has {cfg.model.vocab_size:,}; evaluate a model trained on GPT-2 tokens"
        )
    model = GPT(cfg.model)
    load_weights(model, ckpt)
    model.to(dist.device)
    result = {
        **checkpoint_identity(ckpt, cfg),
        "data": str(source) if source else "validation (cached)",
        **score_model(model, items, dist, precision=precision),
    }
    if dist.is_main:
        write_eval_result(ckpt, result)
    return result


HEADER = (
    f"{'run':<36}{'norm_type':<28}{'step':>7}{'items':>9}{'prec':>6}{'acc':>9}{'acc_norm':>10}{'acc_token_mean':>16}"
)


def table_line(r: dict) -> str:
    """A result as a row of evaluate.py's table (under ``HEADER``)."""
    return (
        f"{r['run']:<36}{r['norm_type']:<28}{str(r['step']):>7}{r['n_items']:>9,}{r['precision']:>6}"
        f"{r['acc']:>9.4f}{r['acc_norm']:>10.4f}{r['acc_token_mean']:>16.4f}"
    )


def card_line(h: dict) -> str:
    """A result as the model card says it."""
    return (
        f"- HellaSwag ({h['n_items']:,} items, {h['precision']}, `evaluate.py --task hellaswag`): acc "
        f"{h['acc']:.4f} (highest summed log-probability), acc_norm {h['acc_norm']:.4f} (per character, as "
        f"lm-evaluation-harness), acc_token_mean {h['acc_token_mean']:.4f} (lowest mean token loss, as llm.c); "
        "random guessing scores 0.25."
    )
