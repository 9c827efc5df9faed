"""Whether runs may be compared: they differ in the norm type, the seeds and the keys the user named, nothing
else (their configs and fingerprints, seen through ``Run.view``), were evaluated on the same tokens and trained
for the same length; and what they all share, for the report. Every refusal is one line naming each key with its
values and runs."""

from __future__ import annotations

import json

from gpt.analysis.runs import AXIS, SEED_KEYS, Run
from gpt.common.errors import UserError
from gpt.run.fingerprint import informational, shown

# How a run is named, logged, published and stored: nothing it computes (prefetch reads the same batches,
# tested bit for bit). Validation (train.eval_every) stays compared: it decides the best checkpoint.
NOT_COMPARED = ("run.", "log.", "hub.", "train.checkpoint_every", "train.keep_last", "train.prefetch")
# ... except how often the loss is logged where a loss ceiling is set: divergence is checked on logged steps.
LOGGED_DIVERGENCE = "log.log_every"


def named(key: str, names) -> bool:
    """Whether ``key`` is one of ``names`` or lies under one (``data.train`` names ``data.train.sha256``)."""
    return any(key == n or key.startswith(n + ".") for n in names)


def compared_keys(runs: list[Run]) -> list[str]:
    ceiling = any(r.config.get("train.loss_ceiling") is not None for r in runs)
    return sorted(
        k
        for k in {k for r in runs for k in r.view}
        if (not k.startswith(NOT_COMPARED) or (ceiling and k == LOGGED_DIVERGENCE)) and k != AXIS and k not in SEED_KEYS
    )


NOT_RECORDED = "not recorded"  # a key a run has no value for (a run from before fingerprints)


def _evaluated(r: Run, key: str) -> bool:
    """Whether ``r`` has the evaluation an evaluation key is about: only those evaluations are compared (a run
    not evaluated, or not on that task, has nothing to disagree with)."""
    if key.startswith("evaluation."):
        return r.evaluation is not None
    task, _, rest = key.partition(".")
    return task in r.tasks if rest.startswith("evaluation.") else True


def _by_value(runs: list[Run], key: str) -> dict[str, list[Run]]:
    """The runs by their value of ``key``, as it is shown (gpt.run.fingerprint.shown)."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        if not _evaluated(r, key):
            continue
        out.setdefault(shown(r.view[key]) if key in r.view else NOT_RECORDED, []).append(r)
    return out


def _listed(by_value: dict, describe=str) -> str:
    """``value (run, run); value (run)``: each value with the runs that hold it."""
    return "; ".join(f"{describe(v)} ({', '.join(r.path.name for r in rs)})" for v, rs in by_value.items())


def check_names(runs: list[Run], vary: list[str], allow_differ: list[str]) -> None:
    """Refuse a --vary or --allow-differ KEY that names nothing these runs record."""
    keys = compared_keys(runs)
    for flag, names in (("--vary", vary), ("--allow-differ", allow_differ)):
        for name in names:
            if not any(named(k, [name]) for k in keys):
                raise UserError(
                    f"{flag} {name}: no such key in these runs' configs or fingerprints; keys are "
                    "dotted like optim.lr, train.precision, hardware.name, data.train.sha256 (a prefix "
                    "such as data.train names every key under it)"
                )


def check_only_the_norm_differs(
    runs: list[Run], vary: list[str], allow_differ: list[str], axes: str = "the norm and the seeds"
) -> dict[str, list]:
    """Refuse runs that differ in anything but the norm type, the seeds and the keys the user named (``axes``: how
    the refusal names what may differ); return the keys allowed to differ that do, each with its values (as shown)
    and their runs."""
    differing, allowed = [], {}
    for key in compared_keys(runs):
        if named(key, vary):
            continue
        by_value = _by_value(runs, key)
        if len(by_value) > 1:
            if named(key, allow_differ):
                allowed[key] = [{"value": v, "runs": [r.path.name for r in rs]} for v, rs in by_value.items()]
            else:
                differing.append(f"{key}: {_listed(by_value)}")
    if differing:
        raise UserError(
            f"these runs differ in more than {axes}, so a difference between them "
            f"would not be the norm's: {' | '.join(differing)}; compare runs that differ only in "
            "model.norm_type and seeds, or name each key: --vary KEY (an axis of the table) or "
            "--allow-differ KEY (accepted, and said in the report)"
        )
    return allowed


def _refuse_mixed(what: str, by_key: dict, describe, fix: str) -> None:
    if len(by_key) > 1:
        raise UserError(f"these runs {what}, so their losses are not comparable: {_listed(by_key, describe)}; {fix}")


def tokens_evaluated(evaluation: dict) -> str:
    """What the evaluated tokens were: the split's sha256 (or sampled sha256), or, for a result written before
    evaluations were fingerprinted, the token set's folder."""
    test = (evaluation.get("fingerprint") or {}).get("test") or {}
    if test.get("sha256"):
        return f"sha256 {test['sha256'][:12]}"
    if test.get("sampled_sha256"):
        return f"sampled sha256 {test['sampled_sha256'][:12]}"
    return f"in {evaluation['data_dir']}"


