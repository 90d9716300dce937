"""``experiments/bench_speed.py`` runs from the checkout's root, as its docstring and the
benchmarks page tell a user to run it, and its children (``python -m gfsim.cli.main``,
``python -c``, which would put the working folder first on their path) time the same gfsim as
the script itself (it sets Python's safe-path mode for them). This test runs the smallest
section (one-candidate searches, each a fresh ``gfsim replay --json`` process)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 600  # a guard against a hang, not a timing: the section takes a few seconds


def test_bench_speed_runs_a_section_from_the_checkout_root():
    res = subprocess.run([sys.executable, "experiments/bench_speed.py", "--only-many-searches",
                          "--many-searches", "2"], cwd=ROOT, capture_output=True, text=True,
                         timeout=HANG_S)
    assert res.returncode == 0, res.stderr[-1500:]
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| 2 one-candidate searches")]
    assert res.stdout.startswith("# Many searches") and len(rows) == 6, res.stdout
