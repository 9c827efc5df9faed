"""What the README and docs/ tell a user: every page reachable from the README and every link resolving,
every command they show parsing (and the files it names existing), the paths they name existing, CI
running the README's commands, and the numbers they state computed again."""

import argparse
import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import CONFIGS, ROOT
from recipes import created, without_recipes

from gpt.config import NORM_TYPES, load_config

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LIMIT = 250  # lines: a newcomer reads it in five minutes; the rest lives in docs/

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FRONT_DOOR = re.compile(r"^(train|evaluate|scripts/\w+)\.py$")
TOOLS = {"tests/quality/measure.py": "quality.measure"}  # the suite's own tools a docs page runs: parsed by their main
PATH = re.compile(r"(?<![\w/.-])((?:gpt|scripts|configs|tests|docs)/[\w./<>*-]*[\w>*])")
# Programs a docs command may run whose arguments no parser of ours checks: each named here on purpose.
UNPARSED = {".venv/bin/ruff", "pip"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def flat(page: Path) -> str:
    """The page's text with every run of whitespace one space: a number's sentence may wrap anywhere."""
    return " ".join(page.read_text().split())


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped, ``&&`` chains split,
    a redirection cut off."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            head = words[: words.index("&&")] if "&&" in words else words
            out.append(head[: head.index(">")] if ">" in head else head)
            words = words[len(head) + 1 :]
    return [c for c in out if c]


def block_after(heading: str, page: Path = README) -> list[list[str]]:
    text = page.read_text()
    return commands(bash_blocks(text[text.index(heading) :])[0])


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.M)}


class Parsed(BaseException):
    """Raised by the patched ``parse_args``: the command's arguments parsed, nothing run."""

    def __init__(self, parsed: argparse.Namespace):
        super().__init__()
        self.parsed = parsed


def parse(module: str, argv: list[str], monkeypatch) -> argparse.Namespace:
    """``argv`` parsed by command ``module``'s own ``main`` (a module of ``gpt.commands``, or a full name),
    stopped right after parsing."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    main = importlib.import_module(module if "." in module else f"gpt.commands.{module}").main
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        try:
            main(argv)
        except Parsed as parsed:
            return parsed.parsed
        except SystemExit as e:
            pytest.fail(f"gpt.commands.{module} refuses {shlex.join(argv)} (exit status {e.code})")
    pytest.fail(f"gpt.commands.{module} ran {shlex.join(argv)} without parsing arguments")


def check_command(words: list[str], monkeypatch) -> argparse.Namespace | None:
    """Check one command as a user would type it; the parsed arguments when one of our commands parses them."""
    for word in words:
        if word.startswith("configs/"):
            assert (ROOT / word).is_file(), f"{shlex.join(words)}: no {word}"
    program = words[0]
    tool = next((w for w in words if w in TOOLS), None)
    if Path(program).name == "python" and tool is not None:
        return parse(TOOLS[tool], words[words.index(tool) + 1 :], monkeypatch)
    if program in ("bash", "sbatch"):
        assert (ROOT / words[1]).is_file(), f"{shlex.join(words)}: no {words[1]}"
        return None
    if program in UNPARSED:
        return None
    assert Path(program).name in ("python", "torchrun"), f"{shlex.join(words)}: a program no test checks"
    if "-m" in words:
        module = words[words.index("-m") + 1]
        if module == "pytest":
            return None
        assert importlib.util.find_spec(module) is not None, f"{shlex.join(words)}: no module {module}"
        if not module.startswith("gpt.commands."):
            return None
        return parse(module.removeprefix("gpt.commands."), words[words.index(module) + 1 :], monkeypatch)
    script = next((w for w in words if FRONT_DOOR.match(w)), None)
    assert script is not None, f"{shlex.join(words)}: names no front door"
    assert (ROOT / script).is_file(), f"{shlex.join(words)}: no {script}"
    return parse(Path(script).stem, words[words.index(script) + 1 :], monkeypatch)


# --------------------------------------------------------------------------- pages and links


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_LIMIT, f"README.md has {lines} lines; keep it under {README_LIMIT}, details go to docs/"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    missing = [rel(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"pages the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_path_named_exists(page):
    named = {p.rstrip(".") for p in PATH.findall(page.read_text()) if "<" not in p and "*" not in p}
    missing = sorted(p for p in named - created(page) if not (ROOT / p).exists())  # a recipe's new file: test_recipes
    assert missing == [], f"{rel(page)} names paths that are not in the repository: {missing}"


def test_the_map_names_modules_that_exist():
    """Each row of docs/architecture.md's map: its wing folder, and every module it names in that folder."""
    missing, wing = [], None
    for cells in table((DOCS / "architecture.md").read_text(), "## The wings", keep_first=True):
        wing = cells[0] or wing
        missing += [
            f"gpt/{wing}{m}" for m in re.findall(r"`([\w.]+\.py)`", cells[1]) if not (ROOT / "gpt" / wing / m).is_file()
        ]
    assert missing == [], f"docs/architecture.md maps modules that are not in the package: {missing}"


