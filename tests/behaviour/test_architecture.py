"""The package's shape: the folders are the architecture.

``gpt/`` holds one sub-package (a *wing*) per concern, in an order: a module imports only from
its own wing or the wings before it (``WINGS``, the README's Layout draws the same). Within a
wing, imports form no cycle; the commands import no other command; the config imports no
torch; the model's files that go to the Hub import nothing of the package; one module owns the
run directory's file names; functions stay short; the front doors are thin. Each rule is a
function of a package folder, so the tests below also show that it catches a breach, on small
packages they write.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from gpt.publish.layouts import SHIPPED as SHIPPED_FILES
from gpt.run.directory import CHARTS

PACKAGE = ROOT / "gpt"

# Lowest first: a wing may import its own modules and those of the wings before it.
WINGS = ["common", "config", "model", "data", "run", "evaluation", "training", "speed", "publish", "analysis",
         "sweep", "commands"]  # fmt: skip
TORCH_FREE = ["common", "config"]  # checked before anything heavy loads
# copied verbatim to the Hub, as their module names
SHIPPED = [".".join(path.relative_to(PACKAGE).with_suffix("").parts) for path in SHIPPED_FILES.values()]
SHARED_BY_COMMANDS = "commands.cli"  # the one module of commands/ that commands import
# The run directory's file names, spelled only by gpt.run.directory (and a checkpoint's own config copy)
RUN_DIR_FILES = {
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "wandb_id.txt",
    "checkpoints",
    "hub.json",
    ".hub-staging",
    *(chart.file for chart in CHARTS),  # loss.png, lr.png, grad_norm.png: the per-step charts, declared there
    "comparison.json",
    "eval-",
}
OWNERS = {"run.directory": RUN_DIR_FILES, "run.checkpoints": {"config.yaml"}}
MAX_FUNCTION_LINES = 60


def modules(package: Path) -> dict[str, Path]:
    """Dotted name (``run.directory``) -> file, for every module of ``package`` but hub_code/ (files for the Hub)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name and "hub_code" not in parts:
            out[name] = path
    return out


def imports(name: str, path: Path, top: str) -> set[str]:
    """Every module of package ``top`` that module ``name`` imports (relative imports resolved), at the
    top or inside a function; ``from top.x import y`` counts as ``x.y`` when that is a module."""
    found = set()
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
                module = ".".join(base)
            elif node.module and node.module.split(".")[0] == top:
                module = node.module.removeprefix(top).lstrip(".")
            else:
                continue
            found |= {f"{module}.{a.name}".lstrip(".") for a in node.names} | {module}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix(f"{top}.") for a in node.names if a.name.startswith(f"{top}.")}
    return found


def arrows(package: Path, top: str = "gpt") -> dict[str, set[str]]:
    """module -> the package's modules it imports (only names that are modules, or their packages)."""
    mods = modules(package)
    known = set(mods)
    return {
        name: {m for m in imports(name, path, top) if m in known and m != name and m != ""}
        for name, path in mods.items()
    }


def wing_of(name: str) -> str:
    return name.split(".")[0]


def against_the_order(package: Path, wings: list[str], top: str = "gpt") -> list[str]:
    rank = {w: i for i, w in enumerate(wings)}
    out = []
    for name, targets in arrows(package, top).items():
        if wing_of(name) not in rank:
            out.append(f"{name}: in no wing (place its folder in WINGS and the README's Layout)")
            continue
        out += [
            f"{name} imports {t}" for t in sorted(targets) if rank.get(wing_of(t), len(wings)) > rank[wing_of(name)]
        ]
    return out


def cycles(package: Path, top: str = "gpt") -> list[str]:
    graph, found = arrows(package, top), []

    def visit(node, path):
        for t in sorted(graph.get(node, ())):
            if t in path:
                found.append(" -> ".join(path[path.index(t) :] + [t]))
            elif len(path) < 12:
                visit(t, path + [t])

    for start in graph:
        visit(start, [start])
    return sorted(set(found))


def commands_importing_commands(package: Path, top: str = "gpt") -> list[str]:
    return [
        f"{name} imports {t}"
        for name, targets in arrows(package, top).items()
        if wing_of(name) == "commands"
        for t in sorted(targets)
        if wing_of(t) == "commands" and t not in ("commands", SHARED_BY_COMMANDS)
    ]


