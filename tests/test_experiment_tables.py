"""The experiment tables in the docs are what their scripts print: the shipped log's policy table
(``experiments/readme_table.py``, run here: 21 replays, seconds) and the counterfactual
benchmark's blocks (``experiments/counterfactual_benchmark.py`` re-renders them from the JSON it
saved; running it again takes hours)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "experiments"


def _rows(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]


def test_the_shipped_logs_policy_table_is_what_its_script_prints(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "readme_table.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=True)
    printed, doc = _rows(out.stdout), _rows((DOCS / "shipped-log.md").read_text())
    assert len(printed) > 20 and printed == doc[:len(printed)]


@pytest.mark.parametrize("marker, saved, cells", [
    ("results", "counterfactual_model.json", True),
    ("model-choice", "counterfactual_dev_choice.json", False)])
def test_the_counterfactual_tables_are_rendered_from_the_saved_run(marker, saved, cells):
    spec = importlib.util.spec_from_file_location(
        "counterfactual_benchmark", ROOT / "experiments" / "counterfactual_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = json.loads((ROOT / "experiments" / "data" / saved).read_text())
    doc = (DOCS / "counterfactual-benchmark.md").read_text()
    block = re.search(re.escape(f"<!-- {marker}:start -->") + r"\n(.*?)\n"
                      + re.escape(f"<!-- {marker}:end -->"), doc, re.S).group(1)
    assert module.render(out, out.get("seconds"), cells) == block


@pytest.mark.parametrize("saved, marker, forecaster", [
    ("h200_worlds.json", "results", None),
    ("h200_worlds_costmodel.json", "results-costmodel", "costmodel")])
def test_the_h200_world_tables_are_rendered_from_the_saved_run(saved, marker, forecaster):
    spec = importlib.util.spec_from_file_location("h200_worlds",
                                                  ROOT / "experiments" / "h200_worlds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = json.loads((ROOT / "experiments" / "data" / saved).read_text())
    doc = (DOCS / "h200-worlds.md").read_text()
    block = re.search(re.escape(f"<!-- {marker}:start -->") + r"\n(.*?)\n"
                      + re.escape(f"<!-- {marker}:end -->"), doc, re.S).group(1)
    assert module.render(runs) == block
    assert {r["worlds"][0]["world"] for r in runs} >= {"h200:softmax", "h200:layernorm",
                                                       "h200:fp8_quant"}
    assert all(r["spec"].get("forecaster") == forecaster for r in runs)


def test_the_live_threshold_tables_are_what_their_script_prints():
    """docs/experiments/live-threshold.md: the replays of the shipped measure-all H200 log
    against the shipped threshold run, recomputed here (seconds)."""
    spec = importlib.util.spec_from_file_location("live_threshold",
                                                  ROOT / "experiments" / "live_threshold.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.run()
    doc = (DOCS / "live-threshold.md").read_text()
    block = re.search(r"<!-- results:start -->\n(.*?)\n<!-- results:end -->", doc, re.S).group(1)
    # The first line carries this machine's run time; every table row must match.
    assert _rows(module.render(out)) == _rows(block)
    assert out["searches"] == 6 and set(out["predictions"]) == {
        "trace, learned", "trace, recorded", "puct, recorded", "puct, learned"}


def test_the_calibration_tables_are_what_the_saved_runs_give():
    """Every calibration row in the benchmark's page is what experiments/calibration_curves.py
    renders from the saved runs, and those runs' measures are what the code computes now from
    the same coverage (the targets' verdicts included)."""
    spec = importlib.util.spec_from_file_location(
        "calibration_curves", ROOT / "experiments" / "calibration_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc = _rows((DOCS / "counterfactual-benchmark.md").read_text())
    from gfsim.worlds.benchmark import targets

    for name in ("dev", "heldout", "h200"):
        out = json.loads((ROOT / "experiments" / "data" / f"calibration_{name}.json").read_text())
        rows = _rows(module.table(out))[1:]  # without the header
        assert len(rows) == len(out["worlds"]) and all(r in doc for r in rows)
        for w in out["worlds"]:
            m = {k: float("nan") if v is None else v for k, v in w["measures"].items()}
            again = targets(m, w["cells"])
            for k in ("coverage", "calibration", "regret"):  # JSON keeps NaN as null
                assert again[k] == w["measures"]["targets"][k], (name, w["world"], k)
