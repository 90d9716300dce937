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

Trace driver only: the closed-loop driver draws children the log may not hold, whose place in
the log's prequential order is not theirs in the replayed search.
"""

from __future__ import annotations

from gfsim.core.errors import GfsimError

__all__ = ["replay_learning"]


def replay_learning(log, policy, model, seed: int, spec, replay_once, memo: dict | None = None):
    """``replay_once(log_with_forecasts)`` (a one-seed trace replay reading forecaster
    ``spec.name``) until the cost model ``spec`` has learned only from what that replay
    measured. Returns (the final replay's result, the rounds it took)."""
    from gfsim.forecasts.attach import attach_records
    from gfsim.forecasts.costmodel import prequential_records

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
    raise GfsimError(f"{log.path}: the replay under {policy.spec()} with the learning "
                     f"forecaster {spec.name} did not settle within {steps + 2} rounds "
                     "(a policy whose decisions depend on more than earlier steps?)")
