"""Predictions for a new search (gfsim.simulator.predictive, issue 40): intervals that cover new
draws at their level, gains that must be detectable before they are recommended, and
``gfsim replay --predict`` on the shipped PUCT log."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.simulator.predictive import (
    expected_gain,
    new_search_gain,
    predictive_interval,
    recommend,
    replay_interval,
)


def test_a_new_search_is_covered_at_the_level_only_with_its_own_spread():
    """Replays that vary little (they share the log's children), new searches on the model that
    vary more and sit off the replays by the model's error, and a next real search whose error
    follows the fitted law (a scaled t over the predictive standard deviation): the replays' own
    interval misses it; centred on the replays, spread by the fresh searches and their
    disagreement with the replays, the interval covers it at its level."""
    from scipy.stats import t

    from gfsim.simulator.predictive import ERROR_DF, ERROR_SCALE

    rng = np.random.default_rng(3)
    n = 6000
    mu = rng.normal(0, 1, n)
    off = rng.normal(0, 0.5, n)  # where the world model sits off the log's replays
    rq = mu[:, None] + rng.normal(0, 0.05, (n, 4))  # replays: tight around the truth
    fresh = (mu + off)[:, None] + rng.normal(0, 0.3, (n, 8))  # new searches on the model
    sd = np.sqrt(fresh.var(axis=1, ddof=1) + rq.var(axis=1, ddof=1) / 4
                 + (fresh.mean(axis=1) - rq.mean(axis=1)) ** 2)
    new = rq.mean(axis=1) + sd * ERROR_SCALE * t.rvs(ERROR_DF, size=n, random_state=rng)
    for level in (0.5, 0.8, 0.9, 0.95):
        lo, hi = predictive_interval(rq, fresh, level)
        got = float(((lo <= new) & (new <= hi)).mean())
        assert abs(got - level) < 0.025, (level, got)
        lo, hi = replay_interval(rq, level)
        assert float(((lo <= new) & (new <= hi)).mean()) < level - 0.2
    # Without the disagreement term the same interval would be too narrow here.
    lo, hi = predictive_interval(rq, fresh + (rq.mean(axis=1) - fresh.mean(axis=1))[:, None])
    assert float(((lo <= new) & (new <= hi)).mean()) < 0.8
    lo, hi = predictive_interval(rq, None)  # without fresh searches: the replays' own
    assert np.array_equal(lo, replay_interval(rq)[0])


def _world_of_gains(rng, n: int, fresh_n: int):
    """True expected gains, and fresh searches' paired gains whose mean sits off the truth by
    the fitted law (a scaled t over ``expected_gain_scale``) and whose single searches spread
    about their mean."""
    from scipy.stats import t

    from gfsim.simulator.predictive import EXPECTED_DF, EXPECTED_SCALE, expected_gain_scale

    truth = rng.normal(0, 0.3, n)
    sd = rng.uniform(0.05, 0.6, n)
    noise = rng.normal(0, 1, (n, fresh_n))
    noise = (noise - noise.mean(axis=1, keepdims=True)) / noise.std(axis=1, ddof=1,
                                                                    keepdims=True)
    shape = sd[:, None] * noise  # each row's sample sd is exactly sd
    off = expected_gain_scale(shape) * EXPECTED_SCALE * t.rvs(EXPECTED_DF, size=n,
                                                              random_state=rng)
    return truth, (truth + off)[:, None] + shape


def test_the_expected_gain_covers_the_true_mean_gain_at_its_level():
    rng = np.random.default_rng(11)
    truth, fresh = _world_of_gains(rng, 8000, 6)
    replays = np.zeros((8000, 4))  # (not read where there are fresh searches)
    for level in (0.5, 0.8, 0.9, 0.95):
        got = expected_gain(replays, fresh, level)
        cover = float(((got.lo <= truth) & (truth <= got.hi)).mean())
        assert abs(cover - level) < 0.02, (level, cover)
        # the one-sided bound holds the truth at its level too
        assert abs(float((got.lower <= truth).mean()) - level) < 0.02
        assert np.all(got.lo <= got.lower) and np.all(got.lower <= got.mean)
    # More fresh searches shrink the sampling part alone; the misfit stays.
    few, many = (expected_gain(replays, fresh[:, :k]) for k in (3, 6))
    assert np.all(many.sampling <= few.sampling * 3 / 6 * (fresh[:, :6].var(axis=1, ddof=1)
                                                         / fresh[:, :3].var(axis=1, ddof=1))
                  + 1e-12)
    assert np.all(many.misfit > 0)


def test_one_new_search_is_wider_than_the_expected_gain_and_centred_on_it():
    rng = np.random.default_rng(5)
    _, fresh = _world_of_gains(rng, 500, 6)
    got = expected_gain(np.zeros((500, 4)), fresh)
    mid, lo, hi = new_search_gain(np.zeros((500, 4)), fresh)
    assert np.allclose(mid, got.mean) and np.all(lo < got.lo) and np.all(got.hi < hi)
    # without fresh searches: the replays' own interval (one more replay's)
    replays = rng.normal(0.1, 0.2, (500, 4))
    mid, lo, hi = new_search_gain(replays)
    assert np.allclose(mid, replays.mean(axis=1))
    assert np.array_equal(lo, replay_interval(replays)[0])


def test_a_gain_counts_only_where_its_expected_gain_is_detectable():
    steady = np.array([0.2, 0.25, 0.22, 0.18])
    noisy = np.array([0.9, -0.6, 1.2, -0.5])
    got = expected_gain(np.stack([steady, noisy]))  # replays alone: a t interval over seeds
    assert got.mean[1] > got.mean[0] and got.lower[0] > 0 > got.lower[1]
    assert np.all(got.misfit == 0)
    # With fresh searches the decision reads them, not the replays: a gain the replays show
    # steadily is not detectable where new searches on the model do not show it.
    assert expected_gain(steady, fresh=np.array([1.0, -1.0, 0.8, -0.9, 0.3])).lower < 0
    gains = np.stack([np.zeros(4), noisy, steady])
    assert recommend(gains, 0) == 2 and recommend(gains[:2], 0) == 0
    clear = np.array([0.5, 0.55, 0.45, 0.6, 0.5, 0.52])
    fresh = np.stack([np.zeros(6), clear, clear - 0.3])
    assert recommend(np.zeros((3, 4)), 0, fresh=fresh) == 1  # the larger detectable one
    assert expected_gain(steady[:1]).lower == -np.inf  # one replay, no fresh: no claim


def test_a_large_expected_gain_is_adopted_at_the_lower_level_and_a_small_one_is_not():
    """``adoptable``'s second door: a gain of at least LARGE_GAIN log2 whose one-sided
    LARGE_LEVEL lower bound is above 0 is adopted though its 90% bound is not; the same
    spread around a small gain is not; and of two adoptable gains the one the replays back
    more (by the mean of the two estimates) wins."""
    from gfsim.simulator.predictive import LARGE_GAIN, LARGE_LEVEL, adoptable

    big = np.array([1.4, -0.3, 1.2, -0.2, 0.9, 0.0])  # mean 0.5 log2, spread wide
    small = big / 4  # mean 0.125: under LARGE_GAIN, however sure
    for x in (big, small):  # the premises: neither detectable at 90%, both at 70%
        assert expected_gain(x[None], x[None]).lower[0] < 0
        assert expected_gain(x[None], x[None], LARGE_LEVEL).lower[0] > 0
    assert small.mean() < LARGE_GAIN <= big.mean()
    fresh = np.stack([np.zeros(6), big, small])
    replays = np.stack([np.zeros(4), np.full(4, 0.3), np.full(4, 0.1)])
    eg, large = expected_gain(replays, fresh), expected_gain(replays, fresh, LARGE_LEVEL)
    assert adoptable(eg, large).tolist() == [False, True, False]
    assert adoptable(eg).tolist() == [False, False, False]  # the 90% door alone
    assert recommend(replays, 0, fresh=fresh) == 1
    assert recommend(replays, 0, level=0.95, fresh=fresh) == 1  # (the door stays at 70%)
    assert recommend(replays[:1].repeat(3, 0), 0, fresh=fresh[[0, 2, 2]]) == 0
    # Two adoptable: the larger expected gain (fresh) that the replays back less loses to the
    # one they back more.
    sure = np.array([0.45, 0.5, 0.55, 0.5, 0.48, 0.52])
    fresh2 = np.stack([np.zeros(6), sure + 0.2, sure])
    assert recommend(np.stack([np.zeros(4), np.full(4, 0.05), np.full(4, 0.4)]), 0,
                     fresh=fresh2) == 2
    assert recommend(np.stack([np.zeros(4), np.full(4, 0.9), np.full(4, 0.4)]), 0,
                     fresh=fresh2) == 1


def test_replay_predicts_a_new_search_and_its_gain():
    res = CliRunner().invoke(app, ["replay", "--driver", "puct", "--children", "model",
                                   "--policy", "threshold:0.7", "--seeds", "2", "--predict",
                                   "3", "--steps", "8", "--json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.stdout)["new_search"]
    assert p["fresh_searches"] == 3 and p["replays"] == 2 and p["level"] == 0.9
    b, g = p["best_speedup"], p["gain_over_baseline"]
    assert b["lo"] < b["mean"] < b["hi"] and g["lo"] < g["mean"] < g["hi"]
    assert g["baseline"] == "all"
    e = p["expected_gain"]
    assert isinstance(e["detectable"], bool) and e["mean"] == pytest.approx(g["mean"])
    assert g["lo"] <= e["lo"] <= e["lower_bound"] < e["hi"] <= g["hi"]  # never narrower
    assert "new search" in p["over"] and "simulated wholly on the world model" in p["over"]
    assert math.isfinite(p["fresh_best_speedup"])


def test_predict_needs_the_puct_driver():
    res = CliRunner().invoke(app, ["replay", "--predict", "2"])
    assert res.exit_code != 0 and "--driver puct" in res.output


def test_the_log_s_surprise_widens_only_where_the_log_is_unlike_the_model_s_searches():
    from gfsim.simulator.predictive import log_surprise

    fresh = np.array([[1.0, 1.2, 0.8, 1.0], [1.0, 1.2, 0.8, 1.0], [2.0, 2.0, 2.0, 2.0]])
    got = log_surprise(np.array([1.1, 2.0, 2.5]), fresh)
    sd = fresh[0].std(ddof=1)
    assert got[0] == 1.0  # within one standard deviation: no widening
    assert got[1] == pytest.approx((1.0 / sd) ** 2)
    assert got[2] == np.inf  # every new search identical, the log elsewhere: no spread holds it
    assert log_surprise(np.array([2.0]), fresh[2:])[0] == 1.0
    assert log_surprise(1.0, np.array([0.5]))[()] == 1.0  # one fresh search: nothing to compare
    rq = np.zeros((3, 4)) + np.array([[0.0], [0.1], [0.2]])
    lo, hi = predictive_interval(rq, fresh, surprise=np.array([1.0, 4.0, 1.0]))
    base_lo, base_hi = predictive_interval(rq, fresh)
    assert hi[1] - lo[1] == pytest.approx(2 * (base_hi[1] - base_lo[1]))
    assert hi[0] - lo[0] == pytest.approx(base_hi[0] - base_lo[0])
