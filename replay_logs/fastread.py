"""The fast reader: a log's records decoded and type-checked by msgspec, then linked in bulk.

``load_log``'s validating reader checks one record at a time in Python. Here every record but
the header is decoded in one call into typed structs that carry schema v1's field checks
(types, ranges, enumerations, required fields, finite numbers, 64-bit integers, text that is
valid UTF-8), so that what remains in Python is the links between records and the columns,
built field by field. Whatever this reader cannot settle exactly, it leaves to the validating
reader, which then names the file, line and field of the first problem as always:

- a record that fails a check, or that carries a field the schema does not know (those are
  kept, and the validating reader keeps them);
- a broken link (an unknown candidate, a parent that is not earlier, a second evaluation,
  ...); the validating reader finds the first one in file order;
- a file whose last line may be cut (no final newline, or a gzip stream that ends early),
  or with blank lines.

So both readers accept exactly the same logs and give the same tables
(``tests/test_fastread.py`` checks both on random and mutated logs).
"""

from __future__ import annotations

import math
import operator
import re
import sys
from typing import Annotated, Literal, Optional, Union

import msgspec
import numpy as np

from gfsim.replay_logs.io import INT_MAX, INT_MIN
from gfsim.replay_logs.schema import ACTIONS, FIELDS, OUTCOMES

__all__ = ["fast_columns"]

_FMAX = sys.float_info.max  # finite floats only
_SPEEDUP_RTOL = 1e-3

_Str = Annotated[str, msgspec.Meta(min_length=1)]
_Int = Annotated[int, msgspec.Meta(ge=INT_MIN, le=INT_MAX)]
_NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=INT_MAX)]
_Bin = Annotated[int, msgspec.Meta(ge=1, le=8)]
_Num = Union[_Int, Annotated[float, msgspec.Meta(ge=-_FMAX, le=_FMAX)]]
_NonNeg = Union[_NonNegInt, Annotated[float, msgspec.Meta(ge=0.0, le=_FMAX)]]
_Pos = Union[Annotated[int, msgspec.Meta(gt=0, le=INT_MAX)],
             Annotated[float, msgspec.Meta(gt=0.0, le=_FMAX)]]
_Probs = Annotated[list[_NonNeg], msgspec.Meta(min_length=8, max_length=8)]


class _Record(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, gc=False):
    pass


class _Generation(msgspec.Struct, gc=False):  # other fields of a generation are not read
    started_s: Optional[_NonNeg] = None
    completed_s: Optional[_NonNeg] = None
    service_s: Optional[_NonNeg] = None
    input_tokens: Optional[_NonNegInt] = None
    output_tokens: Optional[_NonNegInt] = None
    failed_reason: Optional[_Str] = None


class _Run(_Record, tag="run"):
    search_id: _Str
    driver: _Str
    configuration: Union[dict, None, msgspec.UnsetType] = msgspec.UNSET


class _Step(_Record, tag="step"):
    search_id: _Str
    step: _NonNegInt
    parent_ids: list[_Str]
    parent_scores: Union[list[Optional[_Num]], None, msgspec.UnsetType] = msgspec.UNSET


class _Candidate(_Record, tag="candidate"):
    candidate_id: _Str
    search_id: _Str
    task_id: _Str
    step: _NonNegInt
    seq: _NonNegInt
    parent_id: Optional[_Str] = None
    generation: Optional[_Generation] = None
    code_sha256: Optional[_Str] = None
    code: Optional[_Str] = None


class _Forecast(_Record, tag="forecast"):
    candidate_id: _Str
    forecaster: _Str
    mode: _Str
    probs: _Probs
    raw_probability_sum: Optional[_NonNeg] = None
    predicted_bin: Optional[_Bin] = None
    parse_failed: Optional[bool] = None
    input_tokens: Optional[_NonNegInt] = None
    output_tokens: Optional[_NonNegInt] = None
    latency_s: Optional[_NonNeg] = None
    repeat: Optional[_NonNegInt] = None
    attempts: Optional[_NonNegInt] = None
    parse_error: Optional[_Str] = None
    error: Optional[_Str] = None


class _Decision(_Record, tag="decision"):
    candidate_id: _Str
    policy: _Str
    action: Literal[ACTIONS]  # type: ignore[valid-type]
    score: Optional[_Num] = None
    reason: Optional[_Str] = None


class _Attempt(_Record, tag="attempt"):
    candidate_id: _Str
    attempt: _NonNegInt
    session: Optional[_NonNegInt] = None


