"""A whole sweep on the Hub: every run a model repo, the comparison a dataset repo, one collection.

What is published comes from the sweep's folder alone (what ``scripts/sweep.py`` writes): its
comparison folder (``comparison.json``, ``comparison.md``, the charts) and the run folders the
comparison names.

- A model repo per completed, evaluated run: the remote-code export of its final checkpoint,
  its card with its test loss and its row of the sweep. Runs that diverged or did not complete
  are published (their last checkpoint, a card that says so) only with ``include_failed``.
- The dataset repo: the comparison's files, ``runs.jsonl`` (a row per run: the table's data),
  and per run ``runs/<name>/`` with its config, summary, evaluation results and metrics, so
  anyone can recompute the table; its card shows the comparison, the charts, the models, what
  was left out and why, and the commands that reproduce the sweep.
- A collection titled after the sweep: the dataset first, then the models in table order,
  each with a note (norm type, seed, test loss).

Every repo is brought to its files by content (``gpt.publish.sync``), so a rerun uploads only what
changed and a repo that failed is finished by the next run; the others are left as they are.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpt.common.errors import UserError
from gpt.common.files import read_json, write_atomically
from gpt.publish.card import LICENSE
from gpt.publish.export import export_checkpoint
from gpt.publish.hub_api import HubError, UploadError, hub_client
from gpt.publish.sync import Item, apply_repo, plan_repo, sync_collection
from gpt.run.directory import COMPARISON_FILE, COMPLETED, RunDir, eval_result_files, read_eval_result

DATASET_RUNS = "runs"  # the dataset's folder of per-run files
COLLECTION_DESCRIPTION = (
    "GPT-2-style models that differ only in their norm layer, and their comparison (gpt-norm-harness)."
)


@dataclass
class SweepRun:
    """One run of the sweep, in the comparison's table order."""

    name: str  # its folder's name, also its model repo's (after the prefix)
    run: RunDir
    group: str  # its comparison group (the norm type)
    seed: str
    status: str  # completed, diverged, interrupted, ...
    test_loss: float | None  # as the comparison has it
    ckpt: Path | None = None  # what its model repo holds; None: not published
    left_out: str | None = None  # why it is not published


@dataclass
class Sweep:
    folder: Path  # the sweep's folder (its runs and its comparison folder)
    comparison: Path  # the comparison folder
    result: dict  # comparison.json
    runs: list[SweepRun]

    @property
    def title_stem(self) -> str:
        return self.comparison.name.removesuffix("-comparison")

    @property
    def published(self) -> list[SweepRun]:
        return [r for r in self.runs if r.ckpt is not None]


