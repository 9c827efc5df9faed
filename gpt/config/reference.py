"""The config reference as Markdown, generated from the schema: ``docs/configuration.md``.

    python -m gpt.config.reference > docs/configuration.md

Every section and field of ``gpt.config.schema`` with its type, default, allowed values and the
doc its ``opt(...)`` carries, so the page cannot drift from the code (tests/config/test_config_reference.py
fails, naming the command above, when the file is stale).
"""

from __future__ import annotations

import dataclasses
import re
import typing

from gpt.config.loader import _type_name, _yaml_value
from gpt.config.schema import REQUIRED, RESUMABLE, Config

COMMAND = "python -m gpt.config.reference > docs/configuration.md"

INTRO = f"""\
<!-- Generated from gpt/config/schema.py by `{COMMAND}`; do not edit by hand. -->
# Configuration reference

A run is one YAML file in `configs/`, a mapping of the sections below. `extends: other.yaml`
(relative to the file) inherits another file and deep-merges this one over it; `--set
section.key=value` overrides one value from the command line (repeatable, values are YAML
scalars). `python train.py CONFIG --print-config` prints the resolved config (it loads back to
an equal one); `python train.py --help-config` prints every key with its default as YAML.
A mistake (an unknown key, a wrong type, a value out of range, a rule between keys) stops
before anything is built, in one line naming the file or `--set`, the key and what is allowed.
Required: `run.name`, and one of `train.tokens`, `train.steps`, `train.tokens_per_param`.
"""

_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _allowed(meta: dict) -> str:
    """The field's constraints in words: its choices, or its bounds."""
    if meta["choices"]:
        return "one of " + ", ".join(f"`{c}`" for c in meta["choices"])
    return ", ".join(f"{word} {meta[op]:g}" for op, word in _BOUNDS if meta[op] is not None)


def _cell(text: str) -> str:
    """``text`` safe in a table cell: no column break, no ``<split>`` read as an HTML tag."""
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text.replace("|", "\\|"))


def _section(name: str, cls: type) -> list[str]:
    """One section's heading, its doc and a table row per field."""
    hints = typing.get_type_hints(cls)
    lines = [f"## `{name}`", "", cls.__doc__.strip(), ""]
    lines += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = "required" if default is REQUIRED else f"`{_yaml_value(default)}`"
        row = (f"`{name}.{f.name}`", _type_name(hints[f.name]), shown, _allowed(f.metadata), f.metadata["doc"])
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines + [""]


def markdown() -> str:
    """The whole page: the introduction, one table per section, then what a resume may change."""
    lines = [INTRO]
    for section in dataclasses.fields(Config):
        lines += _section(section.name, typing.get_type_hints(Config)[section.name])
    lines += [
        "## What a resumed run may change",
        "",
        "A resume compares the whole resolved config with the checkpoint's and refuses any difference "
        "outside these keys (a trailing `.` means the whole section); each names how a run is stored, "
        "logged or executed, never what it computes:",
        "",
        ", ".join(f"`{key}`" for key in RESUMABLE) + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
