"""The suite's own rules (issue 53): plain ``pytest`` leaves out the tests marked slow and
``scripts/test-all`` runs them once, in its last install's run; no test limits a command it runs
to less than a hang guard (a limit near a command's typical time fails on a busy machine: five
docs tests failed on a 30 s limit)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 600  # a guard against a hang, not a timing: each run here takes a second or two

TWO = """import pytest

@pytest.mark.slow
def test_slow():
    pass

def test_quick():
    pass
"""


def _pytest(folder: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-P", "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                          "--rootdir", str(folder), "-p", "no:cacheprovider", str(folder),
                          *args], capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
    return res.stdout.strip().splitlines()[-1]


def test_plain_pytest_leaves_out_the_slow_tests_and_an_empty_mark_takes_them(tmp_path):
    (tmp_path / "test_two.py").write_text(TWO)
    assert "1 passed, 1 deselected" in _pytest(tmp_path)
    assert "2 passed" in _pytest(tmp_path, "-m", "")


def _test_all(tmp_path: Path, *args: str) -> list[list[str]]:
    """Run scripts/test-all with two stand-in interpreters that record their arguments, and
    servers given in the environment (so that none is started); one argument list per run."""
    calls = tmp_path / "calls"
    pythons = []
    for name in ("regular", "editable"):
        py = tmp_path / name
        py.write_text(f"#!/bin/sh\nprintf '%s\\0' {name} \"$@\" >> {calls}\n"
                      f"printf '\\n' >> {calls}\n")
        py.chmod(0o755)
        pythons += ["--python", str(py)]
    env = {**os.environ, "GFSIM_VLLM_URL": "http://127.0.0.1:9/v1",
           "GFSIM_POSTGRES_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
           "GFSIM_RAY_ADDRESS": "127.0.0.1:9"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "test-all"), *pythons, *args],
                         capture_output=True, text=True, timeout=HANG_S, env=env)
    assert res.returncode == 0, res.stderr[-1500:]
    return [line.split("\0")[:-1] for line in calls.read_text().splitlines() if line]


def test_test_all_runs_the_slow_tests_once_in_the_last_installs_run(tmp_path):
    regular, editable = _test_all(tmp_path, "--", "-x")
    assert regular == ["regular", "-P", "-m", "pytest", "-x"]
    assert editable == ["editable", "-P", "-m", "pytest", "-m", "", "-x"]


def test_test_all_leaves_the_slow_tests_out_when_asked(tmp_path):
    calls = _test_all(tmp_path, "--no-slow")
    assert calls == [["regular", "-P", "-m", "pytest"], ["editable", "-P", "-m", "pytest"]]


# The calls that run a whole command (a gfsim command, a script) and wait for it to end; a
# `timeout` given to them is a limit on that command's wall-clock time.
RUNS = {"run", "check_output", "check_call", "communicate"}
FLOOR_S = 60  # ten times the slowest such command's typical time (a few seconds) or more


def _constants(tree: ast.Module) -> dict[str, float]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, (int, float)):
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


def tight_limits(path: Path) -> list[str]:
    """Each ``timeout=`` under ``FLOOR_S`` that a call running a whole command is given."""
    tree = ast.parse(path.read_text(), str(path))
    names = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else \
            getattr(node.func, "id", "")
        for kw in node.keywords:
            if func not in RUNS or kw.arg != "timeout":
                continue
            value = kw.value.value if isinstance(kw.value, ast.Constant) else \
                names.get(getattr(kw.value, "id", ""))
            if isinstance(value, (int, float)) and value < FLOOR_S:
                found.append(f"{path.name}:{node.lineno}: {func}(timeout={value})")
    return found


def test_no_test_limits_a_command_to_less_than_a_hang_guard():
    tight = [hit for path in sorted((ROOT / "tests").glob("test_*.py"))
             for hit in tight_limits(path)]
    assert tight == []


def test_the_limit_check_finds_a_tight_limit(tmp_path):
    # the check itself can fail: the docs tests' old limit, as a literal and as a constant
    sample = tmp_path / "test_sample.py"
    sample.write_text("import subprocess\nLIMIT = 30\nsubprocess.run(['x'], timeout=30)\n"
                      "subprocess.run(['x'], timeout=LIMIT)\nsubprocess.run(['x'], "
                      "timeout=600)\nt.join(timeout=5)\n")
    assert [h.split(": ", 1)[1] for h in tight_limits(sample)] == \
        ["run(timeout=30)", "run(timeout=30)"]


def test_hypothesis_examples_have_no_deadline():
    # conftest's profile: an example that takes 300 ms passes (Hypothesis's default deadline,
    # 200 ms, failed it with DeadlineExceeded)
    import time

    from hypothesis import given, settings
    from hypothesis import strategies as st

    seen = []

    @settings(max_examples=2, database=None)
    @given(st.integers())
    def slow_example(x):
        seen.append(x)
        time.sleep(0.3)

    slow_example()
    assert 1 <= len(seen) <= 2  # it ran, and no example failed on its time


def test_test_all_spreads_each_run_over_workers_a_file_to_a_worker(tmp_path):
    regular, editable = _test_all(tmp_path, "--workers", "2")
    assert regular == ["regular", "-P", "-m", "pytest", "-n", "2", "--dist", "loadfile"]
    assert editable == ["editable", "-P", "-m", "pytest", "-m", "", "-n", "2", "--dist",
                        "loadfile"]
