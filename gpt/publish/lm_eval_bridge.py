"""EleutherAI's lm-evaluation-harness on a checkpoint: exported to a transformers folder, then lm-eval's API.

An optional extra (``pip install '.[eval]'``: ``lm-eval[hf]`` 0.4). The checkpoint is exported
with the remote-code layout (``gpt.publish.export``: the model lm-eval loads is the trained one,
through ``trust_remote_code``) into a temporary folder, and ``lm_eval.simple_evaluate`` runs the
named tasks on it in fp32. ``include_path`` adds task YAMLs of one's own (a local JSON data set,
say). The result, lm-eval's metrics per task with every item's log-likelihoods, is kept beside
the checkpoint as ``eval-lm-eval-fp32.json``.

It is evaluate.py's task ``lm-eval`` (``LM_EVAL``, registered in ``gpt.evaluation.tasks`` when this module
loads: its checkpoint is exported first, which only this wing can do).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from gpt.common.errors import UserError, first_line
from gpt.evaluation.declaration import Option, Task, TaskInputs, positive_int
from gpt.evaluation.tasks import register_task
from gpt.publish.export import export_checkpoint
from gpt.run.checkpoints import checkpoint_config, checkpoint_identity
from gpt.run.directory import write_eval_result
from gpt.run.distributed import Dist
from gpt.run.fastpath import ieee_fp32
from gpt.run.fingerprint import evaluation_fingerprint

INSTALL = "pip install '.[eval]' (lm-eval[hf] 0.4)"


def item_record(sample: dict) -> dict:
    """One item as lm-eval logged it: its id, the right choice, each choice's log-likelihood, its metrics."""
    return {
        "doc_id": sample["doc_id"],
        "target": sample.get("target"),
        "loglikelihoods": [float(r[0]) for r in sample.get("filtered_resps", [])],
        **{k: sample[k] for k in ("acc", "acc_norm") if k in sample},
    }


def run_lm_eval(
    ckpt: Path,
    tasks: list[str],
    *,
    include_path: Path | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    write: bool = True,
) -> dict:
    """lm-eval's ``tasks`` on checkpoint ``ckpt`` (fp32); the result, kept beside it when ``write``."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise UserError(f"--lm-eval needs lm-evaluation-harness, an optional extra: {INSTALL}") from None
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:  # before the export and the model's loading
        raise UserError(
            f"--lm-eval {','.join(unknown)}: not a task lm-eval knows ({len(manager.all_tasks):,} do: "
            "`lm-eval ls tasks`); --lm-eval-include DIR adds task YAMLs of your own"
        )
    cfg = checkpoint_config(ckpt)
    identity = checkpoint_identity(ckpt, cfg)  # now: a running trainer may prune the checkpoint meanwhile
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpt-lm-eval-") as tmp:
        export_checkpoint(ckpt, Path(tmp), f"local/{cfg.run.name}")
        with ieee_fp32():  # its own matmul precision, never what the process set before
            try:
                out = lm_eval.simple_evaluate(
                    model="hf",
                    model_args={"pretrained": tmp, "trust_remote_code": True, "dtype": "float32"},
                    tasks=list(tasks),
                    task_manager=manager,
                    batch_size=batch_size,
                    device=device,
                    log_samples=True,
                )
            except (KeyError, ValueError) as e:  # an unknown task name, a task YAML that does not load
                raise UserError(f"--lm-eval {','.join(tasks)}: {first_line(e)}") from None
            fingerprint = evaluation_fingerprint(Dist(device=torch.device(device)), "fp32", batch_size)
    result = {
        **identity,
        "split": "lm-eval",
        "precision": "fp32",
        "lm_eval_version": getattr(lm_eval, "__version__", None),
        "tasks": list(tasks),
        "results": out["results"],
        "items": {task: [item_record(s) for s in samples] for task, samples in out.get("samples", {}).items()},
        "seconds": time.perf_counter() - start,
        "fingerprint": fingerprint,
    }
    if write:
        write_eval_result(ckpt, result)
    return result


def lm_eval_tasks(args: argparse.Namespace) -> list[str]:
    """The lm-eval tasks named by --lm-eval TASKS (comma-separated)."""
    tasks = [t for t in (args.lm_eval or "").split(",") if t]
    if not tasks:
        raise UserError("--task lm-eval needs the tasks to run: --lm-eval TASKS (comma-separated)")
    return tasks


def evaluate_checkpoint(ckpt: Path, dist: Dist, inputs: TaskInputs) -> dict:
    """lm-eval's tasks on one checkpoint, on rank 0 (lm-eval runs its own batches; other ranks wait)."""
    args = inputs.args
    return dist.on_main(
        lambda: run_lm_eval(
            ckpt,
            inputs.prepared["lm-eval"],
            include_path=args.lm_eval_include,
            batch_size=args.lm_eval_batch_size,
            device=str(dist.device),
        )
    )


def result_lines(r: dict) -> str:
    """A result as evaluate.py prints it: a line per lm-eval task, with its float metrics."""
    lines = []
    for name, metrics in r["results"].items():
        shown = ", ".join(f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        lines.append(f"{r['run']} (step {r['step']}) lm-eval {name}: {shown}")
    return "\n".join(lines)


LM_EVAL = register_task(
    Task(
        "lm-eval",
        "lm-evaluation-harness's tasks (--lm-eval TASKS) on the checkpoint exported to transformers",
        evaluate_checkpoint,
        None,
        result_lines,
        options=(
            Option(
                ("--lm-eval",),
                {"metavar": "TASKS", "help": "lm-evaluation-harness tasks, comma-separated (extra: .[eval])"},
                selects=True,
            ),
            Option(
                ("--lm-eval-include",), {"type": Path, "metavar": "DIR", "help": "--lm-eval: a folder of task YAMLs"}
            ),
            Option(
                ("--lm-eval-batch-size",),
                {"type": positive_int, "default": 8, "help": "--lm-eval: batch size (default 8)"},
            ),
        ),
        prepare=lm_eval_tasks,
    )
)
