"""docs/extending.md's recipes as steps a test can perform: each step is a code block under a comment that says
where it goes (``<!-- recipe NAME: PATH, WHERE -->``; WHERE is "as a new file", "at its end", or "before / after /
replacing the line `X`") or a block of commands (``<!-- recipe NAME: run -->``). tests/behaviour/test_recipes.py
performs them; tests/behaviour/test_readme.py leaves their files and commands to it."""

import re
from dataclasses import dataclass
from pathlib import Path

# the directive, then (for a fragment ruff must not format as a module of its own) <!-- fmt: off -->, then the block
STEP = re.compile(r"^<!-- recipe (\w+): (.+?) -->\n(?:<!-- fmt: off -->\n)?```\w*\n(.*?)^```$", re.M | re.S)
WHERE = re.compile(r"(before|after|replacing) the line `(.+)`")


@dataclass(frozen=True)
class Step:
    recipe: str
    where: str  # "run", or "PATH, WHERE": "as a new file", "at its end", "before / after / replacing the line `X`"
    body: str

    @property
    def path(self) -> str:
        return self.where.partition(", ")[0]

    def __str__(self) -> str:
        return f"recipe {self.recipe}: {self.where}"


def recipe_steps(page: Path) -> list[Step]:
    return [Step(*m.groups()) for m in STEP.finditer(page.read_text())]


def anchored(step: Step, lines: list[str]) -> int:
    """The index of the one line of ``lines`` that holds ``step``'s anchor."""
    kind, anchor = WHERE.fullmatch(step.where.partition(", ")[2]).groups()
    hits = [i for i, line in enumerate(lines) if anchor in line]
    assert len(hits) == 1, f"{step}: the anchor is on {len(hits)} lines of {step.path}, not one"
    return hits[0]


def perform(step: Step, root: Path) -> None:
    """Make ``step``'s edit in the package at ``root``, as the page says."""
    file, how = root / step.path, step.where.partition(", ")[2]
    if how == "as a new file":
        assert not file.exists(), f"{step}: {step.path} exists already"
        file.write_text(step.body)
        return
    text = file.read_text()
    if how == "at its end":
        file.write_text(text + step.body)
        return
    lines = text.splitlines(keepends=True)
    at = anchored(step, lines)
    kind = WHERE.fullmatch(how).group(1)
    body = step.body.splitlines(keepends=True)
    lines[at : at + 1] = {"before": body + lines[at : at + 1], "after": lines[at : at + 1] + body, "replacing": body}[
        kind
    ]
    file.write_text("".join(lines))


def without_recipes(text: str) -> str:
    """A page's text with its recipe steps cut out (what they name and run does not exist before they are done)."""
    return STEP.sub("", text)


def created(page: Path) -> set[str]:
    """The files the page's recipes create."""
    return {s.path for s in recipe_steps(page) if s.where.endswith(", as a new file")}
