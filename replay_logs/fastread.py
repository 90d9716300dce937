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
# A number of 19 digits or more, or with an exponent of three digits: in range or not, the
# validating reader decides (a value the structs skip, under a key they do not know, is not
# range-checked by msgspec: 2**63 or 1e400 there passed the fast reader).
# (The bytes are mapped to classes once, and the class text searched with bytes.find: a regular
# expression over a chunk cost half a cold load.)
_CLASS = bytearray(b"x" * 256)
for _c in b"0123456789":
    _CLASS[_c] = ord("0")
for _c, _k in ((b"e", "e"), (b"E", "e"), (b"+", "-"), (b"-", "-"), (b".", "."), (b":", ":"),
               (b"[", ":"), (b",", ":"), (b" ", " "), (b"\t", " ")):
    _CLASS[_c[0]] = ord(_k)
_CLASS = bytes(_CLASS)


def _long_number(data: bytes, start: int) -> bool:
    """Whether ``data`` from ``start`` holds a JSON number of 19 digits or more, or with an
    exponent of three digits or more: a run of such digits right after ``:``, ``[`` or ``,``
    (spaces and a sign between); the same text inside a string (a hash) is not one."""
    text = data[start:].translate(_CLASS)
    for needle in (b"0" * 19, b"e000", b"e-000"):
        k = text.find(needle)
        while k >= 0:
            j = k - 1
            if needle[0] == ord("e"):  # back over the mantissa: digits and a point
                while j >= 0 and text[j] in b"0.":
                    j -= 1
                if j == k - 1:  # no mantissa: a word, not a number
                    k = text.find(needle, k + 1)
                    continue
            while j >= 0 and text[j] in b" -":
                j -= 1
            if j >= 0 and text[j] == ord(":"):
                return True
            k = text.find(needle, k + len(needle))
    return False

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


# Records are decoded a chunk at a time (``io.LINE_CHUNK_BYTES``): what a chunk's records cost
# in Python objects is dropped before the next one is decoded, and the columns keep compact
# arrays (``Column``). A 1,000,000-candidate log then peaks under 2 GB instead of above 4 GB.
_NONE = type(None)
_I64 = (-(2 ** 63), 2 ** 63 - 1)


class Column:
    """A column gathered chunk by chunk, each chunk's values held as compactly as they allow
    (an array of floats, ints or booleans with a mask of Nones; otherwise the list itself).
    ``values()`` gives back the very list of Python values it was given, value for value and
    type for type, so that pandas infers from it what it infers from the list."""

    __slots__ = ("parts", "n")

    def __init__(self):
        self.parts: list[tuple] = []
        self.n = 0

    def extend(self, values: list) -> None:
        self.n += len(values)
        kinds = set(map(type, values))
        plain = kinds - {_NONE}
        if len(values) < 64 or len(plain) != 1 or next(iter(plain)) not in (float, int, bool):
            self.parts.append(("list", values))
            return
        (kind,) = plain
        mask = None
        if _NONE in kinds:
            mask = np.fromiter(map(_NONE.__instancecheck__, values), bool, len(values))
            values = [v for v in values if v is not None]
        if kind is int and values and not (_I64[0] <= min(values) and max(values) <= _I64[1]):
            self.parts.append(("list", values if mask is None else _with_none(values, mask)))
            return
        dtype = {float: np.float64, int: np.int64, bool: np.bool_}[kind]
        self.parts.append(("array", np.array(values, dtype=dtype), mask))

    def values(self) -> list:
        out: list = []
        for part in self.parts:
            if part[0] == "list":
                out.extend(part[1])
            elif part[2] is None:
                out.extend(part[1].tolist())
            else:
                out.extend(_with_none(part[1].tolist(), part[2]))
        return out

    def __len__(self) -> int:
        return self.n


def _with_none(values: list, mask: np.ndarray) -> list:
    out = np.empty(len(mask), dtype=object)
    out[~mask] = values
    return out.tolist()  # (an empty object array holds None where nothing was put)


def values(col) -> list:
    """A column's Python values, whichever reader gathered it (a list or a ``Column``)."""
    return col.values() if isinstance(col, Column) else col


class _Links:
    """What the links between records need across chunks: every candidate by id, its line
    and its search (as an index), evaluated or not."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.ids: list[str] = []
        self.line = np.zeros(1 << 16, np.int64)
        self.search = np.zeros(1 << 16, np.int32)
        self.evaluated = np.zeros(1 << 16, bool)
        self.search_code: dict[str, int] = {}
        self.search_task: dict[str, str] = {}

    def grow(self, n: int) -> None:
        if n > len(self.line):
            size = max(n, 2 * len(self.line))
            for name in ("line", "search", "evaluated"):
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[:len(old)] = old
                setattr(self, name, new)

    def lookup(self, ids: list, lines: list) -> np.ndarray | None:
        """The candidates' indices, or None if one is unknown or not earlier than its line."""
        get = self.index.get
        idx = np.fromiter((get(c, -1) for c in ids), np.int64, len(ids))
        if len(idx) and ((idx < 0).any() or (self.line[np.maximum(idx, 0)]
                                             >= np.asarray(lines, np.int64)).any()):
            return None
        return idx


