"""Helpers for tests: build small, exact replay logs in code (as optuna.testing does for
samplers), and the contract tests a plug-in's own suite subclasses (``PolicyContract``,
``ForecasterContract``, ``CostModelContract``: ``gfsim.testing.contracts``).

    b = LogBuilder(tasks={"t": 1.0})
    root = b.candidate("t", step=0, outcome="success", speedup=1.5, probs=b.onehot(5))
    b.candidate("t", step=1, parent=root, outcome="compile_failed")
    path = b.write(tmp_path / "log.jsonl")
"""

from __future__ import annotations

from pathlib import Path

from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.replay_logs.io import LogWriter

__all__ = ["CostModelContract", "ForecasterContract", "LogBuilder", "PolicyContract"]


def __getattr__(name: str):
    # (they import the policies)
    if name in ("PolicyContract", "CostModelContract", "ForecasterContract"):
        from gfsim.testing import contracts

        return getattr(contracts, name)
    raise AttributeError(f"module 'gfsim.testing' has no attribute {name!r}")


class LogBuilder:
    """Accumulates records for one log; each task gets one search named after it."""

    def __init__(self, tasks: dict[str, float] | None = None, *, relative_to: str = "reference",
                 provenance_kind: str = "synthetic", device_name: str = "test-gpu",
                 shape: str = "trajectory", with_forecast_header: bool = True):
        tasks = tasks or {"t": 1.0}
        self.header = {
            "kind": "header", "schema_version": 1, "log_id": "test-log",
            "created_at": "2026-01-01T00:00:00Z",
            "provenance": {"kind": provenance_kind, "note": "built by gfsim.testing for a test"},
            "log_shape": shape, "label_bin_convention": "reference-code",
            "hardware": {"device_name": device_name},
            "tasks": [{"task_id": t, "reference_runtime_ns": 1000.0, "seed_speedup": s}
                      for t, s in tasks.items()],
            "duration_basis": "service",
        }
        if with_forecast_header:
            self.header["forecast_bin_edges"] = list(PAPER_EDGES)
            self.header["forecast_relative_to"] = relative_to
        self.records: list[dict] = [
            {"kind": "run", "search_id": f"s-{t}", "driver": "test"} for t in tasks
        ]
        self._seq: dict[tuple[str, int], int] = {}
        self._n = 0

    @staticmethod
    def onehot(bin_number: int, mass: float = 1.0) -> list[float]:
        """All mass on one bin (1..8); the rest spread evenly."""
        rest = (1.0 - mass) / 7
        return [mass if b == bin_number else rest for b in range(1, 9)]

    def candidate(self, task: str, step: int, *, parent: str | None = None,
                  outcome: str | None = "success", speedup: float | None = 1.0,
                  probs: list[float] | None = None, gen_s: float = 10.0,
                  forecast_s: float = 5.0, stage_s: tuple[float, float, float, float] = (
                      1.0, 2.0, 3.0, 4.0), gen_failed: bool = False, deferred: bool = False,
                  parse_failed: bool = False, tokens: tuple[int, int] | None = (1000, 2000),
                  energy_j: float | None = None, source_meta: dict | None = None) -> str:
        """Add a candidate with its forecast and evaluation; returns its id.

        ``stage_s`` = (cold_start, compile, check, timing) seconds; ``outcome=None`` with
        ``deferred=True`` logs a surrogate's defer decision and no evaluation;
        ``source_meta``: what made the candidate (variant, params), as live runs write it.
        """
        self._n += 1
        cid = f"{task}-{self._n:04d}"
        seq = self._seq.get((task, step), 0)
        self._seq[(task, step)] = seq + 1
        gen = {"service_s": gen_s}
        if tokens is not None:
            gen.update(input_tokens=tokens[0], output_tokens=tokens[1])
        if gen_failed:
            gen["failed_reason"] = "empty answer"
        self.records.append({"kind": "candidate", "candidate_id": cid, "search_id": f"s-{task}",
                             "task_id": task, "parent_id": parent, "step": step, "seq": seq,
                             "generation": gen,
                             **({"source_meta": source_meta} if source_meta else {})})
        if gen_failed:
            return cid
        if probs is not None or parse_failed:
            self.records.append({
                "kind": "forecast", "candidate_id": cid, "forecaster": "f", "mode": "tool",
                "probs": [0.0] * 8 if parse_failed else list(probs),
                "parse_failed": parse_failed, "latency_s": forecast_s,
                "input_tokens": 3000, "output_tokens": 500,
            })
        if deferred:
            self.records.append({"kind": "decision", "candidate_id": cid, "policy": "logged",
                                 "action": "defer"})
            return cid
        if outcome is not None:
            cold, comp, check, timing = stage_s
            ev = {"kind": "evaluation", "candidate_id": cid, "outcome": outcome,
                  "cold_start_s": cold, "compile_s": comp, "check_s": check,
                  "timing_s": timing}
            if outcome == "success":
                ev["speedup"] = speedup
            if energy_j is not None:
                ev["energy_j"] = energy_j
            self.records.append(ev)
        return cid

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        if path.exists():
            path.unlink()
        with LogWriter(path) as w:
            w.append_many([self.header, *self.records])
        return path
