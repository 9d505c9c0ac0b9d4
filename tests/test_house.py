"""The house rules (README, "Where things are"), checked on the source: every module opens with a docstring that says
what it is for, no function runs over 80 lines, no file over 800; the method's top level stays small (at most 12
files, 5,300 lines and 300,000 characters, at most 15% of its lines over 100 columns, none over 700 lines but
train.py, rollout.py within 450); N-GRPO's rule reads in one file of at most 80 lines and policy_loss in 55; no two
modules import each other (directly or round a longer circle, counting imports made inside functions), nor do two
floors (the top level's modules each, and each package one folder down: nothing imports upward), and no function
imports a module of the project (the layering shows in each file's head; optional packages are imported where
chosen)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "engine", "runtime", "grading", "research", "benchmarks")
TOP_LEVEL = sorted(ROOT.glob("*.py"))
SOURCES = sorted([*TOP_LEVEL, *(path for package in PACKAGES for path in ROOT.glob(f"{package}/*.py"))])
PROJECT = {path.stem for path in TOP_LEVEL} | set(PACKAGES)
MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 800
MAX_TOP_LEVEL_FILES, MAX_TOP_LEVEL_LINES, MAX_TOP_LEVEL_CHARS, MAX_METHOD_FILE_LINES = 12, 5300, 300_000, 700
MAX_WIDE_SHARE = 0.15  # of the top level's lines over 100 columns: read by characters, not only lines
LONGER = {"train.py": 760, "rollout.py": 450}  # the CLI with its step loop may run longer; the sampler shorter


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_opens_with_a_docstring_and_keeps_its_functions_short(path):
    text = path.read_text()
    tree = ast.parse(text)
    assert ast.get_docstring(tree), f"{path.name}: no module docstring"
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: over {MAX_FILE_LINES} lines"
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_method_at_the_top_stays_small():
    texts = {path.name: path.read_text() for path in TOP_LEVEL}
    lines = {name: len(text.splitlines()) for name, text in texts.items()}
    assert len(lines) <= MAX_TOP_LEVEL_FILES, sorted(lines)
    assert sum(lines.values()) <= MAX_TOP_LEVEL_LINES, lines
    assert sum(map(len, texts.values())) <= MAX_TOP_LEVEL_CHARS, {name: len(text) for name, text in texts.items()}
    wide = sum(len(line) > 100 for text in texts.values() for line in text.splitlines())
    assert wide <= MAX_WIDE_SHARE * sum(lines.values()), (wide, sum(lines.values()))
    over = {name: n for name, n in lines.items() if n > LONGER.get(name, MAX_METHOD_FILE_LINES)}
    assert not over, over


def test_n_grpo_reads_in_one_short_file_and_the_loss_in_one_short_function():
    assert len((ROOT / "strategies" / "neighbor.py").read_text().splitlines()) <= 80
    tree = ast.parse((ROOT / "ngrpo.py").read_text())
    loss = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "policy_loss")
    assert loss.end_lineno - loss.lineno + 1 <= 55


def imports_in_functions(tree: ast.Module) -> list[str]:
    """The project modules imported inside a function (or a method) of a module."""
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found += [f"{function.name}: {name}" for name in _imports(ast.Module([node], []))
                              if name.split(".")[0] in PROJECT]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_imports_a_module_of_the_project(path):
    assert imports_in_functions(ast.parse(path.read_text())) == []


def test_the_function_import_check_finds_them():
    tree = ast.parse("import torch\ndef f():\n    import json\n    from rollout import generate\n")
    assert sorted(imports_in_functions(tree)) == ["f: rollout", "f: rollout.generate"]


def circles(sources: dict[str, str]) -> list[str]:
    """The modules of `sources` (name -> source text) that sit on an import circle among themselves."""
    graph = {name: {m for m in _imports(ast.parse(text)) if m in sources and m != name}
             for name, text in sources.items()}

    def reaches(start: str, goal: str, seen: set) -> bool:
        for nxt in graph[start] - seen:
            seen.add(nxt)
            if nxt == goal or reaches(nxt, goal, seen):
                return True
        return False

    return sorted(name for name in graph if reaches(name, name, set()))


def test_no_import_circle():
    assert circles({_module_name(path): path.read_text() for path in SOURCES}) == []


def floors(sources: dict[str, str]) -> dict[str, str]:
    """The modules of `sources` joined by floor: a top-level module is a floor of its own, a package one floor
    (its modules' imports as the package's)."""
    joined: dict[str, str] = {}
    for name, text in sources.items():
        floor = name.split(".")[0] if name.split(".")[0] in PACKAGES else name
        joined[floor] = joined.get(floor, "") + "\n" + "\n".join(
            f"import {module.split('.')[0] if module.split('.')[0] in PACKAGES else module}"
            for module in _imports(ast.parse(text)))
    return joined


def test_no_floor_imports_upward():
    """config.py once imported runtime/lora.py for LoRA's target names while runtime/cli.py imports config: a circle
    between floors. The names now live with the model."""
    assert circles(floors({_module_name(path): path.read_text() for path in SOURCES})) == []
    assert circles(floors({"config": "from runtime.lora import TARGETS\n", "runtime.cli": "import config\n"})) == [
        "config", "runtime"]


def test_the_circle_check_finds_circles_through_imports_inside_functions():
    # eval.py and analysis.py once imported each other, one side inside a function: such a pair must be found.
    sources = {"a": "import b\n", "b": "def f():\n    from c import g\n", "c": "from a import h\n", "d": "import a\n"}
    assert circles(sources) == ["a", "b", "c"]
    assert circles({"a": "import b\n", "b": "import math\n"}) == []
