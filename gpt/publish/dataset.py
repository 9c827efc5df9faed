"""A sweep's repos' files: each run's model export with its row of the sweep, and the comparison's dataset
(the comparison folder's files, ``runs.jsonl``, each run's record under ``runs/<name>/``, and its card with the
table, the charts, what was left out and the commands that reproduce it)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from gpt.common.files import write_atomically
from gpt.publish.card import LICENSE
from gpt.publish.export import export_checkpoint
from gpt.publish.naming import Names
from gpt.publish.sweep_source import Sweep, SweepRun
from gpt.run.directory import COMPLETED

DATASET_RUNS = "runs"  # the dataset's folder of per-run files


def model_files(r: SweepRun, names: Names, tmp: Path) -> dict[str, Path]:
    """The export of ``r``'s checkpoint, its card showing its row of the sweep."""
    folder = tmp / r.name
    row = {"dataset": names.dataset, "run": r.name, "group": r.group, "seed": r.seed, "status": r.status}
    files = export_checkpoint(
        r.ckpt,
        folder,
        names.models[r.name],
        run=r.run,
        experiment={**row, "test_loss": r.test_loss},
        evaluations=r.evaluations,
    )
    return {name: folder / name for name in files}


def run_rows(sweep: Sweep, names: Names) -> list[dict]:
    """runs.jsonl: one row per run, the table's data."""
    return [
        {
            "run": r.name,
            "group": r.group,
            "seed": r.seed,
            "status": r.status,
            "test_loss": r.test_loss,
            "model": names.models[r.name] if r.ckpt is not None else None,
        }
        for r in sweep.runs
    ]


def dataset_files(sweep: Sweep, names: Names, tmp: Path) -> dict[str, Path]:
    """The dataset repo's files: the comparison folder's, runs.jsonl, each run's record, the card."""
    files = {
        p.name: p for p in sorted(sweep.comparison.iterdir()) if p.is_file() and p.suffix in (".json", ".md", ".png")
    }
    for r in sweep.runs:
        record = [r.run.config_file, r.run.summary_file, r.run.metrics_file]
        if r.status == COMPLETED:
            record += r.evaluations.files  # the final checkpoint's, as choose_checkpoint found them
        for path in record:
            if path.is_file():
                files[f"{DATASET_RUNS}/{r.name}/{path.name}"] = path
    folder = tmp / "dataset"
    folder.mkdir(parents=True)
    rows = folder / "runs.jsonl"
    write_atomically(rows, "".join(json.dumps(row) + "\n" for row in run_rows(sweep, names)))
    card = folder / "README.md"
    write_atomically(card, dataset_card(sweep, names, sorted(files)))
    return {**files, rows.name: rows, card.name: card}


def dataset_metadata(sweep: Sweep, names: Names) -> dict:
    groups = [g["group"] for g in sweep.result.get("groups", [])]
    n = len(sweep.runs)
    size = "n<1K" if n < 1000 else "1K<n<10K"
    return {
        "license": LICENSE,
        "pretty_name": names.title,
        "task_categories": ["text-generation"],
        "tags": ["gpt2", "normalization", "gpt-norm-harness", *sorted({g.replace("_", "-") for g in groups})],
        "size_categories": [size],
        "configs": [{"config_name": "runs", "data_files": "runs.jsonl", "default": True}],
    }


def reproduce_lines(sweep: Sweep, names: Names) -> list[str]:
    """The commands that train, evaluate and compare the runs again, from the configs this repo holds."""
    result, local = sweep.result, sweep.folder.name
    compare = ["python", "scripts/compare.py", *[f"{local}/{r.name}" for r in sweep.runs]]
    compare += ["--out", f"{local}/{sweep.comparison.name}", "--baseline", str(result.get("baseline"))]
    if result.get("equivalence_margin") is not None:
        compare += ["--equivalence-margin", str(result["equivalence_margin"])]
    for key in result.get("allowed_to_differ") or []:
        compare += ["--allow-differ", key if isinstance(key, str) else str(key.get("key", key))]
    lines = [
        "## Reproduce",
        "",
        "Each run's `config.yaml` here is its whole resolved config (its data set's hashes are in the fingerprint "
        "above). With gpt-norm-harness checked out at the code version shown, and the data prepared:",
        "",
        "```bash",
        f"hf download {names.dataset} --repo-type dataset --local-dir published",
    ]
    for r in sweep.runs:
        lines.append(f"python train.py published/{DATASET_RUNS}/{r.name}/config.yaml --set run.dir={local}/{r.name}")
        lines.append(f"python evaluate.py {local}/{r.name}")
    return [*lines, shlex.join(compare), "```", ""]


def model_link(repo: str) -> str:
    return f"[{repo}](https://huggingface.co/{repo})"


def dataset_card(sweep: Sweep, names: Names, files: list[str]) -> str:
    comparison = (
        (sweep.comparison / "comparison.md").read_text() if (sweep.comparison / "comparison.md").is_file() else ""
    )
    comparison = comparison.replace("\n## ", "\n### ").replace("# Comparison", "## Comparison", 1)
    charts = [f for f in files if f.endswith(".png") and "/" not in f]
    lines = [
        f"# {names.title}",
        "",
        f"GPT-2-style models that differ only in their norm layer, trained with gpt-norm-harness: {len(sweep.runs)} "
        f'runs, {len(sweep.published)} published as models (the collection "{names.title}" holds them with this '
        f"dataset). `comparison.json` is the table's data; `runs.jsonl` has a row per run; `{DATASET_RUNS}/<run>/` "
        "holds each run's config, summary, evaluation results and metrics.",
        "",
        comparison.strip(),
        "",
        "## Charts",
        "",
        *[f"![{c[:-4].replace('_', ' ')}]({c})" for c in charts],
        "",
        "## Runs",
        "",
        "| run | group | seed | status | test loss | model |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r.name} | {r.group} | {r.seed} | {r.status} | "
            f"{'n/a' if r.test_loss is None else format(r.test_loss, '.6f')} | "
            f"{model_link(names.models[r.name]) if r.ckpt else 'not published'} |"
            for r in sweep.runs
        ],
        "",
    ]
    left = [r for r in sweep.runs if r.left_out]
    if left:
        lines += ["Not published as models:", "", *[f"- {r.name}: {r.left_out}" for r in left], ""]
    head = "---\n" + yaml.safe_dump(dataset_metadata(sweep, names), sort_keys=False) + "---\n"
    return head + "\n".join(lines + reproduce_lines(sweep, names))
