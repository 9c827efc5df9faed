"""Held-out test loss (and other tasks) of training runs or checkpoints, one table row per run and task.

    python evaluate.py runs/* [--which final|best|latest] [--precision fp32|bf16|fp16]
    python evaluate.py runs/* --task test_loss --task hellaswag [--hellaswag FILE]
    torchrun --nproc_per_node=8 evaluate.py runs/*          # ranks take disjoint batches
    python evaluate.py --hf gpt2 --data data/fineweb        # OpenAI's GPT-2 on the same tokens
    python -m gpt.commands.evaluate ...   /   gpt-evaluate ...        # the same, from anywhere

The range is the run config's data.test_split from data.test_offset, data.test_tokens
long (null: to the end of the split); --data, --split, --offset and --tokens override it.
The result is the token-weighted mean cross-entropy, bit-identical on any world size in
fp32, written as eval-<split>-<precision>.json beside the checkpoint. The author's
evaluator used fp16 autocast; the default here is fp32.

--task hellaswag scores HellaSwag (gpt/evaluation/hellaswag.py: acc, acc_norm and
acc_token_mean, with every item's answers) into eval-hellaswag-<precision>.json, from
--hellaswag FILE or the validation set cached in ~/.cache/gpt-norm-harness/hellaswag
($GPT_NORM_CACHE), fetched there once when a network exists.

--lm-eval TASKS (comma-separated) runs EleutherAI's lm-evaluation-harness on each checkpoint, exported to
a temporary transformers folder (an optional extra: pip install '.[eval]'); --lm-eval-include DIR adds task
YAMLs of one's own. Its results, with every item's log-likelihoods, are kept as eval-lm-eval-fp32.json.

Each task (--task NAME, and the arguments it adds) is declared once in gpt/evaluation/tasks.py
(lm-eval beside its machinery, gpt/publish/lm_eval_bridge.py); the ones chosen run in that order.
"""

from __future__ import annotations

import sys

from gpt.commands.cli import command, is_rank0, parser_for
from gpt.common.files import write_json
from gpt.config import PRECISIONS


def parse_args(argv: list[str] | None):
    from gpt.evaluation.declaration import positive_int
    from gpt.evaluation.tasks import TASKS
    from gpt.publish import lm_eval_bridge  # noqa: F401  (lm-eval's task: registered beside its machinery)

    parser = parser_for(__doc__, 2)
    parser.add_argument("paths", nargs="*", metavar="RUN_OR_CHECKPOINT")
    parser.add_argument(
        "--which",
        choices=("final", "best", "latest"),
        default="final",
        help="which checkpoint of a run (default final: the end of a completed run)",
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument(
        "--batch-size", type=positive_int, help="sequences per forward pass (default: train.micro_batch_size)"
    )
    parser.add_argument(
        "--task",
        action="append",
        choices=tuple(TASKS),
        metavar="TASK",
        help="what to evaluate, repeatable: "
        + ", ".join(f"{name} (the default)" if t.default else name for name, t in TASKS.items()),
    )
    for task in TASKS.values():
        if task.options:
            group = parser.add_argument_group(f"--task {task.name}", task.needs)
            for option in task.options:
                group.add_argument(*option.flags, **option.kwargs)
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    runless = [o for t in TASKS.values() for o in t.options if o.instead_of_a_run]
    if not args.paths and not any(getattr(args, o.dest) for o in runless):
        named = " or ".join(f"{o.flags[0]} {o.kwargs['metavar']}" for o in runless)
        parser.error(f"give at least one run, checkpoint or {named}")
    return args


def chosen_tasks(args) -> list:
    """The tasks --task names, those an option of theirs selects (--lm-eval, --hf), else the default ones;
    in the registry's order."""
    from gpt.evaluation.tasks import TASKS

    selected = {t.name for t in TASKS.values() for o in t.options if o.selects and getattr(args, o.dest)}
    asked = set(args.task or ([] if selected else [t.name for t in TASKS.values() if t.default]))
    return [t for t in TASKS.values() if t.name in asked | selected]


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpt.evaluation.declaration import TaskInputs
    from gpt.evaluation.held_out import EvalOptions
    from gpt.run.directory import resolve_which
    from gpt.run.distributed import setup

    tasks = chosen_tasks(args)
    options = EvalOptions(args.precision, args.batch_size, show_progress=not args.quiet)
    inputs = TaskInputs(options, args, {t.name: t.prepare(args) for t in tasks if t.prepare})  # before any work
    ckpts = [resolve_which(p, args.which) for p in args.paths]  # every path checked before any work
    dist = setup("auto")
    rows = {}
    try:
        for task in tasks:
            rows[task.name] = [task.evaluate(c, dist, inputs) for c in ckpts]
            if task.more_rows is not None:  # test loss: the --hf models, on the first run's range
                rows[task.name] = task.more_rows(rows[task.name], dist, inputs)
    finally:
        dist.close()
    if is_rank0():
        for task in tasks:
            lines = [line for line in map(task.line, rows[task.name]) if line]
            if lines:
                print("\n".join([task.header, *lines] if task.header else lines))
        if args.json:  # whole or not at all: a full disk is one line, and an earlier file stays as it was
            everything = [r for name in rows for r in rows[name]]
            write_json(args.json, everything if len(rows) > 1 else next(iter(rows.values()), []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
