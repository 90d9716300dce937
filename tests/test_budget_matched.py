"""experiments/budget_matched.py runs end to end and its figures hold together."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "budget_matched.py"


@pytest.mark.slow
@pytest.mark.skipif(not SCRIPT.exists(), reason="experiments/ is not installed with the package")
def test_budget_matched_experiment_on_a_small_log(tmp_path):
    out = tmp_path / "bm.json"
    png = tmp_path / "bm.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--log", "synthetic-mini", "--seeds", "2",
                           "--jobs", "1", "--evals", "60", "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = data["rows"]
    assert len(rows) == 16 and {r["preset"] for r in rows} == {"serverless-a100", "reserved-h100"}
    assert data["usd_cap"]["serverless-a100"] > 0 and "resample one log" in data["note"]
    for r in rows:
        for key in ("equal_evals", "equal_usd"):
            for e in (r[key]["best_speedup"], r[key]["vs_standard"]):
                assert e["lo"] <= e["mean"] <= e["hi"]
        assert r["extrapolated"] == (r["fallback_share"] > 0.25)
        # No search measures past its budget of 60 evaluations.
        assert 0 < r["equal_evals"]["max_gpu_evals"] <= 60
        assert r["full"]["gpu_evals_per_search"] > 0
    std = [r for r in rows if r["search"] == "paper-standard"]
    assert len(std) == 2
    for r in std:  # the reference compared with itself
        assert r["equal_evals"]["vs_standard"]["mean"] == 0 == r["equal_usd"]["vs_standard"]["hi"]
    # The markdown table has one line per row under each preset.
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    assert len(lines) == 2 * (1 + 8)
    assert all("EXTRAPOLATED" in ln for ln in lines
               if ln.startswith("| paper-filtered") and "| 0% |" not in ln)