def sweep_comparison_folder(folder: Path, comparison: Path | None) -> Path:
    """The sweep's comparison folder: ``comparison`` if given, else the one folder in ``folder`` holding one."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder; give the folder a sweep wrote (its runs and its comparison)")
    if comparison is not None:
        if not (comparison / COMPARISON_FILE).is_file():
            raise UserError(f"--comparison {comparison}: holds no {COMPARISON_FILE}; run scripts/compare.py first")
        return comparison
    found = sorted(d for d in folder.iterdir() if (d / COMPARISON_FILE).is_file())
    if len(found) != 1:
        what = f"{len(found)}: {', '.join(d.name for d in found)}" if found else "none"
        raise UserError(
            f"{folder}: a sweep folder holds one comparison folder ({COMPARISON_FILE}), found {what}; "
            "name one with --comparison DIR, or run scripts/sweep.py (or scripts/compare.py) first"
        )
    return found[0]


def choose_checkpoint(r: SweepRun, split: str, include_failed: bool) -> None:
    """Set ``r.ckpt`` to what its repo publishes, or ``r.left_out`` to why nothing is."""
    if r.status == COMPLETED:
        ckpt = r.run.checkpoint("final")
        if read_eval_result(ckpt, split, "fp32") is None:
            r.left_out = f"completed, not evaluated (python evaluate.py {r.run.path})"
        else:
            r.ckpt = ckpt
        return
    if not include_failed:
        r.left_out = f"{r.status}: published only with --include-failed"
        return
    try:
        r.ckpt = r.run.checkpoint("latest")
    except UserError:
        r.left_out = f"{r.status}, and no checkpoint to publish"


def read_sweep(folder: Path, comparison: Path | None = None, include_failed: bool = False) -> Sweep:
    """The sweep in ``folder``: its comparison and its runs in table order, each with what it publishes."""
    folder = Path(folder)
    comparison = sweep_comparison_folder(folder, comparison)
    result = read_json(comparison / COMPARISON_FILE, "comparison")
    split = (result.get("test_range") or {}).get("split", "test")
    runs = []
    for group in result.get("groups", []):
        for entry in group.get("runs", []):
            name = Path(entry["path"]).name  # the path as compare was given it; the folder is in the sweep's
            run = RunDir(folder / name)
            if not run.looks_like_run():
                raise UserError(f"{folder / name}: the comparison names this run, and it is not in {folder}")
            r = SweepRun(name, run, group["group"], str(entry["seed"]), entry["status"], entry.get("test_loss"))
            choose_checkpoint(r, split, include_failed)
            runs.append(r)
    return Sweep(folder, comparison, result, runs)


@dataclass
class Names:
    """Where everything goes on the Hub."""

    models: dict[str, str]  # run name -> model repo
    dataset: str  # the comparison's dataset repo
    title: str  # the collection's title
    namespace: str


def check_repo_name(repo: str) -> None:
    """One line if the Hub would refuse ``repo`` as a repo id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise UserError(f"--namespace/--prefix make the repo name {repo!r}, which the Hub refuses: {e}") from None


def hub_names(sweep: Sweep, namespace: str, prefix: str | None) -> Names:
    lead = f"{prefix}-" if prefix else ""
    names = Names(
        models={r.name: f"{namespace}/{lead}{r.name}" for r in sweep.runs},
        dataset=f"{namespace}/{lead}{sweep.comparison.name}",
        title=f"{prefix or sweep.title_stem}: norm layers compared",
        namespace=namespace,
    )
    for repo in [names.dataset, *names.models.values()]:
        check_repo_name(repo)
    return names


def note(r: SweepRun) -> str:
    """The collection's line under a model."""
    loss = f"test loss {r.test_loss:.4f}" if r.test_loss is not None else f"{r.status}, no test loss"
    return f"{r.group}, seed {r.seed}, {loss}"


def collection_items(sweep: Sweep, names: Names) -> list[Item]:
    n = len(sweep.runs)
    first = Item("dataset", names.dataset, f"The comparison of {n} runs: table, charts, every run's data")
    return [first, *(Item("model", names.models[r.name], note(r)) for r in sweep.published)]


