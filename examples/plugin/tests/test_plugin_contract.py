"""The example plug-in keeps gfsim's contracts, and gfsim finds it by its entry points."""

import gfsim
from gfsim.testing import CostModelContract, ForecasterContract, PolicyContract


class TestBudgetShare(PolicyContract):
    specs = ("budget-share", "budget-share:0.2")


class TestParentPrior(ForecasterContract):
    specs = ("parent-prior", "parent-prior:0.5")


def test_a_replay_reads_the_plugin_forecasters_forecasts():
    out = gfsim.compare(None, "threshold:0.6", forecaster="parent-prior:0.5").to_dict()
    assert out["forecast_source"]["forecaster"] == "parent-prior:0.5"
    assert out["forecast_source"]["kind"] == "assumed"  # the plug-in's own word
    assert out["gpu_evals"] < out["baseline"]["gpu_evals"]


class TestSpotA100(CostModelContract):
    names = ("spot-a100",)


def test_a_replay_names_the_plugin_by_its_spec():
    out = gfsim.compare(None, "budget-share:0.3", cost="spot-a100").to_dict()
    assert out["policy"] == "budget-share:share=0.3"
    assert out["cost_model"] == "spot-a100"


def test_the_importer_writes_a_log_gfsim_replays(tmp_path):
    from gfsim.importers.plugins import import_with

    runs = tmp_path / "runs.csv"
    runs.write_text("id,parent,step,runtime_ns\na,,0,800\nb,,0,\nc,a,1,500\nd,a,1,900\n")
    summary = import_with("runs-csv", runs, tmp_path / "runs.jsonl",
                          {"task": "softmax", "seed_runtime_ns": "1000"})
    assert summary["candidates"] == 4 and summary["evaluations"] == 4
    out = gfsim.compare(str(tmp_path / "runs.jsonl"), "all", driver="closed").to_dict()
    assert out["best_speedup"] == 2.0  # 1000 / 500
