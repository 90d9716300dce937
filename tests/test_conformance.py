"""Every registered policy and cost model honours its base class's contract."""

import dataclasses

import numpy as np
import pytest

from gfsim.core.errors import SpecError
from gfsim.cost_models import PRESETS, STAGES, Usage, load_cost_model
from gfsim.policies import POLICIES, SearchState, make_policy
from gfsim.testing.contracts import contract_batch

SPECS = {
    "all": ["all"],
    "random": ["random:0.3"],
    "oracle": ["oracle:0.5"],
    "topk": ["topk:2", "topk:k=1,on_parse_failure=skip"],
    "threshold": ["threshold:0.7", "threshold:tau=0.5,score=negentropy,rho=0.2",
                  "threshold:coverage=0.4,score=margin"],
    "ev": ["ev:5", "ev:usd_per_log2_speedup=0.5,on_parse_failure=skip"],
}
ALL_SPECS = [s for specs in SPECS.values() for s in specs]


def test_every_registered_policy_has_specs_here():
    assert set(SPECS) == set(POLICIES.builtins())


# The contract's own batch (gfsim.testing): random forecasts and truths, read-only arrays.
make_batch = contract_batch


STATE = SearchState("s", "t", step=3, best_speedup=1.3, gpu_evals=10, seed=11, measure_usd=0.2)


def fitted(spec):
    policy = make_policy(spec)
    return policy.fit(make_batch(200, seed=99), seed=11)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_constructor_stores_parameters_unchanged(spec):
    policy = make_policy(spec)
    cls = type(policy)
    again = cls(**policy.get_params())
    assert again.get_params() == policy.get_params()
    assert make_policy(policy.spec()) == policy


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("n", [0, 1, 7])
def test_decide_returns_one_decision_per_row(spec, n):
    d = fitted(spec).decide(make_batch(n), STATE)
    assert d.measure.dtype == bool and d.measure.shape == (n,)
    assert d.score.shape == (n,) and len(d.reason) == n


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_decide_is_deterministic_and_pure(spec):
    policy = fitted(spec)
    batch = make_batch(16, seed=3, unusable=(2,))
    first = policy.decide(batch, STATE)
    second = policy.decide(batch, STATE)
    assert first.measure.tolist() == second.measure.tolist()
    assert first.reason == second.reason
    # A fresh instance from the same spec decides the same: no hidden state between calls.
    assert fitted(spec).decide(batch, STATE).measure.tolist() == first.measure.tolist()


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if POLICIES[s.split(":")[0]].needs_forecast])
def test_a_candidate_without_a_usable_forecast_is_measured_by_default(spec):
    policy = fitted(spec)
    batch = make_batch(6, seed=4, unusable=(0, 5))
    d = policy.decide(batch, STATE)
    expected = policy.on_parse_failure == "measure"
    assert d.measure[0] == expected and d.measure[5] == expected
    assert d.reason[0] == "parse-failed"


@pytest.mark.parametrize("name", sorted(POLICIES.builtins()))
def test_unknown_keys_list_the_valid_ones(name):
    with pytest.raises(SpecError) as info:
        make_policy(f"{name}:nosuchkey=1")
    for p in POLICIES[name].params:
        assert p.name in str(info.value)


def test_every_probability_share_or_confidence_parameter_is_bounded_to_0_1():
    """threshold:1.5 was accepted: tau is a confidence (maxprob, negentropy, margin), in [0, 1],
    but had no upper bound. A parameter whose help says it is a probability, fraction, share,
    confidence or promise must be refused outside [0, 1]."""
    unit = [(name, p) for name, cls in ((n, POLICIES[n]) for n in POLICIES.builtins())
            for p in cls.params
            if p.kind is float and any(w in p.help for w in ("probability", "fraction", "share",
                                                            "confidence", "promise"))]
    assert len(unit) >= 6  # random p, oracle p, tau, rho, coverage, cal_frac
    for name, p in unit:
        assert (p.low, p.high) == (0.0, 1.0), (name, p.name)
        with pytest.raises(SpecError, match=rf"{p.name}=1.5 is above its maximum 1.0 "
                                            r"\(range 0 to 1(, 0 excluded)?\)"):
            make_policy(f"{name}:{p.name}=1.5")


# -- cost models --------------------------------------------------------------------------
def toml_model(tmp_path):
    path = tmp_path / "cost.toml"
    path.write_text('base = "reserved-h100"\n[gpu]\nusd_per_hour = 2.0\n'
                    '[capacities]\ngpus = 2\n')
    return load_cost_model(str(path))


# Every preset, spec options (another provider, LLM and GPU count) and a TOML file.
MODELS = [*PRESETS.builtins(), "serverless-h200:forecaster=gpt-oss-20b,provider=runpod",
          "reserved-b200:generator=self-hosted-gpt-oss-20b,gpus=2", "toml"]


@pytest.fixture(params=MODELS)
def model(request, tmp_path):
    return toml_model(tmp_path) if request.param == "toml" else load_cost_model(request.param)


PRICED = [s for s in STAGES if s != "idle"]


@pytest.mark.parametrize("stage", PRICED)
def test_zero_usage_costs_nothing(model, stage):
    c = model.cost(Usage(stage))
    assert (c.seconds, c.usd, c.joules, c.usd_imputed) == (0, 0, 0, 0)


