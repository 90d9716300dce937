"""Worlds (gfsim.worlds.protocol): the built-in family, a user's world file, the conformance test
and the counterfactual benchmark's measures (all SYNTHETIC but the Kernel Tuner runtimes)."""

import hashlib
import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from gfsim.replay_logs import load_log
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.worlds.benchmark import BenchSpec, compare_sources, summarize_world
from gfsim.worlds.conformance import check_world
from gfsim.worlds.family import world_names, world_seeds
from gfsim.worlds.kernel_tuner import find_cache
from gfsim.worlds.protocol import resolve_world

runner = CliRunner()
EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "tile_world.py")
# The frozen family (gfsim/worlds/data/family.json): this hash changes only with a new family.
FAMILY_SHA256 = "159e605fe791b11029f8bac49862cd203aec7d8d3ac71d8aef55b217154379a1"


def test_the_family_file_is_frozen():
    data = resources.files("gfsim.worlds").joinpath("data/family.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == FAMILY_SHA256, (
        "family.json changed: the benchmark's worlds are frozen; add a new family instead")
    fam = json.loads(data)
    assert len(fam["worlds"]) >= 6
    kinds = {w["kind"] for w in fam["worlds"]}
    assert {"landscape", "nk", "kernel-tuner"} <= kinds
    assert set(world_seeds("dev", 50)).isdisjoint(world_seeds("heldout", 50))


