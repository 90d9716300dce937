"""``experiments/bench_speed.py`` runs from the checkout's root, as its docstring and the
benchmarks page tell a user to run it. There, the checkout's ``gfsim/`` folder lacks
``gfsim.simulator``, ``.policies``, ``.cost_models`` and ``.replay_logs`` (an install maps those
top-level folders into ``gfsim``), so a child ``python -m gfsim.cli.main`` or ``python -c`` that
puts the working folder first on its path fails against a regular install. This test runs the
smallest section (one-candidate searches, each a fresh ``gfsim replay --json`` process); CI runs
it against both installs."""

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
