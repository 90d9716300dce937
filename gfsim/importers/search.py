"""A bring-your-own-search log: the smallest record set a search tool can write, as a gfsim
trajectory log (``gfsim import search FILE -o LOG``).

One JSON object per line, one per candidate, in the order the tool made them (or with
``order``). Only ``id`` and ``outcome`` are required:

========================  ======================================================================
field                     meaning
========================  ======================================================================
``id``                    the candidate's id (unique; a string)
``parent``                the id of the candidate it was derived from (an earlier line); absent
                          or null for a root (the seed kernel)
``order``                 a number giving the order candidates were made in (default: the line
                          order; ties keep the line order)
``task``, ``search``      the task and the search it belongs to (default ``task``, ``search``)
``code``, ``code_sha256`` the candidate's source, or its hash
``outcome``               ``success``, ``compile_failed``, ``runtime_error``, ``incorrect``,
                          ``timeout``, ``infrastructure_failure``, ``not_measured`` (made but
                          never measured, as a surrogate's filter does: it is logged as
                          deferred, with no evaluation), ``not_attempted`` (made, but what
                          became of it is not known: no evaluation and no decision), or
                          ``generation_failed`` (the proposal failed before there was a
                          program to measure: an LLM error, a patch that did not apply; its
                          ``error`` is kept as the generation's failure reason)
``speedup``               reference runtime / this runtime (> 0), or
``runtime_ns``            the runtime, with the reference from ``--reference-runtime-ns`` or, by
                          default, the runtime of the task's first root that has one
``error``                 a failure's message (kept as the evaluation's ``reason``)
``evaluation_s``          seconds the whole measurement took, where the tool does not split it
                          into stages (kept as the evaluation's ``wall_s``; replays split it
                          across the stages, ``simulator.log_seconds``)
``generation_s``,         seconds: the LLM call that made it, and the three measurement stages
``compile_s``,
``check_s``, ``timing_s``
``input_tokens``,         the generating call's tokens
``output_tokens``
``forecast``              ``{"probs": [8 numbers], "forecaster": NAME, "latency_s": S,
                          "input_tokens": N, "output_tokens": N}``: a forecast over the paper's
                          8 speedup bins, relative to the reference
========================  ======================================================================

Unknown fields are kept on the candidate record. Each candidate is its own step (a tool that
evaluates one program at a time has no parent batches), so the log replays open loop through
the trace driver. A problem is one line naming the file, line and field, and nothing is written
unless the whole import validates.

Other importers are adapters over this one (``gfsim.importers.openevolve``): they build the same
records in memory and hand them to ``import_records``, each with where it came from (a file, or
a file and line), so that a problem is named against the adapter's own source.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.importers.common import is_number, source_name

__all__ = ["import_search", "import_records", "FIELDS", "MEASURED", "OUTCOMES"]

MEASURED = ("success", "compile_failed", "runtime_error", "incorrect", "timeout",
            "infrastructure_failure")
UNMEASURED = ("not_measured", "not_attempted", "generation_failed")
OUTCOMES = (*MEASURED, *UNMEASURED)
FIELDS = ("id", "parent", "order", "task", "search", "code", "code_sha256", "outcome",
          "speedup", "runtime_ns", "error", "generation_s", "compile_s", "check_s", "timing_s",
          "evaluation_s", "input_tokens", "output_tokens", "forecast")
_SECONDS = ("generation_s", "compile_s", "check_s", "timing_s", "evaluation_s")
_TOKENS = ("input_tokens", "output_tokens")


def _where(path: Path, line) -> str:
    """``FILE:LINE`` for a line of a file, or the location an adapter gave (a string)."""
    return line if isinstance(line, str) else f"{path}:{line}"


class _Bad(GfsimError):
    def __init__(self, path: Path, line, field: str | None, message: str):
        where = _where(path, line) + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53


def _text(v) -> bool:
    return isinstance(v, str) and v != ""


def _read(path: Path) -> list[tuple[int, dict]]:
    """(line, record) of every line, read as strictly as a log is; a file that ends in a cut
    line is refused (nothing of an import is guessed)."""
    import warnings

    from gfsim.replay_logs.io import TruncatedTailWarning, iter_records

    if not path.is_file():
        raise GfsimError(f"{path}: no such file")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedTailWarning)
        try:
            return list(iter_records(path))
        except TruncatedTailWarning as w:
            raise GfsimError(str(w)) from None


def _check(path: Path, line: int, rec: dict) -> None:
    def bad(field, message):
        raise _Bad(path, line, field, message)

    if not _text(rec.get("id")):
        bad("id", "missing or not a non-empty string")
    for f in ("parent", "task", "search", "code", "code_sha256", "error"):
        if rec.get(f) is not None and not _text(rec[f]):
            bad(f, "expected a non-empty string")
    if rec.get("order") is not None and not is_number(rec["order"]):
        bad("order", "expected a finite number")
    outcome = rec.get("outcome")
    if outcome not in OUTCOMES:
        bad("outcome", f"expected one of {', '.join(OUTCOMES)}; got {str(outcome)[:40]!r}")
    for f in ("speedup", "runtime_ns"):
        if rec.get(f) is not None and not (is_number(rec[f]) and rec[f] > 0):
            bad(f, "expected a finite number > 0")
    if outcome == "success" and rec.get("speedup") is None and rec.get("runtime_ns") is None:
        bad("speedup", "a success needs a speedup or a runtime_ns")
    if outcome != "success" and rec.get("speedup") is not None:
        bad("speedup", f"outcome {outcome!r} cannot carry a speedup")
    for f in _SECONDS:
        if rec.get(f) is not None and not (is_number(rec[f]) and rec[f] >= 0):
            bad(f, "expected seconds >= 0")
    for f in _TOKENS:
        if rec.get(f) is not None and not _count(rec[f]):
            bad(f, "expected a whole number >= 0")
    fc = rec.get("forecast")
    if fc is not None:
        if not isinstance(fc, dict):
            bad("forecast", "expected an object")
        probs = fc.get("probs")
        if not (isinstance(probs, list) and len(probs) == 8
                and all(is_number(p) and p >= 0 for p in probs) and sum(probs) > 0):
            bad("forecast.probs", "expected 8 numbers >= 0 that do not all equal 0")
        if fc.get("forecaster") is not None and not _text(fc["forecaster"]):
            bad("forecast.forecaster", "expected a non-empty string")
        for f in ("latency_s",):
            if fc.get(f) is not None and not (is_number(fc[f]) and fc[f] >= 0):
                bad(f"forecast.{f}", "expected seconds >= 0")
        for f in _TOKENS:
            if fc.get(f) is not None and not _count(fc[f]):
                bad(f"forecast.{f}", "expected a whole number >= 0")


def import_search(path, out, *, reference_runtime_ns: float | None = None,
                  device: str = "unknown", provenance: str = "measured",
                  log_id: str | None = None) -> dict:
    """Write a trajectory log for a bring-your-own-search file; returns a summary."""
    from gfsim.core.inputs import check_output

    path = Path(path)
    check_output(out, [path])
    rows = _read(path)
    if not rows:
        raise GfsimError(f"{path}: no candidates (one JSON object per line)")
    return import_records(rows, out, source=path, reference_runtime_ns=reference_runtime_ns,
                          device=device, provenance=provenance, log_id=log_id)


def import_records(rows: list[tuple], out, *, source, reference_runtime_ns: float | None = None,
                   device: str = "unknown", provenance: str | dict = "measured",
                   log_id: str | None = None, header_fields: dict | None = None,
                   run_configuration: dict | None = None, driver: str = "imported",
                   task_fields: dict | None = None) -> dict:
    """Write a trajectory log for records of the bring-your-own-search format; returns a
    summary. ``rows`` are ``(where, record)``: ``where`` is a line of ``source`` (an int) or,
    for an adapter, the location to name in a problem (a string: a file, a file and field).
    ``provenance`` is a kind (``measured``, ``synthetic``, ``mixed``) or a whole provenance
    object with ``kind``; ``header_fields`` adds fields to the log's header (``generator``, say) and
    ``run_configuration`` becomes every run record's ``configuration``; ``task_fields`` adds
    fields to a task's header entry (``{task: {"reference_code": ...}}``). All or nothing: a
    problem raises one line, and ``out`` is written only when every record validates."""
    from gfsim.forecasts.bins import PAPER_EDGES
    from gfsim.importers.common import write_validated
    from gfsim.replay_logs import SCHEMA_VERSION

    path, out = Path(source), Path(out)
    kind = provenance.get("kind") if isinstance(provenance, dict) else provenance
    if kind not in ("measured", "synthetic", "mixed"):
        raise GfsimError(f"`provenance`: expected measured, synthetic or mixed; got "
                         f"{kind!r}")
    if reference_runtime_ns is not None and not (is_number(reference_runtime_ns)
                                                 and reference_runtime_ns > 0):
        raise GfsimError("`reference_runtime_ns`: expected a number > 0")
    rows = list(rows)
    if not rows:
        raise GfsimError(f"{path}: no candidates")
    seen: dict[str, object] = {}
    for line, rec in rows:
        _check(path, line, rec)
        if rec["id"] in seen:
            first = seen[rec["id"]]
            raise _Bad(path, line, "id", f"{rec['id'][:80]!r} appears twice (first at "
                                         f"{'line ' if isinstance(first, int) else ''}"
                                         f"{first})")
        seen[rec["id"]] = line
    with_order = [r for r in rows if r[1].get("order") is not None]
    if with_order and len(with_order) != len(rows):
        line = next(ln for ln, r in rows if r.get("order") is None)
        raise _Bad(path, line, "order", "give an order on every line or on none")
    position = {id(r): k for k, r in enumerate(rows)}  # ties keep the given order
    rows.sort(key=lambda r: (r[1]["order"], position[id(r)]) if with_order
              else position[id(r)])
    placed: dict[str, dict] = {}
    for line, rec in rows:
        p = rec.get("parent")
        if p is not None:
            if p not in seen:
                raise _Bad(path, line, "parent", f"{p[:80]!r} is not a candidate of this file")
            if p not in placed:
                raise _Bad(path, line, "parent", f"{p[:80]!r} comes later in the order")
            if (placed[p].get("search") or "search") != (rec.get("search") or "search"):
                raise _Bad(path, line, "parent", f"{p[:80]!r} belongs to another search")
        placed[rec["id"]] = rec
    # the reference runtime of each task: given, or its first root's
    refs: dict[str, float] = {}
    for line, rec in rows:
        task = rec.get("task") or "task"
        if task not in refs and reference_runtime_ns is None and rec.get("parent") is None \
                and rec.get("runtime_ns") is not None:
            refs[task] = float(rec["runtime_ns"])
    tasks = sorted({rec.get("task") or "task" for _, rec in rows})
    searches: dict[str, str] = {}
    for line, rec in rows:
        s, t = rec.get("search") or "search", rec.get("task") or "task"
        if searches.setdefault(s, t) != t:
            raise _Bad(path, line, "task", f"search {s[:60]!r} is for task "
                                           f"{searches[s][:60]!r}; one task per search")
    records: list[dict] = []
    steps: dict[str, int] = {}
    counts: dict[str, int] = {}
    forecasts = 0
    for line, rec in rows:
        task, sid = rec.get("task") or "task", rec.get("search") or "search"
        ref = reference_runtime_ns if reference_runtime_ns is not None else refs.get(task)
        step = steps.get(sid, 0)
        steps[sid] = step + 1
        gen = {"service_s": rec.get("generation_s"), "input_tokens": rec.get("input_tokens"),
               "output_tokens": rec.get("output_tokens"),
               "failed_reason": (rec.get("error") or "generation failed")
               if rec["outcome"] == "generation_failed" else None}
        cand = {"kind": "candidate", "candidate_id": rec["id"], "search_id": sid,
                "task_id": task, "parent_id": rec.get("parent"), "step": step, "seq": 0,
                "generation": {k: v for k, v in gen.items() if v is not None} or None,
                "code_sha256": rec.get("code_sha256") or (
                    hashlib.sha256(rec["code"].encode()).hexdigest() if rec.get("code")
                    else None),
                "code": rec.get("code"),
                "source_line": line if isinstance(line, int) else None,
                **{k: v for k, v in rec.items() if k not in FIELDS}}
        records.append(cand)
        fc = rec.get("forecast")
        if fc is not None:
            total = sum(fc["probs"])
            records.append({"kind": "forecast", "candidate_id": rec["id"],
                            "forecaster": fc.get("forecaster") or "byo", "mode": "imported",
                            "probs": [p / total for p in fc["probs"]],
                            "raw_probability_sum": total, "latency_s": fc.get("latency_s"),
                            "input_tokens": fc.get("input_tokens"),
                            "output_tokens": fc.get("output_tokens")})
            forecasts += 1
        outcome = rec["outcome"]
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "not_measured":  # the tool's own filter chose not to measure it
            records.append({"kind": "decision", "candidate_id": rec["id"], "policy": "logged",
                            "action": "defer", "reason": "not_measured in the source file"})
            continue
        if outcome in ("not_attempted", "generation_failed"):  # no program was measured
            continue
        ev = {"kind": "evaluation", "candidate_id": rec["id"], "outcome": outcome,
              **{f: rec.get(f) for f in ("compile_s", "check_s", "timing_s")},
              "wall_s": rec.get("evaluation_s"), "reason": rec.get("error")}
        if outcome == "success":
            speedup = rec.get("speedup")
            if speedup is None:
                if ref is None:
                    raise _Bad(path, line, "runtime_ns", f"task {task[:60]!r} has no "
                               "reference runtime: give a speedup, a root with a runtime_ns, "
                               "or `reference_runtime_ns`")
                speedup = ref / rec["runtime_ns"]
            ev.update(speedup=speedup, runtime_ns=rec.get("runtime_ns"),
                      ref_runtime_ns=ref if rec.get("runtime_ns") is not None else None)
        records.append(ev)
    if not isinstance(provenance, dict):
        provenance = {"kind": provenance,
                      "note": f"imported by gfsim import search from {path.name}",
                      "source": source_name(path),
                      "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    header = {
        "kind": "header", "schema_version": SCHEMA_VERSION,
        "log_id": log_id or path.name.split(".")[0],
        "created_at": "1970-01-01T00:00:00Z",
        "provenance": provenance,
        "log_shape": "trajectory", "label_bin_convention": "paper",
        "forecast_bin_edges": list(PAPER_EDGES), "forecast_relative_to": "reference",
        "hardware": {"device_name": device},
        "tasks": [{"task_id": t, **({"reference_runtime_ns": refs[t]} if t in refs else {}),
                   "seed_speedup": 1.0, **(task_fields or {}).get(t, {})} for t in tasks],
        "duration_basis": "service",
        "generator": {"model": "unknown (a bring-your-own-search file)"},
        **(header_fields or {}),
    }
    if reference_runtime_ns is not None:
        for t in header["tasks"]:
            t["reference_runtime_ns"] = float(reference_runtime_ns)
    runs = [{"kind": "run", "search_id": s, "driver": driver,
             "configuration": run_configuration} for s in searches]
    write_validated([header, *runs, *records], out, path)
    return {"source": str(path), "out": str(out), "candidates": len(rows),
            "searches": len(searches), "tasks": tasks, "outcomes": counts,
            "forecasts": forecasts}
