"""The reference's search event logs (``events.jsonl``, docs/concepts/paper.md) as trajectory logs.

Two dialects, told apart by their events:
- *standard* (the measure-all PUCT search): a mutation and its evaluation have different
  request ids (``evaluation_requested.from_mutation_request_id`` joins them) and the child's node
  id is ``evaluation_requested.child_ulid``; no forecasts;
- *filtered* (the surrogate search): one ``request_id`` follows a candidate through mutation,
  forecast, selection and evaluation, and is the archived child's node id;
  ``search_initialized`` carries the task, the seed kernel's code and the hardware; forecasts
  are relative to the seed kernel; ``candidate_deferred`` candidates are kept, without an
  evaluation (``deferred``), and the header says which rule selected.

A line is an event (``kind``) or a published data-set row that wraps one (``payload`` with
``event_kind``, or ``event``, or ``line`` holding the event's JSON text). A truncated last line
is dropped with a warning; any other bad line is an error naming it.

Durations: the reference stamps ``started_at`` when a request is made, before its queue, so
requested-to-completed times include queueing. With ``capacities`` (the run's concurrency per
resource), service times are recovered by replaying the log's own FIFO queue (service =
completed - max(requested, the moment a slot freed)), and the header says
``duration_basis: service``; without them the times stay queue-inclusive (``duration_basis:
queue_inclusive``) and the simulator's cost model imputes service times instead.
"""

from __future__ import annotations

import heapq
import json
import math
from datetime import datetime
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.importers.common import parse_key, source_name, write_validated
from gfsim.replay_logs.io import loads_record

__all__ = ["import_events", "import_eval_set", "fetch_hf", "recover_service"]

_OUTCOMES = {"success": "success", "compile_failed": "compile_failed",
             "runtime_error": "runtime_error", "incorrect": "incorrect",
             "infrastructure_failure": "infrastructure_failure"}
_KINDS = {"search_initialized", "step_started", "step_completed", "mutation_requested",
          "mutation_completed", "mutation_failed", "evaluation_requested",
          "evaluation_completed", "evaluation_failed", "forecast_requested",
          "forecast_completed", "forecast_failed", "candidate_selected", "candidate_deferred",
          "mutations_drained", "forecasts_drained", "evaluations_drained"}


def _unwrap(rec: dict, path: Path, line: int) -> dict:
    """The event inside a line: itself, or the event a data-set row wraps."""
    if "kind" in rec:
        return rec
    if isinstance(rec.get("payload"), (dict, str)):
        ev = rec["payload"]
    elif isinstance(rec.get("event"), (dict, str)):
        ev = rec["event"]
    elif isinstance(rec.get("line"), str):
        ev = rec["line"]
    else:
        raise GfsimError(f"{path}:{line}: field 'kind': missing (not an event, and no "
                         "payload/event/line field wrapping one)")
    if isinstance(ev, str):
        try:
            ev = loads_record(ev)  # as a log's own lines: no NaN, no number a double lacks
        except json.JSONDecodeError as exc:
            raise GfsimError(f"{path}:{line}: the wrapped event is not valid JSON "
                             f"({exc.msg})") from None
        except RecursionError:
            raise GfsimError(f"{path}:{line}: the wrapped event is nested too deeply") \
                from None
        except ValueError as exc:
            raise GfsimError(f"{path}:{line}: the wrapped event: {exc}") from None
    if not isinstance(ev, dict):
        raise GfsimError(f"{path}:{line}: the wrapped event is not a JSON object")
    if "kind" not in ev and isinstance(rec.get("event_kind"), str):
        ev = {**ev, "kind": rec["event_kind"]}
    return ev


def _time(value, path: Path, line: int, field: str) -> float | None:
    """Seconds since the epoch of an ISO-8601 UTC stamp (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise GfsimError(f"{path}:{line}: field '{field}': expected an ISO-8601 time")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise GfsimError(f"{path}:{line}: field '{field}': not an ISO-8601 time: "
                         f"{value!r:.40}") from None


def recover_service(intervals: list[tuple[float, float]], capacity: int) -> list[float]:
    """Service times of FIFO requests (requested, completed) on ``capacity`` slots: each is
    served from max(requested, the earliest moment a slot freed) to its completion."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], i))
    free = [-math.inf] * capacity
    heapq.heapify(free)
    out = [0.0] * len(intervals)
    for i in order:
        req, done = intervals[i]
        slot = heapq.heappop(free)
        out[i] = max(0.0, done - max(req, slot))
        heapq.heappush(free, done)
    return out


