"""Every metric test vector of docs/concepts/paper.md (the bins' are in test_bins_and_scores.py)."""

import math

import numpy as np
import pytest

from gfsim.forecasts import metrics as M

UNIFORM = np.full((1, 8), 1 / 8)


def onehot(b):
    return np.eye(8)[[b - 1]]


def test_ece_vector():
    # 3 rows, all confidence 0.85, 1 correct -> |0.85 - 1/3|
    assert M.ece([0.85] * 3, [1, 0, 0]) == pytest.approx(0.516667, abs=1e-6)
    assert M.ece([], []) == 0.0


def test_ece_buckets_are_equal_width_and_clamp_one():
    # conf 1.0 falls in the last bucket with 0.95; two buckets weighted by size.
    assert M.ece([1.0, 0.95, 0.15], [1, 1, 0]) == pytest.approx(2 / 3 * 0.025 + 1 / 3 * 0.15)


def test_brier_vectors():
    assert M.brier(UNIFORM, [5], [True]) == pytest.approx(0.4375)
    assert M.brier(onehot(3), [5], [True]) == pytest.approx(1.0)
    assert M.brier(onehot(5), [5], [True]) == pytest.approx(0.0)


@pytest.mark.parametrize("probs, truth, expected", [
    (onehot(6), 5, 1 / 7), (onehot(1), 5, 4 / 7), (onehot(1), 8, 1.0), (UNIFORM, 1, 0.3125),
])
def test_crps_vectors(probs, truth, expected):
    assert M.crps(probs, [truth], [True]) == pytest.approx(expected)


def test_nll_vectors():
    assert M.nll(UNIFORM, [4], [True]) == pytest.approx(2.07944, abs=1e-5)
    assert M.nll(onehot(2), [4], [True]) == pytest.approx(-math.log(1e-12))


def test_parse_failures_count_as_uniform_in_full_set_scores_and_are_excluded_elsewhere():
    probs = np.vstack([onehot(5), np.zeros((1, 8))])
    parsed = np.array([True, False])
    truth = [5, 5]
    assert M.brier(probs, truth, parsed) == pytest.approx((0.0 + 0.4375) / 2)
    assert M.nll(probs, truth, parsed) == pytest.approx(math.log(8) / 2)
    assert M.accuracy([5, 1], truth, parsed) == 1.0
    assert math.isnan(M.accuracy([5], [5], [False]))


def test_forecast_error_vector():
    rep = M.representative_speedups([1.5], [5])
    assert M.forecast_error([5], [1.5], [True], rep) == pytest.approx(0.310793, abs=1e-6)


def test_representative_values_use_the_data_for_open_bins():
    rep = M.representative_speedups([0.1, 0.2, 9.0, 1.2], [1, 1, 8, 5])
    assert rep[0] == pytest.approx(0.15) and rep[7] == pytest.approx(9.0)
    assert rep[1:7] == pytest.approx([2**-1.5, 2**-0.75, 2**-0.25, 2**0.25, 2**0.75, 2**1.5])
    fallback = M.representative_speedups([1.2], [5])
    assert (fallback[0], fallback[7]) == pytest.approx((0.125, 4 * 2**0.5))


def test_declared_bin_and_its_confidence():
    p = np.array([[0.1, 0.5, 0.4, 0, 0, 0, 0, 0]])
    assert M.declared_bins(p, [3]).tolist() == [3]
    assert M.declared_bins(p, [np.nan]).tolist() == [2]  # falls back to the argmax
    assert M.confidence_on_declared(p, [3]).tolist() == [0.4]


def test_off_by_one():
    assert M.off_by_one([5, 3, 8], [4, 5, 8], [True] * 3) == pytest.approx(2 / 3)


def test_recovered_ranks_by_score_with_ties_by_order():
    # One task, 4 candidates; the forecast ranks the 2nd best first.
    score = [0.9, 0.1, 0.5, np.nan]
    truth = [2.0, 1.0, 4.0, 8.0]
    out = M.recovered(score, truth, ["t"] * 4, budgets=(25, 50, 100))
    assert out["25"] == pytest.approx(2.0 / 8.0)  # top 1: 2.0
    assert out["50"] == pytest.approx(4.0 / 8.0)  # top 2: 2.0, 4.0
    assert out["100"] == 1.0
    assert out["mean"] == pytest.approx((0.25 + 0.5 + 1.0) / 3)
    tie = M.recovered([1.0, 1.0], [1.0, 3.0], ["t", "t"], budgets=(50,))
    assert tie["50"] == pytest.approx(1 / 3)  # the earlier row wins a tie


def test_recovered_averages_over_tasks():
    out = M.recovered([1, 0, 1, 0], [1.0, 2.0, 2.0, 1.0], ["a", "a", "b", "b"], budgets=(50,))
    assert out["50"] == pytest.approx((0.5 + 1.0) / 2)


def test_risk_coverage_and_aurc():
    scores = [0.9, 0.8, 0.3, 0.0]
    correct = [True, False, True, False]
    parsed = [True, True, True, False]  # a parse failure always abstains
    thr, cov, risk = M.risk_coverage(scores, correct, parsed)
    assert thr[0] == -np.inf and thr[-1] == np.inf
    by_thr = dict(zip(thr.tolist(), zip(cov.tolist(), risk.tolist())))
    assert by_thr[0.9] == (0.25, 0.0)
    assert by_thr[0.8] == pytest.approx((0.5, 0.5))
    assert by_thr[0.3] == pytest.approx((0.75, 1 / 3))
    assert by_thr[-np.inf] == pytest.approx((0.75, 1 / 3))
    assert math.isnan(by_thr[np.inf][1]) and by_thr[np.inf][0] == 0.0
    expected = 0.5 * (0 + 0.5) * 0.25 + 0.5 * (0.5 + 1 / 3) * 0.25
    assert M.aurc(cov, risk) == pytest.approx(expected)
    assert M.selective_risk_at(cov, risk, 0.625) == pytest.approx((0.5 + 1 / 3) / 2)
    assert M.selective_risk_at(cov, risk, 1.0) == pytest.approx(1 / 3)  # snapped at the end


def test_weighted_metrics_reduce_to_plain_ones_with_equal_weights():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(8), 30)
    truth = rng.integers(1, 9, 30)
    parsed = np.ones(30, bool)
    w = np.full(30, 2.5)
    for f in (M.brier, M.crps, M.nll):
        assert f(p, truth, parsed, weights=w) == pytest.approx(f(p, truth, parsed))
    conf = p.max(axis=1)
    correct = p.argmax(axis=1) + 1 == truth
    assert M.ece(conf, correct, weights=w) == pytest.approx(M.ece(conf, correct))
    # and weights do move them
    w2 = np.where(correct, 10.0, 1.0)
    assert M.accuracy(p.argmax(axis=1) + 1, truth, parsed, weights=w2) > M.accuracy(
        p.argmax(axis=1) + 1, truth, parsed)
