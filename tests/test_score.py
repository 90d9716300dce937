"""gfsim score: truth in the forecast's frame, both bin conventions, selection/IPW,
out-of-fold recalibration, pairs logs, the CLI and its plot."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.forecasts import metrics as M
from gfsim.forecasts.calibration import recalibrate
from gfsim.forecasts.scoring import forecaster_rows, score_log, true_speedups
from gfsim.replay_logs import load_log, open_log
from gfsim.testing import LogBuilder
from gfsim.worlds.synth import synthesize

runner = CliRunner()
KEYS = {"forecaster", "n", "n_parsed", "accuracy", "off_by_one", "ece", "brier", "crps", "nll",
        "forecast_error", "recovered", "recovered_mean", "aurc"}


def test_score_json_on_the_shipped_log_has_the_promised_keys():
    res = runner.invoke(app, ["score", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert KEYS <= set(out)
    assert set(out["recovered"]) == {"1", "5", "10", "25", "50"}
    assert out["ranking_score"] == "expected_speedup"
    # Only candidates with a successful evaluation have a true bin.
    log = open_log(None)
    assert out["n"] == int((log.evaluations["outcome"] == "success").sum())
    assert 0 <= out["accuracy"] <= out["off_by_one"] <= 1


def test_a_pairs_log_scores_the_same_way(tmp_path):
    path = tmp_path / "pairs.jsonl"
    synthesize(path, seed=3, candidates=120, tasks=3, shape="pairs")
    res = runner.invoke(app, ["score", "--log", str(path), "--json", "--by-task"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["n"] == 120 and len(out["by_task"]) == 3
    assert sum(v["n"] for v in out["by_task"].values()) == 120


def small_log(tmp_path, relative_to="reference", convention="reference-code", selection=None):
    b = LogBuilder({"a": 1.0, "b": 2.0}, relative_to=relative_to)
    b.header["label_bin_convention"] = convention
    if selection:
        b.header["selection"] = selection
    p = b.candidate("a", 0, speedup=2.0, probs=LogBuilder.onehot(6))
    b.candidate("a", 1, parent=p, speedup=3.0, probs=LogBuilder.onehot(5, 0.6))
    b.candidate("a", 1, parent=p, speedup=0.7, probs=LogBuilder.onehot(3, 0.9))
    b.candidate("b", 0, speedup=4.0, probs=LogBuilder.onehot(7, 0.5))
    b.candidate("b", 0, outcome="compile_failed", speedup=None, probs=LogBuilder.onehot(8))
    return load_log(b.write(tmp_path / "small.jsonl"))


def test_truth_is_taken_in_the_forecast_frame(tmp_path):
    ref = true_speedups(small_log(tmp_path))
    assert sorted(ref.values()) == [0.7, 2.0, 3.0, 4.0]  # the failed candidate has no truth
    par = true_speedups(small_log(tmp_path, relative_to="parent"))
    # a's children are relative to their parent (2.0x); roots to their task's seed kernel.
    assert sorted(par.values()) == pytest.approx([0.35, 1.5, 2.0, 2.0])
    seed = true_speedups(small_log(tmp_path, relative_to="seed"))
    assert sorted(seed.values()) == pytest.approx([0.7, 2.0, 2.0, 3.0])


@pytest.mark.parametrize("convention, bin_of_0_7", [("reference-code", 2), ("paper", 3)])
def test_true_bins_follow_the_header_convention(tmp_path, convention, bin_of_0_7):
    rows = forecaster_rows(small_log(tmp_path, convention=convention), "f")
    truth = dict(zip(rows.true_speedup.tolist(), rows.true_bin.tolist()))
    assert truth[0.7] == bin_of_0_7


def test_score_matches_the_metric_functions_on_a_tiny_log(tmp_path):
    out = score_log(small_log(tmp_path))[0]
    # Truth (reference-code bins): 2.0 -> 6, 3.0 -> 7, 0.7 -> 2, 4.0 -> 8.
    pred = np.array([6, 5, 3, 7])
    assert out["n"] == 4 and out["n_parsed"] == 4
    assert out["accuracy"] == pytest.approx(0.25)  # only the first
    assert out["off_by_one"] == pytest.approx(0.75)
    conf = np.array([1.0, 0.6, 0.9, 0.5])
    assert out["ece"] == pytest.approx(M.ece(conf, pred == [6, 7, 2, 8]))


def test_a_selected_log_reports_its_rule_coverage_and_an_ipw_variant(tmp_path):
    b = LogBuilder({"a": 1.0, "b": 1.0})
    b.header["selection"] = {"rule": "topk", "k": 1}
    for t in ("a", "b"):
        b.candidate(t, 0, speedup=2.5, probs=LogBuilder.onehot(7, 0.8))
        b.candidate(t, 0, speedup=1.5, probs=LogBuilder.onehot(5, 0.5))
        b.candidate(t, 0, speedup=1.5, probs=LogBuilder.onehot(5, 0.9))
        b.candidate(t, 0, outcome=None, deferred=True, probs=LogBuilder.onehot(5, 0.6))
        b.candidate(t, 0, outcome=None, deferred=True, probs=LogBuilder.onehot(5, 0.7))
    out = score_log(load_log(b.write(tmp_path / "sel.jsonl")))[0]
    assert out["selection"]["rule"] == {"rule": "topk", "k": 1}
    assert out["selection"]["coverage"] == pytest.approx(6 / 10)
    # Declared bin 5 was measured in 4 of 8 rows (weight 2), bin 7 in 2 of 2 (weight 1).
    w = np.array([1, 2, 2] * 2, dtype=float)
    hit = np.array([False, True, True] * 2)  # 2.5x is bin 6 (forecast 7); 1.5x is bin 5
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["ipw"]["accuracy"] == pytest.approx((w * hit).sum() / w.sum())
    assert out["ipw"]["uncovered_share"] == 0.0


def test_recalibration_never_uses_the_outcomes_it_is_applied_to():
    rng = np.random.default_rng(0)
    n = 400
    probs = rng.dirichlet(np.full(8, 0.3), n)
    fold = np.repeat(["a", "b"], n // 2)
    truth = rng.integers(1, 9, n)
    args = (probs, np.ones(n, bool), np.full(n, np.nan), fold)
    for method in ("temperature", "isotonic"):
        base, _ = recalibrate(method, *args, truth, np.ones(n, bool))
        shuffled = truth.copy()
        shuffled[fold == "a"] = rng.integers(1, 9, (fold == "a").sum())
        again, _ = recalibrate(method, *args, shuffled, np.ones(n, bool))
        # Fold a's outcomes changed: fold a's recalibrated forecasts must not.
        np.testing.assert_array_equal(base[fold == "a"], again[fold == "a"])
        assert not np.array_equal(base[fold == "b"], again[fold == "b"])
        np.testing.assert_allclose(base.sum(axis=1), 1.0)


def test_recalibration_lowers_ece_of_an_overconfident_forecaster(tmp_path):
    out = score_log(open_log(None), calibrate="temperature")[0]
    cal = out["calibration"]
    assert cal["ece_after"] < cal["ece_before"]
    assert cal["nll_after"] < cal["nll_before"]
    assert cal["accuracy_after"] == pytest.approx(cal["accuracy_before"])  # argmax unchanged


def test_recalibration_needs_two_folds(tmp_path):
    b = LogBuilder({"a": 1.0})
    b.candidate("a", 0, speedup=1.5, probs=LogBuilder.onehot(5, 0.5))
    with pytest.raises(GfsimError, match="needs at least two"):
        score_log(load_log(b.write(tmp_path / "one.jsonl")), calibrate="isotonic")


def test_several_forecasters_give_a_list_and_can_be_chosen(tmp_path):
    log = small_log(tmp_path)
    extra = log.forecasts.copy()
    extra["forecaster"] = "g"
    log.forecasts = __import__("pandas").concat([log.forecasts, extra], ignore_index=True)
    assert [r["forecaster"] for r in score_log(log)] == ["f", "g"]
    assert len(score_log(log, forecaster="g")) == 1
    with pytest.raises(GfsimError, match="no forecasts by 'h'"):
        score_log(log, forecaster="h")


@pytest.mark.parametrize("args, fragment", [
    (["score", "--forecaster", "nobody"], "no forecasts by 'nobody'"),
    (["score", "--task", "nope"], "no task 'nope'"),
    (["score", "--score", "entropy"], "unknown score 'entropy'"),
    (["score", "--calibrate", "platt"], "unknown calibration 'platt'"),
])
def test_bad_score_options_exit_2(args, fragment):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and fragment in res.output


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "scores.png"
    res = runner.invoke(app, ["score", "--plot", str(path)])
    assert res.exit_code == 0, res.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_replay_policies_can_read_recalibrated_forecasts():
    plain = json.loads(runner.invoke(app, ["replay", "-p", "threshold:0.7", "--json"]).output)
    cal = json.loads(runner.invoke(app, ["replay", "-p", "threshold:0.7", "--calibrate",
                                         "temperature", "--json"]).output)
    assert cal["calibration"] == "temperature" and plain["calibration"] == "none"
    assert cal["gpu_evals"] != plain["gpu_evals"]
    assert cal["baseline"]["gpu_evals"] == plain["baseline"]["gpu_evals"]
    assert not math.isnan(cal["usd"])
