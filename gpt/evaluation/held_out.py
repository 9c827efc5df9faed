"""Held-out test loss of a checkpoint (or of a transformers GPT-2), recorded beside the checkpoint.

The loss itself is ``gpt.evaluation.token_loss.evaluate_loss`` (the trainer's validation loss is the
same function). This module decides which tokens it covers (the run config's test
range, with evaluate.py's overrides), refuses a range that overlaps what the run trained
or validated on, and writes the result as ``eval-<split>-<precision>.json`` through
``gpt.run.directory``. evaluate.py runs it as the task ``test_loss`` (``gpt.evaluation.tasks``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpt.common.errors import UserError
from gpt.config import Config, config_from_dict
from gpt.data.folders import open_split, resolve_data_dir
from gpt.data.tokenizer import bits_per_byte, token_byte_lengths
from gpt.data.tokens import DataError, TokenRange, tokenizer_name
from gpt.evaluation.token_loss import evaluate_loss
from gpt.model.gpt import GPT
from gpt.model.gpt2_weights import load_hf_gpt2
from gpt.model.loss import autocast_for
from gpt.run.checkpoints import checkpoint_config, checkpoint_identity, load_weights
from gpt.run.directory import RunDir, write_eval_result
from gpt.run.distributed import Dist
from gpt.run.fastpath import ieee_fp32
from gpt.run.fingerprint import evaluation_fingerprint


@dataclass(frozen=True)
class RangeOverride:
    """Parts of the test range to change (evaluate.py's --data, --split, --offset, --tokens); None keeps the run's."""

    data: str | None = None  # token set folder, instead of the run's data.path / data.hub_repo
    split: str | None = None  # split, instead of data.test_split
    offset: int | None = None  # first token, instead of data.test_offset
    n_tokens: int | None = None  # tokens, instead of data.test_tokens

    def changes(self, cfg: Config) -> bool:
        """Whether this names another range than the run's configured test range (its result is then kept
        under the range's own name, beside the configured range's)."""
        return (
            (self.data is not None and self.data != cfg.data.path)
            or self.split not in (None, cfg.data.test_split)
            or self.offset not in (None, cfg.data.test_offset)
            or self.n_tokens not in (None, cfg.data.test_tokens)
        )

    def filled_from(self, result: dict) -> RangeOverride:
        """This override with every part it leaves open taken from another evaluation ``result``."""
        return RangeOverride(
            self.data or result["data_dir"],
            self.split or result["split"],
            result["offset"] if self.offset is None else self.offset,
            result["n_tokens"] if self.n_tokens is None else self.n_tokens,
        )


@dataclass(frozen=True)
class EvalOptions:
    """How to score, whatever the range."""

    precision: str = "fp32"  # fp32, or bf16 / fp16 autocast (the author's evaluator: fp16)
    batch_size: int | None = None  # sequences per forward pass; None: the run's train.micro_batch_size (--hf: 8)
    show_progress: bool = True  # a progress bar on rank 0


@dataclass
class HeldOutRange:
    """Which tokens a test loss is measured on; results are comparable only when these agree."""

    data_dir: str  # the token set folder
    split: str  # the split within it
    offset: int  # first token of the range
    n_tokens: int  # tokens in the range
    tokenizer: str  # from the data set's meta.json ("unknown" for foreign layouts)


def held_out_range(cfg: Config, override: RangeOverride) -> tuple[HeldOutRange, TokenRange]:
    """The test range a run's config names, with ``override`` applied: its identity and its tokens."""
    data_dir = (
        Path(override.data)
        if override.data
        else resolve_data_dir(cfg.data.path, cfg.data.hub_repo, cfg.data.hub_revision)
    )
    split = override.split or cfg.data.test_split
    offset = cfg.data.test_offset if override.offset is None else override.offset
    tokens = open_split(data_dir, split)
    n = override.n_tokens if override.n_tokens is not None else cfg.data.test_tokens
    n = len(tokens) - offset if n is None else n
    if offset < 0 or n <= 0 or offset + n > len(tokens):
        raise DataError(f"{tokens.path}: test range [{offset:,}, {offset + n:,}) is outside its {len(tokens):,} tokens")
    return HeldOutRange(str(data_dir), split, offset, n, tokenizer_name(data_dir)), TokenRange(tokens, offset, n)


def check_disjoint(run: RunDir, held_out: HeldOutRange) -> None:
    """Refuse a test range that overlaps a token range the run trained or validated on."""
    summary = run.summary() or {}
    for what in ("train_token_range", "val_token_range"):
        split, start, end = summary.get(what) or (None, 0, 0)
        if split == held_out.split and start < held_out.offset + held_out.n_tokens and held_out.offset < end:
            raise UserError(
                f"test range {held_out.split} [{held_out.offset:,}, {held_out.offset + held_out.n_tokens:,}) "
                "overlaps the "
                f"tokens {run.path.name} read for {what.split('_')[0]}: {split} [{start:,}, {end:,}); "
                f"choose another --split or --offset"
            )


