"""Mean cross-entropy over a fixed token range, exact on any number of ranks.

The range ``[offset, offset + n_tokens)`` of a token file is cut into sequences of
``seq_len + 1`` tokens (inputs and next-token targets) that start every ``seq_len``
tokens, and the sequences into batches of ``batch_size`` in order. Ranks take whole
batches round robin. Each batch's summed loss goes into its own slot of a float64
vector; an all-reduce adds only zeros to it, and every rank sums the slots in batch
order. So the result is bit-identical on one rank or many, and it is a token-weighted
mean, never an average of averages.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gpt.checkpoint import CHECKPOINTS, INFO_FILE, MODEL_FILE, checkpoint_config, find_checkpoint, load_weights
from gpt.config import Config
from gpt.data import DataError, TokenFile, open_split, read_meta, read_sequences, resolve_data_dir
from gpt.distributed import Dist
from gpt.errors import UserError


def autocast_for(precision: str, device: torch.device):
    """A context-manager factory: autocast to bf16 / fp16, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def eval_sequences(n_tokens: int, seq_len: int) -> int:
    """Sequences in a range of ``n_tokens`` (each needs seq_len + 1 tokens of it)."""
    return max(0, (n_tokens - 1) // seq_len)


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, tokens: TokenFile, offset: int, n_tokens: int, seq_len: int,
                  batch_size: int, dist: Dist, autocast=contextlib.nullcontext, progress=None) -> tuple[float, int]:
    """(mean loss, tokens scored) of ``model`` on ``tokens[offset : offset + n_tokens]``."""
    n_seq = eval_sequences(n_tokens, seq_len)
    n_batches = math.ceil(n_seq / batch_size)
    sums = torch.zeros(n_batches, dtype=torch.float64, device=dist.device)
    was_training = model.training
    model.eval()
    for b in range(dist.rank, n_batches, dist.world_size):
        ids = range(b * batch_size, min((b + 1) * batch_size, n_seq))
        batch = read_sequences(tokens, ids, seq_len, offset).to(dist.device, non_blocking=True)
        with autocast():
            logits, _ = model(batch[:, :-1])
        losses = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        sums[b] = losses.double().sum()
        if progress is not None:
            progress(len(ids) * seq_len)
    model.train(was_training)
    total = dist.all_sum(sums).cpu()
    scored = n_seq * seq_len
    return (float(total.sum()) / scored if scored else math.nan), scored


# ------------------------------------------------------------ held-out test loss of a run

EVAL_PREFIX = "eval-"


@dataclass
class HeldOutRange:
    """Which tokens a test loss is measured on; results are comparable only when these agree."""

    data_dir: str
    split: str
    offset: int
    n_tokens: int
    tokenizer: str  # from the data set's meta.json ("unknown" for foreign layouts)

    def key(self) -> tuple:
        return (self.split, self.offset, self.n_tokens, self.tokenizer)


def held_out_range(cfg: Config, data: str | None = None, split: str | None = None, offset: int | None = None,
               n_tokens: int | None = None) -> tuple[HeldOutRange, TokenFile]:
    """The test range a run's config names, with any of its parts overridden."""
    data_dir = Path(data) if data else resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision)
    split = split or cfg.data.test_split
    offset = cfg.data.test_offset if offset is None else offset
    tokens = open_split(data_dir, split)
    n = n_tokens if n_tokens is not None else cfg.data.test_tokens
    n = len(tokens) - offset if n is None else n
    if offset < 0 or n <= 0 or offset + n > len(tokens):
        raise DataError(f"{tokens.path}: test range [{offset:,}, {offset + n:,}) is outside its {len(tokens):,} tokens")
    meta = read_meta(data_dir) or {}
    tokenizer = meta.get("tokenizer", {}).get("name", "unknown")
    return HeldOutRange(str(data_dir), split, offset, n, tokenizer), tokens