def test_the_map_names_every_module():
    """A module added to a wing (or split out of one) has its row in docs/architecture.md's map."""
    named, wing = set(), None
    for cells in table((DOCS / "architecture.md").read_text(), "## The wings", keep_first=True):
        wing = cells[0] or wing
        named |= {f"{wing}{m}" for m in re.findall(r"`([\w.]+\.py)`", cells[1])}
    modules = {
        str(p.relative_to(ROOT / "gpt"))
        for p in (ROOT / "gpt").glob("*/*.py")
        if p.name != "__init__.py" and p.parent.name != "hub_code"
    }
    unnamed = sorted(m for m in modules if m not in named and not m.startswith("commands/"))
    assert unnamed == [], f"docs/architecture.md, '## The wings': add a row for each of {unnamed}"


def test_the_metrics_list_names_every_key_a_run_logs(tiny_run):
    """docs/training.md says what a metrics.jsonl line holds: every key a run writes is named there."""
    text = (DOCS / "training.md").read_text()
    listed = text[text.index("`metrics.jsonl` (rank 0") : text.index("`stats.jsonl`")]
    keys = {k for line in (tiny_run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    unnamed = sorted(k for k in keys if not re.search(rf"\b{k}\b", listed))
    assert unnamed == [], f"docs/training.md, '## The run directory': name {unnamed} in metrics.jsonl's list"


# --------------------------------------------------------------------------- commands


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_command_parses(page, monkeypatch):
    shown = [c for block in bash_blocks(without_recipes(page.read_text())) for c in commands(block)]  # run for real
    for words in shown:
        check_command(words, monkeypatch)


def test_ci_runs_the_readme_test_command_and_then_the_slow_tests():
    test_command = next(c for c in block_after("## On any machine") if "pytest" in c)
    pytest_args = test_command[test_command.index("pytest") + 1 :]
    assert pytest_args == ["-m", "not slow", "-n", "2"]  # both cores (pytest-xdist): the budget's 2
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [shlex.split(line) for line in ci if "-m pytest" in line]
    runs = [words[words.index(".venv/bin/python") :] for words in runs]  # each after `step NAME`: it times it
    assert runs == [  # the slow tier in two parts that together are all of it, and nothing run twice
        [".venv/bin/python", "-m", "pytest", *pytest_args],
        [".venv/bin/python", "-m", "pytest", "-m", "slow and not serial", "-n", "2", "--dist", "loadgroup"],
        [".venv/bin/python", "-m", "pytest", "-m", "slow and serial"],
    ]
    steps = [line.split('" ', 1)[-1] for line in ci if line.startswith("step ")]  # the command each step runs
    assert 'export PYTEST_ADDOPTS="--durations=15"' in ci and "bash scripts/setup.sh --full" in steps
    lint = [shlex.join(c) for block in bash_blocks(README.read_text()) for c in commands(block) if "ruff" in c[0]]
    assert lint == [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."] and all(c in steps for c in lint)


def test_the_vm_quickstart_is_five_commands_that_parse(monkeypatch):
    steps = block_after("## From a fresh 8-GPU VM")
    assert len(steps) == 5
    assert steps[0] == ["bash", "setup_cloud.sh", "--data", "fineweb"] and (ROOT / "setup_cloud.sh").is_file()
    parsed = {next(w for w in c if w.startswith("scripts/")): check_command(c, monkeypatch) for c in steps[1:]}
    assert list(parsed) == ["scripts/bench.py", "scripts/sweep.py", "scripts/compare.py", "scripts/publish_sweep.py"]
    assert steps[1][:2] == [".venv/bin/torchrun", "--nproc_per_node=8"] and parsed["scripts/sweep.py"].nproc == 8
    assert parsed["scripts/bench.py"].norm_types == parsed["scripts/sweep.py"].norm_types
    assert len(parsed["scripts/sweep.py"].norm_types) * len(parsed["scripts/sweep.py"].seeds) == 12
    # the comparison is the one folder publish_sweep finds beside the runs
    assert str(parsed["scripts/compare.py"].out) == "runs/gpt2-small-comparison"


def test_the_cell_by_hand_is_the_sweeps_own_cell(monkeypatch):
    from gpt.sweep.cells import lay_out

    train, evaluate = block_after("One cell by hand")
    args = check_command(train, monkeypatch)
    sweep = check_command(block_after("## From a fresh 8-GPU VM")[2], monkeypatch)
    cfg = load_config(args.config, args.overrides)
    cell = next(c for c in lay_out(sweep.config, sweep.norm_types, sweep.seeds, Path("runs")) if c.name == cfg.run.name)
    assert cell.cfg.model == cfg.model and cell.cfg.train == cfg.train and cell.cfg.run_dir == cfg.run_dir
    assert check_command(evaluate, monkeypatch).paths == [str(cfg.run_dir)]


# --------------------------------------------------------------------------- numbers


@pytest.fixture(scope="module")
def gpt2_small():
    """GPT-2 small's shapes, on the meta device: what is counted here reads no weight, and drawing 163M takes
    seconds."""
    import torch

    from gpt.model.gpt import GPT

    cfg = load_config(CONFIGS / "gpt2-small.yaml")
    with torch.device("meta"):
        return cfg, GPT(cfg.model, seed=None)


def test_the_cost_table_is_the_benchmark_formula(gpt2_small):
    from gpt.speed.mfu import train_hours

    text = flat(README)
    cfg, model = gpt2_small
    steps = cfg.total_steps(model.num_params(norms=False))
    tokens, flops = steps * cfg.tokens_per_step, model.flops_per_token()
    assert f"A run is {steps:,} steps of {cfg.tokens_per_step:,} tokens ({tokens:,} tokens)" in text
    assert f"{flops:,} model FLOPs per token" in text
    per_gpu_hour = 40 / (8 * 2.5)  # the write-up's $40 for 8 GPUs x 2.5 h
    assert f"priced at ${per_gpu_hour:.2f} per GPU-hour" in text
    write_up = train_hours(tokens, flops, 312.0, 8, 1.0) / 2.5  # the MFU its 2h30m on 8 A100s implies
    rows = re.findall(
        r"^\| (\d+(?:\.\d+)?)%.*?\| ([\d.]+) \| \$(\d+) \| ([\d.]+) h, \$(\d+) \|$", README.read_text(), re.M
    )
    assert [float(r[0]) for r in rows] == [round(100 * write_up, 1), 30, 40]
    for (_, hours, cost, hours_12, cost_12), mfu in zip(rows, (write_up, 0.30, 0.40)):
        h = train_hours(tokens, flops, 312.0, 8, mfu)
        assert (hours, cost, hours_12, cost_12) == (
            f"{h:.2f}",
            f"{h * 8 * per_gpu_hour:.0f}",
            f"{12 * h:.1f}",
            f"{12 * h * 8 * per_gpu_hour:.0f}",
        )
    assert train_hours(tokens, flops, 989.4, 8, 0.4) == pytest.approx(
        train_hours(tokens, flops, 312.0, 8, 0.4) / 3, rel=0.06
    )


def test_the_model_and_speed_pages_count_gpt2_small(gpt2_small):
    cfg, model = gpt2_small
    text = flat(DOCS / "model.md")
    assert f"{model.num_params():,} parameters" in text
    assert f"20 x {model.num_params(norms=False):,} = 3.26B tokens" in text
    m = cfg.model
    attention = 12 * m.n_layers * m.context_length * m.d_model
    flops = model.flops_per_token()
    assert f"6 x {(flops - attention) // 6:,} + {attention:,} = {flops:,}" in flat(DOCS / "speed.md")


def table(text: str, heading: str, keep_first: bool = False):
    """The rows of the first table after ``heading``, by their first cell (its backticks dropped); or,
    ``keep_first``, the list of rows, each a list of cells."""
    text = text[text.index(heading) :]
    rows = re.findall(r"^\|(.*)\|$", text[text.index("\n|") :].split("\n\n")[0], re.M)
    cells = [[c.strip() for c in row.split("|")] for row in rows[2:]]
    for row in cells:
        row[0] = row[0].strip("`")
    return cells if keep_first else {c[0]: c[1:] for c in cells}


def test_the_result_table_quotes_the_write_up():
    ours = table(README.read_text(), "## The result so far")
    write_up = table((DOCS / "reference.md").read_text(), "## The results to compare against")
    assert list(ours) == list(write_up)
    for norm, (loss, *_rest) in ours.items():
        if re.fullmatch(r"\d\.\d+", loss):
            assert loss == write_up[norm][0], norm
    text = flat(README)
    losses = {n: float(write_up[n][0]) for n in ("handrolled_layernorm", "pytorch_layernorm")}
    rms = {n: float(write_up[n][0]) for n in ("handrolled_rmsnorm", "pytorch_rmsnorm")}
    gaps = sorted(round(a - b, 3) for a, b in (losses.values(), rms.values()))
    assert f"ended {gaps[0]}-{gaps[1]} lower in test loss" in text


def test_the_norm_table_names_every_norm_type_and_no_other():
    """A norm type registered in gpt/model/norms.py has its row in the README's table (in the registry's order)."""
    named = table(README.read_text(), "## The norm types")
    missing = [t for t in NORM_TYPES if t not in named]
    assert not missing, f"README.md, '## The norm types': add a row for each of {missing}"
    assert list(named) == list(NORM_TYPES), "README.md's norm table: one row per registered norm type, in its order"


def test_the_commands_table_is_the_packages():
    """Each row: its front door calls the command module its console script names (pyproject.toml)."""
    pyproject = (ROOT / "pyproject.toml").read_text()  # read by hand: tomllib needs Python 3.11, we support 3.10
    section = pyproject[pyproject.index("[project.scripts]") :].split("\n\n")[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', section, re.M))
    rows = table(README.read_text(), "## The commands", keep_first=True)
    named = {cells[2].strip("`"): cells[1].strip("`") for cells in rows if cells[2]}
    assert set(named) == set(scripts)
    for script, front_door in named.items():
        assert scripts[script] == f"gpt.commands.{Path(front_door).stem}:main", script
    for cells in rows:
        assert (ROOT / cells[1].strip("`")).is_file(), cells[1]
