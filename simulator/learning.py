"""Replaying under a forecaster that learns from the search (the cost model).

A learning forecaster's forecast for a candidate rests on what the search measured before the
candidate's decision. In a replay under a policy that skips candidates, that is what *the
replayed policy* measured, not everything the log measured: a cost model trained on the log's
every measurement would know speedups the replayed search never saw, and its forecasts (so the
policy's decisions) would be better informed than they could have been.

The replay and the forecaster depend on each other (the decisions at step s depend on the
forecasts at s, which depend on the measurements of steps < s), and this module solves that by
iteration rather than by threading a model through every engine: forecast with the model
trained on a guess of the measured set (first: everything the log measured), replay, take the
set the replay measured as the next guess, and repeat until the set no longer changes. The
decisions of step 0 cannot change after the first round, those of step 1 after the second, and
so on, so it ends within one round per step; the set it ends on is the one a search that
forecast and decided step by step would measure (a fixed point is consistent at every step,
and the step-by-step solution is the only consistent one). Rounds are cheap: a step whose
training history did not change reuses its fitted forecasts (``prequential_records``' memo).

That iteration serves the trace driver, whose candidates are the log's in the log's order.
A closed-loop search (the puct driver replaying a log, or a search run directly on a world)
draws children no log orders, so there the forecaster learns inside the search instead:
``LearningChildren`` wraps the search's child source, forecasts each step's children with the
model fitted on what the search measured in earlier steps, and learns the step's measurements
when the engine reports them (``ChildSource.observe_step``) -- the same prequential rule, step
by step.
"""

from __future__ import annotations

from gfsim.core.errors import GfsimError

import math
from dataclasses import replace

from gfsim.simulator.children import Child, ChildSource

__all__ = ["replay_learning", "LearningChildren", "log_meta_of", "world_meta_of"]


def replay_learning(log, policy, model, seed: int, spec, replay_once, memo: dict | None = None):
    """``replay_once(log_with_forecasts)`` (a one-seed trace replay reading forecaster
    ``spec.name``) until the cost model ``spec`` has learned only from what that replay
    measured. Returns (the final replay's result, the rounds it took)."""
    from gfsim.forecasts.attach import attach_records
    from gfsim.forecasts.learned import prequential_records

    memo = {} if memo is None else memo
    steps = int(log.candidates["step"].nunique()) if len(log.candidates) else 0
    train: set[str] | None = None  # first guess: everything the log measured
    for rounds in range(1, steps + 3):
        recs, _ = prequential_records(log, spec, train_on=train, memo=memo)
        result = replay_once(attach_records(log, recs, spec.name, "costmodel"))
        table = result.candidate_table()
        measured = set(table.loc[table["state"] == "measured", "candidate_id"])
        if train is not None and measured == train:
            return result, rounds
        train = measured
    raise GfsimError(f"{log.display_name}: the replay under {policy.spec()} with the learning "
                     f"forecaster {spec.name} did not settle within {steps + 2} rounds "
                     "(a policy whose decisions depend on more than earlier steps?)")