class _Cand:
    __slots__ = ("cid", "parent", "step", "order", "gen_req", "gen_done", "gen_failed",
                 "code", "node", "ev_req", "ev_done", "evaluation", "ev_failed", "fc_req",
                 "fc_done", "forecast", "usage", "fc_failed", "decision", "score")

    def __init__(self, cid, parent, step, order):
        self.cid, self.parent, self.step, self.order = cid, parent, step, order
        for s in self.__slots__[4:]:
            setattr(self, s, None)


def _need(ev: dict, key: str, kind, path: Path, line: int):
    if key not in ev or ev[key] is None:
        raise GfsimError(f"{path}:{line}: field '{key}': missing in {ev.get('kind')}")
    if not isinstance(ev[key], kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise GfsimError(f"{path}:{line}: field '{key}': expected {names}")
    return ev[key]


def import_events(path, out, *, task: str | None = None, device: str | None = None,
                  capacities: dict | None = None, log_id: str | None = None) -> dict:
    """Write a trajectory log for one reference ``events.jsonl``; returns a summary."""
    from gfsim.core.inputs import check_output
    from gfsim.replay_logs.io import iter_records

    path, out = Path(path), Path(out)
    if not path.exists():
        raise GfsimError(f"{path}: no such file")
    check_output(out, [path])
    try:
        events, source = [], None
        for line, rec in iter_records(path):
            source = source or (rec.get("source_search") if isinstance(
                rec.get("source_search"), str) else None)
            events.append((line, _unwrap(rec, path, line)))
        if task is None and source:  # a published row: "gpu_mode/trimul__e0033__x.json"
            task = Path(source).name.split("__")[0].split(".")[0] or None
        return _build(path, out, events, task, device, capacities, log_id)
    except GfsimError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise GfsimError(f"{path}: unexpected structure ({type(exc).__name__}: "
                         f"{str(exc)[:120]})") from None


def _build(path, out, events, task, device, capacities, log_id) -> dict:
    init = None
    cands: dict[str, _Cand] = {}  # by candidate (request) id
    by_eval: dict[str, _Cand] = {}  # standard: evaluation request id -> candidate
    steps: list[dict] = []
    step = -1
    filtered = False
    t0 = None
    for line, ev in events:
        kind = ev.get("kind")
        if not isinstance(kind, str) or kind not in _KINDS:
            raise GfsimError(f"{path}:{line}: field 'kind': unknown event {kind!r:.40}")
        for f in ("started_at", "completed_at"):
            if ev.get(f) is not None:
                t = _time(ev[f], path, line, f)
                t0 = t if t0 is None else min(t0, t)
        if kind == "search_initialized":
            if init is not None:
                raise GfsimError(f"{path}:{line}: a second search_initialized (one search per "
                                 "file)")
            init = ev
            _need(ev, "root", dict, path, line)
            filtered = filtered or "seed_reference_code" in ev or "kernel_task" in ev
            continue
        if init is None:
            raise GfsimError(f"{path}:{line}: {kind} before search_initialized")
        if kind == "step_started":
            step = int(_need(ev, "step", int, path, line))
            parents = _need(ev, "parent_ulids", list, path, line)
            scores = ev.get("selected_parent_scores")
            steps.append({"step": step, "parent_ulids": parents, "scores": scores})
            continue
        if kind in ("step_completed", "mutations_drained", "forecasts_drained",
                    "evaluations_drained"):
            continue
        if "step" in ev and kind != "evaluation_requested":
            filtered = True
        rid = str(_need(ev, "request_id", (str, int), path, line))
        if kind == "mutation_requested":
            if rid in cands:
                raise GfsimError(f"{path}:{line}: request {rid!r} requested twice")
            s = int(ev["step"]) if isinstance(ev.get("step"), int) else step
            c = cands[rid] = _Cand(rid, str(_need(ev, "parent_ulid", str, path, line)), s,
                                   len(cands))
            c.gen_req = _time(ev.get("started_at"), path, line, "started_at")
            continue
        if kind == "evaluation_requested" and not filtered:
            src = ev.get("from_mutation_request_id")
            c = cands.get(str(src)) if src is not None else None
            if c is None:
                raise GfsimError(f"{path}:{line}: field 'from_mutation_request_id': no "
                                 f"mutation {src!r} before it")
            by_eval[rid] = c
            c.node = str(_need(ev, "child_ulid", str, path, line))
            c.ev_req = _time(ev.get("started_at"), path, line, "started_at")
            c.code = c.code or ev.get("code")
            continue
        c = (by_eval.get(rid) if not filtered and kind.startswith("evaluation_") else None) \
            or cands.get(rid)
        if c is None:
            raise GfsimError(f"{path}:{line}: field 'request_id': {kind} for unknown request "
                             f"{rid!r}")
        done = _time(ev.get("completed_at"), path, line, "completed_at")
        if kind == "mutation_completed":
            c.code, c.gen_done = _need(ev, "code", str, path, line), done
        elif kind == "mutation_failed":
            c.gen_failed, c.gen_done = str(ev.get("reason") or "failed"), done
        elif kind == "forecast_requested":
            c.fc_req = _time(ev.get("started_at"), path, line, "started_at")
        elif kind == "forecast_completed":
            c.forecast, c.fc_done = _need(ev, "forecast", dict, path, line), done
            c.usage = ev.get("llm_usage") if isinstance(ev.get("llm_usage"), dict) else None
            c.forecast["_line"] = line
        elif kind == "forecast_failed":
            c.fc_failed, c.fc_done = str(ev.get("reason") or "failed"), done
        elif kind in ("candidate_selected", "candidate_deferred"):
            c.decision = "measure" if kind == "candidate_selected" else "defer"
            score = ev.get("selection_score")
            c.score = float(score) if isinstance(score, (int, float)) else None
        elif kind == "evaluation_requested":  # filtered: the candidate's own request id
            c.ev_req = _time(ev.get("started_at"), path, line, "started_at")
            c.node = rid
            c.code = c.code or ev.get("code")
        elif kind == "evaluation_completed":
            c.evaluation, c.ev_done = _need(ev, "evaluation", dict, path, line), done
            c.evaluation["_line"] = line
        elif kind == "evaluation_failed":
            c.ev_failed, c.ev_done = str(ev.get("reason") or "failed"), done
    if init is None:
        raise GfsimError(f"{path}: no search_initialized event: not a reference events log")
    return _write(path, out, init, cands, steps, filtered, t0, task, device, capacities,
                  log_id)


def _feedback(evaluation: dict, path: Path) -> tuple[str, float | None, dict]:
    line = evaluation.get("_line")
    obs = evaluation.get("observation") or {}
    fb = obs.get("feedback") if isinstance(obs, dict) else None
    kind = fb.get("kind") if isinstance(fb, dict) else None
    reward = evaluation.get("reward")
    if kind not in _OUTCOMES:
        if isinstance(reward, (int, float)) and reward > 0:
            return "success", float(reward), {}
        raise GfsimError(f"{path}:{line}: field 'evaluation.observation.feedback.kind': "
                         f"unknown {kind!r:.40}; known: {', '.join(_OUTCOMES)}")
    if kind != "success":
        return _OUTCOMES[kind], None, {}
    s = fb.get("aggregated_speedup", reward)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < 1e9):
        raise GfsimError(f"{path}:{line}: field 'evaluation.observation.feedback."
                         "aggregated_speedup': expected a positive number")
    extra = {"aggregation_method": fb.get("aggregation_method"),
             "per_case_speedups": fb.get("per_case_speedups")}
    return "success", float(s), extra


