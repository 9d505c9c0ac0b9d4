"""The house rules (README, "Where things are"), checked on the source: every module opens with a docstring that says
what it is for, no function runs over 80 lines, no file over 800, and no two modules import each other
(directly or round a longer circle, counting imports made inside functions)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("*.py"), *ROOT.glob("benchmarks/*.py")])
MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 800


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


def test_the_circle_check_finds_circles_through_imports_inside_functions():
    # eval.py and analysis.py once imported each other, one side inside a function: such a pair must be found.
    sources = {"a": "import b\n", "b": "def f():\n    from c import g\n", "c": "from a import h\n", "d": "import a\n"}
    assert circles(sources) == ["a", "b", "c"]
    assert circles({"a": "import b\n", "b": "import math\n"}) == []
