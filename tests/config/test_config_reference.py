"""docs/configuration.md is generated from the schema and kept current: every field, its default and bounds."""

import dataclasses
import subprocess
import sys
import typing

from conftest import ROOT

from gpt.config import Config, ModelConfig
from gpt.config.reference import COMMAND, markdown

PAGE = ROOT / "docs" / "configuration.md"


def test_the_configuration_page_is_current():
    assert PAGE.read_text() == markdown(), f"docs/configuration.md is stale; regenerate it: .venv/bin/{COMMAND}"


def test_every_field_of_every_section_has_one_row():
    text = markdown()
    keys = [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(typing.get_type_hints(Config)[section.name])
    ]
    rows = [line.split(" | ")[0].strip("|` ") for line in text.splitlines() if line.startswith("| `")]
    assert rows == keys
    assert [line[4:-1] for line in text.splitlines() if line.startswith("## `")] == [
        f.name for f in dataclasses.fields(Config)
    ]


def test_rows_state_type_default_bounds_choices_and_doc():
    text = markdown()
    assert "| `model.dropout` | a number | `0.0` | >= 0, < 1 | dropout on embeddings," in text
    assert "| `run.name` | a string | required |  | name of the run;" in text
    assert "| `train.steps` | an integer or null | `null` | >= 1 | train for this many optimizer steps |" in text
    assert "| `log.tags` | a list of a string | `[]` |  |" in text
    norm = next(f for f in dataclasses.fields(ModelConfig) if f.name == "norm_type")
    assert "| one of " + ", ".join(f"`{c}`" for c in norm.metadata["choices"]) + " |" in text
    assert "&lt;split>" in text and "<split>" not in text  # read as text, not as an HTML tag


def test_the_command_prints_the_page():
    out = subprocess.run(
        [sys.executable, "-m", "gpt.config.reference"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout == markdown()
    assert out.stdout.startswith(f"<!-- Generated from gpt/config/schema.py by `{COMMAND}`")
