"""The Python API: each command a thin layer over a function that returns what it prints."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import gfsim
from gfsim.cli.main import app
from gfsim.core.errors import GfsimError

runner = CliRunner()


def _cli_json(*args):
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


def _same(a: dict, b: dict, drop=("settings", "simulation_s")) -> bool:
    return {k: v for k, v in a.items() if k not in drop} == \
        {k: v for k, v in b.items() if k not in drop}


def test_compare_returns_what_replay_prints():
    c = gfsim.compare("synthetic-mini", "random:0.5", seeds=3, budget="usd=25")
    cli = _cli_json("replay", "--log", "synthetic-mini", "--policy", "random:0.5", "--seeds",
                    "3", "--budget", "usd=25")
    assert _same(json.loads(json.dumps(c.to_dict(), default=str)), cli)
    assert c.best_speedup == cli["best_speedup"] and c.usd_delta == cli["usd_delta"]
    assert len(c.pairs) == 3 and len(c.candidates()) == 368
    assert "Comparison(log='synthetic-mini', policy='random:p=0.5'" in repr(c)


def test_compare_takes_a_log_object_a_path_or_a_shipped_name(tmp_path):
    from gfsim.replay_logs import resolve_log

    log = gfsim.load_log("synthetic-mini")  # a shipped name, as every command takes it
    assert log.name == "synthetic-mini" and len(log.candidates) == 368
    by_obj = gfsim.compare(log, "topk:2")
    by_path = gfsim.compare(resolve_log("synthetic-mini"), "topk:2")
    assert by_obj.usd == by_path.usd and by_obj.gpu_evals == by_path.gpu_evals
    with pytest.raises(GfsimError, match="unknown policy 'treshold'"):
        gfsim.compare(log, "treshold:0.7")
    with pytest.raises(Exception, match="no-such-log"):
        gfsim.load_log(str(tmp_path / "no-such-log.jsonl"))


def test_tune_returns_what_the_command_prints_and_records_the_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = gfsim.tune("synthetic-mini", "threshold", ["tau=0.3:0.95"], trials=4, study="py")
    cli = _cli_json("tune", "--log", "synthetic-mini", "--policy", "threshold", "--param",
                    "tau=0.3:0.95", "--trials", "4", "--study", "py")
    assert cli["trials"] == 4 and cli["ran_now"] == 0  # the same study, already tuned
    assert _same(t.to_dict(), cli, drop=("settings", "ran_now"))
    runs = t.study.user_attrs["gfsim_runs"]
    assert runs[0]["command"] == "gfsim.tune (Python)" and runs[0]["options"]["trials"] == 4
    assert t.best["spec"].startswith("threshold:tau=")


def test_import_gfsim_stays_light():
    code = ("import sys, gfsim; heavy = {'pandas', 'numpy', 'simpy', 'optuna', 'torch'} & "
            "set(sys.modules); print(sorted(heavy)); print(gfsim.__version__); "
            "print(callable(gfsim.compare), 'compare' in dir(gfsim))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.split("\n")
    assert out[0] == "[]" and out[2] == "True True", out


def test_savings_returns_what_the_command_prints():
    s = gfsim.savings("synthetic-mini", "topk:2")
    cli = _cli_json("savings", "--log", "synthetic-mini", "--policy", "topk:2")
    assert _same(json.loads(json.dumps(s, default=str)), cli)
    assert s["usd_saved_per_search"]["mean"] > 0 and s["inputs"]["policy"] == "topk:k=2"


@pytest.mark.parametrize("module", ["gfsim.api.compare", "gfsim.api.tune", "gfsim.api.savings",
                                    "gfsim.api.counterfactual", "gfsim.api.recommend",
                                    "gfsim.api.score", "gfsim.api.forecast",
                                    "gfsim.api.costs", "gfsim.api.describe",
                                    "gfsim.replay_logs.log", "gfsim.policies.registry",
                                    "gfsim.cost_models.presets"])
def test_the_api_reference_examples_run(module, tmp_path, monkeypatch):
    import doctest
    import importlib

    monkeypatch.chdir(tmp_path)  # tune's example keeps its study in a journal file here
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, verbose=False)
    assert result.attempted >= 2 and result.failed == 0