def fast_columns(header: dict, chunks) -> dict | None:
    """The columns ``load_log`` builds for the records after the header, or None when the
    validating reader must decide. ``chunks``: (number of the first record's line, bytes,
    offset of that record, number of lines from there) of whole lines, each ending in a
    newline (``io.LineChunks``): what is held is one chunk and the columns, never the log's
    text."""
    g = _Gather(header)
    seen = False
    for line, data, start, n_lines in chunks:
        if len(data) <= start:
            continue
        if (_BLANK.search(data, start) or _LEADING_BLANK.match(data, start)
                or _long_number(data, start)):
            return None
        try:
            recs = _DECODER.decode_lines(memoryview(data)[start:])
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None  # (nesting too deep for msgspec: the validating reader names the line)
        if n_lines != len(recs):  # a line with two records
            return None
        if not g.chunk(recs, line):
            return None
        seen = True
        del recs
    return g.finish() if seen else None


class _Gather:
    """The columns of a log's records, a chunk at a time (``fast_columns``)."""

    def __init__(self, header: dict):
        self.header = header
        self.trajectory = header["log_shape"] == "trajectory"
        self.pairs = header["log_shape"] == "pairs"
        self.task_ids = {t["task_id"] for t in header["tasks"]}
        self.links = _Links()
        self.run_line: dict[str, int] = {}
        self.runs: list[dict] = []
        self.steps: list[dict] = []
        self.counts: dict[str, int] = {"header": 1}
        self.texts: dict[str, str] = {}  # one object per distinct repeated text
        self.cand = {k: Column() for k in (
            "step", "seq", "code_sha256", "has_code", "line",
            *("gen_" + g for g in _Generation.__struct_fields__))}
        self.cand_search: list[str] = []
        self.cand_task: list[str] = []
        self.parent_idx: list[np.ndarray] = []
        self.fc = {k: Column() for k in (
            "raw_probability_sum", "predicted_bin", "parse_failed", "input_tokens",
            "output_tokens", "latency_s", "repeat", "line")}
        self.fc_idx: list[np.ndarray] = []
        self.fc_forecaster: list[str] = []
        self.fc_mode: list[str] = []
        self.probs: list[np.ndarray] = []
        self.fc_errors: list[dict] = []
        self.first_forecast_line = None
        self.dec = {"candidate_id": [], "policy": [], "action": [], "score": Column(),
                    "reason": [], "line": Column()}
        self.ev = {k: Column() for k in FIELDS["evaluation"] if k not in (
            "candidate_id", "outcome", "imputed_by")}
        self.ev_idx: list[np.ndarray] = []
        self.ev_outcome: list[str] = []
        self.ev_imputed: list = []
        self.ev_line = Column()

    def _texts(self, values: list) -> list:
        texts = self.texts
        return [texts.setdefault(v, v) if v is not None else None for v in values]

    def chunk(self, recs: list, first: int) -> bool:
        """Check and gather one chunk's records (the first on line ``first``); False if the
        validating reader must decide."""
        codes = np.fromiter(map(_CODE.__getitem__, map(type, recs)), dtype=np.int8,
                            count=len(recs))
        parts, firsts = {}, []
        for cls, k in _CODE.items():
            idx = np.flatnonzero(codes == k)
            if len(idx):
                firsts.append((int(idx[0]), _TAG[cls], len(idx)))
            parts[cls] = (_take(recs, idx), (idx + first).tolist())
        del recs
        # Counts in order of first appearance, as a Counter over the records has them.
        for _, tag, n in sorted(firsts):
            self.counts[tag] = self.counts.get(tag, 0) + n
        if not self._runs(*parts[_Run]):
            return False
        (steps, step_lines), (cands, cand_lines) = parts[_Step], parts[_Candidate]
        get_run = self.run_line.get
        if any(get_run(sid, ln) >= ln for sid, ln in zip(_column(steps, "search_id"),
                                                           step_lines)):
            return False
        self.steps.extend(_as_record(r) for r in steps)
        if not self._candidates(cands, cand_lines):
            return False
        links = self.links
        for part, lines in (parts[_Forecast], parts[_Decision], parts[_Attempt],
                            parts[_Evaluation]):
            if links.lookup(_column(part, "candidate_id"), lines) is None:
                return False
        return (self._forecasts(*parts[_Forecast]) and self._decisions(*parts[_Decision])
                and self._evaluations(*parts[_Evaluation]))

    def _runs(self, runs: list, lines: list) -> bool:
        for ln, r in zip(lines, runs):
            if r.search_id in self.run_line or (isinstance(r.configuration, dict)
                                                and not _plain(r.configuration)):
                return False
            self.run_line[r.search_id] = ln
        self.runs.extend(_as_record(r) for r in runs)
        return True

    def _candidates(self, cands: list, lines: list) -> bool:
        links = self.links
        ids = _column(cands, "candidate_id")
        sids = self._texts(_column(cands, "search_id"))
        tasks = self._texts(_column(cands, "task_id"))
        if not self.task_ids.issuperset(tasks):
            return False
        get_run = self.run_line.get
        if self.trajectory and any(get_run(sid, ln) >= ln for sid, ln in zip(sids, lines)):
            return False
        if not self.pairs:
            known = links.search_task
            for sid, task in zip(sids, tasks):
                if known.setdefault(sid, task) != task:
                    return False  # a search with candidates of two tasks
        n0 = len(links.ids)
        for k, cid in enumerate(ids):
            if links.index.setdefault(cid, n0 + k) != n0 + k:
                return False  # a candidate id twice
        links.ids.extend(ids)
        links.grow(len(links.ids))
        codes = links.search_code
        links.line[n0:n0 + len(ids)] = lines
        links.search[n0:n0 + len(ids)] = [codes.setdefault(s, len(codes)) for s in sids]
        parents = _column(cands, "parent_id")
        get = links.index.get
        pidx = np.fromiter((-1 if p is None else get(p, -2) for p in parents), np.int64,
                           len(parents))
        has = pidx != -1
        if (pidx[has] < 0).any():
            return False  # an unknown parent
        me = np.arange(n0, n0 + len(ids))
        if (links.line[pidx[has]] >= links.line[me[has]]).any() or (
                links.search[pidx[has]] != links.search[me[has]]).any():
            return False  # a parent not earlier, or of another search
        self.parent_idx.append(pidx)
        self.cand_search.extend(sids)
        self.cand_task.extend(tasks)
        none_gen = _Generation()
        gens = [g if g is not None else none_gen for g in _column(cands, "generation")]
        c = self.cand
        c["step"].extend(_column(cands, "step"))
        c["seq"].extend(_column(cands, "seq"))
        c["code_sha256"].extend(_column(cands, "code_sha256"))
        c["has_code"].extend([x is not None for x in _column(cands, "code")])
        c["line"].extend(lines)
        for g in _Generation.__struct_fields__:
            c["gen_" + g].extend(_column(gens, g))
        return True

    def _forecasts(self, fcs: list, lines: list) -> bool:
        errors = _column(fcs, "error")
        answered = [i for i, e in enumerate(errors) if not e]
        if answered and any(self.header.get(k) is None
                            for k in ("forecast_bin_edges", "forecast_relative_to")):
            return False
        self.fc_errors.extend(
            {"candidate_id": fcs[i].candidate_id, "forecaster": fcs[i].forecaster,
             "error": str(errors[i]), "line": lines[i]} for i, e in enumerate(errors) if e)
        ok = [fcs[i] for i in answered] if len(answered) < len(fcs) else fcs
        if answered and self.first_forecast_line is None:
            self.first_forecast_line = lines[answered[0]]
        given_probs = _column(ok, "probs")
        raw = np.array(given_probs, dtype=float).reshape(-1, 8)
        try:
            raw_sum = list(map(math.fsum, given_probs))  # exactly as the validating reader sums
        except OverflowError:
            return False  # the validating reader names the record
        parse_failed = [bool(f) or t == 0.0 for f, t in zip(_column(ok, "parse_failed"),
                                                            raw_sum)]
        probs = np.zeros((len(ok), 8))
        keep = np.flatnonzero(~np.array(parse_failed, dtype=bool))
        if len(keep):
            probs[keep] = raw[keep] / np.array(raw_sum)[keep, None]
        self.probs.append(probs)
        given = _column(ok, "raw_probability_sum")
        f = self.fc
        self.fc_idx.append(self.links.lookup(_column(ok, "candidate_id"),
                                             [lines[i] for i in answered]))
        self.fc_forecaster.extend(self._texts(_column(ok, "forecaster")))
        self.fc_mode.extend(self._texts(_column(ok, "mode")))
        f["raw_probability_sum"].extend([g if g is not None else t
                                         for g, t in zip(given, raw_sum)])
        f["predicted_bin"].extend(_column(ok, "predicted_bin"))
        f["parse_failed"].extend(parse_failed)
        f["input_tokens"].extend(_column(ok, "input_tokens"))
        f["output_tokens"].extend(_column(ok, "output_tokens"))
        f["latency_s"].extend(_column(ok, "latency_s"))
        f["repeat"].extend([r or 0 for r in _column(ok, "repeat")])
        f["line"].extend([lines[i] for i in answered])
        return True

    def _decisions(self, decs: list, lines: list) -> bool:
        """Gather decisions compactly: a log may hold any number of them for one candidate,
        so each costs what its columns must (its candidate's id, its policy and action as
        one shared object each, its score and line in arrays), not a copy of its text."""
        ids, dec = self.links.ids, self.dec
        idx = self.links.lookup(_column(decs, "candidate_id"), lines)  # (checked by chunk())
        dec["candidate_id"].extend(map(ids.__getitem__, idx.tolist()))
        dec["policy"].extend(self._texts(_column(decs, "policy")))
        dec["action"].extend(self._texts(_column(decs, "action")))
        dec["score"].extend(_column(decs, "score"))
        dec["reason"].extend(_column(decs, "reason"))
        dec["line"].extend(lines)
        return True

    def _evaluations(self, evs: list, lines: list) -> bool:
        links = self.links
        ids = _column(evs, "candidate_id")
        idx = links.lookup(ids, lines)
        if idx is None or links.evaluated[idx].any() or len(np.unique(idx)) != len(idx):
            return False  # a second evaluation of a candidate
        links.evaluated[idx] = True
        ev_cols = {k: _column(evs, k) for k in FIELDS["evaluation"]}
        for outcome, s, rt, ref, imp in zip(ev_cols["outcome"], ev_cols["speedup"],
                                            ev_cols["runtime_ns"], ev_cols["ref_runtime_ns"],
                                            ev_cols["imputed_by"]):
            if (outcome == "success") != (s is not None):
                return False  # a success needs a speedup, a failure cannot carry one
            if s is not None and rt is not None and ref is not None and (
                    abs(ref / rt - s) > _SPEEDUP_RTOL * s):
                return False
            if imp is not None and not _plain(imp):
                return False
        self.ev_idx.append(idx)
        self.ev_outcome.extend(self._texts(ev_cols["outcome"]))
        self.ev_imputed.extend(ev_cols["imputed_by"])
        for k, col in self.ev.items():
            col.extend(ev_cols[k])
        self.ev_line.extend(lines)
        return True

    def finish(self) -> dict:
        links = self.links
        ids = links.ids
        pidx = np.concatenate(self.parent_idx) if self.parent_idx else np.zeros(0, np.int64)
        table = np.empty(len(ids) + 1, dtype=object)
        table[:len(ids)] = ids  # index -1: None
        cand = {"candidate_id": ids, "search_id": self.cand_search, "task_id": self.cand_task,
                "parent_id": table[pidx].tolist(), "step": self.cand["step"],
                "seq": self.cand["seq"], "code_sha256": self.cand["code_sha256"],
                "has_code": self.cand["has_code"], "line": self.cand["line"],
                **{"gen_" + g: self.cand["gen_" + g] for g in _Generation.__struct_fields__}}
        f = self.fc
        fc = {"candidate_id": table[_concat(self.fc_idx)].tolist(),
              "forecaster": self.fc_forecaster, "mode": self.fc_mode,
              "raw_probability_sum": f["raw_probability_sum"],
              "predicted_bin": f["predicted_bin"], "parse_failed": f["parse_failed"],
              "input_tokens": f["input_tokens"], "output_tokens": f["output_tokens"],
              "latency_s": f["latency_s"], "repeat": f["repeat"], "line": f["line"]}
        probs = np.concatenate(self.probs) if self.probs else np.zeros((0, 8))
        ev = {"candidate_id": table[_concat(self.ev_idx)].tolist()}
        for k in FIELDS["evaluation"]:
            if k not in ("candidate_id", "imputed_by"):
                ev[k] = self.ev_outcome if k == "outcome" else self.ev[k]
        ev["imputed_by"] = self.ev_imputed
        ev["line"] = self.ev_line
        # (no decisions: plain lists, of which pandas makes the table it always made)
        dec = self.dec if self.dec["line"].n else {k: values(v) for k, v in self.dec.items()}
        return {"runs": self.runs, "steps": self.steps, "cand": cand, "fc": fc,
                "probs": probs, "dec": dec, "ev": ev, "extras": {},
                "fc_errors": self.fc_errors, "counts": self.counts,
                "first_forecast_line": self.first_forecast_line}


def _as_record(r) -> dict:
    """A run or step struct as the record dict the validating reader keeps (absent optional
    fields absent, present ones as given)."""
    out = {"kind": _TAG[type(r)]}
    for f in r.__struct_fields__:
        v = getattr(r, f)
        if v is not msgspec.UNSET:
            out[f] = v
    return out


def _concat(parts: list, dtype=np.int64) -> np.ndarray:
    """The arrays in ``parts`` end to end (an empty one of ``dtype`` for none)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype)