def torch_in(package: Path, wings: list[str], top: str = "gpt") -> list[str]:
    out = []
    for name, path in modules(package).items():
        if wing_of(name) in wings:
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                out += [f"{name} imports {n}" for n in names if n.split(".")[0] == "torch"]
    return out


def string_constants(path: Path) -> set[str]:
    """Every string literal in ``path`` but docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def names_spelled_outside_their_owner(package: Path) -> dict[str, set[str]]:
    spelled = {
        name: string_constants(path) & (RUN_DIR_FILES - OWNERS.get(name, set()))
        for name, path in modules(package).items()
    }
    return {name: found for name, found in spelled.items() if found}


# Every file gpt/ writes goes through gpt.common.files (whole or not at all); these are the writes that do not,
# each a stream a reader takes line by line, or a file that holds no result. (module:function -> why)
STREAMS = {
    "training.metrics:Metrics.__init__": "metrics.jsonl, one record appended per log step; a torn last line is "
    "dropped on reading (RunDir.metrics)",
    "speed.stages:_run": "a GPU-check stage's log, which its child process writes as it runs",
    "data.encode:_write_splits": "the split files, written into the temporary folder that prepare() renames "
    "into place whole (replacing_folder)",
    "run.lock:RunLock.__init__": "the lock file (flock) and a probe that proves the folder writable",
    "sweep.slurm:SweepFolder.record": "a SLURM sweep's events/<cell>.jsonl, one line appended per event of a job; "
    "a torn line is skipped on reading (SweepFolder.events)",
}
WRITER = "common.files"  # the one module that writes files by hand
GUARDS = ("replacing", "replacing_folder")  # inside `with replacing(...) as tmp:` a write goes to a temporary name
WRITE_CALLS = {
    "write_text",
    "write_bytes",
    "savefig",
    "tofile",
    "touch",
    "save_file",
    "save_model",
    "copyfile",
    "copy",
    "copy2",
    "copytree",
    "dump",
}  # fmt: skip  (a file opened for writing is caught at its open)
SAVERS = {"torch", "np", "numpy"}  # torch.save, np.save


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _writes(call: ast.Call) -> bool:
    """Whether ``call`` writes a file: a writing method or function, or an open for writing."""
    name, f = _call_name(call), call.func
    if name in WRITE_CALLS:
        return True
    if name in ("save", "savez") and isinstance(f, ast.Attribute) and ast.unparse(f.value) in SAVERS:
        return True
    if name == "open":
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) == "os":  # os.open(path, flags): flags that write
            return any(flag in ast.unparse(call) for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND"))
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        if isinstance(f, ast.Attribute) and call.args:  # path.open(mode)
            mode = call.args[0]
        return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
    return False


def unguarded_writes(package: Path) -> list[str]:
    """``module:function: call`` for every write in ``package`` that goes around gpt.common.files: not in that
    module, not inside a ``with replacing(...)`` block, and not one of the ``STREAMS``."""
    found = []
    for name, path in modules(package).items():
        if name != WRITER:
            _find_writes(ast.parse(path.read_text()), name, "", False, found)
    return found


def _find_writes(node: ast.AST, module: str, where: str, guarded: bool, found: list[str]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        where = f"{where}.{node.name}" if where else node.name
    if isinstance(node, (ast.With, ast.AsyncWith)) and any(
        isinstance(i.context_expr, ast.Call) and _call_name(i.context_expr) in GUARDS for i in node.items
    ):
        guarded = True
    if isinstance(node, ast.Call) and _writes(node) and not guarded and f"{module}:{where}" not in STREAMS:
        found.append(f"{module}:{where}: {ast.unparse(node)[:80]}")
    for child in ast.iter_child_nodes(node):
        _find_writes(child, module, where, guarded, found)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "gpt" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "gpt"


# ------------------------------------------------------------------ the package as it is


def test_every_module_is_in_a_wing_and_no_import_goes_against_the_order():
    assert sorted({wing_of(n) for n in modules(PACKAGE)}) == sorted(WINGS)
    assert against_the_order(PACKAGE, WINGS) == []


def test_no_cycles_between_modules():
    assert cycles(PACKAGE) == []


def test_commands_import_no_other_command():
    assert commands_importing_commands(PACKAGE) == []


def test_the_config_imports_no_torch_even_through_others():
    assert torch_in(PACKAGE, TORCH_FREE) == []
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, gpt.config; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loaded == "False"


def test_only_the_run_directory_spells_its_file_names():
    assert names_spelled_outside_their_owner(PACKAGE) == {}


def test_every_wing_says_what_it_owns_and_may_import():
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text())) or ""
        assert "May import:" in doc, f"gpt/{wing}/__init__.py: say what the wing owns and what it may import"


def test_every_file_is_written_whole_or_not_at_all():
    assert unguarded_writes(PACKAGE) == []
    assert all(":" in k and len(v) > 20 for k, v in STREAMS.items())  # each exception names its place and why


def test_no_long_functions():
    long = []
    for path in modules(PACKAGE).values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"gpt/{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines} lines")
    assert long == []


SUFFIXES = ("s", "er", "ing", "ion", "ison", "mark", "_data")  # what turned one name into another before


def look_alike(a: str, b: str) -> bool:
    """``b`` is ``a`` with a suffix (a final e of ``a`` may give way to it): trainer, evaluation, benchmark."""
    roots = {a, a[:-1]} if a.endswith("e") else {a}
    return any(b == root + suffix for root in roots for suffix in SUFFIXES)


def look_alikes(names) -> list[tuple[str, str]]:
    return [(a, b) for a in sorted(names) for b in sorted(names) if look_alike(a, b)]


def test_no_two_modules_differ_only_by_a_suffix():
    # (a wing may share a command's root: commands/train.py runs what training/ holds)
    assert look_alikes({n.split(".")[-1] for n in modules(PACKAGE) if "." in n}) == []
    # the pairs the flat package had are caught
    old = {
        "train",
        "trainer",
        "evaluate",
        "evaluation",
        "compare",
        "comparison",
        "bench",
        "benchmark",
        "prepare",
        "prepare_data",
        "summary",
        "stats",
    }
    assert look_alikes(old) == [
        ("bench", "benchmark"),
        ("compare", "comparison"),
        ("evaluate", "evaluation"),
        ("prepare", "prepare_data"),
        ("train", "trainer"),
    ]


MAX_COMMAND_LINES = 120  # a command reads its arguments and calls its wing; more is logic that belongs there


def long_commands(package: Path) -> list[str]:
    """Every module of ``package``'s commands/ over ``MAX_COMMAND_LINES`` lines (cli.py included)."""
    return [
        f"gpt/commands/{path.name}: {n} lines"
        for path in sorted((package / "commands").glob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_COMMAND_LINES
    ]


def test_commands_stay_thin():
    assert long_commands(PACKAGE) == []


def test_the_size_check_catches_a_long_command(tmp_path):
    body = "".join(f"x{i} = {i}\n" for i in range(MAX_COMMAND_LINES))
    pkg = write_package(
        tmp_path, {"commands/__init__.py": "", "commands/short.py": body, "commands/long.py": body + "y = 0\n"}
    )
    assert long_commands(pkg) == [f"gpt/commands/long.py: {MAX_COMMAND_LINES + 1} lines"]


FRONT_DOORS = [ROOT / "train.py", ROOT / "evaluate.py", *sorted((ROOT / "scripts").glob("*.py"))]


@pytest.mark.parametrize("path", FRONT_DOORS, ids=[str(p.relative_to(ROOT)) for p in FRONT_DOORS])
def test_front_doors_only_call_a_command(path):
    tree = ast.parse(path.read_text())
    found = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    from_gpt = [node for node in found if isinstance(node, ast.ImportFrom) and node.module.startswith("gpt")]
    assert [(node.module, [a.name for a in node.names]) for node in from_gpt] == [
        (f"gpt.commands.{path.stem}", ["main"])
    ], "a front door imports its command's main and nothing else"
    others = {a.name for node in found if node not in from_gpt for a in node.names}
    assert others <= {"sys", "Path"}
    assert "sys.path" not in path.read_text()


def test_the_hub_code_stands_alone():
    # what goes to the Hub must load where this package is not installed: the wrapper and the model's own files
    allowed = {"torch", "transformers", *sys.stdlib_module_names}
    shipped = {p.stem: p for p in (PACKAGE / "publish" / "hub_code").glob("*.py")}
    shipped |= {name.split(".")[-1]: modules(PACKAGE)[name] for name in SHIPPED}
    for stem, path in shipped.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, (stem, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom):
                ok = node.module.split(".")[0] in allowed if not node.level else node.module in shipped
                assert ok, (stem, ast.unparse(node))


def test_the_choices_a_config_names_are_the_implementations_registries():
    from gpt.config import NORM_PLACEMENTS, NORM_TYPES, PRECISIONS, QK_NORMS, SCHEDULES
    from gpt.config.architecture import choices
    from gpt.model import loss, norms
    from gpt.training import schedule

    assert NORM_TYPES == norms.NORM_TYPES and SCHEDULES == schedule.SCHEDULES and PRECISIONS == loss.PRECISIONS
    # the model's options have no second list: each is the spec's (every value builds: tests/model/test_options.py)
    assert choices("norm_placement") == NORM_PLACEMENTS and choices("qk_norm") == QK_NORMS


# ------------------------------------------------------------------ each rule catches its breach


def test_the_checks_catch_an_import_against_the_order_and_a_cycle(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "model/__init__.py": "",
            "data/__init__.py": "",
            "training/__init__.py": "",
            "model/gpt.py": "from gpt.training.loop import Trainer\n",  # the model reaching up to training
            "data/a.py": "from . import b\n",
            "data/b.py": "from gpt.data import a\n",  # a cycle
            "training/loop.py": "from gpt.data.a import x\n",  # downward: fine
        },
    )
    assert against_the_order(pkg, ["model", "data", "training"]) == ["model.gpt imports training.loop"]
    assert cycles(pkg) == ["data.a -> data.b -> data.a", "data.b -> data.a -> data.b"]
    unplaced = against_the_order(pkg, ["model", "data"])  # a new folder must be placed in the order
    assert "training.loop: in no wing (place its folder in WINGS and the README's Layout)" in unplaced


