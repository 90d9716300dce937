"""The checkout is the package: ``gfsim/simulator``, ``gfsim/policies``, ``gfsim/cost_models``
and ``gfsim/replay_logs`` are relative links to the top-level folders that hold them, and the
wheel built from the checkout holds exactly what ``gfsim/`` shows (its modules, the linked
folders' included, and the package data pyproject names), byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("simulator", "policies", "cost_models", "replay_logs")


def test_the_linked_folders_are_relative_links_to_the_top_level_ones():
    for name in LINKED:
        link = ROOT / "gfsim" / name
        assert link.is_symlink(), f"gfsim/{name} should be a link to ../{name}"
        assert os.readlink(link) == f"../{name}"
        assert (link / "__init__.py").resolve() == (ROOT / name / "__init__.py").resolve()


def test_from_the_checkouts_root_gfsim_is_the_checkout_whole():
    code = ("import gfsim.simulator.trace.engine, gfsim.policies.base, gfsim.cost_models.presets, "
            "gfsim.replay_logs; print(gfsim.replay_logs.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).parent == ROOT / "gfsim" / "replay_logs"


def _shown_files() -> dict[str, Path]:
    """What gfsim/ shows, as the wheel should hold it: every module under it (links followed)
    and the package data pyproject lists."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = {}
    for folder, dirs, files in os.walk(ROOT / "gfsim", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder, name)
                out[path.relative_to(ROOT).as_posix()] = path
    for package, patterns in setup["package-data"].items():
        base = ROOT / Path(*package.split("."))
        for pattern in patterns:
            for path in base.glob(pattern):
                out[path.relative_to(ROOT).as_posix()] = path
    return out


def _isolation() -> list[str]:
    """pip's flag to build with this environment's backend where it meets the build system's
    requirements (offline, quick), else none: pip builds in an isolated environment."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    needs = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for need in map(Requirement, needs):
        try:
            if version(need.name) not in need.specifier:
                return []
        except PackageNotFoundError:
            return []
    return ["--no-build-isolation"]


def test_the_wheel_holds_what_gfsim_shows_byte_for_byte(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("gfsim", *LINKED):  # the links kept as links
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_isolation(),
                          "-q", "-w", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    wheel = zipfile.ZipFile(next((tmp_path / "dist").glob("gfsim-*.whl")))
    held = {n for n in wheel.namelist() if not n.endswith("/")}
    package = {n for n in held if not n.split("/")[0].endswith(".dist-info")}
    shown = _shown_files()
    assert package == set(shown), (f"missing from the wheel: {sorted(set(shown) - package)}; "
                                   f"not shown by gfsim/: {sorted(package - set(shown))}")
    assert {n.split("/")[0] for n in package} == {"gfsim"}  # nothing generic at the top
    for name, path in shown.items():
        assert wheel.read(name) == path.read_bytes(), name
