"""Plug-ins (gfsim.core.plugins): policies, forecasters, cost models and worlds of other packages,
registered in code or found through entry points, and the contract classes a plug-in's tests
subclass."""

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, distribution

import numpy as np
import pytest

from gfsim.core.errors import GfsimError, SpecError
from gfsim.core.plugins import PluginError, Registry
from gfsim.policies import POLICIES, Decisions, Policy, make_policy, register_policy
from gfsim.testing import ForecasterContract, PolicyContract


class _Never(Policy):
    name = "test-never"
    state_fields = ()

    def decide(self, batch, state):
        n = len(batch)
        return Decisions.build(np.zeros(n, bool), np.zeros(n), ("never",) * n)


def test_a_registry_keeps_gfsim_s_names_and_refuses_to_lose_a_plugin_s():
    reg = Registry("gfsim.test-nothing", "thing", {"own": 1})
    assert reg.register(2, "mine") == "mine" and reg["mine"] == 2
    assert list(reg) == ["own", "mine"] and reg.builtins() == ["own"]
    with pytest.raises(PluginError, match="'own' names gfsim's own thing;"):
        reg.register(3, "own")
    with pytest.raises(PluginError, match="'mine' is taken by 2"):
        reg.register(3, "mine")
    reg.register(3, "mine", replace=True)
    assert reg["mine"] == 3
    for bad in ("", "a:b", "a b", "x,y", None):
        with pytest.raises(PluginError, match="its name must be"):
            reg.register(4, bad)
    reg.unregister("mine")
    assert "mine" not in reg
    deferred = type("EntryPoint", (), {"name": "later", "value": "pkg:Thing"})()
    from gfsim.core.plugins import _Deferred

    reg._items["later"] = _Deferred(deferred, reg)  # an entry point not imported yet
    with pytest.raises(PluginError, match=r"taken by entry point later = pkg:Thing"):
        reg.register(5, "later")
    with pytest.raises(PluginError):
        reg.unregister("own")


def test_a_policy_registered_in_code_is_a_spec_everywhere():
    register_policy(_Never)
    try:
        assert make_policy("test-never") == _Never()
        assert "test-never" in POLICIES and not POLICIES.builtin("test-never")
        import gfsim

        out = gfsim.compare(None, "test-never").to_dict()
        assert out["policy"] == "test-never" and out["gpu_evals"] == 0
        same = gfsim.compare(None, _Never()).to_dict()  # an object: the same replay
        assert same["best_speedup"] == out["best_speedup"]
    finally:
        POLICIES.unregister("test-never")
    with pytest.raises(SpecError, match="unknown policy 'test-never'"):
        make_policy("test-never")


def test_what_is_not_a_policy_is_refused_with_its_reason():
    with pytest.raises(PluginError, match="not a subclass of gfsim.policies.Policy"):
        register_policy(dict)

    class NoDecide(Policy):
        name = "test-no-decide"

    with pytest.raises(PluginError, match="does not define decide"):
        register_policy(NoDecide)

    class Shadow(_Never):
        name = "threshold"

    with pytest.raises(PluginError, match="'threshold' names gfsim's own policy"):
        register_policy(Shadow)
    with pytest.raises(SpecError, match="a policy is a spec"):
        make_policy(3)


def test_a_cost_model_and_a_world_registered_in_code_are_names():
    from gfsim.cost_models import PRESETS, load_cost_model, register_cost_model
    from gfsim.worlds.family import builtin_factory
    from gfsim.worlds.protocol import WORLDS, register_world, resolve_world

    base = load_cost_model("reserved-h100")
    register_cost_model("test-mine", lambda: base)
    register_world("test-world", builtin_factory("nk-heavy"))
    try:
        assert load_cost_model("test-mine") is base and load_cost_model(base) is base
        with pytest.raises(SpecError, match="a plug-in's, which takes no keys"):
            load_cost_model("test-mine:gpus=2")
        name, factory, seeded = resolve_world("test-world")
        assert name == "test-world" and seeded and factory(3).tasks
        with pytest.raises(PluginError, match="one of gfsim's own worlds"):
            register_world("nk-heavy", builtin_factory("nk-heavy"))
    finally:
        PRESETS.unregister("test-mine")
        WORLDS.unregister("test-world")


