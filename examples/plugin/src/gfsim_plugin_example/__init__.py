"""An example gfsim plug-in (docs/how-to/write-a-plugin.md): a policy, a forecaster, a cost
model, an importer.

- ``budget-share:0.5``: measure a candidate only while the step's share of the budget left
  allows, the most promising first (by the forecast's expected bin index);
- ``parent-prior:1.0``: forecast a candidate as its parent's speedup, give or take a log2 width
  (an assumption, no model): in a live run from the parent's measured speedup, in a replay from
  the log's;
- ``spot-a100``: the ``serverless-a100`` preset with GPU-hours at a spot price (an assumed
  60% discount, not a quoted one);
- ``runs-csv``: a search written as a CSV file (``id,parent,step,runtime_ns``; an empty
  runtime: the kernel failed its check) as a trajectory log, ``gfsim import plugin runs-csv``.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from gfsim.core.errors import SpecError
from gfsim.core.specs import Param
from gfsim.cost_models import PresetCostModel, load_cost_model
from gfsim.forecasts import Forecast, Forecaster
from gfsim.forecasts.bins import gaussian_bins
from gfsim.policies import Batch, Decisions, Policy, SearchState

__all__ = ["BudgetSharePolicy", "ParentPriorForecaster", "import_runs_csv", "spot_a100"]


class BudgetSharePolicy(Policy):
    """Of each parent batch, measure the candidates with the highest expected bin, as many as
    ``share`` of the budget left (in measurements at the engine's estimate of one) affords."""

    name = "budget-share"
    summary = "measure the most promising candidates that a share of the budget left affords"
    params = (Param("share", float, 0.5, "the share of the USD budget left one batch may spend",
                    low=0.0, high=1.0, low_open=True),)
    needs_forecast = True
    state_fields = ("budget_left", "measure_usd")

    def decide(self, batch: Batch, state: SearchState) -> Decisions:
        n = len(batch)
        usable = batch.usable
        score = np.where(usable, batch.probs @ np.arange(8.0), -np.inf)
        left = state.budget_left.get("usd", np.inf)
        price = state.measure_usd
        if not np.isfinite(left) or not price > 0:
            k = n  # no USD budget, or no price yet: measure every candidate
        else:
            k = int(self.share * left // price)
        order = np.argsort(-score, kind="stable")[:k]
        measure = np.zeros(n, bool)
        measure[order] = True
        reason = tuple("budget-share" if m else "over-share" for m in measure)
        return Decisions.build(measure, np.where(usable, score, np.nan), reason)


class ParentPriorForecaster(Forecaster):
    """``parent-prior[:WIDTH]``: a Gaussian in log2 speedup around the parent's measured
    speedup (the seed's for a root), WIDTH wide (1 by default: an assumption)."""

    prefix = "parent-prior"  # the spec's head, what the entry point is named
    mode = "parent-prior"
    kind = "assumed"

    def __init__(self, spec: str = "parent-prior"):
        _, _, rest = spec.partition(":")
        try:
            self.width = float(rest) if rest else 1.0
        except ValueError:
            raise SpecError(f"--forecaster {spec!r}: the width {rest!r} is not a number") from None
        if not 0 < self.width < 10:
            raise SpecError(f"--forecaster {spec!r}: the width must be in (0, 10)")
        self.name = spec

    def _forecast(self, cid: str, parent_speedup: float | None) -> Forecast:
        centre = np.log2(parent_speedup) if parent_speedup and parent_speedup > 0 else 0.0
        probs = gaussian_bins([centre], self.width)[0]
        probs = probs / probs.sum()
        return Forecast(cid, self.name, self.mode, probs.tolist(),
                        raw_probability_sum=1.0, predicted_bin=int(probs.argmax()) + 1)

    def forecast(self, request) -> Forecast:
        return self._forecast(request.candidate_id, request.parent_speedup)

    def attach(self, log):
        from gfsim.forecasts.attach import attach_records

        ev = log.evaluations
        ok = ev[ev["outcome"] == "success"]
        speed = dict(zip(ok["candidate_id"], ok["speedup"]))
        seeds = {t["task_id"]: t.get("seed_speedup") for t in log.header.get("tasks") or []}
        c = log.candidates
        recs = []
        for cid, parent, task in zip(c["candidate_id"], c["parent_id"], c["task_id"]):
            base = speed.get(parent) if isinstance(parent, str) else seeds.get(task)
            recs.append(self._forecast(cid, base).record())
        return attach_records(log, recs, self.name, self.mode)


def spot_a100() -> PresetCostModel:
    """``serverless-a100`` with its GPU at 40% of the on-demand price (assumed)."""
    base = load_cost_model("serverless-a100")
    gpu = dataclasses.replace(base.gpu, usd_per_hour=0.4 * base.gpu.usd_per_hour)
    sources = {**base.sources,
               "gpu.usd_per_hour": "assumed: 40% of serverless-a100's (a spot discount)"}
    return dataclasses.replace(base, name="spot-a100", gpu=gpu, sources=sources)


def import_runs_csv(source: Path, task: str = "kernel", seed_runtime_ns: str = "") -> list[dict]:
    """One search from a CSV file (``id,parent,step,runtime_ns``; ``parent`` empty for a child
    of the seed kernel, ``runtime_ns`` empty for a kernel that failed its check) as a log's
    records: speedups over the seed kernel's runtime (``seed_runtime_ns``, else the first
    row's), nothing else measured (no stage seconds, tokens or forecasts: gfsim prices them
    from its priors and says so)."""
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{source}: no rows")
    runtimes = [float(r["runtime_ns"]) for r in rows if r["runtime_ns"]]
    seed_ns = float(seed_runtime_ns) if seed_runtime_ns else runtimes[0]
    search = f"{task}-csv"
    records: list[dict] = [
        {"kind": "header", "schema_version": 1, "log_id": f"runs-csv-{Path(source).stem}",
         "created_at": "2026-01-01T00:00:00Z",
         "provenance": {"kind": "measured", "note": f"imported from {Path(source).name} by "
                                                    "gfsim-plugin-example's runs-csv"},
         "log_shape": "trajectory", "label_bin_convention": "reference-code",
         "hardware": {"device_name": "unknown (the CSV does not say)"},
         "tasks": [{"task_id": task, "reference_runtime_ns": seed_ns, "seed_speedup": 1.0}]},
        {"kind": "run", "search_id": search, "driver": "runs-csv"}]
    seq: dict[int, int] = {}
    for r in rows:
        step = int(r["step"])
        seq[step] = seq.get(step, -1) + 1
        records.append({"kind": "candidate", "candidate_id": r["id"], "search_id": search,
                        "task_id": task, "parent_id": r["parent"] or None, "step": step,
                        "seq": seq[step], "generation": {}})
        ev = {"kind": "evaluation", "candidate_id": r["id"],
              "outcome": "success" if r["runtime_ns"] else "incorrect"}
        if r["runtime_ns"]:
            ev["speedup"] = seed_ns / float(r["runtime_ns"])
        records.append(ev)
    return records
