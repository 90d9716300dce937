"""The closed-loop fast path runs no cyclic garbage collection while it steps (issue 53): a step
makes thousands of acyclic objects, and each collection walked every object alive, half the
time of a replay."""

import gc

from gfsim.cost_models import Capacities, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import parse_budget
from gfsim.simulator.progress import listening
from gfsim.simulator.closed.engine import SEARCH_PRESETS
from gfsim.simulator.replay import cached_traces, simulate_puct
from gfsim.simulator.world_model import ModelChildren

MODEL = load_cost_model("serverless-a100")


def test_the_closed_loop_fast_path_steps_without_cyclic_collections():
    # A step ticks (simulator.progress) at its end: a collection after the first tick and
    # before the last ran while the search stepped.
    trace = cached_traces(open_log("synthetic-puct-v1"), MODEL, None)[0]
    steps, at = [0], []

    def count(phase, info):
        if phase == "start":
            at.append(steps[0])

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        with listening(lambda n: steps.__setitem__(0, steps[0] + n)):
            res = simulate_puct(ModelChildren(trace), SEARCH_PRESETS["paper-standard"],
                                make_policy("all"), MODEL, Capacities(),
                                parse_budget("usd=40"), 0, search_id=trace.search_id,
                                task_id=trace.task_id)
    finally:
        gc.callbacks.remove(count)
    assert res.gpu_evals > 50 and steps[0] > 5
    assert [k for k in at if 0 < k < steps[0]] == [] and gc.isenabled()
