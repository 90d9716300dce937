"""The package's layers (``gfsim/__init__.py``) and the absence of import cycles, checked by
import-linter against the contracts in ``pyproject.toml``, function-level imports included.

The checkout is the package (``gfsim/simulator`` and its siblings are links to the top-level
folders), so the contracts are checked on it as it stands; the tests that plant a violation do
so in a copy of its modules.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def stage(dest: Path) -> Path:
    """Copy the package's modules (the linked folders' too) into ``dest``."""
    def not_modules(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__"
                or not (n.endswith(".py") or (Path(folder) / n).is_dir())]

    shutil.copytree(ROOT / "gfsim", dest / "gfsim", ignore=not_modules)
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


def test_every_package_is_in_the_checkouts_gfsim_and_the_copy(tree):
    # A package missing from gfsim/ would escape the contracts unseen.
    for base in (ROOT, tree):
        for name in ("core", "forecasts", "replay_logs", "cost_models", "policies", "simulator",
                     "worlds", "tuning", "analysis", "live", "cli", "importers"):
            assert (base / "gfsim" / name / "__init__.py").is_file(), (base, name)
        assert (base / "gfsim" / "simulator" / "trace" / "engine.py").is_file()


def test_the_contracts_are_kept():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout


def test_the_cli_reaching_past_the_api_breaks_the_thin_cli_contract(tree):
    append(tree / "gfsim/cli/replay_cmd.py",
           "\n\ndef _peek():\n    from gfsim.simulator.trace import engine\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "the CLI is thin" in out.stdout and "BROKEN" in out.stdout
    assert "gfsim.cli.replay_cmd -> gfsim.simulator.trace.engine" in out.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(tree):
    # Even inside a function: a lazy import is still a dependency.
    append(tree / "gfsim/replay_logs/io.py",
           "\n\ndef _peek():\n    from gfsim.simulator.trace import engine\n")
    append(tree / "gfsim/simulator/trace/engine.py",
           "\n\ndef _peek():\n    import gfsim.cli.main\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "gfsim.replay_logs is not allowed to import gfsim.simulator" in out.stdout
    assert "gfsim.simulator is not allowed to import gfsim.cli" in out.stdout


def test_an_import_circle_inside_a_package_breaks_the_acyclic_contract(tree):
    append(tree / "gfsim/live/llm/prompt.py",
           "\n\ndef _peek():\n    from gfsim.live.llm import forecaster\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "No cycles are allowed in gfsim.live" in out.stdout
    assert ".prompt -> .forecaster" in out.stdout
