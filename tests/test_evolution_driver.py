"""The evolutionary closed-loop driver (simulator.closed.evolution): the user's own search re-run.

Deliver 3 of issue 51: an OpenEvolve or ShinkaEvolve run is re-run with islands, an elite
archive and migration as its tool selects parents, with the settings its run recorded;
``--driver closed`` chooses it from the log; the configuration that was run reproduces the
log's best (within 10%, inside its own 90% predictive interval)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.cost_models import load_cost_model
from gfsim.importers.openevolve import import_openevolve
from gfsim.importers.shinka import import_shinka
from gfsim.policies import make_policy
from gfsim.replay_logs.log import load_log
from gfsim.simulator.closed.evolution import EvolutionArchive, EvolutionConfig
from gfsim.simulator.predictive import reproduce_log
from gfsim.simulator.closed.puct import ArchiveNode, ChildResult
from gfsim.simulator.replay import replay_many

DATA = Path(__file__).parent / "data"
MODEL = "serverless-a100"


@pytest.fixture(scope="module")
def oe_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("oe") / "oe.jsonl"
    import_openevolve(DATA / "openevolve" / "run", out, runtime_metric="runtime_ns")
    return out


@pytest.fixture(scope="module")
def oe_trace_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("oet") / "oet.jsonl"
    import_openevolve(DATA / "openevolve-trace" / "run", out, runtime_metric="runtime_ns")
    return out


@pytest.fixture(scope="module")
def shinka_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("sh") / "sh.jsonl"
    import_shinka(DATA / "shinka" / "run", out)
    return out


def _run_record(path: Path) -> dict:
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "run":
            return rec
    raise AssertionError("no run record")


def _archive(**cfg) -> EvolutionArchive:
    seed_step = cfg.pop("seed_step", True)
    config = replace(EvolutionConfig.for_tool(cfg.pop("tool", "openevolve"), cfg),
                     seed_step=seed_step)
    return EvolutionArchive(ArchiveNode("root", 1.0, (), is_seed=True), config,
                            stream(0, "test"))


def _grow(archive: EvolutionArchive, rewards, steps_from: int = 0):
    """Complete steps of one parent each, child i with reward rewards[i]."""
    for i, r in enumerate(rewards):
        parents = archive.select_parents(1)
        archive.complete_step(parents, [ChildResult(parents[0].node_id, f"c{steps_from + i}",
                                                    r)])
    return archive


# -- the importers record the run's own settings -------------------------------------------------
def test_openevolve_run_record_holds_its_database_settings(oe_log):
    conf = _run_record(oe_log)["configuration"]["openevolve"]
    # tests/data/openevolve/inputs/config.yaml: database section
    assert conf["selection"] == {"islands": 2, "archive_size": 4, "population_size": 6,
                                 "migration_interval": 3, "migration_rate": 0.5}
    assert conf["selection_from"] == "inputs/config.yaml (database section)"


def test_shinka_run_record_holds_the_islands_it_sits_on(shinka_log):
    conf = _run_record(shinka_log)["configuration"]["shinka"]
    assert conf["selection"] == {"islands": 2}
    assert "no configuration file" in conf["selection_from"]


def test_settings_not_recorded_are_the_tools_defaults_and_say_so():
    cfg = EvolutionConfig.for_tool("openevolve", {"islands": 2, "archive_size": 4})
    d = cfg.as_dict()
    assert (d["islands"], d["archive_size"]) == (2, 4)
    assert d["exploitation_ratio"] == 0.7 and "exploitation_ratio" in d["defaults"]
    assert d["from_config"] == ["archive_size", "islands"]
    assert EvolutionConfig.for_tool("shinka").strategy == "weighted"


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(GfsimError, match="power_law"):
        EvolutionConfig(strategy="tournament")


# -- the archive's rules ---------------------------------------------------------------------------
def test_islands_take_turns_and_children_join_their_slots_island():
    a = _grow(_archive(islands=3, seed_step=False, migration_interval=100), [1.1, 1.2, 1.3])
    # round robin: child i joined island i (the seed sits on island 0)
    assert a.island_members == [["root", "c0"], ["c1"], ["c2"]]


def test_the_first_step_measures_the_initial_program_which_replaces_the_root():
    a = _archive(islands=2, migration_interval=100)
    p = a.select_parents(1)
    assert p[0].node_id == "root"
    a.complete_step(p, [ChildResult("root", "init", 1.0)])
    assert [m.node_id for m in a.nodes] == ["init"] and a.island_members[0] == ["init"]


def test_elite_archive_keeps_the_best_and_population_drops_the_worst():
    a = _grow(_archive(islands=1, archive_size=2, population_size=3, seed_step=False,
                       migration_interval=100), [1.5, 0.5, 2.0, 0.7])
    assert sorted(a.elite, key=lambda i: -a.fitness[i]) == ["c2", "c0"]
    # the worst left (c1 at 0.5, then the seed at 1.0); the best and the newcomer stay
    assert {m.node_id for m in a.nodes} == {"c0", "c2", "c3"}


def test_migration_copies_each_islands_best_to_its_neighbours():
    a = _grow(_archive(islands=3, seed_step=False, migration_interval=1, migration_rate=0.1),
              [1.1])  # c0 joins island 0 beside the seed; one generation: migrate
    assert "c0" in a.island_members[1] and "c0" in a.island_members[2]
    assert a.last_migration == 1


def test_openevolve_keeps_failed_children_shinka_does_not():
    oe = _grow(_archive(islands=1, seed_step=False), [None])
    sh = _grow(_archive(tool="shinka", islands=1, seed_step=False), [None])
    assert "c0" in oe.fitness and oe.fitness["c0"] == 0.0
    assert "c0" not in sh.fitness


def test_openevolve_mixes_exploration_exploitation_and_fitness_weights():
    a = _grow(_archive(islands=1, seed_step=False, archive_size=1, migration_interval=100,
                       exploration_ratio=0.2, exploitation_ratio=0.5), [3.0])
    ids, p = a.parent_distribution(0)
    prob = {i: float(p[[k for k, j in enumerate(ids) if j == i]].sum()) for i in set(ids)}
    # elite (archive 1): c0; explore: 0.1 each; weighted 0.3 x (1/4, 3/4)
    assert prob["c0"] == pytest.approx(0.1 + 0.5 + 0.3 * 0.75)
    assert prob["root"] == pytest.approx(0.1 + 0.3 * 0.25)


def test_power_law_ranks_by_reward():
    a = _grow(_archive(tool="shinka", strategy="power_law", islands=1, seed_step=False,
                       exploitation_alpha=2.0, migration_interval=100), [3.0, 2.0])
    ids, p = a.parent_distribution(0)
    w = np.array([1, 1 / 4, 1 / 9])
    assert ids == ["c0", "c1", "root"] and np.allclose(p, w / w.sum())


def test_weighted_favours_the_better_and_the_less_expanded():
    a = _grow(_archive(tool="shinka", strategy="weighted", islands=1, seed_step=False,
                       migration_interval=100), [3.0, 2.0])
    ids, p = a.parent_distribution(0)
    f = np.array([a.fitness[i] for i in ids])  # median 2, MAD 1: sigmoid(10 (f - 2))
    w = 1 / (1 + np.exp(-10 * (f - 2.0))) / (1 + np.array([a.children[i] for i in ids]))
    assert np.allclose(p, w / w.sum())
    assert sum(a.children.values()) == 2 and p[ids.index("c0")] > p[ids.index("root")]


def test_beam_search_stays_on_the_best_for_num_beams_children_and_hill_climbing_on_the_best():
    a = _archive(tool="shinka", strategy="beam_search", num_beams=2, islands=1,
                 seed_step=False, migration_interval=100)
    picks = []
    for i, r in enumerate([2.0, 1.5, 3.0, 0.5]):
        p = a.select_parents(1)
        picks.append(p[0].node_id)
        a.complete_step(p, [ChildResult(p[0].node_id, f"c{i}", r)])
    assert picks == ["root", "root", "c0", "c0"]
    h = _grow(_archive(tool="shinka", strategy="hill_climbing", islands=1, seed_step=False,
                       migration_interval=100), [2.0, 1.0])
    assert h.select_parents(1)[0].node_id == "c0"


# -- both engines, one keyed stream ----------------------------------------------------------------
@pytest.mark.parametrize("which", ["oe_log", "shinka_log"])
def test_fast_path_agrees_with_simpy_engine_exactly(which, request):
    log = load_log(request.getfixturevalue(which))
    model = load_cost_model(MODEL)
    seeds = list(range(6))
    got = {}
    for engine in ("des", "fast"):
        runs = replay_many(log, [make_policy("all") for _ in seeds], model, seeds,
                           driver="closed", engine=engine, children="model",
                           orphans_dropped=False)
        got[engine] = [(s.best_speedup, s.gpu_evals, s.wall_s, s.table["candidate_id"],
                        s.table["parent_node"], s.table["draw_source"], s.extra["driver"])
                       for r in runs for s in r.searches]
    assert got["des"] == got["fast"]
    assert {g[-1] for g in got["fast"]} == {"evolution"}
    assert len({tuple(g[4]) for g in got["fast"]}) > 1  # seeds choose other parents


# -- --driver closed chooses from the log ----------------------------------------------------------
def _replay_json(*args) -> dict:
    res = CliRunner().invoke(app, ["replay", "-p", "all", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_driver_closed_chooses_evolution_for_openevolve_and_says_so(oe_log):
    out = _replay_json("-l", str(oe_log), "--driver", "closed")
    assert out["driver"] == "evolution (openevolve)" and out["driver_requested"] == "closed"
    assert out["selection"]["islands"] == 2 and out["selection"]["archive_size"] == 4
    assert any(n.startswith("evolution driver on 1 of 1 searches") for n in out["notes"])
    text = CliRunner().invoke(app, ["replay", "-p", "all", "-l", str(oe_log), "--driver",
                                    "closed"]).output
    assert "chose evolution (openevolve) from the log" in " ".join(text.split())
    forced = _replay_json("-l", str(oe_log), "--driver", "puct", "--simulate")
    assert forced["driver"] == "puct" and "selection" not in forced


def test_driver_closed_chooses_shinka_rules_for_shinka(shinka_log):
    out = _replay_json("-l", str(shinka_log), "--driver", "closed")
    assert out["driver"] == "evolution (shinka, weighted)"


def test_driver_closed_keeps_puct_for_a_puct_log():
    closed = _replay_json("-l", "synthetic-puct-v1", "--driver", "closed", "-b", "steps=4")
    puct = _replay_json("-l", "synthetic-puct-v1", "--driver", "puct", "-b", "steps=4")
    assert closed["driver"] == "puct"
    assert closed["best_speedup"] == puct["best_speedup"]
    assert closed["gpu_evals"] == puct["gpu_evals"]


# -- the configuration that was run reproduces the log ---------------------------------------------
@pytest.mark.parametrize("which", ["oe_log", "oe_trace_log", "shinka_log"])
def test_the_configuration_that_ran_reproduces_the_logged_best(which, request):
    """The configuration the log ran (all, F = 1, its own shape), re-run by the run's own
    algorithm on 20 seeds: its best within 10% of the logged best, which lies inside its own
    90% predictive interval."""
    r = reproduce_log(load_log(request.getfixturevalue(which)), load_cost_model(MODEL),
                      range(20), driver="closed")
    assert r["driver"] == "evolution"
    assert abs(r["mean"] / r["logged"] - 1.0) <= 0.10, r
    assert r["lo"] <= r["logged"] <= r["hi"], r
    assert math.isfinite(r["lo"]) and math.isfinite(r["hi"]) and r["within_10"] and r["inside"]


# -- selection pressure from the log's own parent choices ------------------------------------------
def _logged_search(config: EvolutionConfig, steps: int, seed: int = 3):
    """A search run by ``config``'s archive, written down as a trace's columns (what
    ``selection_fit`` reads): each child's speedup its parent's times a log-normal step."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    archive = EvolutionArchive(ArchiveNode("seed", 1.0, (), is_seed=True), config,
                               stream(seed, "logged"))
    t = SimpleNamespace(step=[], parent=[], candidate_ids=[], outcome=[], speedup=[],
                        seed_speedup=1.0)
    where = {}
    for step in range(steps):
        parent = archive.select_parents(1)[0]
        speedup = 1.0 if step == 0 else parent.reward * float(np.exp(rng.normal(0, 0.2)))
        cid = f"c{step}"
        where[cid] = len(t.candidate_ids)
        t.step.append(step)
        t.parent.append(where.get(parent.node_id, -1))
        t.candidate_ids.append(cid)
        t.outcome.append("success")
        t.speedup.append(speedup)
        archive.complete_step([parent], [ChildResult(parent.node_id, cid, speedup)])
    return t


