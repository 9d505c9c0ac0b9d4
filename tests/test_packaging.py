"""pyproject.toml and requirements.txt name the same dependencies (README installs from requirements.txt), and
NGRPO_HIDE_EXTRAS hides every optional package pyproject.toml names."""

import runpy
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _requirement_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_requirements_txt_equals_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(_requirement_lines((ROOT / "requirements.txt").read_text())) == sorted(project["dependencies"])


def test_hide_extras_hides_every_extra_of_pyproject():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    modules = {package.replace("-", "_") for packages in extras.values() for package in packages}
    hidden = runpy.run_path(str(ROOT / "tests" / "hide_extras" / "sitecustomize.py"))["HIDDEN"]
    assert modules and modules <= set(hidden)


def test_every_flat_module_is_linted_at_120_columns():
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["line-length"] == 120 and {"E", "W", "F", "I"} <= set(ruff["lint"]["select"])
