"""The tasks evaluate.py runs on a checkpoint: one module each, behind one small interface.

A ``Task`` says what it needs (``needs``: the data, in words), how it scores a checkpoint
(``evaluate``: score, keep the result beside the checkpoint as ``eval-<name>-<precision>.json``
through ``gpt.run.directory``, return it) and how its result reads in evaluate.py's table
(``header``, ``line``). Held-out test loss is the first task (``gpt.evaluation.test_loss``;
its file keeps its split's name, ``eval-test-fp32.json``); HellaSwag is the second
(``gpt.evaluation.hellaswag``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpt.common.errors import UserError
from gpt.evaluation import hellaswag
from gpt.evaluation.test_loss import EvalOptions, RangeOverride, evaluate_checkpoint
from gpt.model.gpt import GPT
from gpt.run.checkpoints import checkpoint_config, checkpoint_identity, load_weights
from gpt.run.directory import write_eval_result
from gpt.run.distributed import Dist


@dataclass(frozen=True)
class TaskInputs:
    """What evaluate.py hands every task; each reads the parts it needs."""

    options: EvalOptions = EvalOptions()  # precision, batch size, progress
    override: RangeOverride = RangeOverride()  # test loss: another token range than the run's
    hellaswag: Path | None = None  # HellaSwag: a local JSONL file (None: the cached validation set)
    items: list | None = dataclasses.field(default=None, compare=False)  # HellaSwag items, read once for all


@dataclass(frozen=True)
class Task:
    name: str  # evaluate.py --task NAME
    needs: str  # the data it reads, in words (--help shows it)
    evaluate: Callable[[Path, Dist, TaskInputs], dict]  # score a checkpoint, keep the result beside it, return it
    header: str  # evaluate.py's table header
    line: Callable[[dict], str]  # a result as a row of that table


def test_loss_line(r: dict) -> str:
    return (
        f"{r['run']:<36}{r['norm_type']:<28}{str(r['step']):>7}{r['split']:>12}{r['targets_scored']:>15,}"
        f"{r['precision']:>6}{r['loss']:>11.6f}{r['perplexity']:>10.2f}"
    )


def evaluate_hellaswag(ckpt: Path, dist: Dist, inputs: TaskInputs) -> dict:
    """HellaSwag of one checkpoint, kept as ``eval-hellaswag-<precision>.json`` beside it."""
    cfg = checkpoint_config(ckpt)
    if cfg.model.vocab_size < hellaswag.GPT2_VOCAB:
        raise UserError(
            f"{ckpt}: HellaSwag is read in GPT-2 BPE ({hellaswag.GPT2_VOCAB:,} tokens), and this model's vocabulary "
            f"has {cfg.model.vocab_size:,}; evaluate a model trained on GPT-2 tokens"
        )
    items = inputs.items if inputs.items is not None else hellaswag.load_items(inputs.hellaswag)
    model = GPT(cfg.model)
    load_weights(model, ckpt)
    model.to(dist.device)
    result = {
        **checkpoint_identity(ckpt, cfg),
        "data": str(inputs.hellaswag) if inputs.hellaswag else "validation (cached)",
        **hellaswag.evaluate_hellaswag(model, items, dist, precision=inputs.options.precision),
    }
    if dist.is_main:
        write_eval_result(ckpt, result)
    return result


def hellaswag_line(r: dict) -> str:
    return (
        f"{r['run']:<36}{r['norm_type']:<28}{str(r['step']):>7}{r['n_items']:>9,}{r['precision']:>6}"
        f"{r['acc']:>9.4f}{r['acc_norm']:>10.4f}{r['acc_token_mean']:>16.4f}"
    )


TASKS = {
    "test_loss": Task(
        "test_loss",
        "the run's token set: data.test_split from data.test_offset (--data, --split, --offset, --tokens)",
        lambda ckpt, dist, inputs: evaluate_checkpoint(ckpt, dist, inputs.options, inputs.override),
        f"{'run':<36}{'norm_type':<28}{'step':>7}{'split':>12}{'tokens scored':>15}{'prec':>6}{'loss':>11}{'ppl':>10}",
        test_loss_line,
    ),
    "hellaswag": Task(
        "hellaswag",
        f"HellaSwag's validation set ({hellaswag.N_VALIDATION:,} items): --hellaswag FILE, or the cache, "
        "fetched once when a network exists",
        evaluate_hellaswag,
        f"{'run':<36}{'norm_type':<28}{'step':>7}{'items':>9}{'prec':>6}{'acc':>9}{'acc_norm':>10}{'acc_token_mean':>16}",
        hellaswag_line,
    ),
}
