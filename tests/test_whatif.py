"""What-if forecasters: the generative model, the presets fitted to the paper, and their use."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import SpecError
from gfsim.forecasts.whatif import ANCHOR, PAPER_TARGETS, PRESETS, WhatIfForecaster, parse_whatif
from gfsim.worlds.replica import replica_log

runner = CliRunner()


def expected_log2(probs):
    centres = np.log2([0.18, 0.35, 0.6, 0.85, 1.19, 1.68, 2.83, 5.66])
    return probs @ centres


def test_the_model_is_keyed_biased_and_tempered():
    x = np.linspace(-3, 3, 4001)
    ids = [f"c{i}" for i in range(len(x))]
    f = WhatIfForecaster("f", sigma=0.5, beta=0.6, temp=1.0, parse_fail=0.1)
    p, failed = f.distribution(x, ids)
    again, _ = f.distribution(x[::-1], ids[::-1])
    np.testing.assert_array_equal(p, again[::-1])  # keyed by candidate, not by order
    assert not np.array_equal(p, WhatIfForecaster("g", sigma=0.5, beta=0.6).distribution(
        x, ids)[0])
    assert not np.array_equal(p, f.distribution(x, ids, repeat=1)[0])
    assert failed.mean() == pytest.approx(0.1, abs=0.02) and np.all(p[failed] == 0)
    ok = ~failed
    assert np.allclose(p[ok].sum(axis=1), 1.0)
    e = expected_log2(p[ok])
    xs = x[ok]
    # The paper's bias: slow kernels over-forecast, > 4x ones under-forecast.
    assert e[xs < -2].mean() > xs[xs < -2].mean() + 0.3
    assert e[xs > 2.2].mean() < xs[xs > 2.2].mean() - 0.3
    assert abs(e[np.abs(xs - ANCHOR) < 0.3].mean() - ANCHOR) < 0.2
    # A lower temperature is more confident.
    cold, _ = WhatIfForecaster("f", sigma=0.5, beta=0.6, temp=0.3, parse_fail=0.1).distribution(
        x, ids)
    assert cold[ok].max(axis=1).mean() > p[ok].max(axis=1).mean() + 0.1


def test_specs():
    g = parse_whatif("paper:gemini3-flash")
    assert g.name == "paper:gemini3-flash" and g.sigma == PRESETS["gemini3-flash"]["sigma"]
    assert parse_whatif("paper:gpt-oss-20b,seed=3").seed == 3
    s = parse_whatif("synthetic:sigma=0.4,beta=0.9,temp=0.5,parse_fail=0.05")
    assert (s.sigma, s.beta, s.temp, s.parse_fail) == (0.4, 0.9, 0.5, 0.05)
    for bad, msg in (("paper:gpt5", "valid: gemini3-flash"), ("synthetic:noise=1", "unknown key"),
                     ("synthetic:sigma=-1", "outside"), ("paper:gemini3-flash,temp=2",
                                                         "only seed"),
                     ("oracle:1", "expected paper:NAME")):
        with pytest.raises(SpecError, match=msg):
            parse_whatif(bad)


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    return replica_log(0).write(tmp_path_factory.mktemp("replica") / "replica.jsonl")


def test_the_replica_is_shaped_like_the_eval_set(replica):
    from gfsim.forecasts.scoring import true_bins
    from gfsim.replay_logs import load_log

    log = load_log(replica)
    assert log.shape == "pairs" and len(log.candidates) == 424 and len(log.tasks) == 6
    bins = np.bincount(list(true_bins(log).values()), minlength=9)[1:]
    assert list(bins) == [53] * 8
    assert (log.evaluations["outcome"] == "success").all()


@pytest.mark.parametrize("preset", list(PAPER_TARGETS))
def test_each_preset_meets_the_published_figures_in_gfsim_score(replica, tmp_path, preset):
    """Three repeats added by `gfsim forecast`, scored by `gfsim score`: recovered within 1.5
    points and ECE within 0.03 of the paper's figures (where it gives one)."""
    out = tmp_path / "fc.jsonl"
    for r in range(3):
        res = runner.invoke(app, ["forecast", "--log", str(replica), "--forecaster",
                                  f"paper:{preset}", "--out", str(out), "--repeat", str(r),
                                  "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["forecast_now"] == 424
    res = runner.invoke(app, ["score", "--log", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    got = got["forecasters"][0] if "forecasters" in got else got
    rec, ece = PAPER_TARGETS[preset]
    assert got["n"] == 1272
    assert 100 * got["recovered_mean"] == pytest.approx(rec, abs=1.5)
    if ece is not None:
        assert got["ece"] == pytest.approx(ece, abs=0.03)


def test_policies_and_savings_read_a_what_if_forecaster():
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--forecaster",
                              "paper:gemini3-flash", "--policy", "threshold:0.7", "--json"])
    assert res.exit_code == 0, res.output
    sharp = json.loads(res.output)
    res = runner.invoke(app, ["replay", "--log", "synthetic-mini", "--forecaster",
                              "synthetic:sigma=3,temp=1", "--policy", "threshold:0.7", "--json"])
    vague = json.loads(res.output)
    # A confident forecaster lets threshold skip more; a vague one measures nearly all.
    assert sharp["gpu_evals"] < vague["gpu_evals"]
    res = runner.invoke(app, ["savings", "--log", "synthetic-mini", "--forecaster",
                              "paper:gpt-oss-20b", "--seeds", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["inputs"]["forecaster"] == "paper:gpt-oss-20b"


def test_one_candidates_distribution_is_its_row_of_the_batch():
    """``distribution_one`` (a world's one-at-a-time path) must give exactly the row that
    ``distribution`` gives for the same candidate: every preset-like shape of the model
    (overconfident, hedging, a parse-failure rate), targets far outside the bins and zeros."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(0, 3, 400), [0.0, -0.0, 30.0, -30.0, 1e-9]])
    ids = [f"c{i}" for i in range(len(x))]
    n_failed = 0
    for kw in (dict(sigma=0.5, beta=0.8, temp=1.0, parse_fail=0.01),
               dict(sigma=1.0, beta=0.7, temp=0.25, parse_fail=0.2),
               dict(sigma=0.6796, beta=0.7, temp=0.0852, parse_fail=0.3),
               dict(sigma=2.68, beta=0.7, temp=1.8359),
               dict(sigma=0.001, beta=-2.0, temp=0.001)):
        f = WhatIfForecaster("whatif:t", seed=100003, **kw)
        for repeat in (0, 2):
            probs, failed = f.distribution(x, ids, repeat)
            for i, cid in enumerate(ids):
                row, one_failed = f.distribution_one(float(x[i]), cid, repeat)
                assert one_failed == bool(failed[i])
                assert (row is None) if one_failed else row == probs[i].tolist()
                n_failed += one_failed
    assert n_failed > 0  # the failure path was exercised