def model_files(r: SweepRun, names: Names, tmp: Path) -> dict[str, Path]:
    """The export of ``r``'s checkpoint, its card showing its row of the sweep."""
    folder = tmp / r.name
    row = {"dataset": names.dataset, "run": r.name, "group": r.group, "seed": r.seed, "status": r.status}
    files = export_checkpoint(
        r.ckpt, folder, names.models[r.name], run=r.run, experiment={**row, "test_loss": r.test_loss}
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
            record += eval_result_files(r.run.checkpoint("final"))
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


@dataclass
class Outcome:
    """What publishing did, or would do (a dry run)."""

    uploaded: dict[str, list[str]]  # repo -> the files it got (would get)
    unchanged: list[str]  # repos already up to date
    failed: dict[str, str]  # repo -> why
    collection: list[str]  # the collection's changes, one line each
    left_out: dict[str, str]  # run -> why it has no model repo


def publish_repo(api, plan, *, private: bool, dry_run: bool, message: str, outcome: Outcome, log) -> bool:
    """Upload one repo's changed files (a dry run: say which); False if it failed."""
    kind = "dataset" if plan.repo_type == "dataset" else "model"
    if not plan.changed:
        outcome.unchanged.append(plan.repo_id)
        log(f"{kind} {plan.repo_id}: up to date ({len(plan.files)} files)")
        return True
    verb = "would " if dry_run else ""
    log(
        f"{kind} {plan.repo_id}: {verb}{'upload' if plan.exists else 'create, upload'} "
        f"{len(plan.changed)} of {len(plan.files)} files"
    )
    for path in plan.changed:
        log(f"  {path}")
    if dry_run:
        outcome.uploaded[plan.repo_id] = plan.changed
        return True
    try:
        apply_repo(api, plan, private=private, message=message)
    except UploadError as e:
        outcome.failed[plan.repo_id] = e.reason
        log(f"{kind} {plan.repo_id}: FAILED: {e.reason}")
        return False
    outcome.uploaded[plan.repo_id] = plan.changed
    return True


def publish_sweep(
    folder: Path,
    namespace: str,
    *,
    prefix: str | None = None,
    comparison: Path | None = None,
    include_failed: bool = False,
    private: bool = True,
    dry_run: bool = False,
    log=print,
) -> Outcome:
    """Publish the sweep in ``folder`` (see the module's docstring). A repo that fails is named in the
    outcome and left out of the collection; the others are complete. A dry run only reads from the Hub."""
    sweep = read_sweep(folder, comparison, include_failed)
    names = hub_names(sweep, namespace, prefix)
    api = hub_client()
    outcome = Outcome({}, [], {}, [], {r.name: r.left_out for r in sweep.runs if r.left_out})
    done = set()
    with tempfile.TemporaryDirectory(prefix="gpt-sweep-") as tmp:
        for r in sweep.published:
            files = model_files(r, names, Path(tmp))
            plan = plan_repo(api, names.models[r.name], "model", files)
            if publish_repo(
                api,
                plan,
                private=private,
                dry_run=dry_run,
                message=f"{r.name}: {r.ckpt.name}",
                outcome=outcome,
                log=log,
            ):
                done.add(names.models[r.name])
        plan = plan_repo(api, names.dataset, "dataset", dataset_files(sweep, names, Path(tmp)))
        message = f"{sweep.comparison.name}: {len(sweep.runs)} runs"
        if publish_repo(api, plan, private=private, dry_run=dry_run, message=message, outcome=outcome, log=log):
            done.add(names.dataset)
    items = [i for i in collection_items(sweep, names) if i.id in done]
    publish_collection(api, names, items, private=private, dry_run=dry_run, outcome=outcome, log=log)
    for name, why in outcome.left_out.items():
        log(f"left out: {name}: {why}")
    return outcome


def publish_collection(api, names: Names, items: list[Item], *, private, dry_run, outcome: Outcome, log) -> None:
    verb = "would " if dry_run else ""
    try:
        created, changes = sync_collection(
            api, names.namespace, names.title, COLLECTION_DESCRIPTION, items, private=private, dry_run=dry_run
        )
    except HubError as e:
        what = f"collection {names.title!r}"
        outcome.failed[what] = getattr(e, "reason", str(e))
        log(f"{what}: FAILED: {outcome.failed[what]}")
        return
    if created:
        outcome.collection.append(f"{verb}create collection {names.title!r} in {names.namespace}")
    for action, item, position in changes:
        where = f" to position {position + 1}" if position is not None else ""
        outcome.collection.append(f"{verb}{action} {item.type} {item.id}{where}: {item.note}")
    if not created and not changes:
        log(f"collection {names.title!r}: up to date ({len(items)} items)")
    for line in outcome.collection:
        log(f"collection: {line}")


def outcome_problems(outcome: Outcome) -> None:
    """Raise the one line that names every failed repo (and the collection, if it failed); nothing if none."""
    if not outcome.failed:
        return
    failed = "; ".join(f"{repo} ({why})" for repo, why in outcome.failed.items())
    done = len(outcome.uploaded) + len(outcome.unchanged)
    raise UserError(
        f"publishing failed for {len(outcome.failed)}: {failed}; the other {done} repos are complete: "
        "run the same command again to finish"
    )