def check_disjoint(run_dir: Path, rng: HeldOutRange) -> None:
    """Refuse a test range that overlaps a token range the run trained or validated on."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        return
    summary = json.loads(summary_path.read_text())
    for what in ("train_token_range", "val_token_range"):
        split, start, end = summary.get(what) or (None, 0, 0)
        if split == rng.split and start < rng.offset + rng.n_tokens and rng.offset < end:
            raise UserError(f"test range {rng.split} [{rng.offset:,}, {rng.offset + rng.n_tokens:,}) overlaps the "
                            f"tokens {run_dir.name} read for {what.split('_')[0]}: {split} [{start:,}, {end:,}); "
                            f"choose another --split or --offset")


def resolve_which(run_or_ckpt: Path, which: str) -> Path:
    """The checkpoint ``which`` (best | latest | final) of a run, or the checkpoint itself."""
    path = Path(run_or_ckpt)
    if (path / MODEL_FILE).is_file():
        return path
    if not (path / "config.yaml").is_file() and not (path / CHECKPOINTS).is_dir():
        raise UserError(f"{path}: not a run directory or checkpoint (no config.yaml, no {CHECKPOINTS}/, "
                        f"no {MODEL_FILE})")
    if which == "final":
        summary = path / "summary.json"
        status = json.loads(summary.read_text())["status"] if summary.is_file() else "running or killed"
        if status != "completed":
            raise UserError(f"{path}: the run has no final checkpoint (status: {status}); "
                            "use --which latest or --which best")
        which = "latest"
    return find_checkpoint(path, which)


def eval_file_name(split: str, precision: str) -> str:
    return f"{EVAL_PREFIX}{split}-{precision}.json"


def evaluate_model(model: torch.nn.Module, rng: HeldOutRange, tokens: TokenFile, seq_len: int, batch_size: int,
                   precision: str, d: Dist, show_progress: bool = True) -> dict:
    """Test loss of ``model`` on ``rng``, as the JSON record evaluate.py writes."""
    start = time.perf_counter()
    bar = tqdm(total=eval_sequences(rng.n_tokens, seq_len) * seq_len, unit="tok", unit_scale=True,
               disable=not (show_progress and d.is_main), file=sys.stderr, desc="evaluating")
    model.to(d.device)
    loss, scored = evaluate_loss(model, tokens, rng.offset, rng.n_tokens, seq_len, batch_size, d,
                                 autocast_for(precision, d.device), progress=bar.update)
    bar.close()
    return {"loss": loss, "perplexity": math.exp(loss) if loss < 700 else math.inf, "tokens": scored,
            **asdict(rng), "range": [rng.offset, rng.offset + rng.n_tokens], "precision": precision,
            "batch_size": batch_size, "world_size": d.world_size, "seconds": time.perf_counter() - start}


def evaluate_checkpoint(ckpt: Path, d: Dist, precision: str = "fp32", batch_size: int | None = None,
                        data: str | None = None, split: str | None = None, offset: int | None = None,
                        n_tokens: int | None = None, show_progress: bool = True, write: bool = True) -> dict:
    """Held-out loss of one checkpoint, written as ``eval-<split>-<precision>.json`` beside it."""
    from gpt.model import GPT  # heavy imports only when a model is built

    cfg = checkpoint_config(ckpt)
    rng, tokens = held_out_range(cfg, data, split, offset, n_tokens)
    run_dir = ckpt.parent.parent if ckpt.parent.name == CHECKPOINTS else ckpt.parent
    check_disjoint(run_dir, rng)
    model = GPT(cfg.model)
    load_weights(model, ckpt)
    result = evaluate_model(model, rng, tokens, cfg.model.context_length, batch_size or cfg.train.micro_batch_size,
                            precision, d, show_progress)
    info = json.loads((ckpt / INFO_FILE).read_text()) if (ckpt / INFO_FILE).is_file() else {}
    result = {"run": cfg.run.name, "norm_type": cfg.model.norm_type, "seed": cfg.train.seed,
              "checkpoint": str(ckpt), "step": info.get("step"), **result}
    if write and d.is_main:
        (ckpt / eval_file_name(rng.split, precision)).write_text(json.dumps(result, indent=2) + "\n")
    return result


def evaluate_hf(name: str, d: Dist, like: dict | None, precision: str, batch_size: int, data: str | None = None,
                split: str | None = None, offset: int | None = None, n_tokens: int | None = None,
                show_progress: bool = True) -> dict:
    """A transformers GPT-2 (converted to our model) on the same range as ``like`` (another result)."""
    from gpt.config import config_from_dict
    from gpt.hf import load_hf_gpt2

    if like is not None:
        data = data or like["data_dir"]
        split, offset = split or like["split"], like["offset"] if offset is None else offset
        n_tokens = like["n_tokens"] if n_tokens is None else n_tokens
    if data is None:
        raise UserError("--hf needs the tokens to score: give --data (and --split), or a run to take them from")
    try:
        model = load_hf_gpt2(name)
    except Exception as e:  # offline without a cached copy, unknown name: the library's first line
        raise UserError(f"--hf {name}: cannot load: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    cfg = config_from_dict({"run": {"name": f"hf:{name}"}, "train": {"steps": 1}, "model": vars(model.cfg)})
    rng, tokens = held_out_range(cfg, data, split or "test", offset or 0, n_tokens)
    result = evaluate_model(model, rng, tokens, cfg.model.context_length, batch_size, precision, d,
                            show_progress)
    return {"run": f"hf:{name}", "norm_type": cfg.model.norm_type, "seed": None, "checkpoint": name, "step": None,
            **result}