def _write(path, out, init, cands, steps, filtered, t0, task, device, capacities, log_id):
    from gfsim.replay_logs import SCHEMA_VERSION

    root = init["root"]
    root_id = root.get("ulid")
    root_eval = root.get("evaluation") if isinstance(root.get("evaluation"), dict) else {}
    seed_speedup = root_eval.get("reward")
    seed_speedup = float(seed_speedup) if isinstance(seed_speedup, (int, float)) and \
        seed_speedup > 0 else 1.0
    kt = init.get("kernel_task") if isinstance(init.get("kernel_task"), dict) else {}
    task_id = task or kt.get("op_name") or path.name.split(".")[0]
    hardware = dict(init.get("hardware") or {}) if isinstance(init.get("hardware"), dict) else {}
    if device or "device_name" not in hardware:
        hardware["device_name"] = device or "unknown (not in the events)"
    search_id = f"{task_id}-{'filtered' if filtered else 'standard'}"
    # A candidate is named by its archive node id where it has one (its evaluated child
    # ulid; in the filtered dialect that is its request id), else by its mutation request.
    for c in cands.values():
        c.cid = c.node or c.cid
    node_of = {c.node: c.cid for c in cands.values() if c.node is not None}
    for c in cands.values():
        if c.parent != root_id and c.parent not in node_of:
            raise GfsimError(f"{path}: request {c.cid!r}: parent {c.parent!r} is neither the "
                             "root nor an evaluated candidate")
    ordered = sorted(cands.values(), key=lambda c: (c.step, c.order))

    def rel(t):
        return None if t is None or t0 is None else t - t0

    basis = "service" if capacities else "queue_inclusive"
    service = {}
    if capacities:
        for res, attr in (("gen", ("gen_req", "gen_done")), ("forecast", ("fc_req", "fc_done")),
                          ("eval", ("ev_req", "ev_done"))):
            rows = [c for c in ordered if getattr(c, attr[0]) is not None
                    and getattr(c, attr[1]) is not None]
            times = recover_service([(getattr(c, attr[0]), getattr(c, attr[1])) for c in rows],
                                    int(capacities.get(res, 1)))
            service[res] = {c.cid: s for c, s in zip(rows, times)}
    selected = [c for c in ordered if c.decision == "measure"]
    per_parent: dict = {}
    for c in selected:
        per_parent[(c.step, c.parent)] = per_parent.get((c.step, c.parent), 0) + 1
    header = {
        "kind": "header", "schema_version": SCHEMA_VERSION,
        "log_id": log_id or f"gpu-forecasters-{search_id}",
        "created_at": datetime.utcfromtimestamp(t0).strftime("%Y-%m-%dT%H:%M:%SZ") if t0
        else "1970-01-01T00:00:00Z",
        "provenance": {"kind": "measured",
                       "note": f"imported by gfsim import gpu-forecasters-events from "
                               f"{path.name}: the reference's "
                               f"{'filtered' if filtered else 'standard'}"
                               " PUCT search; mutation tokens are never logged there, and stage "
                               "times (compile/check/timing) are not split",
                       "source": source_name(path),
                       "dialect": "filtered" if filtered else "standard"},
        "log_shape": "trajectory",
        "label_bin_convention": "reference-code",
        "forecast_bin_edges": list(PAPER_EDGES),
        "forecast_relative_to": "seed",
        "hardware": hardware,
        "tasks": [{"task_id": task_id, "description": f"{task_id} (the reference's pack)",
                   "seed_speedup": seed_speedup,
                   "reference_code": init.get("seed_reference_code") or root.get("program_code")}],
        "timing_protocol": {"l2_flush": False, "input_clone_timed": True, "statistic": "mean",
                            "source": "the reference's evaluator"},
        "duration_basis": basis,
        "generator": {"model": "unknown (not in the events)"},
    }
    if capacities:
        header["service_recovery"] = {"capacities": capacities,
                                      "rule": "FIFO: completed - max(requested, slot freed)"}
    if filtered and selected:
        header["selection"] = {"rule": "top-k by expected bin index per parent (the "
                                       "reference's filtered search), as logged",
                               "k": max(per_parent.values())}
    driver = f"reference-puct-{'filtered' if filtered else 'standard'}"
    records: list[dict] = [header, {"kind": "run", "search_id": search_id, "driver": driver}]
    by_step: dict[int, list[_Cand]] = {}
    for c in ordered:
        by_step.setdefault(c.step, []).append(c)
    logged = {s["step"]: s for s in steps}
    counts = {"candidates": 0, "forecasts": 0, "evaluations": 0, "deferred": 0}
    for s in sorted(by_step):
        st = logged.get(s, {"parent_ulids": [], "scores": None})
        parents = [p for p in st["parent_ulids"] if p != root_id]
        rec = {"kind": "step", "search_id": search_id, "step": s,
               "parent_ids": [node_of.get(p, p) for p in parents]}
        if isinstance(st.get("scores"), list) and len(st["scores"]) == len(st["parent_ulids"]):
            rec["parent_scores"] = [sc for p, sc in zip(st["parent_ulids"], st["scores"])
                                    if p != root_id]
        records.append(rec)
        for seq, c in enumerate(by_step[s]):
            gen = {"started_s": rel(c.gen_req), "completed_s": rel(c.gen_done)}
            if c.cid in service.get("gen", {}):
                gen["service_s"] = service["gen"][c.cid]
            if c.gen_failed is not None or c.code is None:
                gen["failed_reason"] = c.gen_failed or "no code in the log"
            cand = {"kind": "candidate", "candidate_id": c.cid, "search_id": search_id,
                    "task_id": task_id, "parent_id": None if c.parent == root_id
                    else node_of[c.parent], "step": s, "seq": seq,
                    "generation": {k: v for k, v in gen.items() if v is not None}}
            if c.code is not None:
                cand["code"] = c.code
            records.append(cand)
            counts["candidates"] += 1
    for c in ordered:
        if c.forecast is not None or c.fc_failed is not None:
            records.append(_forecast_record(c, path, service.get("forecast", {})))
            counts["forecasts"] += 1
        if c.decision is not None:
            records.append({"kind": "decision", "candidate_id": c.cid,
                            "policy": "logged-surrogate", "action": c.decision,
                            "score": c.score})
            counts["deferred"] += c.decision == "defer"
        if c.evaluation is not None or c.ev_failed is not None:
            records.append(_evaluation_record(c, path, service.get("eval", {})))
            counts["evaluations"] += 1
    write_validated(records, out, path)
    return {"source": str(path), "out": str(out), "dialect": "filtered" if filtered
            else "standard", "task": task_id, "steps": len(by_step), **counts,
            "duration_basis": basis}


