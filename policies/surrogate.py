"""Policies that read forecasts: the reference's top-k and the selective threshold surrogate."""

from __future__ import annotations

import numpy as np

from gfsim.core.errors import SpecError
from gfsim.core.rng import keyed_uniforms
from gfsim.core.specs import Param, bind_params, parse_spec
from gfsim.forecasts.bins import bin_cdf_above, expected_log2_gain
from gfsim.forecasts.confidence import SCORES, expected_bin_index
from gfsim.policies.base import Batch, Decisions, GroupPolicy, rank_within_groups

__all__ = ["TopKPolicy", "ThresholdPolicy", "ExpectedValuePolicy"]

_ON_PARSE_FAILURE = Param(
    "on_parse_failure", ("measure", "skip"), "measure",
    "what to do with a candidate whose forecast failed to parse or is missing",
)


_THRESHOLD_REASONS = np.array(["unsure", "promising", "confident-not-better"], dtype=object)
_TOPK_REASONS = np.array(["below-k", "top-k"], dtype=object)


def _apply_unusable(batch: Batch, measure: np.ndarray, reason: np.ndarray, rule: str):
    """Rows without a usable forecast: measured or skipped by ``on_parse_failure``."""
    unusable = ~batch.usable
    if unusable.any():
        measure = np.where(unusable, rule == "measure", measure)
        reason = reason.copy()
        reason[unusable] = np.where(batch.has_forecast[unusable], "parse-failed", "unforecast")
    return measure, reason


class TopKPolicy(GroupPolicy):
    name = "topk"
    summary = "per parent batch, measure the top k by expected bin index (the reference's rule)"
    params = (Param("k", int, 4, "candidates measured per parent batch", 1), _ON_PARSE_FAILURE)
    needs_forecast = True
    state_fields = ()

    def decide_groups(self, batch, group, best, state) -> Decisions:
        usable = batch.usable
        score = np.where(usable, expected_bin_index(batch.probs), -np.inf)
        # Ties by request order, as the reference; unusable rows rank last and never count.
        measure = usable & (rank_within_groups(group, score) < self.k)
        reason = _TOPK_REASONS[measure.astype(np.intp)]
        measure, reason = _apply_unusable(batch, measure, reason, self.on_parse_failure)
        return Decisions.build(measure, score, reason)