def check_comparable(runs: list[Run], lengths: bool = True) -> None:
    """Refuse test losses measured on different tokens or tokenizations, and (with ``lengths``) runs that planned
    different training lengths (steps, or tokens per step)."""
    ranges, budgets = {}, {}
    for r in runs:
        if r.evaluation is not None:
            e = r.evaluation
            ranges.setdefault((e["split"], e["offset"], e["n_tokens"], e["tokenizer"], tokens_evaluated(e)), []).append(
                r
            )
        if lengths and r.planned_tokens is not None:
            budgets.setdefault((r.summary["total_steps"], r.planned_tokens), []).append(r)
    _refuse_mixed(
        "were evaluated on different test tokens",
        ranges,
        lambda k: f"{k[0]} [{k[1]:,}, {k[1] + k[2]:,}) tokenizer {k[3]} {k[4]}",
        "re-evaluate them on one range of one token set",
    )
    _refuse_mixed(
        "trained for different lengths",
        budgets,
        lambda k: f"{k[0]:,} steps = {k[1]:,} tokens",
        "train every run for the same train.steps or train.tokens (train.tokens_per_param counts the "
        "parameters outside the norm layers, the same for every norm type)",
    )


def shared_by_all(runs: list[Run]) -> dict:
    """The computation keys on which every run agrees (flat); the recorded-only ones (code commit, ...) where
    they agree too; and, where the runs' commits or uncommitted changes differ, which do (``code.commits``:
    each commit with its runs; ``code.dirty_runs``: the runs with uncommitted changes)."""
    shared = {}
    for key in compared_keys(runs):
        by_value = _by_value(runs, key)
        if len(by_value) == 1 and NOT_RECORDED not in by_value:
            shared[key] = next(iter(by_value.values()))[0].view[key]  # of a run that has it (not all were evaluated)
    notes = [informational(r.summary.get("segments")) for r in runs]
    for key in sorted({k for n in notes for k in n}):
        values = {json.dumps(n.get(key), sort_keys=True) for n in notes}
        if len(values) == 1:
            shared[key] = notes[0][key]
    commits: dict[str, list[str]] = {}
    for r, n in zip(runs, notes):
        for commit in n.get("code.commit") if isinstance(n.get("code.commit"), list) else [n.get("code.commit")]:
            commits.setdefault(commit or "not a git checkout", []).append(r.path.name)
    if len(commits) > 1:
        shared["code.commits"] = commits
    dirty = [r.path.name for r, n in zip(runs, notes) if n.get("code.dirty") is True or n.get("code.dirty") == [True]]
    if dirty and "code.dirty" not in shared:
        shared["code.dirty_runs"] = dirty
    test = {tokens_evaluated(r.evaluation) for r in runs if r.evaluation is not None}
    if len(test) == 1:
        shared["evaluation.test"] = test.pop()
    steps = {r.summary.get("total_steps") for r in runs} - {None}
    if len(steps) == 1:
        shared["total_steps"] = steps.pop()
    return shared


def check_margins(equivalence_margin: float | None, detect: float | None) -> None:
    """Refuse a margin or a difference to detect that is not a positive loss difference."""
    for flag, value in (("--equivalence-margin", equivalence_margin), ("--detect", detect)):
        if value is not None and not value > 0:
            raise UserError(f"{flag} {value} must be > 0 (a loss difference, e.g. 0.01)")