def _forecast_record(c: _Cand, path: Path, service: dict) -> dict:
    rec = {"kind": "forecast", "candidate_id": c.cid, "forecaster": "logged", "mode": "tool"}
    lat = service.get(c.cid)
    if lat is None and c.fc_req is not None and c.fc_done is not None:
        lat = None  # queue-inclusive only: left for the cost model's prior
    if c.forecast is None:
        return {**rec, "probs": [0.0] * 8, "parse_failed": True, "parse_error": c.fc_failed,
                "latency_s": lat}
    f = c.forecast
    bp = f.get("bin_probabilities")
    if not isinstance(bp, dict):
        raise GfsimError(f"{path}:{f.get('_line')}: field 'forecast.bin_probabilities': "
                         "expected an object keyed '1'..'8'")
    probs = []
    for b in range(1, 9):
        v = bp.get(str(b), 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= 1e6):
            raise GfsimError(f"{path}:{f.get('_line')}: field 'forecast.bin_probabilities."
                             f"{b}': expected a probability")
        probs.append(float(v))
    pb = f.get("predicted_bin")
    usage = c.usage or {}
    return {**rec, "probs": probs, "raw_probability_sum": f.get("raw_probability_sum"),
            "predicted_bin": pb if isinstance(pb, int) and 1 <= pb <= 8 else None,
            "parse_failed": sum(probs) == 0,
            "input_tokens": usage.get("input_tokens") if isinstance(
                usage.get("input_tokens"), int) else None,
            "output_tokens": usage.get("output_tokens") if isinstance(
                usage.get("output_tokens"), int) else None,
            "latency_s": lat}