def test_every_family_world_reads_data_the_package_ships(monkeypatch, tmp_path):
    """A regular install (``.ci/run``: ``pip install .``, run from outside the checkout) skipped
    the two kt-* worlds: their caches lived in tests/data, found only through a variable the
    tests set. Every file a family world reads must be matched by pyproject's package-data globs
    (what a wheel holds) and be read from the installed package, with no variable set, an
    empty home and another working folder."""
    import tomllib

    from gfsim.worlds.family import family

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["gfsim.worlds"]
    source = root / "gfsim" / "worlds"
    packaged = {p.relative_to(source).as_posix() for g in globs for p in source.glob(g)}
    installed = Path(str(resources.files("gfsim.worlds"))).resolve()
    monkeypatch.delenv("GFSIM_KERNEL_TUNER_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    needs = [w for w in family()["worlds"] if w.get("caches")]
    assert needs, "the family has Kernel Tuner worlds"
    for w in needs:
        world = resolve_world(w["name"])[1](world_seeds("heldout", 1)[0])
        assert len(world.tasks) == len(w["caches"])
        for name in w["caches"]:
            assert f"data/kernel_tuner/{name}" in packaged, f"{name}: not package data"
            assert find_cache(name).resolve().is_relative_to(installed)


@pytest.mark.parametrize("name", world_names())
def test_every_built_in_world_conforms(name):
    _, factory, seeded = resolve_world(name)
    assert seeded
    assert check_world(factory(7), factory, seed=7) == []
    # Another seed is another world.
    a, b = factory(7), factory(8)
    ra, rb = a.root(a.tasks[0].task_id), b.root(b.tasks[0].task_id)
    assert [a.evaluation(a.child(ra, i)) if a.generation(a.child(ra, i)).get("failed_reason")
            is None else None for i in range(6)] != \
        [b.evaluation(b.child(rb, i)) if b.generation(b.child(rb, i)).get("failed_reason")
         is None else None for i in range(6)]


def test_a_users_world_file_conforms_and_loads_by_path():
    name, factory, seeded = resolve_world(f"{EXAMPLE}:make_world")
    assert seeded and check_world(factory(3), factory, seed=3) == []
    # An instance is one world whatever the seed.
    _, inst, seeded = resolve_world("gfsim.worlds.landscape:Landscape")
    assert seeded and inst(2).seed == 2


class _Sequential:
    """A world that draws children from one shared generator: not keyed."""

    def __init__(self, seed=0):
        from gfsim.worlds.landscape import Landscape

        self.inner = Landscape(seed=seed, n_tasks=1)
        self.tasks = self.inner.tasks
        self.rng = np.random.default_rng(seed)

    def task(self, t):
        return self.inner.task(t)

    def root(self, t):
        return self.inner.root(t)

    def child(self, parent, index):
        return self.inner.child(parent, int(self.rng.integers(0, 10**6)))

    def generation(self, node):
        return self.inner.generation(node)

    def forecast(self, node, forecaster="x", repeat=0):
        return self.inner.forecast(node, forecaster, repeat)

    def evaluation(self, node):
        return self.inner.evaluation(node)

    def provenance(self):
        return self.inner.provenance()


class _Milliseconds(_Sequential):
    """Keyed, but its runtime is in milliseconds where the schema says nanoseconds."""

    def child(self, parent, index):
        return self.inner.child(parent, index)

    def evaluation(self, node):
        rec = dict(self.inner.evaluation(node))
        if "runtime_ns" in rec:
            rec["runtime_ns"] /= 1e6
        return rec


class _BadRecords(_Milliseconds):
    def evaluation(self, node):
        rec = dict(self.inner.evaluation(node))
        rec["compile_s"] = "fast"
        return rec


def test_conformance_catches_unkeyed_worlds_wrong_units_and_bad_records():
    problems = check_world(_Sequential(1))
    assert any("another order" in p or "again" in p for p in problems), problems
    problems = check_world(_Milliseconds(1))
    assert any("runtime_ns" in p and "ns" in p for p in problems), problems
    problems = check_world(_BadRecords(1))
    assert any("compile_s" in p for p in problems), problems


def test_bad_world_specs_are_one_line_errors(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom')\n")
    nothing = tmp_path / "nothing.py"
    nothing.write_text("x = 1\n")
    for spec, words in ((f"{bad}:make", "importing it failed"), (f"{nothing}:make", "has no"),
                        (f"{nothing}:x", "neither a world"),
                        ("no_such_module_x:W", "cannot import"),
                        (f"{tmp_path}/absent.py:W", "no such file"),
                        ("kernel-tuner:absent.json.gz", "not found"),
                        ("just-a-name", "no such world; valid: family, landscape-heavy-drift")):
        res = runner.invoke(app, ["counterfactual", "--world", spec, "--seeds", "2"])
        assert res.exit_code == 2, (spec, res.output)
        assert words in res.stderr and "Traceback" not in res.output, (spec, res.stderr)


def test_synth_writes_a_valid_log_for_any_world_and_a_replay_reproduces_it(tmp_path):
    from dataclasses import replace

    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.simulator import replay
    from gfsim.simulator.closed.engine import SEARCH_PRESETS

    out = tmp_path / "nk.jsonl"
    res = runner.invoke(app, ["synth", "--world", "nk-heavy", "--driver", "puct", "--steps", "8",
                              "--seed", "5", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    log = load_log(out, cache=False)
    assert log.header["provenance"]["world"]["world"] == "nk"
    config = replace(SEARCH_PRESETS["paper-standard"], steps=8)
    r = replay(log, make_policy("all"), load_cost_model("serverless-a100"), driver="puct",
               search=config)
    summary = json.loads(res.stdout)
    for s in r.searches:
        assert s.extra["fallback_share"] == 0
        assert s.best_speedup == pytest.approx(summary["best_speedup"][s.task_id])
    again = tmp_path / "again.jsonl"
    runner.invoke(app, ["synth", "--world", "nk-heavy", "--driver", "puct", "--steps", "8",
                        "--seed", "5", "-o", str(again)])
    assert again.read_bytes() == out.read_bytes()
    res = runner.invoke(app, ["synth", "--world", "nk-heavy", "-o", str(again), "-n", "10"])
    assert res.exit_code == 2 and "--driver puct" in res.stderr


def test_nk_world_duplicates_and_failures():
    _, factory, _ = resolve_world("nk-light-fragile")
    w = factory(4)
    root = w.root(w.tasks[0].task_id)
    kids = [w.child(root, i) for i in range(400)]
    codes = [k.code_id for k in kids]
    assert len(set(codes)) < len(codes)  # one-site mutations revisit kernels
    for k in kids:  # the same kernel always fails, or not, the same way (but for no kernel)
        same = [j for j in kids if j.code_id == k.code_id and j.outcome != "generation_failed"]
        if k.outcome != "generation_failed":
            assert {j.outcome for j in same} == {k.outcome}
    assert {"compile_failed", "success"} <= {k.outcome for k in kids}


def test_kernel_tuner_world_changes_one_parameter_and_reports_the_cached_measurement():
    path = find_cache("convolution_milo_A100.json.gz")
    from gfsim.importers.kernel_tuner import read_configs
    from gfsim.worlds.kernel_tuner import KernelTunerWorld

    configs, meta = read_configs(path)
    by_key = {c[0]: c for c in configs}
    w = KernelTunerWorld([str(path)], seed=3)
    t = w.tasks[0]
    ref_ms = t.reference_runtime_ns / 1e6
    ran = sorted(c[3] for c in configs if c[2] == "success")
    assert ref_ms == pytest.approx(float(np.median(ran)), rel=1e-9)
    node = w.root(t.task_id)
    for i in range(60):
        child = w.child(node, i)
        a, b = by_key[node.code_id][1], by_key[child.code_id][1]
        assert sum(a[k] != b[k] for k in a) == 1
        cached = by_key[child.code_id]
        assert child.outcome == cached[2]
        ev = w.evaluation(child)
        assert ev["compile_s"] == pytest.approx(cached[4] / 1e3, rel=1e-6)
        if child.outcome == "success":
            assert child.speedup == pytest.approx(ref_ms / cached[3], rel=1e-5)
            node = child


def test_world_children_replicates_and_the_shared_cache():
    from dataclasses import replace

    from gfsim.simulator.closed.engine import SEARCH_PRESETS

    from gfsim.worlds.synth_puct import run_on_world

    _, factory, _ = resolve_world("landscape-overconfident")
    w = factory(2)
    task = w.tasks[0].task_id
    config = replace(SEARCH_PRESETS["paper-standard"], steps=6, overgen=2)
    plain = run_on_world(w, task, config, "topk:4", seed=1, replicate=1)[0]
    cache: dict = {}
    run_on_world(w, task, config, "all", seed=1, replicate=1, cache=cache)
    shared = run_on_world(w, task, config, "topk:4", seed=1, replicate=1, cache=cache)[0]
    assert shared.table["candidate_id"] == plain.table["candidate_id"]
    assert shared.best_speedup == plain.best_speedup and shared.total.usd == plain.total.usd
    other = run_on_world(w, task, config, "topk:4", seed=1, replicate=2)[0]
    assert set(other.table["candidate_id"]).isdisjoint(plain.table["candidate_id"])


def _rows(replay_fn, direct_fn, n_w=6, cells=(("all", 1), ("all", 2), ("topk:4", 2))):
    rng = np.random.default_rng(0)
    rows = []
    for w in range(n_w):
        level = rng.normal()
        out = []
        for i, (p, f) in enumerate(cells):
            d = [level + direct_fn(i) + 0.01 * rng.normal() for _ in range(2)]
            r = [level + replay_fn(i) + 0.01 * rng.normal() for _ in range(3)]
            out.append({"policy": p, "overgen": f, "replay": {"fallback": r}, "direct": d,
                        "draw_shares": {"fallback": {"own": 1.0}},
                        "replay_evals": {"fallback": 1.0}, "direct_evals": 1.0,
                        "replay_usd": {"fallback": 1.0}, "direct_usd": 1.0})
        rows.append({"world": "toy", "kind": "synthetic", "tasks": ["t"], "world_seed": w,
                     "usd_budget": 1.0, "cells": out})
    return rows


def test_the_measures_reward_a_faithful_replay_and_punish_a_reversed_one():
    spec = BenchSpec(policies=("all", "topk:4"), overgens=(1, 2), replay_seeds=3,
                     direct_reps=2, children="fallback")
    cells = (("all", 1), ("all", 2), ("topk:4", 1), ("topk:4", 2))
    good = summarize_world(_rows(lambda i: 0.5 * i, lambda i: 0.5 * i, cells=cells), spec)
    m = good["measures"]
    assert m["tau"] == pytest.approx(1.0) and m["noise_ceiling_tau"] == pytest.approx(1.0)
    assert m["pairs_ordered"] == 1.0 and m["pairs_over_margin"] == 6
    assert m["regret_of_replay_pick"] == pytest.approx(0.0)
    assert m["regret_of_all_f1"] == pytest.approx(1 - 2 ** -1.5, abs=0.02)
    assert all(abs(c["bias_log2"]["mean"]) < 0.02 for c in good["cells"])
    # The between-world level cancels in the centred standard errors.
    assert max(c["se"]["direct"] for c in good["cells"]) < 0.04
    assert not good["warnings"]
    bad = summarize_world(_rows(lambda i: -0.5 * i, lambda i: 0.5 * i, cells=cells), spec)
    mb = bad["measures"]
    assert mb["tau"] == pytest.approx(-1.0) and mb["pairs_ordered"] == 0.0
    assert mb["regret_of_replay_pick"] == pytest.approx(1 - 2 ** -1.5, abs=0.02)
    assert mb["coverage_90"] < 0.5 and mb["interval_score_mean"] > m["interval_score_mean"]
    assert mb["regret_of_argmax"] == pytest.approx(mb["regret_of_replay_pick"])
    assert mb["replay_picks"] == {"all F=1": 6}  # no gain detectable: the incumbent
    assert mb["coverage_90_difference"] < 0.5 < m["coverage_90_difference"]
    # The expected gain's intervals (the replays' own, without fresh searches) hold the other
    # world seeds' mean gain where the replay is faithful, and never where it is reversed.
    assert mb["expected_gain_curve"]["0.90"] == 0.0 < 0.5 < m["expected_gain_curve"]["0.90"]
    top = bad["cells"][-1]
    assert top["bias_log2"]["hi"] < -1.0  # replay -1.5 against direct +1.5: far off
    noisy = summarize_world(_rows(lambda i: 3.0 * np.sin(7 * i), lambda i: 0.5 * i,
                                  cells=cells), spec)
    assert noisy["warnings"] == [] or "world seeds" in noisy["warnings"][0]
    # The targets: met by the faithful replay (but coverage: its seeds barely spread), missed
    # by the reversed one, each by a stated amount.
    t, tb = m["targets"], mb["targets"]
    assert t["tau"]["met"] and t["pairs_ordered"]["met"] and t["regret"]["met"]
    assert t["bias_interval"]["met"]
    assert not tb["tau"]["met"] and tb["tau"]["miss"] == pytest.approx(0.8 + 1.0)
    assert not tb["bias_interval"]["met"] and tb["bias_interval"]["miss"] > 1.0
    assert tb["pairs_ordered"]["miss"] == pytest.approx(0.9)


def test_the_ranking_targets_score_what_the_recommendation_ranks_by():
    # The replays order the cells backwards by a little; the fresh searches (what the expected
    # gain reads) order them right by a lot: the recommendation ranks by the mean of the two
    # gains, so its ranking is right while the replays' alone is reversed, and the targets
    # score its ranking, naming the replays' beside it.
    spec = BenchSpec(policies=("all", "topk:4"), overgens=(1, 2), replay_seeds=3,
                     direct_reps=2, fresh_seeds=3, children="fallback")
    cells = (("all", 1), ("all", 2), ("topk:4", 1), ("topk:4", 2))
    rows = _rows(lambda i: -0.2 * i, lambda i: 0.5 * i, cells=cells)
    rng = np.random.default_rng(1)
    for row in rows:
        for i, c in enumerate(row["cells"]):
            c["fresh"] = [1.0 * i + 0.01 * rng.normal() for _ in range(3)]
    m = summarize_world(rows, spec)["measures"]
    assert m["tau"] == pytest.approx(-1.0) and m["pairs_ordered"] == 0.0
    assert m["ranking_tau"] == pytest.approx(1.0) and m["ranking_pairs_ordered"] == 1.0
    t = m["targets"]
    assert t["tau"]["met"] and t["tau"]["value"] == pytest.approx(1.0)
    assert t["tau"]["replays"] == pytest.approx(-1.0)
    assert t["pairs_ordered"]["met"] and t["pairs_ordered"]["replays"] == 0.0
    # Reversed fresh searches reverse it too (the targets can fail on the ranking).
    for row in rows:
        for i, c in enumerate(row["cells"]):
            c["fresh"] = [-1.0 * i + 0.01 * rng.normal() for _ in range(3)]
    mb = summarize_world(rows, spec)["measures"]
    assert mb["ranking_tau"] == pytest.approx(-1.0) and not mb["targets"]["tau"]["met"]


def test_two_child_sources_are_judged_against_the_same_direct_runs():
    spec = BenchSpec(policies=("all", "topk:4"), overgens=(1, 2), replay_seeds=3,
                     direct_reps=2, children="fallback,model")
    assert spec.children == ("fallback", "model")
    cells = (("all", 1), ("all", 2), ("topk:4", 1), ("topk:4", 2))
    rows = _rows(lambda i: -0.5 * i, lambda i: 0.5 * i, cells=cells)
    good = _rows(lambda i: 0.5 * i, lambda i: 0.5 * i, cells=cells)
    for row, g in zip(rows, good):  # the model's replays are the faithful ones
        for c, gc in zip(row["cells"], g["cells"]):
            gc["direct"] = c["direct"]
            for k in ("replay", "draw_shares", "replay_evals", "replay_usd"):
                c[k]["model"] = gc[k]["fallback"]
    fb, mo = summarize_world(rows, spec, "fallback"), summarize_world(rows, spec, "model")
    assert fb["children"] == "fallback" and mo["children"] == "model"
    assert fb["measures"]["noise_ceiling_tau"] == mo["measures"]["noise_ceiling_tau"]
    versus = compare_sources([fb, mo])["toy"]["model"]
    assert versus["tau"]["better"] and versus["max_abs_bias"]["better"]
    assert versus["tau"]["fallback"] == pytest.approx(-1.0)
    with pytest.raises(GfsimError, match="each once"):
        BenchSpec(children="model,model")
    with pytest.raises(GfsimError, match="unknown child source"):
        BenchSpec(children="fallback,nope")


def test_counterfactual_json_on_a_users_world(tmp_path):
    res = runner.invoke(app, ["counterfactual", "--world", f"{EXAMPLE}:make_world", "--seeds",
                              "2", "--steps", "5", "--policies", "all,topk:2", "--overgen",
                              "1,2", "--replay-seeds", "2", "--direct-reps", "2", "--jobs", "1",
                              "--fresh-seeds", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    (w,) = out["worlds"]
    assert w["measures"]["fresh_seeds"] == 2
    assert list(w["measures"]["coverage_curve"]) == ["0.50", "0.80", "0.90", "0.95"]
    assert w["world_seeds"] == [0, 1] and len(w["cells"]) == 4
    base = next(c for c in w["cells"] if c["policy"] == "all" and c["overgen"] == 1)
    assert base["fallback_share"] == 0 and base["draw_shares"] == {"own": 1.0}
    for c in w["cells"]:
        assert math.isclose(sum(c["draw_shares"].values()), 1.0, rel_tol=1e-6)
        assert c["replay_usd"] <= w["usd_budget_mean"] * 1.5
    m = w["measures"]
    for key in ("noise_ceiling_tau", "tau", "pairs_ordered", "regret_of_replay_pick",
                "regret_of_all_f1", "coverage_90", "interval_width_median", "max_cell_se"):
        assert key in m
    assert w["warnings"]  # two seeds cannot reach a 0.04 standard error, and it says so


def test_counterfactual_runs_several_worlds_repeated_or_by_commas():
    """-w A -w B kept only B, and --world A,B was refused: both run A and B, in order, once."""
    small = ["--seeds", "2", "--steps", "3", "--policies", "all,topk:2", "--overgen", "1,2",
             "--replay-seeds", "2", "--direct-reps", "2", "--jobs", "1", "--json"]
    runs = {}
    for worlds in (["-w", "nk-heavy", "-w", "landscape-overconfident"],
                   ["--world", "nk-heavy,landscape-overconfident,nk-heavy"]):
        res = runner.invoke(app, ["counterfactual", *worlds, *small])
        assert res.exit_code == 0, (worlds, res.output)
        out = json.loads(res.stdout)
        assert [w["world"] for w in out["worlds"]] == ["nk-heavy", "landscape-overconfident"]
        assert out["world_seeds"] == world_seeds("heldout", 2)
        runs[len(worlds)] = out["worlds"]
    assert runs[2] == runs[4]
    res = runner.invoke(app, ["counterfactual", "-w", "nk-heavy,nk-haevy", "--seeds", "2"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert "--world 'nk-haevy': no such world; valid: family, landscape-heavy-drift" in res.stderr


def test_world_specs_split_on_commas_but_keep_a_specs_own_list():
    from gfsim.api.counterfactual import _world_specs

    assert _world_specs(["h200:softmax,layernorm,nk-heavy", "kernel-tuner:a.json,b.json"]) == (
        ["h200:softmax,layernorm", "nk-heavy", "kernel-tuner:a.json,b.json"], set())
    names, optional = _world_specs(["nk-heavy,family"])
    assert names == ["nk-heavy", *[n for n in world_names() if n != "nk-heavy"]]
    assert optional == set(world_names()) - {"nk-heavy"}  # only these may be skipped
    with pytest.raises(GfsimError, match="`world`: empty"):
        _world_specs([" , "])


def test_counterfactual_rejects_bad_options():
    for args, words in ((["--children", "nope"], "unknown child source"),
                        (["--seeds", "1"], "--seeds must be >= 2"),
                        (["--overgen", "1,x"], "whole numbers"),
                        (["--policies", "all", "--overgen", "1"], "at least two"),
                        (["--split", "train"], "unknown split"),
                        (["--policies", "nope:1"], "nope")):
        res = runner.invoke(app, ["counterfactual", "--world", "nk-heavy", *args])
        assert res.exit_code == 2, (args, res.output)
        assert words in res.stderr, (args, res.stderr)


def test_keyed_streams_are_what_worlds_rely_on():
    a = stream(3, "t", "p", 5).random(4)
    stream(3, "t", "p", 4).random(9)
    assert np.array_equal(a, stream(3, "t", "p", 5).random(4))


def test_assert_world_conforms_for_users_tests():
    from gfsim.worlds.conformance import assert_world_conforms

    _, factory, _ = resolve_world(f"{EXAMPLE}:make_world")
    assert_world_conforms(lambda seed: factory(seed), seed=2)
    with pytest.raises(AssertionError, match="another order|again"):
        assert_world_conforms(_Sequential(2))


def test_counterfactual_runs_on_the_whole_built_in_family_in_a_small_form():
    res = runner.invoke(app, ["counterfactual", "--seeds", "2", "--steps", "3", "--policies",
                              "all,topk:2", "--overgen", "1,2", "--replay-seeds", "2",
                              "--direct-reps", "2", "--jobs", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["split"] == "heldout" and out["world_seeds"] == world_seeds("heldout", 2)
    ran = [w["world"] for w in out["worlds"]]
    assert ran == world_names() and out["skipped"] == {}  # the kt-* caches ship with gfsim
    for w in out["worlds"]:
        exact = next(c for c in w["cells"] if c["policy"] == "all" and c["overgen"] == 1)
        assert exact["fallback_share"] == 0
        assert w["kind"] == ("measured" if w["world"].startswith("kt-") else "synthetic")


def test_counterfactual_compares_child_sources_and_the_docs_tables_render(tmp_path):
    res = runner.invoke(app, ["counterfactual", "--world", f"{EXAMPLE}:make_world", "--seeds",
                              "2", "--steps", "5", "--policies", "all,topk:2", "--overgen",
                              "1,2", "--replay-seeds", "2", "--direct-reps", "2", "--jobs", "1",
                              "--children", "fallback,model", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    fb, mo = out["worlds"]
    assert (fb["children"], mo["children"]) == ("fallback", "model")
    # The same direct runs judge both sources.
    assert [c["direct_log2"] for c in fb["cells"]] == [c["direct_log2"] for c in mo["cells"]]
    over = next(c for c in mo["cells"] if c["overgen"] == 2)
    assert over["draw_shares"].get("model", 0) > 0 and "fallback" not in over["draw_shares"]
    assert set(out["against_fallback"][mo["world"]]["model"]) >= {"tau", "max_abs_bias"}
    assert set(mo["measures"]["targets"]) == {"tau", "pairs_ordered", "bias_interval",
                                              "regret", "coverage", "calibration",
                                              "expected_gain", "new_search_gain"}
    for key in ("expected_gain_curve", "new_search_gain_curve"):
        curve = mo["measures"][key]
        assert list(curve) == ["0.50", "0.80", "0.90", "0.95"]
        assert all(0.0 <= v <= 1.0 for v in curve.values())
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cf_bench", Path(__file__).resolve().parents[1] / "experiments/counterfactual_benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.render(out, 1.0)
    assert "Targets, `model`:" in text and f"### `{mo['world']}`" in text
    assert text.count("| `all` | 1 |") == 1  # one row per cell, both sources in it


def test_nk_flat_tables_read_what_the_numpy_tables_hold():
    """The NK world reads its effect and illegal-pair tables as flat lists; a kernel's log2
    runtime and legality must be what the (sites, values, ...) arrays give, summed in site
    order, for the family's shapes and odd ones (k = 0, k = sites - 1, 16 values)."""
    import random

    from gfsim.worlds.nk import NKParams, NKWorld

    rnd = random.Random(3)
    for params in (NKParams(), NKParams(sites=5, values=3, k=4),
                   NKParams(sites=2, values=16, k=0), NKParams(effect_df=1.5)):
        w = NKWorld(params, 100001, 3)
        for tid in w._tables:
            tab, ill = w._tables[tid], w._illegal[tid]
            for _ in range(300):
                x = tuple(rnd.randrange(params.values) for _ in range(params.sites))
                n, k = len(x), params.k
                want = float(sum(tab[(i, *(x[(i + j) % n] for j in range(k + 1)))]
                                 for i in range(n)))
                assert w._log2_runtime(tid, x) == want
                assert w._has_illegal(tid, x) == any(ill[i, x[i], x[(i + 1) % n]]
                                                     for i in range(n))


def test_counterfactual_json_is_the_same_on_one_process_and_on_two():
    """The figures of ``gfsim counterfactual`` must not depend on how its world seeds are
    spread over processes (nor on the order they finish in): every draw is keyed. Two child
    sources and two kinds of world, so the per-source rows, the comparison and a measured
    world's notes all go through both paths."""
    args = ["counterfactual", "--world", "nk-light-fragile,kt-mi250x-overconfident", "--seeds",
            "2", "--steps", "4", "--policies", "all,topk:2,ev:10", "--overgen", "1,2",
            "--replay-seeds", "2", "--direct-reps", "2", "--children", "fallback,model",
            "--json"]
    outs = []
    for jobs in ("1", "2"):
        res = runner.invoke(app, [*args, "--jobs", jobs])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out.pop("settings")["options"]["jobs"] == int(jobs)  # how each was made
        assert out.pop("ran_on")["workers"] == int(jobs)  # and where it ran
        outs.append(json.dumps(out))
    assert outs[0] == outs[1]
    out = json.loads(outs[0])
    assert [(w["world"], w["children"]) for w in out["worlds"]] == [
        ("nk-light-fragile", "fallback"), ("nk-light-fragile", "model"),
        ("kt-mi250x-overconfident", "fallback"), ("kt-mi250x-overconfident", "model")]


def test_predictive_intervals_cover_new_searches_at_their_level():
    """Replays and direct runs drawn from one distribution: the calibration curve is the
    levels; direct runs with three times the spread: every level falls short."""
    spec = BenchSpec(policies=("all", "topk:4"), overgens=(1, 2), replay_seeds=6,
                     direct_reps=2, children="fallback")
    cells = (("all", 1), ("all", 2), ("topk:4", 1), ("topk:4", 2))

    def rows(direct_sd, n_w=400, seed=1):
        rng = np.random.default_rng(seed)
        out = []
        for w in range(n_w):
            level = rng.normal()
            cs = [{"policy": p, "overgen": f,
                   "replay": {"fallback": (level + 0.1 * i + rng.normal(0, 0.3, 6)).tolist()},
                   "direct": (level + 0.1 * i + rng.normal(0, 0.3 * direct_sd, 2)).tolist(),
                   "draw_shares": {"fallback": {"own": 1.0}},
                   "replay_evals": {"fallback": 1.0}, "direct_evals": 1.0,
                   "replay_usd": {"fallback": 1.0}, "direct_usd": 1.0}
                  for i, (p, f) in enumerate(cells)]
            out.append({"world": "toy", "kind": "synthetic", "tasks": ["t"], "world_seed": w,
                        "usd_budget": 1.0, "cells": cs})
        return out

    m = summarize_world(rows(1.0), spec)["measures"]
    for level, got in m["coverage_curve"].items():
        assert abs(got - float(level)) < 0.03, (level, got)
    assert m["targets"]["calibration"]["met"] and m["targets"]["coverage"]["met"]
    wide = summarize_world(rows(3.0), spec)["measures"]
    assert all(got < float(level) - 0.1 for level, got in wide["coverage_curve"].items())
    assert wide["targets"]["calibration"]["met"] is False
