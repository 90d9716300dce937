"""Many searches: the column form (traces as views of the whole log's columns, the fast path
and the notes reading those columns once) gives what the per-search form gives, to the bit.

The per-search form is the same traces with every field materialised on its own (no view):
the fast path then chains each search's fields as before issue 52. A replay's results are
columns too (``simulator.search_columns``): its figures and its ``--json`` document, streamed
a chunk of searches at a time, are held equal, to the byte, to those of a plain list of one
``SearchResult`` per search (the form before issue 53). The log is SYNTHETIC,
drawn here: searches of 1 to 90 candidates, parents within a step and across steps, failed
generations, every outcome, candidates without an evaluation or a forecast.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.cost_models import Capacities, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator.budget import Budget
from gfsim.simulator.seconds_report import evaluation_seconds
from gfsim.simulator import replay as _replay  # noqa: F401  (loads the module)
from gfsim.simulator.replay import calibration_batch, simulate_searches
from gfsim.cli.common import json_bytes, json_parts
from gfsim.simulator.results import ReplayResult, SearchResult
from gfsim.simulator.search_columns import SearchList, columns_in
from gfsim.simulator.traces import SearchTrace, build_traces, columns_of

HEADER = {"kind": "header", "schema_version": 1, "log_id": "many-searches-test",
          "created_at": "2026-12-06T00:00:00Z",
          "provenance": {"kind": "synthetic", "note": "SYNTHETIC: drawn by "
                         "tests/test_many_searches.py; nothing was measured"},
          "log_shape": "trajectory", "label_bin_convention": "reference-code",
          "forecast_bin_edges": [0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0],
          "forecast_relative_to": "reference", "hardware": {"device_name": "none"},
          "tasks": [{"task_id": "t", "reference_runtime_ns": 1000.0, "seed_speedup": 1.0},
                    {"task_id": "u", "seed_speedup": 1.2}]}
OUTCOMES = ["success"] * 5 + ["compile_failed", "runtime_error", "incorrect", None]


def _search(rng: random.Random, sid: str, size: int, task: str) -> list[dict]:
    out = [{"kind": "run", "search_id": sid, "driver": "trace"}]
    ids: list[str] = []
    step, seq = 0, 0
    out.append({"kind": "step", "search_id": sid, "step": 0, "parent_ids": []})
    for k in range(size):
        if k and rng.random() < 0.3:  # a new step, whose parents are earlier candidates
            step, seq = step + 1, 0
            out.append({"kind": "step", "search_id": sid, "step": step, "parent_ids": []})
        cid = f"{sid}-c{k}"
        gen = {"started_s": 0.0, "completed_s": 20.0 + k % 7, "service_s": 20.0 + k % 7}
        if rng.random() < 0.05:
            gen["failed_reason"] = "no code"
        rec = {"kind": "candidate", "candidate_id": cid, "search_id": sid, "task_id": task,
               "step": step, "seq": seq, "generation": gen}
        if ids and rng.random() < 0.7:
            rec["parent_id"] = rng.choice(ids[-4:])
        out.append(rec)
        seq += 1
        if rng.random() < 0.9:
            p = [rng.random() for _ in range(8)]
            out.append({"kind": "forecast", "candidate_id": cid, "forecaster": "fc",
                        "mode": "tool", "probs": [x / sum(p) for x in p],
                        "latency_s": round(rng.uniform(5, 50), 2)})
        outcome = rng.choice(OUTCOMES)
        if outcome is not None and "failed_reason" not in gen:
            ev = {"kind": "evaluation", "candidate_id": cid, "outcome": outcome,
                  "compile_s": 1.0, "check_s": round(rng.uniform(1, 3), 2)}
            if outcome == "success":
                ev.update(speedup=round(rng.uniform(0.3, 3.0), 3), timing_s=8.0)
            if rng.random() < 0.3:  # a whole-evaluation time only: split by the priors
                ev = {k: v for k, v in ev.items() if not k.endswith("_s")}
                ev["service_s"] = 12.5
            out.append(ev)
        ids.append(cid)
    return out


@pytest.fixture(scope="module")
def many_log(tmp_path_factory):
    rng = random.Random(52)
    records = [HEADER]
    for i in range(160):  # mostly tiny searches, a few of 64 candidates or more
        size = rng.choice([1, 1, 1, 2, 3, 5, 8]) if i % 20 else rng.randint(64, 90)
        records += _search(rng, f"s{i}", size, "t" if i % 3 else "u")
    path = tmp_path_factory.mktemp("many") / "many.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_log(path)


def _per_search(traces: list[SearchTrace]) -> list[SearchTrace]:
    """The same traces, each holding its own fields (the form before the columns)."""
    return [SearchTrace(**{f.name: getattr(t, f.name) for f in dataclasses.fields(t)})
            for t in traces]


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN, numpy arrays compared by value."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_traces_are_views_of_one_log_and_equal_per_search_fields(many_log):
    model = load_cost_model("serverless-a100")
    traces = build_traces(many_log, model)
    assert len(traces) == 160
    assert columns_of(traces) is not None  # the column form
    plain = _per_search(traces)
    assert columns_of(plain) is None  # the per-search form
    for t, p in zip(traces, plain):
        for f in dataclasses.fields(t):
            assert _same(getattr(t, f.name), getattr(p, f.name)), (t.search_id, f.name)
    assert evaluation_seconds(traces) == evaluation_seconds(plain)
    got, want = calibration_batch(traces), calibration_batch(plain)
    for f in dataclasses.fields(got):
        assert _same(getattr(got, f.name), getattr(want, f.name)), f.name


@pytest.mark.parametrize("policy,steps,model_name", [
    ("threshold:0.7", None, "serverless-a100"),
    ("all", None, "reserved-h100"),
    ("topk:1", 2, "serverless-a100"),
])
def test_column_replay_equals_per_search_replay(many_log, policy, steps, model_name):
    model = load_cost_model(model_name)
    traces = build_traces(many_log, model)
    plain = _per_search(traces)
    caps = Capacities(generator=1000, forecaster=1000, compile_workers=1000, gpus=1000)
    budget = Budget() if steps is None else Budget(steps=steps)
    for drop in (False, True):
        runs = [simulate_searches(ts, make_policy(policy), model, caps, budget, 0, drop,
                                  engine="fast") for ts in (traces, plain)]
        cols, per = runs
        for a, b in zip(cols, per):
            assert a.summary() == b.summary()
            assert _same(a.anytime, b.anytime)
            assert _same(a.table, b.table)
            assert a.stages == b.stages and a.total == b.total
            assert a.unforecast == b.unforecast
        assert [r.trace_hash for r in cols] == [r.trace_hash for r in per]
        figures = [ReplayResult(policy, "log", model.name, 0, r).figures() for r in runs]
        assert figures[0] == figures[1]


def test_a_log_of_many_small_searches_keeps_no_derived_files(tmp_path, monkeypatch):
    """A warm replay of many one-candidate searches costs what a cold one does: encoding
    their traces and results beside the log's cache cost more than building them (10^5
    searches: 60 s against 8 s, and a warm replay at 3.7 GB against 2.2 GB cold)."""
    replay_mod = sys.modules["gfsim.simulator.replay"]
    rng = random.Random(1)
    records = [HEADER]
    for i in range(replay_mod._KEEP_MAX_SEARCHES + 50):
        records += _search(rng, f"s{i}", 1, "t")
    path = tmp_path / "tiny-searches.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setenv("GFSIM_LOG_CACHE", "on")
    outs = []
    for _ in range(2):  # the second run reads the table cache the first wrote
        replay_mod._TRACES.clear()
        res = CliRunner().invoke(app, ["replay", "--log", str(path), "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        out.pop("simulation_s")
        outs.append(out)
    assert outs[0] == outs[1]
    assert list(path.parent.glob(".gfsim-cache/*/manifest.json"))  # the tables are cached
    assert not list(path.parent.glob(".gfsim-cache/*/derived/*/*.bin"))  # nothing derived


def _plain(result: ReplayResult) -> ReplayResult:
    """The same replay with a list of one ``SearchResult`` per search (the form before the
    columns): every figure is then made search by search."""
    def listed(searches):
        return None if searches is None else [r for r in searches]

    return dataclasses.replace(result, searches=listed(result.searches),
                               orphans_dropped=listed(result.orphans_dropped))


@pytest.mark.parametrize("policy,budget,model_name", [
    ("threshold:0.7", None, "serverless-a100"),
    ("topk:1", "steps=2", "reserved-h100"),
])
def test_results_as_columns_give_the_per_search_figures_and_json(many_log, policy, budget,
                                                                  model_name):
    from gfsim.api.compare import _add_stop_reasons
    from gfsim.simulator import comparison_json, parse_budget, replay_with_baseline

    model, the_budget = load_cost_model(model_name), parse_budget(budget)
    caps = Capacities(generator=1000, forecaster=1000, compile_workers=1000, gpus=1000)
    result, base = replay_with_baseline(many_log, make_policy(policy), model,
                                        budget=the_budget, capacities=caps)
    for r in (result, base):  # one table per replay, no result object per search
        assert isinstance(r.searches, SearchList) and columns_in(r.searches) is not None
        assert all(isinstance(s, SearchResult) for s in r.searches[:3])
    plain, plain_base = _plain(result), _plain(base)
    assert columns_in(plain.searches) is None
    assert result.figures() == plain.figures() and base.figures() == plain_base.figures()
    assert result.trace_hash() == plain.trace_hash()
    docs = []
    for r, b in ((result, base), (plain, plain_base)):
        out = comparison_json(r, b, the_budget)
        _add_stop_reasons(out, r, b)
        docs.append(out)
    streamed = b"".join(json_parts(docs[0]))
    assert streamed == json_bytes(docs[1])  # the columns' document, to the byte
    assert streamed == json_bytes(docs[0])  # and read whole, as a plain dict would be
    assert docs[0]["searches"][5] == docs[1]["searches"][5]
    assert docs[0]["anytime"]["s7"] == docs[1]["anytime"]["s7"]
    assert json.loads(streamed)["searches"][0]["stop_reason"]["code"] in (
        "steps_done", "budget:steps")


def test_json_parts_stream_nested_lists_and_dicts_byte_for_byte():
    """What print_json writes a chunk at a time equals the whole document encoded at once:
    parts at two depths, empty parts, control characters, NaN."""
    class Rows(list):
        def json_chunks(self):
            yield []
            for a in range(0, len(self), 3):
                yield self[a:a + 3]

    class Table(dict):
        def json_chunks(self):
            keys = list(self)
            for a in range(0, len(keys), 2):
                yield {k: self[k] for k in keys[a:a + 2]}

    rows = Rows([{"id": f"s{i}\u202e", "x": [i, float("nan")]} for i in range(7)])
    table = Table({f"k{i}": [[1.5, i]] for i in range(5)})
    doc = {"a": 1, "rows": rows, "inner": {"table": table, "empty": Rows(), "none": Table()},
           "tail": "\x1b[31m"}
    plain = {"a": 1, "rows": list(rows), "inner": {"table": dict(table), "empty": [],
                                                   "none": {}}, "tail": "\x1b[31m"}
    assert b"".join(json_parts(doc)) == json_bytes(plain)


def test_a_replay_of_many_searches_keeps_a_few_hundred_bytes_a_search(tmp_path):
    """Results as columns: what a replay of one-candidate searches keeps is a few arrays, not
    a result object per search (before issue 53: about 1,000 B a search, now about 360 B)."""
    import gc
    import tracemalloc

    replay_log = sys.modules["gfsim.simulator.replay"].replay
    rng = random.Random(3)
    records = [HEADER]
    n = 3000
    for i in range(n):
        records += _search(rng, f"s{i}", 1, "t")
    path = tmp_path / "one-candidate-searches.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    log = load_log(path)
    model = load_cost_model("serverless-a100")
    caps = Capacities(generator=1000, forecaster=1000, compile_workers=1000, gpus=1000)
    replay_log(log, make_policy("all"), model, capacities=caps)  # traces built and kept
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = replay_log(log, make_policy("all"), model, capacities=caps)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert columns_in(result.searches) is not None and len(result.searches) == n
    assert kept / n < 600, f"{kept / n:.0f} B a search"