def _evaluation_record(c: _Cand, path: Path, service: dict) -> dict:
    rec = {"kind": "evaluation", "candidate_id": c.cid, "service_s": service.get(c.cid)}
    if c.evaluation is None:
        outcome = "timeout" if str(c.ev_failed).lower().startswith("timeout") else \
            "infrastructure_failure"
        return {**rec, "outcome": outcome, "failure": c.ev_failed}
    outcome, speedup, extra = _feedback(c.evaluation, path)
    if c.ev_req is not None and c.ev_done is not None:
        rec["wall_s"] = max(0.0, c.ev_done - c.ev_req)  # queue-inclusive
    return {**rec, "outcome": outcome, "speedup": speedup,
            **{k: v for k, v in extra.items() if v is not None}}


# -- the published evaluation set ----------------------------------------------------------------
_ROW_FIELDS = ("comparison_id", "pack", "anchor_code", "candidate_code", "aggregated_speedup")
_PRED_FIELDS = ("comparison_id", "surrogate_label", "bin_probabilities")


def _rows(path: Path):
    """(where, row) for a JSON Lines (``.jsonl[.gz]``) or Parquet file; ``where`` names the line
    or the row."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise GfsimError(f"{path}: not a readable Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}: row {i}", row
        return
    from gfsim.replay_logs.io import iter_records

    for line, rec in iter_records(path):
        yield f"{path}:{line}", rec


def _probs(value, where: str) -> list[float]:
    """``[{bin, p}, ...]`` or ``{"1": p, ...}`` -> 8 numbers in bin order."""
    out = [0.0] * 8
    items = value.items() if isinstance(value, dict) else (
        [(d.get("bin"), d.get("p")) for d in value if isinstance(d, dict)]
        if isinstance(value, list) else None)
    if items is None:
        raise GfsimError(f"{where}: field 'bin_probabilities': expected [{{bin, p}}] or an "
                         "object keyed '1'..'8'")
    for b, p in items:
        if isinstance(b, float) and b.is_integer():
            b = int(b)  # (a table's column of whole numbers may read as floats)
        b = parse_key(b, where, "field 'bin_probabilities': bin")
        if not 1 <= b <= 8 or isinstance(p, bool) or not isinstance(p, (int, float)) or \
                not (0 <= p <= 1e6):
            raise GfsimError(f"{where}: field 'bin_probabilities': bad entry ({b!r:.10}, "
                             f"{p!r:.20})")
        out[b - 1] = float(p)
    return out


def import_eval_set(rows_path, predictions_path, out, *, log_id: str | None = None) -> dict:
    """The paper's evaluation set and its predictions as a ``pairs`` log for ``gfsim score``:
    one candidate per comparison (against its own anchor kernel), one forecaster per
    surrogate label, one forecast per repeat."""
    from gfsim.replay_logs import SCHEMA_VERSION

    from gfsim.core.inputs import check_output

    rows_path, predictions_path, out = Path(rows_path), Path(predictions_path), Path(out)
    check_output(out, [rows_path, predictions_path])
    for p in (rows_path, predictions_path):
        if not p.exists():
            raise GfsimError(f"{p}: no such file")
    cands, evals, packs, seen = [], [], {}, set()
    for where, row in _rows(rows_path):
        if not isinstance(row, dict):
            raise GfsimError(f"{where}: expected an object")
        for f in _ROW_FIELDS:
            if row.get(f) is None:
                raise GfsimError(f"{where}: field '{f}': missing")
        cid, pack = str(row["comparison_id"]), str(row["pack"])
        if cid in seen:
            raise GfsimError(f"{where}: field 'comparison_id': {cid!r} appears twice")
        seen.add(cid)
        s = row["aggregated_speedup"]
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0 < s < 1e9):
            raise GfsimError(f"{where}: field 'aggregated_speedup': expected a positive number")
        for f in ("anchor_code", "candidate_code"):
            if not isinstance(row[f], str):
                raise GfsimError(f"{where}: field '{f}': expected text")
        packs.setdefault(pack, 0)
        cands.append({"kind": "candidate", "candidate_id": cid, "search_id": f"{pack}-pairs",
                      "task_id": pack, "parent_id": None, "step": 0, "seq": packs[pack],
                      "code": row["candidate_code"], "anchor_code": row["anchor_code"],
                      "source_search": row.get("source_search"),
                      "true_bin": row.get("true_bin")})
        packs[pack] += 1
        evals.append({"kind": "evaluation", "candidate_id": cid, "outcome": "success",
                      "speedup": float(s)})
    if not cands:
        raise GfsimError(f"{rows_path}: no rows")
    fcs, labels = [], {}
    for where, p in _rows(predictions_path):
        if not isinstance(p, dict):
            raise GfsimError(f"{where}: expected an object")
        for f in _PRED_FIELDS:
            if f not in p:
                raise GfsimError(f"{where}: field '{f}': missing")
        cid = str(p["comparison_id"])
        if cid not in seen:
            raise GfsimError(f"{where}: field 'comparison_id': {cid!r} is not in {rows_path}")
        label = str(p["surrogate_label"])
        labels[label] = labels.get(label, 0) + 1
        failed = bool(p.get("parse_failed")) or p.get("bin_probabilities") is None
        probs = [0.0] * 8 if p.get("bin_probabilities") is None else \
            _probs(p["bin_probabilities"], where)
        rep = p.get("repeat") or 0
        if isinstance(rep, bool) or not isinstance(rep, int) or rep < 0:
            raise GfsimError(f"{where}: field 'repeat': expected a whole number >= 0")
        pb = p.get("predicted_bin")

        def count(v):
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        lat = p.get("elapsed_s")
        fcs.append({"kind": "forecast", "candidate_id": cid, "forecaster": label,
                    "mode": "tool", "probs": probs,
                    "raw_probability_sum": p.get("raw_probability_sum")
                    if isinstance(p.get("raw_probability_sum"), (int, float)) else None,
                    "predicted_bin": pb if isinstance(pb, int) and 1 <= pb <= 8 else None,
                    "parse_failed": failed or sum(probs) == 0,
                    "parse_error": p.get("parse_error") if isinstance(p.get("parse_error"), str)
                    else None, "input_tokens": count(p.get("input_tokens")),
                    "output_tokens": count(p.get("output_tokens")),
                    "latency_s": float(lat) if isinstance(lat, (int, float)) and lat >= 0
                    and math.isfinite(lat) else None, "repeat": rep})
    header = {
        "kind": "header", "schema_version": SCHEMA_VERSION,
        "log_id": log_id or "gpu-forecasters-eval-set", "created_at": "1970-01-01T00:00:00Z",
        "provenance": {"kind": "measured",
                       "note": "imported by gfsim import gpu-forecasters-eval-set: the paper's "
                               "evaluation pairs (each candidate against its own anchor) and "
                               "the forecasters' predictions",
                       "rows": source_name(rows_path),
                       "predictions": source_name(predictions_path)},
        "log_shape": "pairs", "label_bin_convention": "reference-code",
        "forecast_bin_edges": list(PAPER_EDGES), "forecast_relative_to": "reference",
        "hardware": {"device_name": "as in each row's hardware field"},
        "tasks": [{"task_id": p, "description": f"{p} (pairs against their anchors)",
                   "seed_speedup": 1.0} for p in packs],
        "duration_basis": "service", "generator": {"model": "unknown"},
    }
    write_validated([header, *cands, *fcs, *evals], out, rows_path)
    return {"rows": str(rows_path), "predictions": str(predictions_path), "out": str(out),
            "pairs": len(cands), "packs": packs, "forecasts_per_forecaster": labels}


def fetch_hf(folder: Path) -> tuple[Path, Path]:
    """Download the published evaluation set and predictions with ``datasets`` into
    ``folder`` as JSON Lines; a clear error when ``datasets`` is missing or the hub is
    unreachable."""
    try:
        import datasets
    except ImportError:
        raise GfsimError("`hf` needs the datasets package: pip install 'gfsim[hf]'") from None
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ("codezakh/gpu-forecasters-eval-set",
                 "codezakh/gpu-forecasters-eval-set-predictions"):
        try:
            ds = datasets.load_dataset(name)
        except Exception as exc:  # offline, no such data set, hub errors
            raise GfsimError(f"`hf`: cannot load {name} from the HuggingFace hub (offline? "
                             f"{type(exc).__name__}: {str(exc)[:160]}); download the files "
                             "and pass `rows` and `predictions` instead") from None
        split = next(iter(ds.values()))
        path = folder / (name.split("/")[1] + ".jsonl")
        split.to_json(str(path))
        out.append(path)
    return out[0], out[1]