@pytest.mark.parametrize("truth", [0.1, 0.7])
def test_exploitation_share_is_recovered_from_the_parents_a_search_chose(truth):
    from gfsim.simulator.selection_fit import fit_selection

    run_with = EvolutionConfig.for_tool("openevolve", {
        "islands": 2, "archive_size": 5, "exploitation_ratio": truth, "migration_interval": 20})
    fits = [fit_selection(_logged_search(run_with, 300, seed), replace(
        run_with, exploitation_ratio=0.4)) for seed in range(5)]
    # a 90% interval: it holds the truth in most of five searches, and the estimates centre
    covered = sum(f["interval_90"][0] <= truth <= f["interval_90"][1] for f in fits)
    assert covered >= 4 and abs(np.mean([f["estimate"] for f in fits]) - truth) <= 0.1, fits
    assert sum(not f["configured_consistent"] for f in fits) >= 4  # 0.4 is told apart
    assert all(f["outside_model"] == 0 and f["choices"] == 300 for f in fits)


def test_power_law_exponent_is_recovered():
    from gfsim.simulator.selection_fit import fit_selection

    run_with = EvolutionConfig.for_tool("shinka", {"strategy": "power_law", "islands": 1,
                                                   "exploitation_alpha": 2.0})
    fit = fit_selection(_logged_search(run_with, 200), run_with)
    assert fit["interval_90"][0] <= 2.0 <= fit["interval_90"][1], fit
    assert fit["configured_consistent"]


def test_the_fixtures_parent_choices_fit_their_settings_and_not_puct(oe_log):
    out = _replay_json("-l", str(oe_log), "--driver", "closed")
    fit = out["selection_fit"]["run"]
    assert fit["parameter"] == "exploitation_ratio" and fit["configured"] == 0.7
    assert fit["choices"] == 14 and fit["configured_consistent"]
    assert fit["puct_agrees"] < fit["choices"] - fit["outside_model"]


def test_recommend_takes_driver_closed_and_its_incumbent_interval_holds_the_log(oe_log):
    res = CliRunner().invoke(app, ["recommend", "-l", str(oe_log), "--driver", "closed",
                                   "--seeds", "6", "--json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)["recommendation"]
    now = rec["configs"][0]["best_speedup"]
    assert rec["configs"][0]["config"] == "all F=1" and rec["fresh_seeds"]
    assert now["lo"] <= 1.6390505262610449 <= now["hi"]
