"""gfsim tune: the search space, the standardised score, resumable studies, several workers."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import SpecError
from gfsim.cost_models import load_cost_model
from gfsim.replay_logs import open_log
from gfsim.simulator import Budget
from gfsim.tuning.trials import (
    TrialSetup,
    aggregate,
    evaluate,
    expected_random_best,
    parse_constraint,
    parse_objectives,
    parse_param,
)

runner = CliRunner()


def test_parameters_of_the_policy_and_of_the_search():
    p = parse_param("tau=0.3:0.99", "threshold", "trace")
    assert (p.kind, p.low, p.high, p.target) == ("float", 0.3, 0.99, "policy")
    p = parse_param("overgen=1:8:int", "threshold", "puct")
    assert (p.kind, p.target) == ("int", "search")
    assert parse_param("k=1:4", "topk", "trace").kind == "int"  # an int parameter stays int
    p = parse_param("usd_per_log2_speedup=0.1:100:log", "ev", "trace")
    assert p.log and p.kind == "float"
    p = parse_param("score=maxprob|margin", "threshold", "trace")
    assert p.choices == ("maxprob", "margin") and p.kind == "categorical"
    for text, policy, driver, msg in (
        ("overgen=1:4", "threshold", "trace", "only with `driver` puct"),
        ("color=1:2", "threshold", "puct", "valid: tau, score, rho"),
        ("tau=0.9:0.3", "threshold", "trace", "LOW must be below HIGH"),
        ("tau=0:1:log", "threshold", "trace", "LOW > 0"),
        ("rho=0.5:2", "threshold", "trace", "above its maximum"),
        ("score=maxprob|vibes", "threshold", "trace", "'vibes' is not one of"),
        ("tau", "threshold", "trace", "expected NAME="),
        ("k=1.5:3", "topk", "trace", "whole numbers"),
        ("tau=0.1:0.9", "nope", "trace", "unknown policy"),
        # 'all' has none: this said "valid: " with nothing after it
        ("tau=0.3:0.9", "all", "trace", "policy 'all' has no tunable parameters \\(tune"),
        ("tau=0.3:0.9", "all", "puct", "'all' has no tunable parameters; the puct search's: "
                                       "overgen, samples_per_parent"),
    ):
        with pytest.raises(SpecError, match=msg):
            parse_param(text, policy, driver)
    assert parse_objectives("best_speedup:max,usd:min") == [("best_speedup", "maximize"),
                                                           ("usd", "minimize")]
    assert parse_objectives("score") == [("score", "maximize")]
    for bad in ("speed", "usd:up", "usd,usd"):
        with pytest.raises(SpecError):
            parse_objectives(bad)
    assert parse_constraint("usd<=40") == ("usd", 40.0)
    with pytest.raises(SpecError):
        parse_constraint("usd>=40")


def test_tuning_a_parameter_of_all_says_it_has_none(tmp_path):
    res = runner.invoke(app, ["tune", "--policy", "all", "--param", "tau=0.3:0.9", "--storage",
                              str(tmp_path / "j.log")])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("gfsim: error: --param tau: policy 'all' has no tunable "
                                  "parameters (tune another policy, or a search parameter with "
                                  "--driver puct)")


def test_the_expected_best_of_random_order_is_exact():
    rng = np.random.default_rng(0)
    values = rng.lognormal(0, 0.5, 9)
    for k in range(0, 11):
        draws = itertools.combinations(values, min(k, 9))
        brute = np.mean([max([1.0, *d]) for d in draws]) if k else 1.0
        assert expected_random_best(values, k, floor=1.0) == pytest.approx(brute, rel=1e-12)


def setup(log="synthetic-mini", seeds=(0, 1), **kw):
    return TrialSetup(open_log(log), load_cost_model("serverless-a100"), "threshold",
                      kw.pop("driver", "trace"), Budget(), list(seeds), **kw)


def test_evaluation_is_common_random_numbers_and_matches_replay():
    from gfsim.policies import make_policy
    from gfsim.simulator import replay

    s = setup()
    a, b = evaluate(s, "threshold:tau=0.8", None), evaluate(s, "threshold:tau=0.8", None)
    for m in a["values"]:
        np.testing.assert_array_equal(a["values"][m], b["values"][m])
    r = replay(s.log, make_policy("threshold:tau=0.8"), s.model, seed=1,
               orphans_dropped=False)
    assert list(a["values"]["best_speedup"][1]) == [x.best_speedup for x in r.searches]
    assert aggregate("best_speedup", a["values"]["best_speedup"]) == pytest.approx(
        np.mean([np.exp(np.mean(np.log(row))) for row in a["values"]["best_speedup"]]))
    # The score is 0 at the random-order expectation and 1 at the log's best: measuring
    # everything in a measure-all log finds the log's best.
    full = evaluate(s, "threshold:tau=1.0,rho=0.0", None)
    assert np.all(full["values"]["score"] == pytest.approx(1.0)) or full["clipped"] > 0


def tune(tmp_path, *args):
    res = runner.invoke(app, ["tune", "--log", "synthetic-mini", "--seeds", "2",
                              "--storage", f"sqlite:///{tmp_path}/s.db", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_a_study_resumes_and_reports_out_of_sample(tmp_path):
    # The random policy reads the seed: each trial replays every seed, and fresh ones check it.
    rnd = ("--policy", "random", "--param", "p=0.1:0.9")
    out = tune(tmp_path, *rnd, "--trials", "5", "--study", "a", "--plot", str(tmp_path / "plots"))
    assert (out["trials"], out["ran_now"]) == (5, 5)
    assert out["synthetic_log"] and any("demonstration" in n for n in out["notes"])
    best = out["best"]
    assert out["top"][0]["number"] == best["number"]
    assert best["values"][0] == max(t["values"][0] for t in out["top"])
    oos = out["out_of_sample"]
    assert len(oos) == 3 and out["fresh_seeds"] == [2, 3]
    assert oos[0]["in_sample"]["best_speedup"] == best["metrics"]["best_speedup"]
    assert out["seeds"] == 2 and out["deterministic"] is None
    # Re-scoring the best trial's spec on the same seeds gives its stored figures back.
    again = evaluate(setup(), best["spec"], None)
    assert aggregate("best_speedup", again["values"]["best_speedup"]) == pytest.approx(
        best["metrics"]["best_speedup"])
    assert {p.split("/")[-1] for p in out["plots"]} == {"history-best_speedup.png"}
    assert len(out["leave_one_task_out"]) == 3
    # The same command with more trials resumes the study: only the rest run.
    more = tune(tmp_path, *rnd, "--trials", "8", "--study", "a", "--validate-seeds", "0")
    assert (more["trials"], more["ran_now"]) == (8, 3) and more["out_of_sample"] == []
    done = tune(tmp_path, *rnd, "--trials", "8", "--study", "a", "--validate-seeds", "0")
    assert done["ran_now"] == 0
    res = runner.invoke(app, ["tune", "--log", "synthetic-mini", *rnd,
                              "--objective", "best_speedup,usd", "--storage",
                              f"sqlite:///{tmp_path}/s.db", "--study", "a"])
    assert res.exit_code == 2 and "exists with directions" in res.output


def test_pareto_front_and_constraints(tmp_path):
    out = tune(tmp_path, "--param", "tau=0.2:0.99", "--objective", "best_speedup:max,usd:min",
               "--sampler", "nsga2", "--trials", "8", "--study", "mo", "--validate-seeds", "0",
               "--plot", str(tmp_path / "p"))
    front = out["pareto_front"]
    assert front and all(r["pareto"] for r in front)
    everyone = out["top"]
    for f in front:  # no finished trial dominates a front member
        for o in everyone:
            assert not (o["values"][0] >= f["values"][0] and o["values"][1] <= f["values"][1]
                        and o["values"] != f["values"])
    assert any(p.endswith("pareto-front.png") for p in out["plots"])
    limit = min(t["metrics"]["usd"] for t in everyone) + 0.01
    con = tune(tmp_path, "--param", "tau=0.2:0.99", "--constraint", f"usd<={limit}",
               "--trials", "6", "--study", "c", "--validate-seeds", "0")
    rows = con["top"]
    assert any(not r["feasible"] for r in rows) or all(r["metrics"]["usd"] <= limit
                                                       for r in rows)
    feasible = [r for r in rows if r["feasible"]]
    if feasible:
        assert con["best"]["feasible"] and con["best"]["metrics"]["usd"] <= limit


def test_the_puct_search_shape_is_tuned_with_the_policy(tmp_path):
    out = tune(tmp_path, "--driver", "puct", "--log", "synthetic-puct-v1", "--param",
               "tau=0.5:0.9", "--param", "overgen=1:3", "--param", "steps=3:4", "--trials",
               "3", "--study", "p", "--validate-seeds", "0")
    for r in out["top"]:
        assert r["search"]["overgen"] == r["params"]["overgen"]
        assert r["search"]["steps"] == r["params"]["steps"]
        assert r["spec"].startswith("threshold:tau=")


def test_several_workers_share_one_journal_study(tmp_path):
    """Two worker processes on one JournalStorage file: every trial finishes exactly once."""
    code = ("from gfsim.cli.main import app; app(['tune', '--log', 'synthetic-mini', "
            "'--param', 'tau=0.3:0.99', '--seeds', '2', '--trials', '10', '--workers', '2', "
            "'--study', 'w', '--validate-seeds', '0', '--json'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["trials"] == 10 and out["storage"] == "w.journal"
    import optuna
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="w", storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(tmp_path / "w.journal"))))
    states = [t.state for t in study.trials]
    numbers = [t.number for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 10
    assert len(numbers) == len(set(numbers))
    assert all(s == optuna.trial.TrialState.COMPLETE for s in states)


def test_the_default_storage_is_a_journal_file_and_an_old_sqlite_study_resumes(tmp_path,
                                                                             monkeypatch):
    from gfsim.tuning.study import storage_url

    monkeypatch.chdir(tmp_path)
    args = ["tune", "--log", "synthetic-mini", "--seeds", "1", "--param", "tau=0.3:0.99",
            "--validate-seeds", "0", "--json"]
    res = runner.invoke(app, [*args, "--trials", "2", "--study", "fresh"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["storage"] == "fresh.journal"
    assert (tmp_path / "fresh.journal").exists() and not (tmp_path / "fresh.db").exists()
    # A study an earlier gfsim kept in NAME.db goes on there.
    res = runner.invoke(app, [*args, "--trials", "2", "--study", "old", "--storage",
                              "sqlite:///old.db"])
    assert res.exit_code == 0, res.output
    assert storage_url(None, "old", 1) == "sqlite:///old.db"
    res = runner.invoke(app, [*args, "--trials", "3", "--study", "old"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["storage"] == "sqlite:///old.db" and (out["trials"], out["ran_now"]) == (3, 1)


@pytest.mark.parametrize("kind", ["corrupt", "folder", "no-parent"])
def test_a_journal_storage_that_cannot_be_used_is_one_line_and_left_as_it_is(tmp_path, kind):
    path = tmp_path / "s.journal"
    if kind == "corrupt":
        path.write_text('{"op_code": 0, "worker_id": "w"\n{not json\n')
    elif kind == "folder":
        path.mkdir()
    else:
        path = tmp_path / "missing" / "s.journal"
    before = path.read_bytes() if kind == "corrupt" else None
    res = runner.invoke(app, ["tune", "--log", "synthetic-mini", "--param", "tau=0.3:0.99",
                              "--trials", "1", "--storage", str(path), "--study", "j"])
    assert res.exit_code == 2, res.output
    assert f"--storage {path}:" in res.output and "Traceback" not in res.output
    assert ("not a journal file" if kind == "corrupt" else "cannot be opened") in res.output
    if before is not None:
        assert path.read_bytes() == before


def tune_here(*args, code=0):
    """``gfsim tune`` in the current folder, with the default study name and storage."""
    res = runner.invoke(app, ["tune", "--log", "synthetic-puct-v1", "--seeds", "2",
                              "--validate-seeds", "1", "--trials", "2", *args, "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res.stderr


BASE = ("--param", "tau=0.3:0.99")


@pytest.mark.parametrize("other, named", [
    (("--policy", "random", "--param", "p=0.1:0.9"), "policy=threshold, not random"),
    (("--param", "tau=0.5:0.9"), 'params=["tau=0.3:0.99"], not ["tau=0.5:0.9"]'),
    (("--driver", "puct", "--seeds", "1", *BASE), "driver=trace, not puct"),
])
def test_another_configuration_starts_another_study_and_is_refused_under_one_name(
        tmp_path, monkeypatch, other, named):
    monkeypatch.chdir(tmp_path)
    first = tune_here(*BASE)
    second = tune_here(*other)
    # By default each configuration has its own study: the second ran its own trials.
    assert first["study"] != second["study"] and second["study"].startswith("gfsim-tune-")
    assert (second["trials"], second["ran_now"]) == (2, 2)
    assert first["configuration"] != second["configuration"]
    # Under one explicit name the second is refused, in one line naming the difference.
    tune_here(*BASE, "--study", "same")
    err = tune_here(*other, "--study", "same", code=2)
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("gfsim: error: study 'same' in same.journal was made with ")
    assert named in err and "use another --study name or the same settings" in err


def test_the_same_command_resumes_its_own_study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tune_here(*BASE)
    # --jobs, --top, --validate-seeds and --seeds (which cannot change a trial here) are
    # not part of what the study is.
    again = tune_here(*BASE, "--jobs", "1", "--top", "1", "--seeds", "3")
    assert again["study"] == first["study"] and again["storage"] == f"{first['study']}.journal"
    assert (again["trials"], again["ran_now"]) == (2, 0)
    assert [r["values"] for r in again["top"]] == [r["values"] for r in first["top"]]
    more = tune_here(*BASE, "--trials", "3")
    assert (more["study"], more["trials"], more["ran_now"]) == (first["study"], 3, 1)
    import optuna

    from gfsim.tuning.study import make_storage

    study = optuna.load_study(study_name=first["study"],
                              storage=make_storage(first["storage"]))
    assert study.user_attrs["gfsim_configuration"] == first["configuration"]
    assert first["configuration"]["log_sha256"] and first["configuration"]["policy"] == \
        "threshold"


def test_a_deterministic_configuration_replays_each_trial_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tune_here(*BASE, "--seeds", "4")
    assert out["seeds"] == 1 and out["seeds_requested"] == 4
    assert out["deterministic"].startswith("deterministic configuration: each trial replayed "
                                           "once; seeds cannot change it (")
    assert out["out_of_sample"] == [] and out["fresh_seeds"] == []
    assert out["configuration"]["seeds"] is None
    import optuna

    from gfsim.tuning.study import make_storage

    study = optuna.load_study(study_name=out["study"], storage=make_storage(out["storage"]))
    assert all(len(t.user_attrs["values_best_speedup"]) == 1 for t in study.trials)
    res = runner.invoke(app, ["tune", "--log", "synthetic-puct-v1", *BASE, "--seeds", "4",
                              "--trials", "2"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "deterministic configuration: each trial replayed once" in text
    assert "1 seed each" in text and "out of sample" not in text
    # A policy that reads the seed keeps them all, and the fresh-seed check.
    rnd = tune_here("--policy", "random", "--param", "p=0.1:0.9", "--seeds", "3")
    assert rnd["seeds"] == 3 and rnd["deterministic"] is None
    assert "random" in rnd["seed_dependence"]
    assert len(rnd["out_of_sample"]) == 2 and rnd["fresh_seeds"] == [3]
    res = runner.invoke(app, ["tune", "--log", "synthetic-puct-v1", "--policy", "random",
                              "--param", "p=0.1:0.9", "--seeds", "3", "--trials", "2"])
    text = " ".join(res.stdout.split())
    assert "3 seeds each" in text and "out of sample: 3 fresh seeds" in text
    assert "deterministic" not in text


def test_which_search_spaces_the_seed_can_change():
    from gfsim.tuning.trials import seed_dependence_of_space

    s = setup()
    for policy, specs, driver, seeded in (
        ("threshold", ["tau=0.3:0.99", "score=maxprob|margin"], "trace", False),
        ("topk", ["k=1:4"], "trace", False),
        ("all", [], "trace", False),
        ("threshold", ["coverage=0.2:0.9"], "trace", True),  # calibrates on a keyed split
        ("threshold", ["coverage=0.2:0.9", "cal_frac=0.5:1.0"], "trace", True),
        ("threshold", ["cal_frac=0.5:1.0"], "trace", False),  # no coverage: no calibration
        ("random", ["p=0.1:0.9"], "trace", True),
        ("threshold", ["tau=0.3:0.99"], "puct", True),  # the closed loop draws children
    ):
        params = [parse_param(t, policy, driver) for t in specs]
        the = replace(s, policy=policy, driver=driver)
        assert (seed_dependence_of_space(the, params) is not None) == seeded, (policy, specs)


def test_a_study_from_an_older_gfsim_is_adopted_when_its_settings_agree(tmp_path,
                                                                      monkeypatch):
    import optuna

    from gfsim.tuning.study import make_storage

    monkeypatch.chdir(tmp_path)
    storage = make_storage("old.journal")
    old = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    old.set_user_attr("setup", {"log": "synthetic-puct-v1", "cost": "serverless-a100",
                                "policy": "threshold", "forecaster": None, "driver": "trace",
                                "children": "fallback", "budget": None, "seeds": 2, "seed": 0,
                                "params": ["tau=0.3:0.99"]})
    old.add_trial(optuna.trial.create_trial(
        params={"tau": 0.5}, distributions={"tau": optuna.distributions.FloatDistribution(
            0.3, 0.99)}, value=0.5, user_attrs={"spec": "threshold:tau=0.5"}))
    where = ("--study", "old", "--storage", "old.journal", "--validate-seeds", "0")
    err = tune_here("--param", "tau=0.3:0.9", *where, code=2)
    assert 'params=["tau=0.3:0.99"], not ["tau=0.3:0.9"]' in err
    out = tune_here(*BASE, *where)
    assert (out["trials"], out["ran_now"]) == (2, 1)
    assert any("older gfsim" in n for n in out["notes"])
    study = optuna.load_study(study_name="old", storage=make_storage("old.journal"))
    assert study.user_attrs["gfsim_configuration"] == out["configuration"]
    # A study that holds trials and records nothing (not made by gfsim tune) is refused.
    bare = optuna.create_study(study_name="bare", storage=storage, direction="maximize")
    bare.add_trial(optuna.trial.create_trial(
        params={"tau": 0.5}, distributions={"tau": optuna.distributions.FloatDistribution(
            0.3, 0.99)}, value=1.0))
    err = tune_here(*BASE, "--study", "bare", "--storage", "old.journal", code=2)
    assert "holds trials but no record of the settings" in err
