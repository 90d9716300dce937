"""Speed-ups that must not change results: cached traces, the running measurement cost."""

from __future__ import annotations

import math

import numpy as np

from gfsim.cost_models import load_cost_model
from gfsim.forecasts.whatif import attach, parse_whatif
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import replay
from gfsim.simulator.closed.engine import PuctSimulation
from gfsim.simulator.replay import trace_cache
from gfsim.simulator.traces import mean_measure_usd

MODEL = load_cost_model("serverless-a100")


def fingerprint(r):
    return r.trace_hash(), r.best_speedup, r.total.usd, r.total.joules


def test_cached_traces_give_the_results_of_fresh_ones():
    log = open_log("synthetic-puct-v1")
    runs = [("threshold:0.7", "puct"), ("ev:10", "puct"), ("topk:2", "trace"),
            ("threshold:coverage=0.5", "trace")]
    try:
        trace_cache(False)
        fresh = [fingerprint(replay(log, make_policy(p), MODEL, seed=s, driver=d,
                                    orphans_dropped=False)) for p, d in runs for s in (0, 1)]
    finally:
        trace_cache(True)
    cached = [fingerprint(replay(log, make_policy(p), MODEL, seed=s, driver=d,
                                 orphans_dropped=False)) for p, d in runs for s in (0, 1)]
    assert cached == fresh
    # A copy with other forecasts (a what-if forecaster) is never served the original's traces.
    what = attach(log, parse_whatif("synthetic:sigma=0.3,temp=0.3"))
    name = "synthetic:sigma=0.3,temp=0.3"
    a = replay(what, make_policy("threshold:0.7"), MODEL, forecaster=name)
    trace_cache(False)
    try:
        b = replay(what, make_policy("threshold:0.7"), MODEL, forecaster=name)
    finally:
        trace_cache(True)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(replay(log, make_policy("threshold:0.7"), MODEL))


def test_the_running_measurement_cost_is_the_growing_traces_mean(monkeypatch):
    """ev reads the mean USD of a measurement every step: the running value must equal
    ``mean_measure_usd`` of the trace so far, bit for bit, so decisions cannot move."""
    seen = []
    original = PuctSimulation._measure_usd

    def checked(self):
        got = original(self)
        t = self.trace
        want = mean_measure_usd(t.price, t.outcome) if len(t) else math.nan
        seen.append((got, want))
        return got

    monkeypatch.setattr(PuctSimulation, "_measure_usd", checked)
    replay(open_log("synthetic-mini"), make_policy("ev:10"), MODEL, driver="puct", seed=3,
           engine="des")
    assert len(seen) >= 3 * 15  # three searches of 16 steps, the log's own shape
    got, want = np.array(seen).T
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