@pytest.mark.parametrize("stage", PRICED)
def test_costs_are_non_negative_additive_and_keep_time(model, stage):
    a = Usage(stage, seconds=12.5, input_tokens=300, output_tokens=900)
    b = Usage(stage, seconds=7.5, input_tokens=100, output_tokens=100)
    ab = Usage(stage, seconds=20.0, input_tokens=400, output_tokens=1000)
    ca, cb, cab = model.cost(a), model.cost(b), model.cost(ab)
    assert ca.seconds == 12.5
    assert ca.usd >= 0 and ca.joules >= 0
    assert (ca + cb).usd == pytest.approx(cab.usd)
    assert (ca + cb).joules == pytest.approx(cab.joules)
    assert ca.usd > 0, "every priced stage costs something for real usage"


@pytest.mark.parametrize("stage", PRICED)
def test_imputed_usage_is_all_imputed_usd(model, stage):
    c = model.cost(Usage(stage, seconds=3, input_tokens=10, output_tokens=10, imputed=True))
    assert c.usd_imputed == c.usd > 0
    assert model.cost(Usage(stage, seconds=3, output_tokens=10)).usd_imputed == 0


def test_idle_is_free_only_under_serverless_billing(model):
    idle = model.idle(3600.0)
    if model.billing == "serverless":
        assert idle.usd == 0 and idle.joules == 0
    else:
        assert idle.usd == pytest.approx(model.gpu.usd_per_hour)
        assert idle.joules == pytest.approx(3600 * model.gpu.idle_w_context)


def test_measured_energy_replaces_the_estimate(model):
    assert model.cost(Usage("timing", seconds=10, energy_j=123.0)).joules == 123.0


def test_every_preset_names_sources_for_its_figures(model):
    desc = model.describe()
    sources = desc["sources"]
    for key in ("gpu.usd_per_hour", "gpu.board_w", "gpu.active_w", "forecaster", "generator"):
        assert sources.get(key), f"{model.name}: no source for {key}"
    assert all(dataclasses.is_dataclass(getattr(model, s)) for s in ("gpu", "cpu", "priors"))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_decide_groups_equals_deciding_batch_by_batch(spec):
    policy = fitted(spec)
    sizes = [4, 1, 6, 3, 16]
    batch = make_batch(sum(sizes), seed=8, unusable=(3, 9))
    group = np.repeat(np.arange(len(sizes)), sizes)
    best = np.repeat([0.8, 1.3, 2.0, 1.0, 3.5], sizes)
    together = policy.decide_groups(batch, group, best, STATE)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        alone = policy.decide(batch.take(rows),
                              dataclasses.replace(STATE, best_speedup=best[start]))
        assert together.measure[rows].tolist() == alone.measure.tolist(), g
        assert together.reason[start:start + size] == alone.reason, g
        # Exactly: the puct fast path decides a step's batches together and keeps the result
        # for each batch whose best is unchanged when it decides.
        np.testing.assert_array_equal(together.score[rows], alone.score)
        start += size


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_decisions_depend_on_no_state_field_a_policy_does_not_declare(spec):
    # Engines decide several searches' batches in one call when the declared fields agree.
    policy = fitted(spec)
    assert policy.state_fields is not None, "built-in policies declare what they read"
    assert set(policy.state_fields) <= set(SearchState.__dataclass_fields__) - {"best_speedup"}
    batch = make_batch(30, seed=4, unusable=(2,))
    base = policy.decide(batch, STATE)
    others = {"search_id": "other", "task_id": "u", "step": 17, "gpu_evals": 99, "seed": 5,
              "budget_left": {"usd": 1.0}, "measure_usd": 3.0}
    for name, value in others.items():
        changed = policy.decide(batch, dataclasses.replace(STATE, **{name: value}))
        same = (changed.measure.tolist() == base.measure.tolist()
                and changed.reason == base.reason
                and np.array_equal(changed.score, base.score, equal_nan=True))
        if name not in policy.state_fields:
            assert same, f"{spec} reads {name} but does not declare it"


@pytest.mark.parametrize("stage", PRICED)
def test_price_many_equals_cost_row_by_row(model, stage):
    rng = np.random.default_rng(1)
    secs, tin, tout = rng.uniform(0, 100, 5), rng.integers(0, 9000, 5), rng.integers(0, 9000, 5)
    energy = np.array([np.nan, 10.0, np.nan, 0.0, 5.5])
    imputed = np.array([True, False, False, True, False])
    usd, joules, imp = model.price_many(stage, secs, tin, tout, energy, imputed)
    for i in range(5):
        e = None if np.isnan(energy[i]) else float(energy[i])
        c = model.cost(Usage(stage, float(secs[i]), float(tin[i]), float(tout[i]), e,
                             bool(imputed[i])))
        assert (usd[i], joules[i], imp[i]) == pytest.approx((c.usd, c.joules, c.usd_imputed))


# -- the plug-in contracts (gfsim.testing), on gfsim's own policies and cost models -------------
from gfsim.testing import CostModelContract, PolicyContract  # noqa: E402


class TestBuiltinPoliciesKeepThePluginContract(PolicyContract):
    specs = tuple(ALL_SPECS)


class TestBuiltinCostModelsKeepThePluginContract(CostModelContract):
    names = ("serverless-a100", "reserved-h100")
