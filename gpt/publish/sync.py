"""Bringing the Hub to what is here, by content: a repo to a set of local files, a collection to a list of items.

A repo's files are compared with what the Hub lists (the git blob id of a plain file, the
sha256 of an LFS one): only files that are new or differ are uploaded, in one commit, and
nothing there is deleted; a repo already up to date gets no commit at all. A collection is
found by its title in its namespace; missing items are added, notes mended and the order set,
and items it holds beyond the list are left where they are.

Every plan is made with reading requests only, so a dry run shows what would change and
changes nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from gpt.publish.hub_api import retried


def git_blob_oid(path: Path) -> str:
    """The id git (and the Hub's file listing) gives a plain file's content."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class RepoPlan:
    """What bringing one repo to ``files`` takes."""

    repo_id: str  # user/name
    repo_type: str  # "model" or "dataset"
    files: dict[str, Path]  # path in the repo -> the local file
    exists: bool  # the repo is on the Hub already
    changed: list[str]  # the paths that are new there or differ, to upload

    @property
    def url(self) -> str:
        return self.repo_id if self.repo_type == "model" else f"{self.repo_type}s/{self.repo_id}"


def differs(local: Path, remote) -> bool:
    """Whether ``local`` differs from the Hub's ``remote`` file (a RepoFile; None: not there)."""
    if remote is None:
        return True
    if remote.lfs is not None:  # an LFS (or Xet) file: the Hub keeps its content's sha256
        return remote.lfs.sha256 != sha256(local)
    return remote.blob_id != git_blob_oid(local)


def plan_repo(api, repo_id: str, repo_type: str, files: dict[str, Path]) -> RepoPlan:
    """Compare ``files`` with the repo's main branch, reading only."""
    from huggingface_hub import RepoFile
    from huggingface_hub.errors import RepositoryNotFoundError

    def listing():
        try:
            entries = api.list_repo_tree(repo_id, repo_type=repo_type, recursive=True)
            return {e.path: e for e in entries if isinstance(e, RepoFile)}
        except RepositoryNotFoundError:
            return None

    remote = retried(listing, f"{repo_type} {repo_id} (listing its files)")
    changed = [path for path, local in sorted(files.items()) if differs(local, (remote or {}).get(path))]
    return RepoPlan(repo_id, repo_type, dict(files), remote is not None, changed)


def apply_repo(api, plan: RepoPlan, *, private: bool, message: str, attempts: int = 3) -> str | None:
    """Create the repo if needed and upload the changed files in one commit; its id (None: nothing to do)."""
    from huggingface_hub import CommitOperationAdd

    if not plan.changed:
        return None

    def upload() -> str:
        api.create_repo(plan.repo_id, repo_type=plan.repo_type, private=private, exist_ok=True)
        operations = [CommitOperationAdd(path, str(plan.files[path])) for path in plan.changed]
        info = api.create_commit(plan.repo_id, operations, commit_message=message, repo_type=plan.repo_type)
        return info.oid

    return retried(upload, f"{plan.repo_type} {plan.repo_id}", attempts=attempts)


@dataclass(frozen=True)
class Item:
    """One entry of a collection."""

    type: str  # "model" or "dataset"
    id: str  # the repo, user/name
    note: str  # the line shown under it


def find_collection(api, namespace: str, title: str):
    """The collection of ``namespace`` titled ``title``, with all its items; None if there is none."""
    for found in api.list_collections(owner=namespace, limit=100):
        if found.title == title:
            return api.get_collection(found.slug)
    return None


def collection_changes(current: list[Item], items: list[Item]) -> list[tuple[str, Item, int | None]]:
    """What turns a collection holding ``current`` into one that starts with ``items`` in order:
    ("add", item, None), ("note", item, None) and ("move", item, position), in the order to apply them."""
    changes = []
    held = {(i.type, i.id): i for i in current}
    order = [(i.type, i.id) for i in current]
    for item in items:
        there = held.get((item.type, item.id))
        if there is None:
            changes.append(("add", item, None))
            order.append((item.type, item.id))
        elif there.note != item.note:
            changes.append(("note", item, None))
    for position, item in enumerate(items):
        if order[position] != (item.type, item.id):
            changes.append(("move", item, position))
            order.remove((item.type, item.id))
            order.insert(position, (item.type, item.id))
    return changes


def sync_collection(
    api, namespace: str, title: str, description: str, items: list[Item], *, private: bool, dry_run: bool
) -> tuple[bool, list[tuple[str, Item, int | None]]]:
    """Bring the collection to ``items`` (see ``collection_changes``), creating it if needed; returns
    (created, changes). A dry run only reads."""

    def current():
        found = find_collection(api, namespace, title)
        held = [Item(i.item_type, i.item_id, i.note or "") for i in found.items] if found is not None else []
        return found, held

    found, held = retried(current, f"collection {title!r} (reading it)")
    changes = collection_changes(held, items)
    if dry_run or (found is not None and not changes):
        return found is None, changes

    def apply():
        collection = find_collection(api, namespace, title) or api.create_collection(  # read again: a retry
            title, namespace=namespace, description=description, private=private, exists_ok=True
        )
        slug = collection.slug
        object_ids = {(i.item_type, i.item_id): i.item_object_id for i in collection.items}
        for action, item, position in collection_changes(
            [Item(i.item_type, i.item_id, i.note or "") for i in collection.items], items
        ):
            if action == "add":
                added = api.add_collection_item(slug, item.id, item.type, note=item.note, exists_ok=True)
                object_ids |= {(i.item_type, i.item_id): i.item_object_id for i in added.items}
            else:
                key = object_ids[(item.type, item.id)]
                api.update_collection_item(
                    slug, key, **({"note": item.note} if action == "note" else {"position": position})
                )

    retried(apply, f"collection {title!r}")
    return found is None, changes
