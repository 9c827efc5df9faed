"""The groups of a comparison and its baseline: runs grouped by norm type (and the --vary keys) in the
write-up's order, the baseline named or chosen by rule (never an accident of order), and, with a learning rate
chosen on validation (``gpt.analysis.selection``), the chosen rates' groups."""

from __future__ import annotations

import dataclasses

from gpt.analysis.comparable import compared_keys, named
from gpt.analysis.runs import AXIS, Group, Run
from gpt.analysis.selection import LR_KEY, optimism, select_rates
from gpt.common.errors import UserError
from gpt.config import DEFAULT_BASELINE, NORM_TYPES, Config, norm_order


def group_runs(runs: list[Run], vary: list[str] = ()) -> list[Group]:
    """Groups by norm type and the --vary keys, in the write-up's order of norm types."""
    groups: dict[str, Group] = {}
    varied = [k for k in compared_keys(runs) if named(k, vary)]
    for r in runs:
        values = {AXIS: r.config[AXIS], **{k: r.view.get(k) for k in varied}}
        label = ", ".join([str(r.config[AXIS]), *(f"{k}={v}" for k, v in values.items() if k != AXIS)])
        groups.setdefault(label, Group(label, values)).runs.append(r)
    for g in groups.values():
        seeds = [r.seed for r in g.runs]
        if len(seeds) != len(set(seeds)):
            raise UserError(
                f"group {g.label!r} has two runs with the same seed and config: "
                + ", ".join(str(r.path) for r in g.runs)
            )

    return sorted(groups.values(), key=lambda g: (norm_order(g.values[AXIS]), g.label))


def choose_baseline(groups: list[Group], baseline: str | None) -> tuple[str, str]:
    """The baseline group's label and why it is the baseline: named by --baseline, else handrolled_layernorm,
    else the first norm type in the write-up's order when one group has it; never an accident of order."""
    labels = [g.label for g in groups]
    if baseline is not None:
        if baseline not in labels:
            raise UserError(f"--baseline {baseline!r} is not a group; groups: {', '.join(labels)}")
        return baseline, "--baseline"
    if DEFAULT_BASELINE in labels:
        return DEFAULT_BASELINE, f"the default, {DEFAULT_BASELINE}, the write-up's baseline"
    plain = [g for g in groups if g.values[AXIS] == DEFAULT_BASELINE and all(map(_is_default, g.values.items()))]
    if len(plain) == 1:  # the write-up's model, where every --vary key is at its default: pre-norm, ...
        return plain[0].label, f"the default, {DEFAULT_BASELINE} with every --vary model key at its default"
    first = [g for g in groups if g.values[AXIS] == groups[0].values[AXIS]]
    plain = [g for g in first if all(map(_is_default, g.values.items()))]
    if len(first) > 1 and len(plain) == 1:  # no hand-rolled LayerNorm: the first norm type, the rest at default
        return plain[0].label, "the first norm type in the write-up's order, every --vary key at its default"
    if len(first) > 1:
        raise UserError(
            f"no default baseline among groups that differ in more than the norm: give --baseline, "
            f"one of: {', '.join(labels)}"
        )
    return labels[0], (
        f"the first norm type of these runs in the write-up's order ({', '.join(NORM_TYPES)}); --baseline names another"
    )


def _is_default(item: tuple[str, object]) -> bool:
    """Whether a group's value of key ``model.name`` is the model's default (the axis itself counts as one): the
    write-up's architecture, or a training setting's named choice (optim.name adamw). A number varied (optim.lr) has no
    such default: its baseline is named."""
    key, value = item
    if key == AXIS:
        return True
    field = _field(key)
    chosen = field is not None and field.metadata.get("choices") is not None  # a named choice: optim.name adamw
    return (key.startswith("model.") or chosen) and config_default(key) == value


def _field(key: str) -> dataclasses.Field | None:
    section, _, name = key.partition(".")
    kind = next((f.default_factory for f in dataclasses.fields(Config) if f.name == section), None)
    return next((f for f in dataclasses.fields(kind) if f.name == name), None) if isinstance(kind, type) else None


def config_default(key: str):
    """The default of config key ``section.name`` (``dataclasses.MISSING`` for a key with none: a fingerprint's)."""
    field = _field(key)
    return dataclasses.MISSING if field is None else field.default


def choose_selected(groups: list[Group], selection: dict, baseline: str | None) -> tuple[list[Group], str, str]:
    """The group of each norm type's rate chosen on validation (``gpt.analysis.selection``), the baseline among
    them and why: ``baseline`` names a norm type (compared at its chosen rate) or a chosen group; by default
    ``choose_baseline``'s rule over the norm types."""
    chosen = {f["family"]: f["chosen"] for f in selection["families"] if f["chosen"] is not None}
    by_label = {g.label: g for g in groups}
    compared = [by_label[label] for label in chosen.values()]
    if not compared:
        raise UserError(
            "--select-on val: no learning rate of any norm type has every run completed with a validation loss: "
            + "; ".join(f"{rate['group']}: {rate['reason']}" for f in selection["families"] for rate in f["rates"])
        )
    if baseline in chosen.values():
        return compared, baseline, "--baseline"
    if baseline is not None and baseline not in chosen:
        raise UserError(
            f"--baseline {baseline!r}: with --select-on val name a norm type, compared at its learning rate chosen "
            f"on validation; one of: {', '.join(chosen)}"
        )
    families = [
        Group(name, {k: v for k, v in by_label[label].values.items() if k != LR_KEY}) for name, label in chosen.items()
    ]
    name, why = choose_baseline(families, baseline)
    return compared, chosen[name], why if baseline is not None else f"{why}, at its learning rate chosen on validation"


def compared_groups(
    groups: list[Group], baseline: str | None, select_on: str | None
) -> tuple[list[Group], str, str, dict | None]:
    """The groups whose test losses are compared, the baseline's label, why it is the baseline, and the selection
    of learning rates made on ``select_on`` (None: every group, no selection)."""
    if select_on is None:
        return (groups, *choose_baseline(groups, baseline), None)
    selection = select_rates(groups, AXIS)
    selection["optimism"] = optimism(selection, groups)  # the chosen rates' test losses share the choice's runs
    return (*choose_selected(groups, selection, baseline), selection)
