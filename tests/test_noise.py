"""--measure-noise: keyed log-normal noise on measurements; the confirmed best beside the raw."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import SpecError
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import replay
from gfsim.simulator.noise import MeasureNoise, parse_noise
from gfsim.simulator.closed.engine import SearchConfig

runner = CliRunner()
MODEL = load_cost_model("serverless-a100")


def test_factors_are_keyed_log_normal_with_the_stated_cv():
    noise = MeasureNoise(0.1)
    ids = [f"c{i}" for i in range(40_000)]
    f = noise.factors(3, "s", ids)
    # The runtime factor is 1/f: median 1 and coefficient of variation cv.
    runtime = 1 / f
    assert np.median(runtime) == pytest.approx(1.0, abs=0.005)
    assert runtime.std() / runtime.mean() == pytest.approx(0.1, rel=0.03)
    assert np.log(f).std() == pytest.approx(noise.sigma, rel=0.03)
    # Keyed: a candidate's factor does not depend on which others are drawn or in what order.
    assert noise.factors(3, "s", ids[7:9][::-1]).tolist() == [f[8], f[7]]
    assert not np.array_equal(noise.factors(4, "s", ids[:50]), f[:50])
    assert not np.array_equal(noise.factors(3, "other", ids[:50]), f[:50])
    assert not np.array_equal(noise.factors(3, "s", ids[:50], purpose="confirm"), f[:50])
    assert MeasureNoise(0).factors(3, "s", ids[:5]).tolist() == [1.0] * 5


def test_noise_spec_parsing():
    assert parse_noise(None) is None and parse_noise("  ") is None
    assert parse_noise("cv=0.02") == MeasureNoise(0.02) == parse_noise("0.02")
    for bad, msg in (("cv=abc", "not a number"), ("cv=2", r"in \[0, 1\]"),
                     ("sigma=0.1", "expected cv=VALUE"), ("cv=-0.1", r"in \[0, 1\]")):
        with pytest.raises(SpecError, match=msg):
            parse_noise(bad)


def test_zero_noise_changes_nothing():
    log = open_log("synthetic-mini")
    plain = replay(log, make_policy("threshold:0.7"), MODEL, seed=2)
    zero = replay(log, make_policy("threshold:0.7"), MODEL, seed=2, noise=MeasureNoise(0.0))
    assert plain.trace_hash() == zero.trace_hash()
    for s in plain.searches:
        assert s.best_speedup == s.confirmed_speedup == s.true_best_speedup


def test_every_measurement_carries_its_keyed_factor_and_policies_share_it():
    log = open_log("synthetic-mini")
    noise = MeasureNoise(0.2)
    runs = {p: replay(log, make_policy(p), MODEL, seed=5, noise=noise)
            for p in ("all", "random:0.5")}
    truth = dict(zip(log.evaluations["candidate_id"], log.evaluations["speedup"]))
    seen: dict[str, float] = {}
    for policy, r in runs.items():
        for s in r.searches:
            tab = s.table
            ids = [c for c, v in zip(tab["candidate_id"], tab["speedup"]) if v == v]
            f = noise.factors(5, s.search_id, ids)
            got = [v for v in tab["speedup"] if v == v]
            np.testing.assert_allclose(got, [truth[c] * x for c, x in zip(ids, f)], rtol=1e-12)
            for c, v in zip(ids, got):
                assert seen.setdefault(c, v) == v  # common random numbers across policies
            # The raw best is the best noisy measurement; confirmed re-measures that kernel.
            assert s.best_speedup == max(got + [s.seed_speedup])
            if s.best_candidate_id is not None:
                true = truth[s.best_candidate_id]
                assert s.true_best_speedup == true
                assert s.confirmed_speedup == pytest.approx(true * noise.factors(
                    5, s.search_id, [s.best_candidate_id], purpose="confirm")[0], rel=1e-12)
    assert len(seen) > 0


def test_the_raw_best_is_biased_up_and_the_confirmed_best_is_not():
    """The winner's curse: a maximum of noisy measurements overstates the kernel it picks; a
    fresh measurement of that kernel does not (in log terms its noise has mean zero)."""
    log = open_log("synthetic-v1")
    noise = MeasureNoise(0.2)
    raw, confirmed = [], []
    for seed in range(6):
        r = replay(log, make_policy("all"), MODEL, seed=seed, noise=noise,
                   orphans_dropped=False)
        for s in r.searches:
            raw.append(math.log(s.best_speedup / s.true_best_speedup))
            confirmed.append(math.log(s.confirmed_speedup / s.true_best_speedup))
    assert np.mean(raw) > 0.2  # about 2.5 sigma of a max over hundreds of measurements
    assert abs(np.mean(confirmed)) < 3 * noise.sigma / math.sqrt(len(confirmed))


def test_puct_rewards_are_noisy_and_children_are_drawn_around_the_truth():
    log = open_log("synthetic-puct-v1")
    noise = MeasureNoise(0.1)
    truth = dict(zip(log.evaluations["candidate_id"], log.evaluations["speedup"]))
    plain = replay(log, make_policy("all"), MODEL, seed=1, driver="puct",
                   search=SearchConfig(steps=10))
    noisy = replay(log, make_policy("all"), MODEL, seed=1, driver="puct",
                   search=SearchConfig(steps=10), noise=noise)
    assert plain.trace_hash() != noisy.trace_hash()  # noise changes what the search does
    checked = 0
    for s in noisy.searches:
        tab = s.table
        for cid, src, tmpl, v in zip(tab["candidate_id"], tab["draw_source"], tab["template"],
                                     tab["speedup"]):
            if src == "own" and v == v:
                f = noise.factors(1, s.search_id, [cid])[0]
                assert v == pytest.approx(truth[tmpl] * f, rel=1e-12)
                checked += 1
        assert s.true_best_speedup <= max(truth.values())
    assert checked > 50


def test_cli_reports_the_confirmed_best_and_rejects_bad_noise():
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--measure-noise", "cv=0.1",
                              "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["measure_noise"]["cv"] == 0.1
    for side in (out, out["baseline"]):
        assert {"best_speedup", "confirmed_speedup", "true_best_speedup"} <= set(side)
    assert any("measurement noise" in n for n in out["notes"])
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--measure-noise", "cv=x"])
    assert res.exit_code == 2 and "--measure-noise: cv='x' is not a number" in res.output
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--measure-noise", "0.05",
                              "--seeds", "3", "--json"])
    assert res.exit_code == 0, res.output
    iv = json.loads(res.output)["intervals"]["overall"]
    assert {"confirmed_speedup", "true_best_speedup"} <= set(iv)
    plain = json.loads(runner.invoke(app, ["replay", "--log", "synthetic-mini", "--seeds", "2",
                                           "--policy", "random:0.5", "--json"]).output)
    assert plain["measure_noise"] is None
    assert "confirmed_speedup" not in plain["intervals"]["overall"]
