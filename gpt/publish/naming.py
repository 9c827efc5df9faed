"""Where a sweep goes on the Hub: a model repo per run and a dataset repo for the comparison (under a namespace
and an optional prefix, each name checked as the Hub checks it), the collection's title and its items' notes."""

from __future__ import annotations

from dataclasses import dataclass

from gpt.common.errors import UserError
from gpt.publish.sweep_source import Sweep, SweepRun
from gpt.publish.sync import Item


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
