"""The package's layers (``gfsim/__init__.py``) and the absence of import cycles, checked by
import-linter against the contracts in ``pyproject.toml``, function-level imports included.

The check runs on the source tree as it installs: ``simulator/``, ``policies/`` and the other
top-level folders are copied to where ``[tool.setuptools.package-dir]`` puts them, so the
same graph is seen from a regular or an editable install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def stage(dest: Path) -> Path:
    """Copy the package's modules into ``dest`` in their installed layout."""
    setup = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    dirs = setup["package-dir"]
    for package in setup["packages"]:
        mapped = max((k for k in dirs if package == k or package.startswith(k + ".")), key=len)
        rest = package[len(mapped):].lstrip(".")
        source = ROOT / dirs[mapped] / Path(*rest.split(".")) if rest else ROOT / dirs[mapped]
        target = dest / Path(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            shutil.copy(module, target / module.name)
    return dest


def lint(tree: Path) -> subprocess.CompletedProcess:
    # lint-imports puts its working directory first on sys.path, so `gfsim` is the staged copy.
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, "
            "no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True,
                          text=True, timeout=120)


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.fixture
def tree(tmp_path):
    return stage(tmp_path / "tree")


def test_every_package_is_staged(tree):
    # A package missing from the stage would escape the contracts unseen.
    for name in ("core", "forecasts", "replay_logs", "cost_models", "policies", "simulator",
                 "worlds", "tuning", "analysis", "live", "cli", "importers"):
        assert (tree / "gfsim" / name / "__init__.py").is_file(), name
    assert (tree / "gfsim" / "simulator" / "engine.py").is_file()


def test_the_contracts_are_kept(tree):
    out = lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(tree):
    # Even inside a function: a lazy import is still a dependency.
    append(tree / "gfsim/replay_logs/io.py",
           "\n\ndef _peek():\n    from gfsim.simulator import engine\n")
    append(tree / "gfsim/simulator/engine.py", "\n\ndef _peek():\n    import gfsim.cli.main\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "gfsim.replay_logs is not allowed to import gfsim.simulator" in out.stdout
    assert "gfsim.simulator is not allowed to import gfsim.cli" in out.stdout


def test_an_import_circle_inside_a_package_breaks_the_acyclic_contract(tree):
    append(tree / "gfsim/live/prompt.py",
           "\n\ndef _peek():\n    from gfsim.live import forecaster\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "No cycles are allowed in gfsim.live" in out.stdout
    assert ".prompt -> .forecaster" in out.stdout