class LearningChildren(ChildSource):
    """A child source whose children carry the cost model's forecasts, learned in the search.

    Every child of step s (generation failures aside, which are not forecast) is forecast by
    a ``LearnedModel`` fitted on the successes the search measured in steps < s, from its
    features (``meta_of(child)``: its ``source_meta``, or None) and its parent's measured
    speedup, as ``gfsim.forecasts.learned.prequential_records`` does for a log. The forecast
    costs what the features cost to get (their compile seconds, no tokens). One instance per
    search: it holds that search's model."""

    def __init__(self, inner: ChildSource, spec, meta_of, model):
        from gfsim.forecasts.learned import LearnedModel

        self.inner, self.spec, self.meta_of, self.model = inner, spec, meta_of, model
        self.cm = LearnedModel(spec)
        self.pending: dict[str, tuple] = {}  # drawn, not yet reported: (features, centre, learned)
        self.trained_on: dict[str, int] = {}  # child id -> successes its forecast was fitted on

    def root(self) -> tuple[str, float]:
        return self.inner.root()

    def template_cache(self) -> dict | None:
        return self.inner.template_cache()

    def draw(self, node_id, node_speedup, expansion, n, seed) -> list[Child]:
        return self.draw_step([(node_id, node_speedup, expansion, n)], seed)[0]

    def draw_step(self, requests, seed) -> list[list[Child]]:
        """The children of every expansion of one step (``requests``: ``(node_id,
        node_speedup, expansion, n)`` per parent, in order), as ``[self.draw(*r, seed) for r
        in requests]`` would give them, forecast in one batch: the model is fitted at most
        once a step (only if the previous step's measurements changed its training set) and
        predicts all the step's children in one call. Why: fitting and predicting per parent
        repeated the same work for every parent of a step (nothing is learned between them:
        a step's measurements arrive after all its draws), and a batch's rows are predicted
        independently, so the forecasts are the same, bit for bit."""
        from gfsim.forecasts.learned import distribution, encode, forecast_seconds

        requests = list(requests)
        inner_step = getattr(self.inner, "draw_step", None)
        drawn = inner_step(requests, seed) if callable(inner_step) else \
            [self.inner.draw(*r, seed) for r in requests]
        live, feats, metas = [], [], []  # live: (request, place) of each forecast child
        for i, ((_, node_speedup, _, _), kids) in enumerate(zip(requests, drawn)):
            parent = math.log2(node_speedup) if node_speedup > 0 else None
            for j, k in enumerate(kids):
                if not k.gen_failed:
                    m = self.meta_of(k)
                    live.append((i, j))
                    metas.append(m)
                    feats.append(encode(m, parent))
        out = [list(kids) for kids in drawn]  # generation failures keep their place, unforecast
        if not live:
            return out
        centre, width, learned = self.cm.predict(feats)
        probs = distribution(centre, width)
        trained = len(self.cm.y)
        for (i, j), m, f, c, p in zip(live, metas, feats, centre, probs):
            k = out[i][j]
            self.pending[k.candidate_id] = (f, float(c), learned)
            self.trained_on[k.candidate_id] = trained
            out[i][j] = self._forecast(k, p, forecast_seconds(m))
        return out

    def _forecast(self, child: Child, probs, seconds: float) -> Child:
        from gfsim.cost_models.usage import Usage

        c = self.model.cost(Usage("forecasting", seconds, 0.0, 0.0))
        base = child.plan_key if child.plan_key is not None else (
            child.template if child.template is not None else child.candidate_id)
        # The plan differs from the inner child's (the forecast's seconds and price), and is
        # the same for every child of one base (its features, so its seconds, are the same).
        return replace(child, has_forecast=True, probs=probs, parse_failed=False,
                       fc_s=seconds, fc_in=0.0, fc_out=0.0, fc_imputed=False,
                       price={**child.price, "forecasting": (c.usd, c.joules, c.usd_imputed)},
                       plan_key=("costmodel", base))

    def observe_step(self, results) -> None:
        """The step's measured children (``ChildResult``, reward None: failed): the successes
        train the model, and its errors on them learn the width, as in the log's case."""
        for r in results:
            got = self.pending.pop(r.node_id, None)
            if got is None or r.reward is None or not r.reward > 0:
                continue
            feats, centre, learned = got
            y = math.log2(r.reward)
            if learned:
                self.cm.score(centre, y)
            self.cm.observe(feats, y)
        self.pending.clear()  # a child not measured in its step never is


def log_meta_of(log):
    """``meta_of`` for children copied from ``log``'s candidates: the ``source_meta`` of the
    logged candidate a child copies (its ``template``); None for one that copies none. Where
    a live cost model recorded how long its forecast of that candidate took, that is the
    forecast's seconds (``features.seconds``), as in the log's own prequential forecasts."""
    from gfsim.forecasts.learned import log_metas, recorded_latency

    latency = recorded_latency(log)
    by_id = {}
    for cid, meta in zip(log.candidates["candidate_id"].tolist(), log_metas(log)):
        if cid in latency:
            meta = dict(meta or {})
            meta["features"] = {**(meta.get("features") or {}), "seconds": latency[cid]}
        by_id[cid] = meta
    return lambda child: by_id.get(child.template) if child.template is not None else None


def world_meta_of(source):
    """``meta_of`` for a ``WorldChildren`` source: the world's ``describe`` of the child's
    node (None where the world describes nothing)."""
    describe = getattr(source.world, "describe", None)
    if not callable(describe):
        return lambda child: None
    return lambda child: describe(source.nodes[child.candidate_id])
