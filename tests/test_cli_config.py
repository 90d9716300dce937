"""One settings file (``--config FILE.toml``) for replay, savings, tune, recommend,
counterfactual and live: any option, the command line winning, errors naming the file and the
key; every ``--json`` result says how it was made; one vocabulary for resource slots."""

import hashlib
import json

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.replay_logs import resolve_log

runner = CliRunner()


def run_json(*args):
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


def without_origin(out: dict) -> dict:
    """A result with the record of where its settings came from (and how long the simulation
    took on this machine) set aside."""
    settings = dict(out["settings"])
    settings.pop("from")
    settings.pop("config")
    return {**{k: v for k, v in out.items() if k != "simulation_s"}, "settings": settings}


def test_a_file_and_the_same_flags_give_the_same_json(tmp_path):
    cfg = tmp_path / "study.toml"
    cfg.write_text('''
log = "synthetic-mini"
policy = "random:0.5"
seeds = 2
cost = "reserved-h100:gpus=2"
budget = {usd = 3, steps = 4}
capacity = {gen = 2}

[replay]
baseline = "topk:2"

[tune]
trials = 3
''')
    flags = ["--log", "synthetic-mini", "--policy", "random:0.5", "--seeds", "2", "--cost",
             "reserved-h100:gpus=2", "--budget", "usd=3,steps=4", "--capacity", "gen=2",
             "--baseline", "topk:2"]
    from_file = run_json("replay", "--config", str(cfg))
    from_flags = run_json("replay", *flags)
    assert without_origin(from_file) == without_origin(from_flags)
    assert from_file["policy"] == "random:p=0.5" and from_file["budget"]["steps"] == 4
    s = from_file["settings"]
    assert s["config"] == str(cfg) and s["from"]["policy"] == "config file"
    assert s["from"]["baseline"] == "config file"  # the [replay] table
    assert "trials" not in s["options"]  # the [tune] table is tune's
    assert from_flags["settings"]["from"]["policy"] == "command line"
    assert from_flags["settings"]["config"] is None
    # the command line wins over the file
    won = run_json("replay", "--config", str(cfg), "--policy", "all")
    assert won["policy"] == "all" and won["settings"]["from"]["policy"] == "command line"
    assert won["settings"]["options"]["seeds"] == 2


def test_every_json_result_says_how_it_was_made():
    out = run_json("replay", "--log", "synthetic-mini", "--policy", "threshold:0.7")
    s = out["settings"]
    from gfsim import __version__

    assert s["command"] == "replay" and s["gfsim_version"] == __version__
    assert s["options"]["policy"] == "threshold:0.7" and s["options"]["seed"] == 0
    assert s["log_sha256"] == hashlib.sha256(resolve_log("synthetic-mini").read_bytes()
                                             ).hexdigest()
    assert s["from"] == {"as_json": "command line", "log": "command line",
                         "policy": "command line"}


def test_tune_reads_its_table_and_records_each_run_in_the_study(tmp_path, monkeypatch):
    import optuna

    monkeypatch.chdir(tmp_path)  # the study's journal file: s.journal here
    cfg = tmp_path / "tune.toml"
    cfg.write_text('log = "synthetic-mini"\npolicy = "threshold"\n'
                   '[tune]\ntrials = 2\nparam = ["tau=0.3:0.9"]\nstudy = "s"\n')
    out = run_json("tune", "--config", str(cfg))
    assert out["settings"]["options"]["trials"] == 2
    assert out["settings"]["options"]["param"] == ["tau=0.3:0.9"]
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "s.journal")))
    attrs = optuna.load_study(study_name="s", storage=storage).user_attrs
    runs = attrs["gfsim_runs"]
    assert len(runs) == 1 and runs[0]["options"]["trials"] == 2
    assert runs[0]["log_sha256"] == attrs["gfsim_configuration"]["log_sha256"]


@pytest.mark.parametrize("text, words", [
    ('polcy = "all"', ["key 'polcy'", "not an option of gfsim replay", "valid:", "policy"]),
    ('policy = "all', ["not valid TOML"]),
    ("json = 3", ["key 'json'", "expected true or false"]),
    ("as-json = true", ["key 'as-json'", "not an option", "json"]),
    ('[replay]\nseedz = 2', ["[replay] key 'seedz'", "not an option"]),
    ('[replay]\ntrials = 2', ["[replay] key 'trials'", "not an option"]),
])
def test_a_bad_settings_file_is_one_line_naming_the_file_and_key(tmp_path, text, words):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    res = runner.invoke(app, ["replay", "--config", str(cfg)])
    assert res.exit_code == 2
    assert str(cfg) in res.output and all(w in res.output for w in words), res.output
    res = runner.invoke(app, ["replay", "--config", str(tmp_path / "none.toml")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_a_file_several_commands_read_may_hold_options_of_any_of_them(tmp_path):
    # trials is tune's: replay passes over it at the top level (a [replay] table refuses it)
    cfg = tmp_path / "shared.toml"
    cfg.write_text('log = "synthetic-mini"\npolicy = "all"\ntrials = 4\n')
    out = run_json("replay", "--config", str(cfg))
    assert out["policy"] == "all" and "trials" not in out["settings"]["options"]


def test_the_documented_example_file_works_for_replay_and_tune(tmp_path, monkeypatch):
    from pathlib import Path

    example = Path(__file__).parents[1] / "docs" / "examples" / "study.toml"
    out = run_json("replay", "--config", str(example))
    assert out["policy"] == "threshold:tau=0.7" or out["policy"].startswith("threshold")
    assert out["settings"]["options"]["seeds"] == 2
    monkeypatch.chdir(tmp_path)
    out = run_json("tune", "--config", str(example), "--trials", "2")
    assert out["settings"]["options"]["param"] == ["tau=0.3:0.95"]
    assert out["settings"]["from"]["trials"] == "command line"


def test_one_vocabulary_for_resource_slots():
    from gfsim.cli.common import parse_capacities
    from gfsim.core.errors import SpecError

    assert parse_capacities("gen=2,forecast=3,compile=4,gpus=1", "--capacity") == \
        {"gen": 2, "forecast": 3, "compile": 4, "gpus": 1}
    # the older spellings of replay, live and the event importer still read the same
    assert parse_capacities("generator=2,forecaster=3,compile_workers=4,eval=1",
                            "--capacity") == {"gen": 2, "forecast": 3, "compile": 4, "gpus": 1}
    with pytest.raises(SpecError, match="--capacity: unknown key 'gpus'; valid: gen, forecast"):
        parse_capacities("gpus=2", "--capacity", keys=("gen", "forecast"))
    with pytest.raises(SpecError, match="gen must be >= 1"):
        parse_capacities("gen=0", "--capacity")
    a = run_json("replay", "--log", "synthetic-mini", "--capacity", "gen=1,gpus=1")
    b = run_json("replay", "--log", "synthetic-mini", "--capacity", "generator=1,gpu=1")
    assert a["usd"] == b["usd"] and a["wall_s"] == b["wall_s"]