def test_the_checks_catch_a_command_importing_a_command(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "commands/__init__.py": "",
            "commands/cli.py": "",
            "commands/train.py": "from gpt.commands.cli import command\n",  # the shared helpers: fine
            "commands/sweep.py": "def main():\n    from gpt.commands import train\n",  # inside a function too
        },
    )
    assert commands_importing_commands(pkg) == ["commands.sweep imports commands.train"]


def test_the_checks_catch_torch_in_the_config(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "",
            "config/schema.py": "def names():\n    from torch.nn import LayerNorm\n",
        },
    )
    assert torch_in(pkg, ["config"]) == ["config.schema imports torch.nn"]


def test_the_checks_catch_a_run_directory_name_spelled_elsewhere(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "run/__init__.py": "",
            "publish/__init__.py": "",
            "run/directory.py": 'LOSS = "loss.png"\n',
            "publish/export.py": 'def chart(run):\n    """Reads loss.png."""\n    return run / "loss.png"\n',
        },
    )
    assert names_spelled_outside_their_owner(pkg) == {"publish.export": {"loss.png"}}


def test_the_checks_catch_a_write_that_bypasses_the_atomic_writer(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "analysis/__init__.py": "",
            "analysis/table.py": """\
                import json
                from gpt.common.files import replacing, write_atomically

                def save(out, result, fig):
                    write_atomically(out / "comparison.md", "...")  # through the writer: fine
                    with replacing(out / "chart.png") as tmp:  # into a temporary name: fine
                        fig.savefig(tmp)
                    (out / "comparison.json").write_text(json.dumps(result))  # in place: caught
                    with open(out / "runs.csv", "w") as f:  # caught
                        f.write("")
                    with open(out / "runs.csv") as f:  # reading: fine
                        f.read()
                    fig.savefig(out / "loss.png")  # caught

                class Sink:
                    def __init__(self, path):
                        self.file = open(path, "a")  # an append stream that is not declared: caught
            """,
        },
    )
    assert unguarded_writes(pkg) == [
        "analysis.table:save: (out / 'comparison.json').write_text(json.dumps(result))",
        "analysis.table:save: open(out / 'runs.csv', 'w')",
        "analysis.table:save: fig.savefig(out / 'loss.png')",
        "analysis.table:Sink.__init__: open(path, 'a')",
    ]


def test_the_tests_are_laid_out_like_the_package():
    # a change's tests sit where its code does: tests/<wing>/, the cross-cutting suites in tests/behaviour/,
    # and what measures the suite itself (coverage, mutations) in tests/quality/
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("__pycache__", "fixtures")}
    assert folders <= {*WINGS, "behaviour", "quality"}, (
        f"test folders that are not wings: {sorted(folders - {*WINGS, 'behaviour', 'quality'})}"
    )
    assert sorted(p.name for p in tests.glob("test_*.py")) == [], "a test file belongs in its wing's folder"
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name (pytest imports them by name)"
