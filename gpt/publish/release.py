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
changed and a repo that failed is finished by the next run; the others are left as they are. This module is the
upload; what is read is ``sweep_source``'s, where it goes ``naming``'s, the files ``dataset``'s.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpt.common.errors import UserError
from gpt.publish.dataset import dataset_files, model_files
from gpt.publish.hub_api import HubError, UploadError, hub_client
from gpt.publish.naming import Names, collection_items, hub_names
from gpt.publish.sweep_source import read_sweep
from gpt.publish.sync import Item, apply_repo, plan_repo, sync_collection

COLLECTION_DESCRIPTION = (
    "GPT-2-style models that differ only in their norm layer, and their comparison (gpt-norm-harness)."
)


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
