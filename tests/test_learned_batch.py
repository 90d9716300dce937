"""The cost model's fast paths (issue 39) change no forecast: its fit (``_Boosted``: compiled in
``forecasts.trees``, or over scikit-learn's own histogram builder and splitter where Numba is
missing) grows scikit-learn's trees bit for bit, its
array predictor (``_Forest``) predicts what scikit-learn's does, and ``LearningChildren``'s
one-batch-per-step ``draw_step`` forecasts what drawing parent by parent, child by child,
does, on a shipped log's closed-loop replay. Replays' results are pinned to the values the
code before these changes gave."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from gfsim.forecasts.learned import LearnedModel, LearnedForecaster, _Boosted, _Forest


def _sklearn(x, y, spec: LearnedForecaster, min_leaf: int):
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=spec.max_iter, max_depth=spec.max_depth, learning_rate=spec.learning_rate,
        min_samples_leaf=min_leaf, early_stopping=False, random_state=spec.seed).fit(x, y)


def _probe(x, rng):
    """Rows to predict: the training rows, the same rows jittered and shuffled, and with
    some values missing (a missing value takes the side its node sends it to)."""
    jit = x[rng.permutation(len(x))] * (1 + 0.05 * rng.standard_normal(x.shape))
    holes = x.copy()
    holes[rng.random(x.shape) < 0.3] = np.nan
    return np.concatenate([x, jit, holes])


def _assert_same_trees(x, y, spec, min_leaf, rng):
    assert _Boosted.handles(spec, x)
    ours = _Boosted(x, y, spec, min_leaf)
    theirs = _sklearn(x, y, spec, min_leaf)
    probe = _probe(x, rng)
    a, b = ours.predict(probe), theirs.predict(probe)
    assert np.array_equal(a, b), (x.shape, spec, np.abs(a - b).max())


@pytest.fixture(scope="module")
def search_source():
    """A search on the measured softmax world whose policy reads the cost model learning in
    it (what ``run_on_world(..., learning=...)`` runs); returns its learning source."""
    from gfsim.cost_models import load_cost_model
    from gfsim.forecasts.bins import PAPER_EDGES
    from gfsim.policies import make_policy
    from gfsim.simulator.budget import Budget
    from gfsim.simulator.children import WorldChildren
    from gfsim.simulator.learning import LearningChildren, world_meta_of
    from gfsim.simulator.replay import simulate_puct
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import paper_standard

    _, factory, _ = resolve_world("h200:softmax")
    model = load_cost_model("serverless-a100")
    inner = WorldChildren(factory(0), "h200-softmax", model)
    source = LearningChildren(inner, LearnedForecaster(), world_meta_of(inner), model)
    simulate_puct(source, replace(paper_standard(10), overgen=4), make_policy("threshold:0.7"),
                  model, model.capacities, Budget(), 1, search_id="s", task_id="h200-softmax",
                  bin_edges=PAPER_EDGES)
    return source


@pytest.mark.slow
def test_the_fit_is_scikit_learn_s_bit_for_bit_on_a_search_s_own_training_sets(search_source):
    """Every training set the search fitted on (the successes of its first steps, in the
    order it learned them): the same predictions, to the bit, as scikit-learn's fit."""
    cm = search_source.cm
    assert len(cm.y) >= 40
    rng = np.random.default_rng(0)
    spec = LearnedForecaster()
    for n in sorted({cm.spec.min_train, 12, 20, 28, 36, len(cm.y)}):
        part = LearnedModel(spec)
        for row, v in zip(cm.rows[:n], cm.y[:n]):
            part.observe(row, v)
        part._columns = sorted({k for r in part.rows for k in r})
        x = part._matrix(part.rows)
        assert np.isnan(x).any()  # features some candidates lack: the missing-value paths
        _assert_same_trees(x, np.asarray(part.y), spec, max(2, n // 20), rng)


@pytest.mark.parametrize("case", range(16))
def test_the_fit_is_scikit_learn_s_bit_for_bit_on_awkward_data(case):
    """Missing values, constant and duplicated columns (ties between features: the first
    wins), indicators, tied targets, fewer rows than two leaves need, more than 255 distinct
    values (quantile bins), every depth it takes and other rates and iteration counts."""
    rng = np.random.default_rng(100 + case)
    n = [3, 9, 17, 40, 64, 120, 300, 31, 50, 8, 75, 260, 24, 48, 96, 36][case]
    nf = [1, 2, 5, 9, 12, 6, 4, 17, 3, 7, 10, 5, 2, 4, 3, 8][case]
    x = rng.standard_normal((n, nf))
    if nf > 1:
        x[:, 1] = rng.integers(0, 2, n)  # an indicator
    if nf > 2:
        x[:, 2] = x[:, 1]  # its duplicate: equal gains, the first feature must win
    if nf > 3:
        x[:, 3] = np.round(x[:, 3])  # few distinct values
        x[rng.random(n) < 0.3, 3] = np.nan  # missing in some rows
    if nf > 4:
        x[:, 4] = 1.5  # constant: never split
    if case % 3 == 0:
        x[rng.random((n, nf)) < 0.15] = np.nan
        x[0, :] = rng.standard_normal(nf)  # every column keeps a value
    y = rng.standard_normal(n) if case % 4 else np.round(rng.standard_normal(n))  # ties
    if case % 2:  # targets of many magnitudes: a histogram got by subtraction rounds
        y *= 10.0 ** rng.integers(-6, 7, n)  # differently from one summed from its samples
    spec = LearnedForecaster(max_depth=1 + case % 4, learning_rate=[0.1, 0.3, 0.05][case % 3],
                         max_iter=[100, 40, 7][case % 3])
    _assert_same_trees(x, y, spec, max(2, n // 20), rng)


def test_the_compiled_fit_is_the_one_that_runs_and_needs_no_scikit_learn_class(monkeypatch):
    """Numba is a dependency: the compiled loop fits, and a fit never reaches scikit-learn's
    private classes (here made to fail), nor imports scikit-learn for them."""
    from gfsim.forecasts import learned, trees

    assert trees.available()
    monkeypatch.setattr(learned, "_sklearn_parts", lambda: pytest.fail("scikit-learn's classes"))
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((30, 4)), rng.standard_normal(30)
    assert _Boosted.handles(LearnedForecaster(), x)
    _Boosted(x, y, LearnedForecaster(), 2)


@pytest.mark.parametrize("case", range(6))
def test_the_compiled_fit_and_the_one_over_scikit_learn_s_classes_grow_the_same_trees(
        case, monkeypatch):
    """Both of ``_Boosted``'s fits, to the bit: every tree's features, thresholds, missing-value
    sides and leaf values; among the columns, one value and missing values (scikit-learn's
    right-to-left scan has nothing to scan there) and indicators."""
    from gfsim.forecasts import learned

    rng = np.random.default_rng(500 + case)
    n, nf = [12, 40, 68, 150, 9, 260][case], [17, 6, 12, 3, 5, 8][case]
    x = rng.standard_normal((n, nf))
    x[:, 0] = rng.integers(0, 2, n)
    x[:, 1] = np.where(rng.random(n) < 0.4, np.nan, 2.0)  # one value, and missing ones
    if nf > 3:
        x[rng.random(n) < 0.2, 3] = np.nan
    y = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    spec = LearnedForecaster(max_depth=1 + case % 4, max_iter=[100, 30][case % 2])
    fitted = []
    for compiled in (True, False):
        monkeypatch.setattr(learned, "COMPILED", compiled)
        b = _Boosted(x, y, spec, max(2, n // 20))
        fitted.append((b.feat, b.thr, b.mgl, b.val, b.base))
    for a, b in zip(*fitted):
        assert np.array_equal(a, b)
    _assert_same_trees(x, y, spec, max(2, n // 20), rng)


def test_deeper_trees_fall_back_to_scikit_learn_s_fit_and_predict_as_it_does():
    """Past depth 4 the 31-leaf cap can bind (scikit-learn grows the best node first), so its
    own fit serves; the array predictor still predicts what its ``predict`` does."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((150, 6))
    x[rng.random(x.shape) < 0.1] = np.nan
    y = rng.standard_normal(150)
    spec = LearnedForecaster(max_depth=8)
    assert not _Boosted.handles(spec, x)
    model = _sklearn(x, y, spec, 7)
    probe = _probe(x, rng)
    assert np.array_equal(_Forest(model).predict(probe), model.predict(probe))
    cm = LearnedModel(spec)
    for row, v in zip(x, y):
        cm.observe({f"c{j}": float(c) for j, c in enumerate(row) if c == c}, v)
    cm.predict([{"c0": 0.5}])
    assert isinstance(cm._forest, _Forest)


def test_a_step_drawn_in_one_batch_forecasts_as_parent_by_parent_on_a_log_replay():
    """Closed-loop replays of the shipped live cost-model log (its first searches), recorded
    step by step (each step's parents' requests, what was measured), then redrawn by two
    fresh sources: one parent at a time (``draw``) and the whole step at once
    (``draw_step``): the same children with the same forecasts as the replay's, to the bit;
    and each child's centre is the one the model predicts for it alone."""
    from gfsim.cost_models import load_cost_model
    from gfsim.forecasts.registry import resolve
    from gfsim.policies import make_policy
    from gfsim.replay_logs import open_log
    from gfsim.simulator.budget import Budget
    from gfsim.simulator.learning import LearningChildren, log_meta_of
    from gfsim.simulator.replay import cached_traces, simulate_puct
    from gfsim.simulator.shape import shapes_for
    from gfsim.simulator.world_model import child_sources

    log, name = resolve(open_log("h200-costmodel-all"), "costmodel")
    model = load_cost_model("reserved-h200")
    traces = cached_traces(log, model, name)
    make, meta_of = child_sources("fallback", traces), log_meta_of(log)

    def fresh(t):
        return LearningChildren(make(t), LearnedForecaster(), meta_of, model)

    compared = 0
    for trace, (config, _) in list(zip(traces, shapes_for(log, traces, None)))[:3]:
        steps: list[list] = [[]]  # per step: (request, seed, children drawn)
        measured: list = []

        class Recorded(LearningChildren):  # the real source, its calls written down
            def draw_step(self, requests, seed):
                out = super().draw_step(requests, seed)
                steps[-1] += [(r, seed, kids) for r, kids in zip(requests, out)]
                return out

            def observe_step(self, results):
                measured.append(list(results))
                steps.append([])
                super().observe_step(results)

        rec = Recorded(make(trace), LearnedForecaster(), meta_of, model)
        simulate_puct(rec, config, make_policy("topk:2"), model, model.capacities, Budget(), 0,
                      search_id=trace.search_id, task_id=trace.task_id,
                      forecast_frame=trace.forecast_frame, bin_edges=trace.bin_edges)
        one, batch = fresh(trace), fresh(trace)
        assert one.root() == batch.root() == rec.root()  # as the engine starts a search
        for step, results in zip(steps, measured + [None]):
            if not step:
                continue
            seeds = {seed for _, seed, _ in step}
            assert len(seeds) == 1
            requests = [r for r, _, _ in step]
            by_parent = [one.draw(*r, *seeds) for r in requests]
            at_once = batch.draw_step(requests, *seeds)
            for (_, _, kids), a, b in zip(step, by_parent, at_once):
                assert [k.candidate_id for k in kids] == [k.candidate_id for k in a] \
                    == [k.candidate_id for k in b]
                for k, ka, kb in zip(kids, a, b):
                    assert k.has_forecast == ka.has_forecast == kb.has_forecast
                    assert np.array_equal(k.probs, ka.probs) and np.array_equal(k.probs, kb.probs)
                    assert k.plan_key == ka.plan_key == kb.plan_key
                    compared += k.has_forecast
            assert one.pending == batch.pending
            for cid, (feats, centre, _) in batch.pending.items():
                alone, _, _ = batch.cm.predict([feats])
                assert float(alone[0]) == centre, cid
            if results is not None:
                one.observe_step(results)
                batch.observe_step(results)
        assert one.cm.y == batch.cm.y == rec.cm.y
        assert one.trained_on == batch.trained_on == rec.trained_on
    assert compared > 100


def _scores(tab) -> str:
    return hashlib.sha256(repr([(c, float(s).hex()) for c, s in
                                zip(tab["candidate_id"], tab["score"])]).encode()).hexdigest()


# Recorded on f05fb05, before the batch step and the fast fit: (trace hash, digest of every
# candidate's forecast score). Every forecast is the same to the bit since.
BEFORE = {
    "topk:2": ("f2b543a509de4c369ae1bad7d8c4f6ab9fffeb66eeba0f2ed19616d8b457e2df",
               "1b354a4f1cdc2e22523666946ad72599ddd1033620339e09339aa56165551ac8"),
    "threshold:0.7": ("e194fbfb0aeb97f3d5fd3671bee47be8e3960c9596a1890466c88a44ef05e4de",
                      "5ed4c4391bc147d4c00dd89d1133dcaec788f7be07ac7225de4ca0e7d2b1cd76"),
    "world": ("55e649f0a13a983a4aca9e35d280555462f3e691874b56f4ffc834d574aae2f5",
              "2c026150153fc6dba7df1a042369fbc96e642c90d969b2c59788bfb6fa199f00"),
}


@pytest.mark.parametrize("policy", ["topk:2", "threshold:0.7"])
def test_a_closed_loop_log_replay_learning_in_the_search_is_what_it_was(policy):
    from gfsim.cost_models import load_cost_model
    from gfsim.forecasts.registry import resolve
    from gfsim.policies import make_policy
    from gfsim.replay_logs import open_log
    from gfsim.simulator.replay import replay

    attached, name = resolve(open_log("h200-costmodel-all"), "costmodel")
    r = replay(attached, make_policy(policy), load_cost_model("reserved-h200"),
               learning=LearnedForecaster(), seed=0, forecaster=name, driver="puct")
    digest = hashlib.sha256("".join(_scores(s.table) for s in r.searches).encode()).hexdigest()
    assert (r.trace_hash(), digest) == BEFORE[policy]


def test_a_search_on_a_world_learning_in_the_search_is_what_it_was():
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import paper_standard, run_on_world

    _, factory, _ = resolve_world("h200:softmax")
    world = factory(0)
    res, _ = run_on_world(world, world.tasks[0].task_id, replace(paper_standard(10), overgen=4),
                          "threshold:0.7", seed=1, learning=LearnedForecaster())
    assert (res.trace_hash, _scores(res.table)) == BEFORE["world"]
