"""Replay-log schema v1 (docs/concepts/logs.md): record kinds, their fields and field checks.

A record is one JSON object per line with ``kind`` first. Units live in field names. Unknown
fields are kept (the reader stores them); unknown kinds are an error. Each check below returns
``None`` when a value is acceptable and a short message otherwise, so that the reader can name
the file, line and field of the first problem.
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = [
    "SCHEMA_VERSION",
    "KINDS",
    "LOG_SHAPES",
    "OUTCOMES",
    "ACTIONS",
    "RELATIVE_TO",
    "DURATION_BASES",
    "PROVENANCE_KINDS",
    "FIELDS",
    "check_record",
]

SCHEMA_VERSION = 1
KINDS = ("header", "run", "step", "candidate", "forecast", "decision", "attempt", "evaluation")
LOG_SHAPES = ("trajectory", "pairs", "config_space")
OUTCOMES = (
    "success",
    "compile_failed",
    "runtime_error",
    "incorrect",
    "timeout",
    "infrastructure_failure",
)
ACTIONS = ("measure", "skip", "defer")
RELATIVE_TO = ("reference", "seed", "parent")
DURATION_BASES = ("service", "queue_inclusive")
PROVENANCE_KINDS = ("measured", "synthetic", "mixed")
BIN_CONVENTIONS = ("paper", "reference-code")

Check = Callable[[Any], "str | None"]


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def string(v):
    return None if isinstance(v, str) and v != "" else "expected a non-empty string"


def integer(v):
    return None if isinstance(v, int) and not isinstance(v, bool) else "expected an integer"


def nonneg_int(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else (
        "expected an integer >= 0"
    )


def number(v):
    return None if _is_num(v) else "expected a finite number"


def nonneg(v):
    return None if _is_num(v) and v >= 0 else "expected a finite number >= 0"


def positive(v):
    return None if _is_num(v) and v > 0 else "expected a finite number > 0"


def boolean(v):
    return None if isinstance(v, bool) else "expected true or false"


def obj(v):
    return None if isinstance(v, dict) else "expected an object"


def one_of(*allowed: str) -> Check:
    def check(v):
        return None if v in allowed else f"expected one of {', '.join(allowed)}; got {v!r}"

    return check


def list_of(item: Check, length: int | None = None) -> Check:
    def check(v):
        if not isinstance(v, list):
            return "expected a list"
        if length is not None and len(v) != length:
            return f"expected {length} values, got {len(v)}"
        for i, x in enumerate(v):
            msg = item(x)
            if msg:
                return f"item {i}: {msg}"
        return None

    return check


def probabilities(v):
    """Eight finite numbers >= 0 whose sum is a double (``[1e308] * 8`` is not: the sum that
    normalises them overflows)."""
    msg = list_of(nonneg, 8)(v)
    if msg:
        return msg
    try:
        total = math.fsum(v)
    except OverflowError:
        total = math.inf
    return None if math.isfinite(total) else "the 8 probabilities sum past the largest double"


def bin_number(v):
    return None if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 8 else (
        "expected a bin number 1..8"
    )


def edges(v):
    msg = list_of(positive, 7)(v)
    if msg:
        return msg
    if any(b <= a for a, b in zip(v, v[1:])):
        return "bin edges must increase"
    return None


def _nullable(check: Check) -> Check:
    def nullable(v):
        return None if v is None else check(v)

    return nullable


REQ, OPT = True, False

# kind -> {field: (required, check)}. Optional fields may also be null.
FIELDS: dict[str, dict[str, tuple[bool, Check]]] = {
    "header": {
        "schema_version": (REQ, integer),
        "log_id": (REQ, string),
        "created_at": (REQ, string),
        "provenance": (REQ, obj),
        "log_shape": (REQ, one_of(*LOG_SHAPES)),
        "label_bin_convention": (REQ, one_of(*BIN_CONVENTIONS)),
        "forecast_bin_edges": (OPT, edges),
        "forecast_relative_to": (OPT, one_of(*RELATIVE_TO)),
        "hardware": (REQ, obj),
        "tasks": (REQ, list_of(obj)),
        "timing_protocol": (OPT, obj),
        "duration_basis": (OPT, one_of(*DURATION_BASES)),
        "generator": (OPT, obj),
        "selection": (OPT, obj),
    },
    "run": {
        "search_id": (REQ, string),
        "driver": (REQ, string),
        "configuration": (OPT, obj),
    },
    "step": {
        "search_id": (REQ, string),
        "step": (REQ, nonneg_int),
        "parent_ids": (REQ, list_of(string)),
        "parent_scores": (OPT, list_of(_nullable(number))),
    },
    "candidate": {
        "candidate_id": (REQ, string),
        "search_id": (REQ, string),
        "task_id": (REQ, string),
        "parent_id": (OPT, string),
        "step": (REQ, nonneg_int),
        "seq": (REQ, nonneg_int),
        "generation": (OPT, obj),
        "code_sha256": (OPT, string),
        "code": (OPT, string),
    },
    "forecast": {
        "candidate_id": (REQ, string),
        "forecaster": (REQ, string),
        "mode": (REQ, string),
        "probs": (REQ, probabilities),
        "raw_probability_sum": (OPT, nonneg),
        "predicted_bin": (OPT, bin_number),
        "parse_failed": (OPT, boolean),
        "input_tokens": (OPT, nonneg_int),
        "output_tokens": (OPT, nonneg_int),
        "latency_s": (OPT, nonneg),
        "repeat": (OPT, nonneg_int),
        "attempts": (OPT, nonneg_int),  # requests it took, retries included
        "parse_error": (OPT, string),  # why a parse failure failed
        "error": (OPT, string),  # no answer at all: the candidate stays unforecast
    },
    "decision": {
        "candidate_id": (REQ, string),
        "policy": (REQ, string),
        "action": (REQ, one_of(*ACTIONS)),
        "score": (OPT, number),
        "reason": (OPT, string),
    },
    # Written by a live run just before it measures a candidate (fsynced), so that a candidate
    # whose measurement killed the run is recorded as a failure on resume, not redone forever.
    "attempt": {
        "candidate_id": (REQ, string),
        "attempt": (REQ, nonneg_int),
        "session": (OPT, nonneg_int),
    },
    "evaluation": {
        "candidate_id": (REQ, string),
        "outcome": (REQ, one_of(*OUTCOMES)),
        "speedup": (OPT, positive),
        "runtime_ns": (OPT, positive),
        "ref_runtime_ns": (OPT, positive),
        "compile_s": (OPT, nonneg),
        "check_s": (OPT, nonneg),
        "timing_s": (OPT, nonneg),
        "cold_start_s": (OPT, nonneg),
        "wall_s": (OPT, nonneg),
        "service_s": (OPT, nonneg),
        "energy_j": (OPT, nonneg),
        "imputed_by": (OPT, obj),
    },
}

GENERATION_FIELDS: dict[str, Check] = {
    "started_s": nonneg,
    "completed_s": nonneg,
    "service_s": nonneg,
    "input_tokens": nonneg_int,
    "output_tokens": nonneg_int,
    "failed_reason": string,
}

TASK_FIELDS: dict[str, tuple[bool, Check]] = {
    "task_id": (REQ, string),
    "description": (OPT, string),
    "reference_runtime_ns": (OPT, positive),
    "seed_speedup": (OPT, positive),
}


def _check_fields(rec: dict, spec: dict[str, tuple[bool, Check]], prefix: str = ""):
    for name, (required, check) in spec.items():
        if name not in rec or rec[name] is None:
            if required:
                return prefix + name, "missing"
            continue
        msg = check(rec[name])
        if msg:
            return prefix + name, msg
    return None


def check_record(rec: dict) -> tuple[str, str] | None:
    """First (field, message) problem of one record, or None. Checks types only, not links."""
    kind = rec.get("kind")
    if not isinstance(kind, str) or kind not in FIELDS:
        if kind is None:
            return "kind", "missing"
        return "kind", f"unknown kind {kind!r:.60}; valid: {', '.join(KINDS)}"
    problem = _check_fields(rec, FIELDS[kind])
    if problem:
        return problem
    if kind == "header":
        if rec["schema_version"] != SCHEMA_VERSION:
            return "schema_version", (
                f"this gfsim reads schema version {SCHEMA_VERSION}, got {rec['schema_version']}"
            )
        prov_kind = rec["provenance"].get("kind")
        if prov_kind not in PROVENANCE_KINDS:
            return "provenance.kind", (
                f"say plainly where the data came from: one of {', '.join(PROVENANCE_KINDS)}"
            )
        for i, task in enumerate(rec["tasks"]):
            problem = _check_fields(task, TASK_FIELDS, prefix=f"tasks[{i}].")
            if problem:
                return problem
    elif kind == "candidate" and rec.get("generation") is not None:
        gen = rec["generation"]
        for name, check in GENERATION_FIELDS.items():
            if gen.get(name) is not None:
                msg = check(gen[name])
                if msg:
                    return f"generation.{name}", msg
    elif kind == "evaluation":
        if rec["outcome"] == "success" and rec.get("speedup") is None:
            return "speedup", "a successful evaluation needs a speedup > 0"
        if rec["outcome"] != "success" and rec.get("speedup") is not None:
            return "speedup", f"outcome {rec['outcome']!r} cannot carry a speedup"
    return None