def evaluate_model(model: GPT, held_out: HeldOutRange, tokens: TokenRange, options: EvalOptions, dist: Dist) -> dict:
    """Test loss of ``model`` on ``tokens`` (``options.batch_size`` set), as the JSON record evaluate.py writes."""
    seq_len, batch_size = model.cfg.context_length, options.batch_size
    start = time.perf_counter()
    bar = tqdm(
        total=tokens.n_sequences(seq_len) * seq_len,
        unit="tok",
        unit_scale=True,
        disable=not (options.show_progress and dist.is_main),
        file=sys.stderr,
        desc="evaluating",
    )
    model.to(dist.device)
    with ieee_fp32():  # its own matmul precision, never what the process set before (a trainer's TF32)
        loss, scored = evaluate_loss(
            model,
            tokens,
            dist,
            seq_len=seq_len,
            batch_size=batch_size,
            autocast=autocast_for(options.precision, dist.device),
            progress=bar.update,
        )
        fingerprint = evaluation_fingerprint(dist, options.precision, batch_size, tokens.tokens)
    bar.close()
    n_bytes = bytes_scored(tokens, scored, held_out.tokenizer)
    return {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "targets_scored": scored,  # tokens predicted from those before them: the loss is their mean
        "bytes_scored": n_bytes,  # their text's bytes (None: the tokenizer is not known here)
        "bits_per_byte": bits_per_byte(loss, scored, n_bytes),
        **asdict(held_out),
        "range": [held_out.offset, held_out.offset + held_out.n_tokens],
        "precision": options.precision,
        "batch_size": batch_size,
        "world_size": dist.world_size,
        "seconds": time.perf_counter() - start,
        "fingerprint": fingerprint,
    }


def bytes_scored(tokens: TokenRange, scored: int, tokenizer: str, chunk: int = 1 << 22) -> int | None:
    """The bytes of the text of the ``scored`` targets of ``tokens`` (the tokens after its first: each predicted
    from those before it), by ``gpt.data.tokenizer.token_byte_lengths``; None where the tokenizer is unknown."""
    lengths = token_byte_lengths(tokenizer) if tokenizer != "unknown" else None
    if lengths is None:
        return None
    total, first = 0, tokens.offset + 1
    for start in range(first, first + scored, chunk):
        ids = tokens.tokens.read(start, min(chunk, first + scored - start)).astype(np.int64)
        total += int(lengths[np.clip(ids, 0, len(lengths) - 1)].sum())
    return total


def evaluate_checkpoint(
    ckpt: Path,
    dist: Dist,
    options: EvalOptions = EvalOptions(),
    override: RangeOverride = RangeOverride(),
    write: bool = True,
) -> dict:
    """Held-out loss of one checkpoint; with ``write``, recorded beside it (``gpt.run.directory.write_eval_result``)."""
    cfg = checkpoint_config(ckpt)
    identity = checkpoint_identity(ckpt, cfg)  # now: a running trainer may prune the checkpoint meanwhile
    held_out, tokens = held_out_range(cfg, override)
    check_disjoint(RunDir.of_checkpoint(ckpt), held_out)
    model = GPT(cfg.model)
    load_weights(model, ckpt)
    options = dataclasses.replace(options, batch_size=options.batch_size or cfg.train.micro_batch_size)
    result = evaluate_model(model, held_out, tokens, options, dist)
    result = {
        **identity,
        **result,
        "configured_range": not override.changes(cfg),
    }
    if write and dist.is_main:
        write_eval_result(ckpt, result)
    return result


def evaluate_hf(
    name: str,
    dist: Dist,
    like: dict | None = None,
    options: EvalOptions = EvalOptions(),
    override: RangeOverride = RangeOverride(),
) -> dict:
    """A transformers GPT-2 (converted to our model) on the range of ``like`` (another result), or ``override``'s."""
    if like is not None:
        override = override.filled_from(like)
    if override.data is None:
        raise UserError("--hf needs the tokens to score: give --data (and --split), or a run to take them from")
    try:
        model = load_hf_gpt2(name)
    except Exception as e:  # offline without a cached copy, unknown name: the library's first line
        raise UserError(f"--hf {name}: cannot load: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    cfg = config_from_dict({"run": {"name": "hf"}, "train": {"steps": 1}, "model": vars(model.cfg)})
    held_out, tokens = held_out_range(cfg, override)
    options = dataclasses.replace(options, batch_size=options.batch_size or 8)
    result = evaluate_model(model, held_out, tokens, options, dist)
    return {
        "run": f"hf:{name}",
        "norm_type": cfg.model.norm_type,
        "seed": None,
        "checkpoint": name,
        "step": None,
        **result,
    }


def evaluate_hf_models(names: list[str], rows: list[dict], dist: Dist, options: EvalOptions, override: RangeOverride):
    """``rows`` (the checkpoints' test losses) with each transformers GPT-2 of ``names`` appended, each scored on
    the range of the first row (the first run's), else ``override``'s."""
    for name in names:
        rows.append(evaluate_hf(name, dist, rows[0] if rows else None, options, override))
    return rows


HEADER = f"{'run':<36}{'norm_type':<28}{'step':>7}{'split':>12}{'tokens scored':>15}{'prec':>6}{'loss':>11}{'ppl':>10}"


def table_line(r: dict) -> str:
    """A result as a row of evaluate.py's table (under ``HEADER``)."""
    return (
        f"{r['run']:<36}{r['norm_type']:<28}{str(r['step']):>7}{r['split']:>12}{r['targets_scored']:>15,}"
        f"{r['precision']:>6}{r['loss']:>11.6f}{r['perplexity']:>10.2f}"
    )
