"""Output written for users (issue 43): numbers with their units at any size, import summaries
without Python literals, benchmark targets as what was asked and what was found, tune's plots
in gfsim's style, no citation of a page that does not exist."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli import units
from gfsim.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "data" / "tiny.jsonl"


@pytest.mark.parametrize("seconds, text", [(5400, "1.50 h"), (42, "42.0 s"), (0.004, "4.00 ms"),
                                           (0, "0.00 s"), (3 * 86400, "72.0 h"),
                                           (5 * 86400, "5.00 d"),
                                           (150, "2.50 min")])
def test_a_duration_reads_in_the_unit_that_fits(seconds, text):
    assert units.duration(seconds) == text


def test_dollars_and_energy_keep_what_a_small_figure_needs():
    assert units.usd(0.0042) == "$0.0042" and units.usd(-0.2) == "-$0.20"
    assert units.usd(1234.5) == "$1,234.50"
    assert units.energy(7.2e6) == "2.00 kWh" and units.energy(350) == "350 J"
    assert units.duration(30, units.duration_unit(5400)) == "0.0083 h"  # a row's one unit


def test_a_small_logs_stage_table_is_not_rounded_to_zero():
    res = runner.invoke(app, ["replay", "--log", str(TINY), "--policy", "all"],
                        terminal_width=100)
    assert res.exit_code == 0, res.output
    table = res.output[res.output.index("cost by stage"):].split("USD resting")[0]
    rows = [ln for ln in table.splitlines() if ln.strip().startswith(("generation", "timing"))]
    assert rows and all("0.00 h" not in r and "$0.00 " not in r for r in rows), table
    assert re.search(r"\d (s|min|ms)\b", table) and "$" in table


def test_import_summaries_print_no_python_literals(tmp_path):
    res = runner.invoke(app, ["import", "shinka", str(ROOT / "tests/data/shinka/run"), "-o",
                              str(tmp_path / "s.jsonl")], terminal_width=100)
    assert res.exit_code == 0, res.output
    body = res.output.split("\n", 1)[1]
    assert "{" not in body and "'" not in body and "True" not in body, body
    assert "outcomes: success " in body  # a mapping as `key value` pairs
    ref = next(ln for ln in body.splitlines() if ln.strip().startswith("reference:"))
    number = ref.split(":")[1].split()[0]
    assert "combined_score" in ref and len(number.replace(".", "").lstrip("0")) <= 4, ref
    res = runner.invoke(app, ["import", "kernel-tuner", "convolution_milo_A100.json.gz", "-o",
                              str(tmp_path / "k.jsonl")], terminal_width=100)
    assert res.exit_code == 0, res.output
    ms = next(ln for ln in res.output.splitlines() if "reference ms:" in ln)
    assert re.fullmatch(r"\s*reference ms: \d+\.\d{1,3}", ms), ms
    assert "e+0" not in res.output
    res = runner.invoke(app, ["import", "openevolve", str(ROOT / "tests/data/openevolve/run"),
                              "-o", str(tmp_path / "o.jsonl"), "--runtime-metric",
                              "runtime_ns"], terminal_width=100)
    ref = next(ln for ln in res.output.splitlines() if ln.strip().startswith("reference:"))
    assert "runtime_ns" in ref, ref  # the reference says its unit


def test_benchmark_targets_read_as_findings_with_the_target_and_what_to_do():
    from gfsim.cli.counterfactual_cmd import _finding

    missed = _finding("tau", {"met": False, "value": 0.71, "target": ">= 0.80", "miss": 0.0927,
                              "replays": 0.52})
    assert missed == ("ranking: the recommendation orders the configurations unlike the direct "
                      "runs (Kendall tau 0.71, target >= 0.80, short by 0.09; the replays alone "
                      "0.52): do not choose by its order alone")
    pairs = _finding("pairs_ordered", {"met": True, "value": 0.95, "target": ">= 90%",
                                       "miss": 0.0, "replays": float("nan")})
    assert pairs == ("clear pairs (> 0.1 log2 apart on the direct runs): 95% ordered right by "
                     "the recommendation (target >= 90%)")
    met = _finding("coverage", {"met": True, "value": 0.9, "target": "85%-95%", "miss": 0.0})
    assert met == ("a new search's best: the 90% intervals hold 90% of direct runs (target "
                   "85%-95%): trust them")
    regret = _finding("regret", {"met": False, "value": 0.056, "target": "<= 5%",
                                 "miss": 0.006})
    assert regret.endswith("short by 0.6%: measure what it recommends before adopting")
    gap = _finding("expected_gain", {"met": False, "value": 0.2, "target": "within 5",
                                     "miss": 0.15})
    assert "off nominal by up to 20%" in gap and gap.endswith("short by 15%")
    assert "not measurable" in _finding("tau", {"met": None, "value": None, "target": ">= x",
                                                "miss": None})


def test_the_world_list_has_no_maintainers_note():
    res = runner.invoke(app, ["counterfactual", "--list-worlds"], terminal_width=100)
    assert res.exit_code == 0, res.output
    assert "do not edit" not in res.output and "pins its hash" not in res.output
    assert "frozen 2026-12-01" in res.output


def test_no_output_cites_a_file_the_repository_lacks():
    from gfsim.cost_models import PRESETS, load_cost_model

    for spec in PRESETS.builtins():
        for source in load_cost_model(spec).sources.values():
            for path in re.findall(r"\b[\w./-]+\.md\b", source):
                assert (ROOT / path).exists() or (ROOT / "docs" / path).exists(), \
                    (spec, path)


def test_tunes_plots_are_gfsims_with_units_and_the_synthetic_tag(tmp_path, monkeypatch):
    from gfsim.analysis import plots

    monkeypatch.chdir(tmp_path)
    seen = []
    for name in ("plot_tuning_history", "plot_tuning_front"):
        real = getattr(plots, name)
        monkeypatch.setattr(plots, name, lambda *a, real=real, **k: seen.append(
            (a, k)) or real(*a, **k))
    res = runner.invoke(app, ["tune", "--log", "synthetic-mini", "--policy", "threshold",
                              "--param", "tau=0.3:0.9", "--trials", "3", "--objective",
                              "best_speedup,usd", "--plot", str(tmp_path / "plots"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert sorted(Path(p).name for p in out["plots"]) == [
        "history-best_speedup.png", "history-usd.png", "pareto-front.png"]
    assert all(Path(p).stat().st_size > 10_000 for p in out["plots"])
    titles = [k["title"] for _, k in seen]
    assert len(titles) == 3 and all(t.startswith("SYNTHETIC log (nothing measured): gfsim "
                                                 "tune: study ") and "synthetic-mini" in t
                                    for t in titles)
    assert plots.OBJECTIVE_LABELS["usd"].endswith("($)")