class _Evaluation(_Record, tag="evaluation"):
    candidate_id: _Str
    outcome: Literal[OUTCOMES]  # type: ignore[valid-type]
    speedup: Optional[_Pos] = None
    runtime_ns: Optional[_Pos] = None
    ref_runtime_ns: Optional[_Pos] = None
    compile_s: Optional[_NonNeg] = None
    check_s: Optional[_NonNeg] = None
    timing_s: Optional[_NonNeg] = None
    cold_start_s: Optional[_NonNeg] = None
    wall_s: Optional[_NonNeg] = None
    service_s: Optional[_NonNeg] = None
    energy_j: Optional[_NonNeg] = None
    imputed_by: Optional[dict] = None


_DECODER = msgspec.json.Decoder(
    Union[_Run, _Step, _Candidate, _Forecast, _Decision, _Attempt, _Evaluation])
_BLANK = re.compile(rb"\n[ \t\r\f\v]*\n")  # a blank line after the first
_LEADING_BLANK = re.compile(rb"[ \t\r\f\v]*\n")

# The schema, and these structs, must name the same fields.
assert {f for f in _Run.__struct_fields__} == set(FIELDS["run"])
assert {f for f in _Step.__struct_fields__} == set(FIELDS["step"])
assert {f for f in _Candidate.__struct_fields__} == set(FIELDS["candidate"])
assert {f for f in _Forecast.__struct_fields__} == set(FIELDS["forecast"])
assert {f for f in _Decision.__struct_fields__} == set(FIELDS["decision"])
assert {f for f in _Attempt.__struct_fields__} == set(FIELDS["attempt"])
assert {f for f in _Evaluation.__struct_fields__} == set(FIELDS["evaluation"])