PLUGIN = '''
import numpy as np
from gfsim.core.specs import Param
from gfsim.policies import Decisions, Policy


class Coin(Policy):
    """Measure a candidate when its keyed coin (from its id) lands heads."""

    name = "coin"
    summary = "measure each candidate with probability p, by its id"
    params = (Param("p", float, 0.5, "the probability of measuring", low=0.0, high=1.0),)
    state_fields = ()

    def decide(self, batch, state):
        n = len(batch)
        u = np.array([(hash(c) % 1000) / 1000 for c in batch.candidate_ids])
        return Decisions.build(u < self.p, u, ("coin",) * n)


def spot():
    import dataclasses
    from gfsim.cost_models import load_cost_model
    base = load_cost_model("serverless-a100")
    return dataclasses.replace(base, name="spot")


def lines(source, task="t"):
    from gfsim.testing import LogBuilder
    b = LogBuilder(tasks={task: 1.0})
    for line in open(source).read().split():
        b.candidate(task, step=0, speedup=float(line))
    return [b.header, *b.records]
'''


def _fake_distribution(tmp_path, entry_points: str):
    """A package on a path of its own with a dist-info holding ``entry_points``: what an
    installed plug-in looks like to importlib.metadata."""
    (tmp_path / "fake_gfsim_plugin.py").write_text(PLUGIN)
    info = tmp_path / "fake_gfsim_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gfsim-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONHASHSEED="0")
    return env