class ThresholdPolicy(GroupPolicy):
    """The selective surrogate: measure iff conf < tau or promise >= rho.

    conf = score(forecast); promise = P(S > current best | forecast) from the forecast's CDF over
    its bin edges, after converting to the reference frame with ``batch.base_speedup``. A
    confident forecast that says "not better than the best so far" is the only thing skipped.
    ``coverage=q`` replaces tau by the score quantile that measures a fraction q of a
    calibration split (``fit``).
    """

    name = "threshold"
    summary = "measure iff confidence < tau or P(S > best) >= rho (the selective surrogate)"
    params = (
        # A confidence score (maxprob, negentropy, margin) lies in [0, 1]: so does tau.
        Param("tau", float, 0.7, "confidence below which a candidate is always measured", 0.0,
              1.0),
        Param("score", tuple(SCORES), "maxprob", "confidence score of a forecast"),
        Param("rho", float, 0.5, "promise P(S > best) at or above which it is measured", 0.0, 1.0),
        Param("coverage", float, None, "set tau so that this fraction is measured (calibrated)",
              0.0, 1.0, low_open=True),
        _ON_PARSE_FAILURE,
        Param("top_span", float, 4.0, "prior: open top bin is log-uniform up to edge*top_span",
              1.0),
        Param("cal_frac", float, 0.5, "share of candidates in the coverage calibration split",
              0.0, 1.0, low_open=True),
    )
    needs_forecast = True
    state_fields = ()

    @classmethod
    def from_spec(cls, spec: str) -> "ThresholdPolicy":
        _, pairs = parse_spec(spec)
        values = bind_params(cls.name, cls.params, pairs)
        if "coverage" in values and "tau" in values:
            raise SpecError("threshold: give tau or coverage, not both")
        return cls(**values)

    def __init__(self, **values):
        super().__init__(**values)
        self.tau_: float | None = None

    def spec(self) -> str:
        text = super().spec()
        if self.coverage is not None:  # tau is learned (tau_) in the coverage form
            text = text.replace(f"tau={self.tau},", "").replace(f":tau={self.tau}", ":")
        return text

    def reads_seed(self) -> bool:
        # The coverage form calibrates tau on a split keyed by the seed.
        return self.coverage is not None and self.cal_frac < 1.0

    def fit(self, calibration: Batch, seed: int) -> "ThresholdPolicy":
        if self.coverage is None:
            return self
        if len(calibration) == 0 or not calibration.usable.any():
            raise SpecError("threshold:coverage needs forecasts to calibrate on; the log has none")
        usable = calibration.usable
        conf = SCORES[self.score](calibration.probs[usable])
        # Keyed split: whether a candidate calibrates depends only on (seed, candidate).
        ids = [c for c, u in zip(calibration.candidate_ids, usable) if u]
        pick = keyed_uniforms(seed, ids, "threshold-calibration") < self.cal_frac
        sample = conf[pick] if pick.any() else conf
        if self.coverage >= 1.0:
            self.tau_ = float(np.nextafter(sample.max(), np.inf))
        else:
            self.tau_ = float(np.quantile(sample, self.coverage, method="inverted_cdf"))
        return self

    @property
    def effective_tau(self) -> float:
        if self.coverage is None:
            return self.tau
        if self.tau_ is None:
            raise RuntimeError("threshold:coverage must be fitted before it decides")
        return self.tau_

    def decide_groups(self, batch, group, best, state) -> Decisions:
        usable = batch.usable
        conf = np.where(usable, SCORES[self.score](batch.probs), np.nan)
        threshold = np.asarray(best, dtype=float) / np.maximum(batch.base_speedup, 1e-300)
        promise = bin_cdf_above(batch.probs, batch.bin_edges, threshold, top_span=self.top_span)
        tau = self.effective_tau
        unsure = conf < tau
        promising = promise >= self.rho
        measure = usable & (unsure | promising)
        reason = _THRESHOLD_REASONS[np.where(unsure, 0, np.where(promising, 1, 2))]
        measure, reason = _apply_unusable(batch, measure, reason, self.on_parse_failure)
        return Decisions.build(measure, conf, reason)


class ExpectedValuePolicy(GroupPolicy):
    """Value of information: measure iff the forecast's expected gain over the best so far, in
    log2 speedup, is worth what measuring costs: ``usd_per_log2_speedup`` x E[gain] >=
    ``state.measure_usd`` (the engine's estimate of one measurement's USD). The exchange rate is
    a tunable parameter, not a fact."""

    name = "ev"
    summary = ("measure iff usd_per_log2_speedup x E[log2 gain over best] >= the USD of a "
               "measurement (value of information)")
    params = (
        Param("usd_per_log2_speedup", float, 10.0,
              "what one doubling of the best speedup is worth, in USD", 0.0),
        _ON_PARSE_FAILURE,
        Param("top_span", float, 4.0, "prior: open top bin is log-uniform up to edge*top_span",
              1.0),
    )
    needs_forecast = True
    state_fields = ("measure_usd",)

    def decide_groups(self, batch, group, best, state) -> Decisions:
        usable = batch.usable
        threshold = np.asarray(best, dtype=float) / np.maximum(batch.base_speedup, 1e-300)
        gain = expected_log2_gain(batch.probs, batch.bin_edges, threshold,
                                  top_span=self.top_span)
        value = self.usd_per_log2_speedup * gain
        cost = state.measure_usd if state.measure_usd == state.measure_usd else 0.0
        measure = usable & (value >= cost)
        reason = _EV_REASONS[measure.astype(np.intp)]
        measure, reason = _apply_unusable(batch, measure, reason, self.on_parse_failure)
        return Decisions.build(measure, value, reason)


_EV_REASONS = np.array(["not-worth-it", "worth-measuring"], dtype=object)
