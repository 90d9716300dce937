"""The caches gfsim keeps (gfsim.core.caches): every one declared, none hidden on an object
outside the declared ones, and turning them all off changes no answer."""

import re
from pathlib import Path

import pytest

from gfsim.core import caches
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator.replay import replay_many

ROOT = Path(__file__).resolve().parents[1]
MODEL = load_cost_model("serverless-a100")
USES = re.compile(r"\b(?:kept|keep|on_object)\(\s*[\w.\[\]]+\s*,\s*\"(\w+)\"")
# What may still sit in an object's __dict__ in the simulator, and why it is no cache:
ALLOWED = {
    "traces.py": "a trace's view of the log's columns, its fields sliced on first read",
    "results.py": "a result's own lazily built table and totals (of that result alone)",
    "search_columns.py": "a result rebuilt from a replay's columns, its own lazy fields set",
}


def test_every_cache_kept_on_an_object_is_declared_and_every_declared_one_is_used():
    used = set()
    for path in [*ROOT.glob("simulator/**/*.py"), *ROOT.glob("gfsim/**/*.py")]:
        used |= set(USES.findall(path.read_text()))
    assert used, "no cache uses found: the pattern no longer matches the code"
    assert used <= set(caches.CACHES), used - set(caches.CACHES)
    on_objects = {k for k, v in caches.CACHES.items() if v.startswith("on ") and
                  not v.startswith("on disk")}
    assert on_objects <= used, on_objects - used


def test_no_cache_hides_in_an_object_s_dict_in_the_simulator():
    for path in ROOT.glob("simulator/**/*.py"):
        if "__dict__" in path.read_text():
            assert path.name in ALLOWED, (
                f"{path.name} keeps something in an object's __dict__: declare it in "
                "gfsim.core.caches.CACHES and use kept/keep/on_object")


def _replays():
    log = open_log("synthetic-puct-v1")
    seeds = [0, 1, 2]
    closed = replay_many(log, [make_policy("threshold:0.7") for _ in seeds], MODEL, seeds,
                         driver="puct", orphans_dropped=False, children="model")
    trace = replay_many(open_log("synthetic-mini"), [make_policy("topk:2")], MODEL, [0])
    return [(s.best_speedup, s.best_candidate_id, s.gpu_evals, s.total.usd, s.wall_s)
            for r in (*closed, *trace) for s in r.searches]


def test_turning_the_caches_off_changes_no_answer():
    warm = _replays()
    with caches.caches_off():
        assert not caches.enabled()
        cold = _replays()
    assert caches.enabled()
    assert cold == warm
    assert _replays() == warm


def test_the_switch_is_restored_whatever_happens_in_the_block():
    with pytest.raises(RuntimeError):
        with caches.caches_off():
            raise RuntimeError("inside")
    assert caches.enabled()
    box = type("Box", (), {})()
    made = []
    with caches.caches_off():
        caches.on_object(box, "_log_pool", lambda: made.append(1) or len(made))
        caches.on_object(box, "_log_pool", lambda: made.append(1) or len(made))
        assert caches.keep(box, "_trace_key", 5) == 5 and caches.kept(box, "_trace_key") is None
    assert made == [1, 1] and "_log_pool" not in box.__dict__
    assert caches.on_object(box, "_log_pool", lambda: 7) == 7
    assert caches.on_object(box, "_log_pool", lambda: 8) == 7
