"""The package's shape: layers import only downward, functions stay short, one module owns the run
directory's file names, and the front doors are thin."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "gpt"

# Lowest first. A module may import only modules of a lower layer (the README's Layout section
# draws the same map). A new module must be placed here: the test names it until it is.
LAYERS = [
    ["errors", "norms", "schedule", "loss", "plots", "monitors", "stats", "rng", "fastpath", "speed", "bounded",
     "stages"],  # nothing from gpt/ but errors
    ["config.schema", "tokenizer", "distributed", "data", "sources", "report"],
    ["config.loader"],
    ["config"],
    ["model", "checkpoint", "optimizer", "prepare", "scoring", "cli", "card"],
    ["hf", "summary", "rundir", "fingerprint"],
    ["metrics", "hub"],
    ["trainer", "evaluation", "comparison"],  # siblings: none of them imports another
    ["grid", "benchmark"],
    ["train", "evaluate", "compare", "sweep", "prepare_data", "demo", "bench", "push_to_hub", "generate",
     "gpu_check"],  # the commands
]
RUN_DIR_FILES = {"config.yaml", "metrics.jsonl", "summary.json", "wandb_id.txt", "checkpoints", "hub.json",
                 ".hub-staging"}
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name and parts[0] != "hub_code":  # __init__.py: only the docstring; hub_code/: files for the Hub
            out[name] = path
    return out


def gpt_imports(path: Path) -> set[str]:
    """Every gpt module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gpt":
            if node.module == "gpt":
                found |= {a.name for a in node.names}
            else:
                found.add(node.module.removeprefix("gpt."))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("gpt.") for a in node.names if a.name.startswith("gpt.")}
    return found


def test_every_module_has_a_layer():
    placed = [m for layer in LAYERS for m in layer]
    assert len(placed) == len(set(placed))
    assert sorted(placed) == sorted(modules()), "place new modules in LAYERS (and the README's Layout)"


@pytest.mark.parametrize("name", sorted(modules()))
def test_imports_go_only_downward(name):
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    path = modules()[name]
    upward = sorted(m for m in gpt_imports(path) if rank.get(m, len(LAYERS)) >= rank[name])
    assert upward == [], f"gpt.{name} (layer {rank[name]}) imports {upward} from its own layer or above"


def test_no_long_functions():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"gpt/{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines} lines")
    assert long == []


def string_constants(path: Path) -> set[str]:
    """Every string literal in ``path`` but docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_only_rundir_spells_the_run_directory_files():
    allowed = {"rundir": RUN_DIR_FILES, "checkpoint": {"config.yaml"}}  # a checkpoint's own copy of the config
    spelled = {name: string_constants(path) & (RUN_DIR_FILES - allowed.get(name, set()))
               for name, path in modules().items()}
    assert {name: found for name, found in spelled.items() if found} == {}


FRONT_DOORS = [ROOT / "train.py", ROOT / "evaluate.py", *sorted((ROOT / "scripts").glob("*.py"))]


@pytest.mark.parametrize("path", FRONT_DOORS, ids=[str(p.relative_to(ROOT)) for p in FRONT_DOORS])
def test_front_doors_only_call_a_command(path):
    tree = ast.parse(path.read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    from_gpt = [node for node in imports if isinstance(node, ast.ImportFrom) and node.module.startswith("gpt")]
    assert [(node.module, [a.name for a in node.names]) for node in from_gpt] == [
        (f"gpt.{path.stem}", ["main"])], "a front door imports its command's main and nothing else from gpt"
    others = {a.name for node in imports if node not in from_gpt for a in node.names}
    assert others <= {"sys", "Path"}
    assert "sys.path" not in path.read_text()


def test_the_hub_code_stands_alone():
    # the modelling code shipped to the Hub must load where this package is not installed
    for path in sorted((PACKAGE / "hub_code").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." + node.module if node.level else node.module.split(".")[0])
        assert imported <= {"torch", "transformers", ".norms", ".configuration_gpt_norm"}, (path.name, imported)
    norms_imports = {node.module or "" for node in ast.walk(ast.parse((PACKAGE / "norms.py").read_text()))
                     if isinstance(node, ast.ImportFrom)}
    assert not any(m.startswith("gpt") for m in norms_imports)  # shipped verbatim as norms.py
