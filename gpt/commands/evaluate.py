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

--lm-eval TASKS (comma-separated) runs EleutherAI's lm-evaluation-harness on each checkpoint,
exported to a temporary transformers folder (an optional extra: pip install '.[eval]');
--lm-eval-include DIR adds task YAMLs of one's own. Its results, with every item's
log-likelihoods, are kept as eval-lm-eval-fp32.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.commands.cli import command, is_rank0, parser_for
from gpt.common.errors import quoted
from gpt.common.files import write_json
from gpt.config import PRECISIONS


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a positive whole number")
    return int(text)


def parse_args(argv: list[str] | None):
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
    parser.add_argument("--data", help="token set folder (default: the run's data.path / data.hub_repo)")
    parser.add_argument("--split", help="split (default: the run's data.test_split)")
    parser.add_argument("--offset", type=int, help="first token (default: the run's data.test_offset)")
    parser.add_argument("--tokens", type=int, help="tokens in the range (default: data.test_tokens, or to the end)")
    parser.add_argument(
        "--hf",
        action="append",
        default=[],
        metavar="MODEL",
        help="also evaluate a transformers GPT-2 checkpoint (Hub name or folder); needs --data "
        "or a run to take the range from",
    )
    parser.add_argument(
        "--task",
        action="append",
        choices=("test_loss", "hellaswag"),
        metavar="TASK",
        help="what to evaluate, repeatable: test_loss (the default), hellaswag",
    )
    parser.add_argument("--hellaswag", type=Path, metavar="FILE", help="HellaSwag items (JSONL), instead of the cache")
    parser.add_argument(
        "--lm-eval", metavar="TASKS", help="lm-evaluation-harness tasks, comma-separated (extra: .[eval])"
    )
    parser.add_argument("--lm-eval-include", type=Path, metavar="DIR", help="--lm-eval: a folder of task YAMLs")
    parser.add_argument("--lm-eval-batch-size", type=positive_int, default=8, help="--lm-eval: batch size (default 8)")
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.paths and not args.hf:
        parser.error("give at least one run, checkpoint or --hf MODEL")
    return args


def lm_eval_checkpoint(ckpt, args, dist) -> dict:
    """lm-eval's tasks on one checkpoint, on rank 0 (lm-eval runs its own batches; other ranks wait)."""
    from gpt.publish.lm_eval_bridge import run_lm_eval

    tasks = [t for t in args.lm_eval.split(",") if t]
    return dist.on_main(
        lambda: run_lm_eval(
            ckpt,
            tasks,
            include_path=args.lm_eval_include,
            batch_size=args.lm_eval_batch_size,
            device=str(dist.device),
        )
    )


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpt.evaluation.hellaswag import load_items
    from gpt.evaluation.tasks import TASKS, TaskInputs
    from gpt.evaluation.test_loss import EvalOptions, RangeOverride, evaluate_hf
    from gpt.run.directory import resolve_which
    from gpt.run.distributed import setup

    asked = args.task or ([] if args.lm_eval else ["test_loss"])  # --lm-eval alone runs only lm-eval
    tasks = [TASKS[name] for name in dict.fromkeys([*(["test_loss"] if args.hf else []), *asked])]
    inputs = TaskInputs(
        EvalOptions(args.precision, args.batch_size, show_progress=not args.quiet),
        RangeOverride(args.data, args.split, args.offset, args.tokens),
        args.hellaswag,
        load_items(args.hellaswag) if TASKS["hellaswag"] in tasks else None,  # a missing file: before any work
    )
    ckpts = [resolve_which(p, args.which) for p in args.paths]  # every path checked before any work
    dist = setup("auto")
    try:
        rows = {task.name: [task.evaluate(c, dist, inputs) for c in ckpts] for task in tasks}
        for name in args.hf:
            like = (rows.get("test_loss") or [None])[0]  # the first run's range, if a run was evaluated
            rows.setdefault("test_loss", []).append(evaluate_hf(name, dist, like, inputs.options, inputs.override))
        if args.lm_eval:
            rows["lm-eval"] = [lm_eval_checkpoint(c, args, dist) for c in ckpts]
    finally:
        dist.close()
    if is_rank0():
        for task in tasks:
            if rows.get(task.name):
                print("\n".join([task.header, *map(task.line, rows[task.name])]))
        for r in rows.get("lm-eval", []):
            for name, metrics in r["results"].items():
                shown = ", ".join(f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
                print(f"{r['run']} (step {r['step']}) lm-eval {name}: {shown}")
        if args.json:  # whole or not at all: a full disk is one line, and an earlier file stays as it was
            everything = [r for name in rows for r in rows[name]]
            write_json(args.json, everything if len(rows) > 1 else next(iter(rows.values()), []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