def _plain(obj) -> bool:
    """Whether a free-form object (a run's configuration, an evaluation's imputed_by) holds
    only what the validating reader accepts: integers within int64."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and not INT_MIN <= v <= INT_MAX:
            return False
    return True


_TAG = {cls: cls.__struct_config__.tag for cls in (_Run, _Step, _Candidate, _Forecast, _Decision,
                                                  _Attempt, _Evaluation)}
_CODE = {cls: k for k, cls in enumerate(_TAG)}


def _take(recs: list, idx: np.ndarray) -> list:
    if len(idx) == 0:
        return []
    got = operator.itemgetter(*idx.tolist())(recs)
    return [got] if len(idx) == 1 else list(got)


def _column(part: list, name: str) -> list:
    return list(map(operator.attrgetter(name), part))


def fast_columns(header_line: int, header: dict, rest: bytes):
    """The columns ``load_log`` builds, for the records after the header (``rest``, which
    starts on line ``header_line + 1``), or None when the validating reader must decide."""
    if not rest.endswith(b"\n") or _BLANK.search(rest) or _LEADING_BLANK.match(rest):
        return None
    try:
        recs = _DECODER.decode_lines(rest)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None  # (nesting too deep for msgspec: the validating reader names the line)
    if rest.count(b"\n") != len(recs):  # a line with two records (no line is blank)
        return None
    first = header_line + 1
    codes = np.fromiter(map(_CODE.__getitem__, map(type, recs)), dtype=np.int8,
                        count=len(recs))
    parts = {}
    for cls, k in _CODE.items():
        idx = np.flatnonzero(codes == k)
        parts[cls] = (_take(recs, idx), (idx + first).tolist())
    (runs, run_lines), (steps, step_lines) = parts[_Run], parts[_Step]
    (cands, cand_lines), (fcs, fc_lines) = parts[_Candidate], parts[_Forecast]
    (decs, dec_lines), (evs, ev_lines) = parts[_Decision], parts[_Evaluation]
    atts, att_lines = parts[_Attempt]

    # -- links (any break: the validating reader reports the first one) --------------------
    run_line: dict[str, int] = {}
    for ln, r in zip(run_lines, runs):
        if r.search_id in run_line or (isinstance(r.configuration, dict)
                                       and not _plain(r.configuration)):
            return None
        run_line[r.search_id] = ln
    get_run = run_line.get
    if any(get_run(sid, ln) >= ln for sid, ln in zip(_column(steps, "search_id"), step_lines)):
        return None
    task_ids = {t["task_id"] for t in header["tasks"]}
    cand_ids = _column(cands, "candidate_id")
    cand_search_ids = _column(cands, "search_id")
    cand_tasks = _column(cands, "task_id")
    parent_ids = _column(cands, "parent_id")
    cand_line = dict(zip(cand_ids, cand_lines))
    if len(cand_line) != len(cand_ids) or not task_ids.issuperset(cand_tasks):
        return None
    if header["log_shape"] == "trajectory" and any(
            get_run(sid, ln) >= ln for sid, ln in zip(cand_search_ids, cand_lines)):
        return None
    if header["log_shape"] != "pairs" and len(set(zip(cand_search_ids, cand_tasks))) != len(
            set(cand_search_ids)):
        return None  # a search with candidates of two tasks
    cand_search = dict(zip(cand_ids, cand_search_ids))
    get_line = cand_line.get
    for p, sid, ln in zip(parent_ids, cand_search_ids, cand_lines):
        if p is not None and (get_line(p, ln) >= ln or cand_search[p] != sid):
            return None
    for part, lines in ((fcs, fc_lines), (decs, dec_lines), (atts, att_lines), (evs, ev_lines)):
        if any(get_line(c, ln) >= ln for c, ln in zip(_column(part, "candidate_id"), lines)):
            return None
    ev_cols = {k: _column(evs, k) for k in FIELDS["evaluation"]}
    if len(set(ev_cols["candidate_id"])) != len(evs):
        return None  # a second evaluation of a candidate
    for outcome, s, rt, ref, imp in zip(ev_cols["outcome"], ev_cols["speedup"],
                                        ev_cols["runtime_ns"], ev_cols["ref_runtime_ns"],
                                        ev_cols["imputed_by"]):
        if (outcome == "success") != (s is not None):
            return None  # a success needs a speedup, a failure cannot carry one
        if s is not None and rt is not None and ref is not None and (
                abs(ref / rt - s) > _SPEEDUP_RTOL * s):
            return None
        if imp is not None and not _plain(imp):
            return None
    errors = _column(fcs, "error")
    answered = [i for i, e in enumerate(errors) if not e]
    if answered and any(header.get(k) is None
                        for k in ("forecast_bin_edges", "forecast_relative_to")):
        return None

    # -- columns, as the validating reader builds them ----------------------------------------
    none_gen = _Generation()
    gens = [g if g is not None else none_gen for g in _column(cands, "generation")]
    cand = {"candidate_id": cand_ids, "search_id": cand_search_ids, "task_id": cand_tasks,
            "parent_id": parent_ids, "step": _column(cands, "step"),
            "seq": _column(cands, "seq"), "code_sha256": _column(cands, "code_sha256"),
            "has_code": [c is not None for c in _column(cands, "code")], "line": cand_lines,
            **{"gen_" + g: _column(gens, g) for g in _Generation.__struct_fields__}}
    fc_errors = [{"candidate_id": fcs[i].candidate_id, "forecaster": fcs[i].forecaster,
                  "error": str(errors[i]), "line": fc_lines[i]}
                 for i, e in enumerate(errors) if e]
    ok = [fcs[i] for i in answered] if len(answered) < len(fcs) else fcs
    given_probs = _column(ok, "probs")
    raw = np.array(given_probs, dtype=float).reshape(-1, 8)
    raw_sum = list(map(math.fsum, given_probs))  # exactly as the validating reader sums them
    parse_failed = [bool(f) or t == 0.0 for f, t in zip(_column(ok, "parse_failed"), raw_sum)]
    probs = np.zeros((len(ok), 8))
    keep = np.flatnonzero(~np.array(parse_failed, dtype=bool))
    if len(keep):
        probs[keep] = raw[keep] / np.array(raw_sum)[keep, None]
    given = _column(ok, "raw_probability_sum")
    fc = {"candidate_id": _column(ok, "candidate_id"), "forecaster": _column(ok, "forecaster"),
          "mode": _column(ok, "mode"),
          "raw_probability_sum": [g if g is not None else t for g, t in zip(given, raw_sum)],
          "predicted_bin": _column(ok, "predicted_bin"), "parse_failed": parse_failed,
          "input_tokens": _column(ok, "input_tokens"),
          "output_tokens": _column(ok, "output_tokens"), "latency_s": _column(ok, "latency_s"),
          "repeat": [r or 0 for r in _column(ok, "repeat")],
          "line": [fc_lines[i] for i in answered]}
    dec = {k: _column(decs, k) for k in ("candidate_id", "policy", "action", "score", "reason")}
    dec["line"] = dec_lines
    ev = {k: v for k, v in ev_cols.items() if k != "imputed_by"}
    ev["imputed_by"] = ev_cols["imputed_by"]
    ev["line"] = ev_lines
    kinds = ["header"] + list(map(_TAG.__getitem__, map(type, recs)))
    return {"runs": [_as_record(r) for r in runs], "steps": [_as_record(r) for r in steps],
            "cand": cand, "fc": fc, "probs": probs, "dec": dec, "ev": ev, "extras": {},
            "fc_errors": fc_errors,
            "kinds": kinds, "first_forecast_line": fc_lines[answered[0]] if answered else None}


def _as_record(r) -> dict:
    """A run or step struct as the record dict the validating reader keeps (absent optional
    fields absent, present ones as given)."""
    out = {"kind": _TAG[type(r)]}
    for f in r.__struct_fields__:
        v = getattr(r, f)
        if v is not msgspec.UNSET:
            out[f] = v
    return out
