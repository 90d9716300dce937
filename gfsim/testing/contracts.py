"""Contract tests a plug-in's own test suite subclasses (as Optuna's ``BasicSamplerTestCase``).

A policy plug-in's tests say which specs to check; every ``test_*`` method then runs on each
(plain ``assert``: pytest collects them from a class named ``Test...``)::

    from gfsim.testing import PolicyContract

    class TestCoin(PolicyContract):
        specs = ("coin", "coin:0.25")

The contract is ``gfsim.policies.Policy``'s: parameters stored unchanged and written back by
``spec()`` (so specs, caches and worker processes can rebuild the policy), one decision per
row, pure and deterministic decisions that never write into their inputs, ``decide_groups``
equal to ``decide`` batch by batch, and ``state_fields`` honest (decisions do not move with a
field it leaves out). gfsim's own policies pass it (``tests/test_conformance.py``).
``CostModelContract`` does the same for a cost-model plug-in's names (each loads, prices
every stage with no negative figure, and loads equal again), ``ForecasterContract`` for a
forecaster plug-in's specs (``gfsim.forecasts.protocol``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.policies.base import Batch, SearchState

__all__ = ["CostModelContract", "ForecasterContract", "PolicyContract", "contract_batch",
           "contract_requests"]


def _frozen(a) -> np.ndarray:
    a = np.array(a)
    a.setflags(write=False)  # a policy that writes into its inputs fails loudly
    return a


def contract_batch(n: int, seed: int = 0, unusable=()) -> Batch:
    """A batch of ``n`` candidates with random forecasts over the paper's bins (rows
    ``unusable`` a failed parse), random truths (a fifth failed), read-only arrays."""
    rng = np.random.default_rng(seed)
    parse_failed = np.zeros(n, bool)
    for i in unusable:
        parse_failed[i] = True
    probs = rng.dirichlet(np.full(8, 0.5), size=n)
    probs[parse_failed] = 0.0
    truth = np.where(rng.random(n) < 0.2, np.nan, rng.lognormal(0, 0.7, n))
    return Batch(candidate_ids=tuple(f"c{seed}-{i}" for i in range(n)), probs=_frozen(probs),
                 has_forecast=_frozen(np.ones(n, bool)), parse_failed=_frozen(parse_failed),
                 base_speedup=_frozen(np.ones(n)), bin_edges=PAPER_EDGES,
                 true_speedup=_frozen(truth))


STATE = SearchState("s", "t", step=3, best_speedup=1.3, gpu_evals=10, seed=11, measure_usd=0.2,
                    budget_left={"usd": 5.0, "seconds": 3600.0})


class PolicyContract:
    """Subclass it with ``specs``: the policy specs to check (a plug-in's name must be
    registered, ``register_policy`` or the ``gfsim.policies`` entry point)."""

    specs: tuple[str, ...] = ()

    def policies(self):
        from gfsim.policies import make_policy

        assert self.specs, f"{type(self).__name__}: set specs to the policy specs to check"
        for spec in self.specs:
            yield spec, make_policy(spec).fit(contract_batch(200, seed=99), seed=11)

    def test_the_spec_rebuilds_an_equal_policy(self):
        from gfsim.policies import make_policy

        for spec, _ in self.policies():
            policy = make_policy(spec)
            again = type(policy)(**policy.get_params())
            assert again.get_params() == policy.get_params(), spec
            assert make_policy(policy.spec()) == policy, (spec, policy.spec())

    def test_one_decision_per_row(self):
        for spec, policy in self.policies():
            for n in (0, 1, 7):
                d = policy.decide(contract_batch(n), STATE)
                assert d.measure.dtype == bool and d.measure.shape == (n,), spec
                assert d.score.shape == (n,) and len(d.reason) == n, spec

    def test_decisions_are_deterministic_and_pure(self):
        from gfsim.policies import make_policy

        batch = contract_batch(16, seed=3, unusable=(2,))
        for spec, policy in self.policies():
            first, second = policy.decide(batch, STATE), policy.decide(batch, STATE)
            assert first.measure.tolist() == second.measure.tolist(), spec
            assert list(first.reason) == list(second.reason), spec
            fresh = make_policy(spec).fit(contract_batch(200, seed=99), seed=11)
            assert fresh.decide(batch, STATE).measure.tolist() == first.measure.tolist(), spec

    def test_decide_groups_equals_decide_batch_by_batch(self):
        batch = contract_batch(12, seed=5, unusable=(4,))
        group = np.repeat(np.arange(3), 4)
        best = np.repeat([1.0, 1.6, 2.4], 4)
        for spec, policy in self.policies():
            together = policy.decide_groups(batch, group, best, STATE)
            for g in range(3):
                rows = slice(4 * g, 4 * g + 4)
                alone = policy.decide(batch.take(rows), dataclasses.replace(
                    STATE, best_speedup=float(best[4 * g])))
                assert together.measure[rows].tolist() == alone.measure.tolist(), (spec, g)
                assert list(together.reason[rows]) == list(alone.reason), (spec, g)

    def test_state_fields_name_what_decisions_read(self):
        """A field left out of ``state_fields`` does not move the decisions (engines decide
        the batches of several searches together when those fields agree)."""
        fields = [f.name for f in dataclasses.fields(SearchState) if f.name != "best_speedup"]
        other = {"search_id": "other", "task_id": "other", "step": 30, "gpu_evals": 99,
                 "seed": 12345, "measure_usd": 7.5, "budget_left": {"usd": 0.1}}
        batch = contract_batch(16, seed=7)
        for spec, policy in self.policies():
            if policy.state_fields is None:
                continue  # it may read every field
            base = policy.decide(batch, STATE).measure.tolist()
            for name in fields:
                if name in policy.state_fields or name not in other:
                    continue
                moved = policy.decide(batch, dataclasses.replace(STATE, **{name: other[name]}))
                assert moved.measure.tolist() == base, (spec, name)


class CostModelContract:
    """Subclass it with ``names``: cost-model names to check (``register_cost_model`` or the
    ``gfsim.cost_models`` entry point): each loads, is a ``PresetCostModel``, prices a stage
    as a ``Cost`` with no negative figure, and loads the same again."""

    names: tuple[str, ...] = ()

    def test_each_name_loads_a_cost_model_that_prices_stages(self):
        from gfsim.cost_models import STAGES, Cost, PresetCostModel, Usage, load_cost_model

        assert self.names, f"{type(self).__name__}: set names to the cost models to check"
        for name in self.names:
            model = load_cost_model(name)
            assert isinstance(model, PresetCostModel), name
            assert load_cost_model(name) == model, name
            for stage in STAGES:
                if stage == "idle":  # priced by idle(), per idle GPU-second
                    cost = model.idle(10.0)
                else:
                    cost = model.cost(Usage(stage, seconds=2.0, input_tokens=100.0,
                                            output_tokens=50.0))
                assert isinstance(cost, Cost), (name, stage)
                assert min(cost.seconds, cost.usd, cost.joules) >= 0, (name, stage, cost)


def contract_requests(n: int = 5):
    """``n`` forecast requests of small Triton-like candidates (their code differs)."""
    from gfsim.forecasts.protocol import ForecastRequest

    ref = "def kernel(x):\n    return x * 2\n"
    return [ForecastRequest(candidate_id=f"c{i}", candidate_code=ref.replace("2", str(i + 2)),
                            reference_code=ref, task="t: double a vector",
                            hardware={"device_name": "test-gpu"}, search_id="s", task_name="t",
                            meta={"variant": "v", "params": {"BLOCK": 2 ** (i + 5)}},
                            parent_speedup=1.0)
            for i in range(n)]


def _offers(call) -> tuple[bool, object]:
    """(offered, result): False where the forecaster refuses the call as the protocol says."""
    from gfsim.forecasts.protocol import ForecasterError

    try:
        return True, call()
    except ForecasterError:
        return False, None


class ForecasterContract:
    """Subclass it with ``specs``: forecaster specs to check (``register_forecaster`` or the
    ``gfsim.forecasters`` entry point). Each builds a ``Forecaster`` with a name, a mode and a
    kind; what it offers of the protocol keeps it: ``forecast`` answers each request with a
    distribution over the 8 bins (or a recorded parse failure or error, all zeros), in request
    order through ``forecast_many``; ``attach`` adds its forecasts of a log's candidates under
    its name and leaves the log it was given as it was. It must offer one of the two."""

    specs: tuple[str, ...] = ()

    def _forecasters(self):
        from gfsim.forecasts import Forecaster, make_forecaster

        assert self.specs, f"{type(self).__name__}: set specs to the forecasters to check"
        for spec in self.specs:
            f = make_forecaster(spec)
            assert isinstance(f, Forecaster), (spec, f)
            yield spec, f

    def test_each_spec_builds_a_named_forecaster_that_offers_something(self):
        for spec, f in self._forecasters():
            assert isinstance(f.name, str) and f.name, spec
            assert isinstance(f.mode, str) and f.mode, spec
            assert isinstance(f.kind, str) and f.kind, spec
            requests = contract_requests(2)
            can_forecast, _ = _offers(lambda: f.forecast(requests[0]))
            can_attach, _ = _offers(lambda: f.attach(_contract_log()))
            assert can_forecast or can_attach, f"{spec}: offers neither forecast nor attach"

    def test_forecasts_are_distributions_or_recorded_failures(self):
        from gfsim.forecasts.protocol import Forecast

        requests = contract_requests()
        for spec, f in self._forecasters():
            offered, got = _offers(lambda: f.forecast_many(requests))
            if not offered:
                continue
            assert [g.candidate_id for g in got] == [r.candidate_id for r in requests], spec
            for g in got:
                assert isinstance(g, Forecast) and g.forecaster == f.name, (spec, g)
                p = np.asarray(g.probs, dtype=float)
                assert p.shape == (8,) and np.all(np.isfinite(p)) and np.all(p >= 0), (spec, g)
                if g.parse_failed or g.error is not None:
                    assert not p.any(), (spec, g)
                else:
                    assert abs(p.sum() - 1.0) < 1e-6, (spec, g)

    def test_attach_adds_its_forecasts_under_its_name_and_keeps_the_input(self):
        log = _contract_log()
        before = log.forecasts.copy()
        for spec, f in self._forecasters():
            offered, out = _offers(lambda: f.attach(log))
            if not offered:
                continue
            assert log.forecasts.equals(before), f"{spec}: attach changed the log it was given"
            mine = out.forecasts[out.forecasts["forecaster"] == f.name]
            assert len(mine), f"{spec}: attach added no forecast named {f.name!r}"
            assert set(mine["candidate_id"]) <= set(log.candidates["candidate_id"]), spec


def _contract_log():
    """A small log in memory: two searches of measured and failed candidates, with what made
    each (``source_meta``, which a forecaster that learns reads)."""
    import tempfile
    from pathlib import Path

    from gfsim.replay_logs import load_log
    from gfsim.testing import LogBuilder

    b = LogBuilder(tasks={"a": 1.0, "b": 1.2})
    for task in ("a", "b"):
        root = b.candidate(task, 0, speedup=1.1, probs=b.onehot(5, 0.6),
                           source_meta={"variant": "v", "params": {"BLOCK": 64}})
        for block, outcome, speedup in ((128, "success", 1.6), (256, "compile_failed", None),
                                        (32, "success", 0.8)):
            b.candidate(task, 1, parent=root, outcome=outcome, speedup=speedup,
                        probs=b.onehot(5, 0.5),
                        source_meta={"variant": "v", "params": {"BLOCK": block}})
    with tempfile.TemporaryDirectory() as tmp:
        return load_log(b.write(Path(tmp) / "contract.jsonl"), cache=False)