def _gfsim(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "gfsim.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_entry_points_make_another_package_s_policy_and_cost_model_specs(tmp_path):
    env = _fake_distribution(tmp_path, """
        [gfsim.policies]
        coin = fake_gfsim_plugin:Coin
        [gfsim.cost_models]
        spot = fake_gfsim_plugin:spot
        [gfsim.importers]
        lines = fake_gfsim_plugin:lines
        """)
    (tmp_path / "speedups.txt").write_text("1.5\n0.8\n2.25\n")
    got = _gfsim(["import", "plugin", "lines", "speedups.txt", "-o", "lines.jsonl", "--option",
                  "task=softmax", "--json"], env, tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["candidates"] == 3
    got = _gfsim(["replay", "--log", "lines.jsonl", "--policy", "all", "--json"], env, tmp_path)
    assert got.returncode == 0 and json.loads(got.stdout)["best_speedup"] == 2.25, got.stderr
    got = _gfsim(["import", "plugin", "lines", "speedups.txt", "-o", "x.jsonl", "--option",
                  "colour=red"], env, tmp_path)
    assert got.returncode != 0 and "unexpected keyword argument 'colour'" in got.stderr
    assert not (tmp_path / "x.jsonl").exists()
    got = _gfsim(["replay", "--policy", "coin:0.3", "--cost", "spot", "--json"], env, tmp_path)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["policy"] == "coin:p=0.3" and out["cost_model"] == "spot"
    assert 0 < out["gpu_evals"] < out["baseline"]["gpu_evals"]
    listed = _gfsim(["policies"], dict(env, COLUMNS="200"), tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "coin" in listed.stdout and "(plug-in: fake_gfsim_plugin)" in listed.stdout


def test_a_broken_entry_point_is_an_error_that_names_it(tmp_path):
    env = _fake_distribution(tmp_path, """
        [gfsim.policies]
        coin = fake_gfsim_plugin:NoSuchThing
        heads = fake_gfsim_plugin:Coin
        """)
    got = _gfsim(["replay", "--policy", "coin", "--json"], env, tmp_path)
    assert got.returncode != 0
    said = " ".join(got.stderr.split())
    assert "entry point coin = fake_gfsim_plugin:NoSuchThing (group gfsim.policies)" in said
    got = _gfsim(["replay", "--policy", "heads", "--json"], env, tmp_path)
    assert got.returncode != 0
    assert "the object is named 'coin', not 'heads'" in " ".join(got.stderr.split())
    ok = _gfsim(["replay", "--policy", "threshold:0.7", "--json"], env, tmp_path)
    assert ok.returncode == 0, ok.stderr  # gfsim's own names never touch the broken one


class _LiesAboutState(_Never):
    """Says its decisions read no state field, but reads the step."""

    name = "test-liar"

    def decide(self, batch, state):
        n = len(batch)
        return Decisions.build(np.full(n, state.step < 10), np.zeros(n), ("liar",) * n)


class _WritesIntoItsInput(_Never):
    name = "test-writer"

    def decide(self, batch, state):
        batch.probs[:, 0] = 0.0
        return super().decide(batch, state)


def test_the_contract_catches_a_policy_that_breaks_it():
    register_policy(_LiesAboutState)
    register_policy(_WritesIntoItsInput)
    try:
        class Liar(PolicyContract):
            specs = ("test-liar",)

        class Writer(PolicyContract):
            specs = ("test-writer",)

        Liar().test_one_decision_per_row()  # it keeps the rest
        with pytest.raises(AssertionError, match="step"):
            Liar().test_state_fields_name_what_decisions_read()
        with pytest.raises(ValueError, match="read-only"):
            Writer().test_decisions_are_deterministic_and_pure()
        with pytest.raises(AssertionError, match="set specs"):
            PolicyContract().test_one_decision_per_row()
    finally:
        POLICIES.unregister("test-liar")
        POLICIES.unregister("test-writer")


def test_the_example_plugin_installed_is_found_by_its_entry_points():
    """examples/plugin, which CI installs beside gfsim (its own tests run there too)."""
    try:
        distribution("gfsim-plugin-example")
    except PackageNotFoundError:
        if os.environ.get("GFSIM_REQUIRE_PLUGIN_EXAMPLE") == "1":
            pytest.fail("examples/plugin is not installed (GFSIM_REQUIRE_PLUGIN_EXAMPLE=1)")
        pytest.skip("examples/plugin is not installed (pip install ./examples/plugin)")
    from gfsim.cost_models import load_cost_model

    policy = make_policy("budget-share:0.25")
    assert type(policy).__module__ == "gfsim_plugin_example" and policy.share == 0.25
    from gfsim.forecasts import make_forecaster

    forecaster = make_forecaster("parent-prior:0.5")
    assert type(forecaster).__module__ == "gfsim_plugin_example" and forecaster.width == 0.5
    assert load_cost_model("spot-a100").gpu.usd_per_hour < \
        load_cost_model("serverless-a100").gpu.usd_per_hour


def test_an_importer_plugin_writes_a_whole_log_or_nothing(tmp_path):
    from gfsim.importers.plugins import IMPORTERS, import_with, register_importer
    from gfsim.replay_logs import load_log
    from gfsim.testing import LogBuilder

    def good(source, task="t"):
        b = LogBuilder(tasks={task: 1.0})
        b.candidate(task, step=0, speedup=1.5)
        return [b.header, *b.records]

    def broken(source):
        records = good(source)
        del records[0]["tasks"]  # a header without its tasks
        return records

    register_importer("test-good", good)
    register_importer("test-broken", broken)
    register_importer("test-nothing", lambda source: [])
    source = tmp_path / "run.txt"
    source.write_text("x")
    try:
        summary = import_with("test-good", source, tmp_path / "good.jsonl", {"task": "k"})
        assert summary["candidates"] == 1 and load_log(tmp_path / "good.jsonl").tasks
        with pytest.raises(GfsimError, match="do not validate"):
            import_with("test-broken", source, tmp_path / "broken.jsonl")
        assert not list(tmp_path.glob("broken*"))
        with pytest.raises(PluginError, match="not a non-empty list of records"):
            import_with("test-nothing", source, tmp_path / "nothing.jsonl")
        with pytest.raises(SpecError, match="unknown importer plug-in 'nope'"):
            import_with("nope", source, tmp_path / "nope.jsonl")
        with pytest.raises(PluginError, match="names gfsim's own importer"):
            register_importer("openevolve", good)
    finally:
        for name in ("test-good", "test-broken", "test-nothing"):
            IMPORTERS.unregister(name)


# -- forecasters -----------------------------------------------------------------------------
class TestGfsimsOwnForecasters(ForecasterContract):
    """gfsim's own forecasters keep the contract a plug-in's must (the live vLLM one is checked
    against a real server in tests/test_forecaster.py)."""

    specs = ("paper:gemini3-flash", "synthetic:sigma=0.5,beta=0.3", "learned",
             "costmodel:min_train=4")


def _echo_class():
    """A forecaster plug-in registered in code: every candidate in the bin its parent's
    speedup falls in (a made-up rule, for the test)."""
    from gfsim.forecasts import Forecast, Forecaster

    class Echo(Forecaster):
        prefix, mode, kind = "test-echo", "echo", "assumed"

        def __init__(self, spec="test-echo"):
            self.name = spec

        def forecast(self, request):
            probs = [0.0] * 8
            probs[4 if (request.parent_speedup or 1.0) >= 1.0 else 3] = 1.0
            return Forecast(request.candidate_id, self.name, self.mode, probs,
                            raw_probability_sum=1.0, predicted_bin=probs.index(1.0) + 1)

    return Echo


def test_a_forecaster_registered_in_code_is_a_spec_and_objects_pass_through(tmp_path):
    import gfsim
    from gfsim.api.forecast import make_forecaster as make_for_command
    from gfsim.forecasts import FORECASTERS, LoggedForecaster, make_forecaster, register_forecaster
    from gfsim.forecasts.provenance import forecast_source
    from gfsim.forecasts.registry import kind_of

    echo = register_forecaster(_echo_class())
    try:
        made = make_forecaster("test-echo:x")
        assert isinstance(made, echo) and made.name == "test-echo:x"
        assert make_forecaster(made) is made and kind_of("test-echo") == "assumed"

        class Contract(ForecasterContract):
            specs = ("test-echo",)

        Contract().test_forecasts_are_distributions_or_recorded_failures()
        Contract().test_each_spec_builds_a_named_forecaster_that_offers_something()
        # It forecasts one candidate at a time, so a replay is told how to get its forecasts.
        with pytest.raises(GfsimError, match="write its forecasts into the log first"):
            gfsim.compare(None, "threshold:0.6", forecaster="test-echo")
        # A name no maker has is a logged forecaster's; `gfsim forecast` refuses it by name.
        assert isinstance(make_forecaster("my-llm"), LoggedForecaster)
        with pytest.raises(SpecError, match="no forecaster goes by 'my-llm'; known: paper"):
            make_for_command("my-llm")
        # What a plug-in's forecasts rest on is said from its kind, not "origin not recorded".
        from gfsim.replay_logs import open_log
        from gfsim.forecasts.attach import attach_records
        from gfsim.testing.contracts import contract_requests

        log = open_log(None)
        recs = [f.record() for f in made.forecast_many(contract_requests(3))]
        for r, cid in zip(recs, log.candidates["candidate_id"]):
            r["candidate_id"] = cid
        src = forecast_source(attach_records(log, recs, made.name, made.mode), made.name)
        assert src["kind"] == "assumed" and "plug-in forecaster test-echo:x" in src["text"]
    finally:
        FORECASTERS.unregister("test-echo")


def test_the_forecaster_contract_catches_one_that_breaks_it():
    from gfsim.forecasts import FORECASTERS, Forecast, Forecaster, register_forecaster

    class Unnormalised(Forecaster):
        prefix, mode = "test-unnormalised", "bad"

        def __init__(self, spec):
            self.name = spec

        def forecast(self, request):
            return Forecast(request.candidate_id, self.name, self.mode, [0.5] * 8)

    class Nothing(Unnormalised):
        prefix = "test-nothing"

        def forecast(self, request):
            return Forecaster.forecast(self, request)  # refuses, as the base class does

    register_forecaster(Unnormalised)
    register_forecaster(Nothing)
    try:
        class Bad(ForecasterContract):
            specs = ("test-unnormalised",)

        class Empty(ForecasterContract):
            specs = ("test-nothing",)

        with pytest.raises(AssertionError):
            Bad().test_forecasts_are_distributions_or_recorded_failures()
        with pytest.raises(AssertionError, match="offers neither"):
            Empty().test_each_spec_builds_a_named_forecaster_that_offers_something()
        with pytest.raises(PluginError, match="a maker is a callable"):
            register_forecaster(42, "test-number")
    finally:
        FORECASTERS.unregister("test-unnormalised")
        FORECASTERS.unregister("test-nothing")


def test_the_live_forecaster_is_found_through_gfsim_s_own_entry_point():
    """vllm: plugs in as a plug-in would (its module needs the live extra, loaded when named)."""
    from gfsim.forecasts import make_forecaster
    from gfsim.forecasts.registry import kind_of

    assert kind_of("vllm:http://x,model=m") == "llm"
    f = make_forecaster("vllm:http://127.0.0.1:9,model=m,mode=tool")
    assert (f.kind, f.mode, type(f).__name__) == ("llm", "tool", "VllmForecaster")


def test_recommend_and_tune_take_policy_objects_as_well_as_specs(tmp_path):
    """A Policy (or a (policy, F) pair) is named by its spec(); a Policy class is tuned by its
    name: the same answers as the specs give."""
    import gfsim
    from gfsim.policies.surrogate import ThresholdPolicy

    by_spec = gfsim.recommend("synthetic-mini", ["topk:k=2", "threshold:tau=0.7"], driver="trace",
                              prices=False, seeds=1, jobs=1)
    by_object = gfsim.recommend("synthetic-mini", [make_policy("topk:2"), ThresholdPolicy(tau=0.7)],
                                driver="trace", prices=False, seeds=1, jobs=1)
    assert by_object["recommendation"] == by_spec["recommendation"]
    from gfsim.tuning.recommend import parse_config

    from gfsim.simulator.closed.engine import SEARCH_PRESETS

    pair = parse_config((make_policy("topk:2"), 2), "puct", SEARCH_PRESETS["paper-standard"])
    assert (pair.spec, pair.search.overgen, pair.label) == ("topk:k=2", 2, "topk:k=2 F=2")
    with pytest.raises(GfsimError, match="expected POLICY\\[@F\\], a Policy or a"):
        parse_config(42, "trace", None)
    by_class = gfsim.tune("synthetic-mini", ThresholdPolicy, "tau=0.3:0.99", trials=2, seeds=1,
                          storage=f"sqlite:///{tmp_path / 'a.db'}", recommend=False)
    by_name = gfsim.tune("synthetic-mini", "threshold", "tau=0.3:0.99", trials=2, seeds=1,
                         storage=f"sqlite:///{tmp_path / 'b.db'}", recommend=False)
    assert by_class.data["policy"] == "threshold"
    assert by_class.best["params"] == by_name.best["params"]
