"""Reference points: measure everything, a random fraction, or what an oracle would pick."""

from __future__ import annotations

import numpy as np

from gfsim.core.rng import keyed_uniforms
from gfsim.core.specs import Param
from gfsim.policies.base import (
    Batch,
    Decisions,
    GroupPolicy,
    Policy,
    SearchState,
    group_bounds,
    rank_within_groups,
)

__all__ = ["AllPolicy", "RandomPolicy", "OraclePolicy"]


class AllPolicy(Policy):
    name = "all"
    summary = "measure every candidate (the baseline)"
    state_fields = ()

    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        n = len(batch)
        return Decisions.build(np.ones(n, bool), np.full(n, np.nan), ("all",) * n)

    def decide_groups(self, batch, group, best, state) -> Decisions:
        return self.decide(batch, state)  # rowwise and stateless


class RandomPolicy(Policy):
    name = "random"
    summary = "measure each candidate with probability p (keyed draw per candidate)"
    params = (Param("p", float, 0.5, "probability of measuring a candidate", 0.0, 1.0,
                    low_open=True),)
    state_fields = ("seed",)

    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        # Keyed by candidate, so random:0.3 measures a subset of what random:0.6 measures.
        u = keyed_uniforms(state.seed, batch.candidate_ids, "random-policy")
        measure = u < self.p
        reason = np.where(measure, "draw<p", "draw>=p").tolist()
        return Decisions.build(measure, u, reason)

    def decide_groups(self, batch, group, best, state) -> Decisions:
        return self.decide(batch, state)  # rowwise and stateless


class OraclePolicy(GroupPolicy):
    name = "oracle"
    summary = "per parent batch, measure the top fraction p by TRUE speedup (a reference point)"
    params = (Param("p", float, 0.25, "fraction of each batch to measure", 0.0, 1.0,
                    low_open=True),)
    needs_truth = True
    state_fields = ()

    def decide_groups(self, batch, group, best, state) -> Decisions:
        n = len(batch)
        truth = batch.true_speedup if batch.true_speedup is not None else np.full(n, np.nan)
        score = np.where(np.isnan(truth), -np.inf, truth)
        rank = rank_within_groups(group, score)  # ties keep request order
        bounds = group_bounds(group)
        sizes = np.diff(bounds)
        take = np.ceil(self.p * sizes - 1e-9).astype(int)
        measure = rank < np.repeat(take, sizes)
        reason = np.where(measure, "oracle-top", "oracle-rest").tolist()
        return Decisions.build(measure, score, reason)
