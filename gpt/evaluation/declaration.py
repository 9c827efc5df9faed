"""What an evaluation task is: its ``Task`` declaration (what evaluate.py needs to run it, how it scores a
checkpoint, its metrics, its report and card lines), its ``Metric``s and command-line ``Option``s, and the
``TaskInputs`` evaluate.py hands its scoring. The registry of tasks is ``gpt.evaluation.tasks``; a task's module
imports its types from here (the registry imports the task modules, so they cannot import it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpt.common.errors import quoted
from gpt.evaluation.held_out import EvalOptions
from gpt.run.directory import read_eval_result
from gpt.run.distributed import Dist


@dataclass(frozen=True)
class Metric:
    """One number of a task's result (a key of it), compared over seeds."""

    name: str  # its key in the result, e.g. acc
    title: str  # what it is, in a few words (the report says it when the task gives no note)
    higher_is_better: bool = True


@dataclass(frozen=True)
class Option:
    """A command-line argument a task adds to evaluate.py: ``parser.add_argument(*flags, **kwargs)``."""

    flags: tuple[str, ...]  # ("--hellaswag",)
    kwargs: dict = field(default_factory=dict)  # type, metavar, help, ...
    selects: bool = False  # given, it runs the task without --task (--lm-eval TASKS, --hf MODEL)
    instead_of_a_run: bool = False  # given, evaluate.py needs no run or checkpoint (--hf MODEL)

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class TaskInputs:
    """What evaluate.py hands every task: how to score, the parsed arguments, each task's prepared inputs."""

    options: EvalOptions = EvalOptions()  # precision, batch size, progress
    args: argparse.Namespace = field(default_factory=argparse.Namespace)  # every task's options, parsed
    prepared: dict = field(default_factory=dict, compare=False)  # task name -> what its ``prepare`` returned


@dataclass(frozen=True)
class Task:
    name: str  # evaluate.py --task NAME; its result beside a checkpoint: eval-<name>-<precision>.json
    needs: str  # the data it reads, in words (--help shows it)
    evaluate: Callable[[Path, Dist, TaskInputs], dict]  # score a checkpoint, keep the result beside it, return it
    header: str | None  # evaluate.py's table header (None: its lines stand alone)
    line: Callable[[dict], str]  # a result as evaluate.py prints it (a row of that table)
    metrics: tuple[Metric, ...] = ()  # compared over seeds by gpt.analysis.table (none: not compared)
    title: str | None = None  # the report's heading for it (None: its name)
    note: str | None = None  # the report's paragraph under that heading (None: its metrics' titles)
    card: Callable[[dict], str] | None = None  # its line on the model card (None: not on the card)
    options: tuple[Option, ...] = ()  # what it adds to evaluate.py's arguments
    prepare: Callable[[argparse.Namespace], object] | None = None  # its inputs, read once before any work
    default: bool = False  # run when neither --task nor an option that selects a task is given
    more_rows: Callable[[list[dict], Dist, TaskInputs], list[dict]] | None = None  # rows beyond the checkpoints'

    def result(self, ckpt: Path, precision: str = "fp32") -> dict | None:
        """Its result kept beside checkpoint ``ckpt`` (None: not evaluated on it)."""
        return read_eval_result(ckpt, self.name, precision)


def positive_int(text: str) -> int:
    """An argument's value as a whole number > 0 (argparse ``type``)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a positive whole number")
    return int(text)
