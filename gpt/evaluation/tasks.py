"""The registry of evaluation tasks, each declared once: evaluate.py, the comparison, the report and the model
card read what they need of a task from its entry here and name none by hand.

A ``Task`` (``gpt.evaluation.declaration``, with ``Metric``, ``Option`` and ``TaskInputs``) says what evaluate.py
needs to run it (its command-line ``options``; its ``prepare``d inputs, read and checked before any model loads; the
data it reads, ``needs``), how it scores a checkpoint (``evaluate``: score, keep the result beside the checkpoint as
``eval-<name>-<precision>.json`` through ``gpt.run.directory``, return it), how a result reads in evaluate.py's
table (``header``, ``line``), what the comparison compares over seeds (``metrics``; none: not compared) and how the
report heads it (``title``, ``note``), and how the model card shows it (``card``).

A new task is one module (its scoring; docs/extending.md walks one) and one entry in ``TASKS`` below. The held-out
test loss (``gpt.evaluation.held_out``; its file keeps its split's name, ``eval-test-fp32.json``, and the comparison
and the card are built around it) and HellaSwag (``gpt.evaluation.hellaswag``) are declared here;
lm-evaluation-harness, whose checkpoint is first exported by ``gpt.publish``, a wing above this one, is declared
beside its machinery and registered from there (``gpt.publish.lm_eval_bridge``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpt.common.errors import UserError
from gpt.evaluation import held_out, hellaswag
from gpt.evaluation.declaration import Metric, Option, Task, TaskInputs
from gpt.evaluation.held_out import RangeOverride
from gpt.run.distributed import Dist


def register_task(task: Task) -> Task:
    """Add ``task`` to ``TASKS`` (after the others); a name taken is refused."""
    if task.name in TASKS:
        raise UserError(f"evaluation task {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def unregister_task(name: str) -> None:
    TASKS.pop(name)


def compared_tasks() -> list[Task]:
    """The tasks the comparison compares over seeds: those with metrics."""
    return [t for t in TASKS.values() if t.metrics]


def _range_override(args: argparse.Namespace) -> RangeOverride:
    return RangeOverride(args.data, args.split, args.offset, args.tokens)


def _evaluate_hf(rows: list[dict], dist: Dist, inputs: TaskInputs) -> list[dict]:
    return held_out.evaluate_hf_models(inputs.args.hf, rows, dist, inputs.options, inputs.prepared["test_loss"])


TEST_LOSS = Task(
    "test_loss",
    "the run's token set: data.test_split from data.test_offset (--data, --split, --offset, --tokens)",
    lambda ckpt, dist, inputs: held_out.evaluate_checkpoint(ckpt, dist, inputs.options, inputs.prepared["test_loss"]),
    held_out.HEADER,
    held_out.table_line,
    options=(
        Option(("--data",), {"help": "token set folder (default: the run's data.path / data.hub_repo)"}),
        Option(("--split",), {"help": "split (default: the run's data.test_split)"}),
        Option(("--offset",), {"type": int, "help": "first token (default: the run's data.test_offset)"}),
        Option(("--tokens",), {"type": int, "help": "tokens in the range (default: data.test_tokens, or to the end)"}),
        Option(
            ("--hf",),
            {
                "action": "append",
                "default": [],
                "metavar": "MODEL",
                "help": "also evaluate a transformers GPT-2 checkpoint (Hub name or folder); needs --data "
                "or a run to take the range from",
            },
            selects=True,
            instead_of_a_run=True,
        ),
    ),
    prepare=_range_override,
    default=True,
    more_rows=_evaluate_hf,
)

HELLASWAG = Task(
    hellaswag.RESULT,
    f"HellaSwag's validation set ({hellaswag.N_VALIDATION:,} items): --hellaswag FILE, or the cache, "
    "fetched once when a network exists",
    lambda ckpt, dist, inputs: hellaswag.evaluate_checkpoint(
        ckpt, dist, inputs.prepared["hellaswag"], inputs.args.hellaswag, inputs.options.precision
    ),
    hellaswag.HEADER,
    hellaswag.table_line,
    metrics=tuple(Metric(name, title) for name, title in hellaswag.METRICS.items()),
    title="HellaSwag",
    note="acc: the ending with the highest summed log-probability; acc_norm: per character of the ending "
    "(lm-evaluation-harness's); acc_token_mean: the lowest mean per-token loss (llm.c's, build-nanogpt's). "
    "Random guessing: 0.25; OpenAI's GPT-2 124M: 0.2955 acc_token_mean.",
    card=hellaswag.card_line,
    options=(
        Option(
            ("--hellaswag",), {"type": Path, "metavar": "FILE", "help": "HellaSwag items (JSONL), instead of the cache"}
        ),
    ),
    prepare=lambda args: hellaswag.load_items(args.hellaswag),  # a missing file: said before any work
)

# Every task, in the order evaluate.py runs and prints them; a new task is an entry here.
TASKS: dict[str, Task] = {t.name: t for t in (TEST_LOSS, HELLASWAG)}
