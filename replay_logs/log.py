"""A replay log in memory: validated once, held column by column.

``load_log`` reads a ``.jsonl``/``.jsonl.gz`` file, checks every record against schema v1 and
every link between records (ids, parents, one evaluation per candidate), renormalises forecast
probabilities (keeping the raw sum) and builds one pandas DataFrame per record kind, so that a
sweep over many policies never parses JSON again.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gfsim.core.errors import LogError
from gfsim.core.inputs import size_text
from gfsim.core.memory import budget_text, memory_budget_bytes, no_cyclic_gc
from gfsim.replay_logs.io import (
    LineChunks,
    LogText,
    TruncatedTailWarning,
    iter_records,
    loads_record,
)
from gfsim.replay_logs.schema import FIELDS, check_record

__all__ = ["ReplayLog", "load_log", "open_log", "CANDIDATE_STATUSES"]

# Derived, never guessed: evaluated (has an evaluation), deferred (a logged decision chose not
# to measure it), generation_failed (the mutator returned nothing), not_attempted (the rest).
CANDIDATE_STATUSES = ("evaluated", "deferred", "generation_failed", "not_attempted")
PROB_COLUMNS = [f"p{b}" for b in range(1, 9)]
_GEN_COLUMNS = ("started_s", "completed_s", "service_s", "input_tokens", "output_tokens",
                "failed_reason")
_SPEEDUP_RTOL = 1e-3


@dataclass
class ReplayLog:
    """A validated log. Tables keep log order; ``line`` columns point back into the file."""

    path: str
    header: dict
    runs: list[dict]
    steps: list[dict]
    candidates: pd.DataFrame
    forecasts: pd.DataFrame
    decisions: pd.DataFrame
    evaluations: pd.DataFrame
    counts: dict[str, int] = field(default_factory=dict)
    label: str | None = None  # the shipped name it was loaded by, if any
    # Forecast records that carry ``error`` (no answer): kept apart, never used as forecasts.
    forecast_errors: pd.DataFrame | None = None
    # What a crash cut from the end of the file (the reader's warning), or None: such a log
    # is never cached, so every load says so again.
    truncated: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.header.get("log_id") or Path(self.path).name

    @property
    def display_name(self) -> str:
        """The log as messages name it: a shipped log by its name (its path lies inside the
        installed package and says nothing to the user), any other by its path."""
        return f"{self.label} (shipped log)" if self.label else str(self.path)

    @property
    def shape(self) -> str:
        return self.header["log_shape"]

    @property
    def tasks(self) -> dict[str, dict]:
        return {t["task_id"]: t for t in self.header["tasks"]}

    @property
    def is_synthetic(self) -> bool:
        return self.header["provenance"].get("kind") != "measured"

    def forecasters(self) -> list[str]:
        """Forecaster names in order of first appearance."""
        if not len(self.forecasts):
            return []
        return list(dict.fromkeys(self.forecasts["forecaster"].tolist()))

    def status_counts(self) -> dict[str, int]:
        counts = self.candidates["status"].value_counts()
        return {s: int(counts.get(s, 0)) for s in CANDIDATE_STATUSES}


def _flatten_candidate(rec: dict, cols: dict[str, list]) -> None:
    gen = rec.get("generation") or {}
    for name in _GEN_COLUMNS:
        cols["gen_" + name].append(gen.get(name))


def load_log(path: str | os.PathLike, *, cache: bool = False) -> ReplayLog:
    """Read and validate a log; raise ``LogError`` naming file, line and field on bad input.

    Records are decoded by the fast reader (``replay_logs.fastread``) where it can settle a log
    exactly, else by the validating reader; both give the same tables.

    Args:
        path: a log file (``.jsonl`` or ``.jsonl.gz``), or the name of a log gfsim ships
            (``gfsim logs``) where no file of that name exists.
        cache: keep the validated tables in a columnar cache beside the log (or in the user's
            cache folder; ``replay_logs.cache``) and read them from there while the log's
            bytes are unchanged.

    Returns:
        The ``ReplayLog``: its header and its candidates, evaluations, forecasts and decisions
        as pandas tables.

    Examples:
        >>> from gfsim.replay_logs import load_log
        >>> log = load_log("synthetic-mini")
        >>> log.name, log.shape, len(log.candidates), log.is_synthetic
        ('synthetic-mini', 'trajectory', 368, True)
    """
    path = str(path)
    if not os.path.exists(path):
        from gfsim.replay_logs.shipped import SHIPPED_LOGS, shipped_path

        if path in SHIPPED_LOGS:  # a shipped log by its name, as every command takes it
            log = load_log(shipped_path(path), cache=cache)
            log.label = path
            return log
    digest = None
    if cache:
        from gfsim.replay_logs import cache as log_cache
        from gfsim.replay_logs import derived

        # Bytes unchanged since they were hashed (by their status) need not be read again.
        try:
            before = os.stat(path)
        except OSError:
            before = None  # LogText.open names the problem
        known = log_cache.known_digest(path, before) if before is not None else None
        if known is not None:
            log = _cached(path, log_cache.load(path, None, known), known)
            if log is not None:
                return log
        read_ns = time.time_ns()
    # Read (a plain file) or inflated (a gzip, whose stored bytes are held) a chunk at a time
    # by each reader: the text is never held whole.
    text = LogText.open(Path(path))
    if cache and log_cache._enabled():
        digest = text.digest()
        if before is not None:
            try:
                log_cache.remember_digest(path, digest, before, os.stat(path), read_ns)
            except OSError:
                pass
        log = _cached(path, log_cache.load(path, None, digest), digest)
        if log is not None:
            return log
        text.hash_reads = True  # (cached under the digest of the bytes the tables come from)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncatedTailWarning)
        with no_cyclic_gc():  # hundreds of thousands of acyclic objects: nothing for the collector
            cols = _fast_columns(path, text)
            if cols is None:
                cols = _validating_columns(path, text)
            digest = text.read_digest or digest
            del text  # a gzip's stored bytes are not needed now
            log = _build(path, cols)
            del cols
            release_unused_memory()
    for w in caught:  # said to the caller as they were raised
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    cuts = [w for w in caught if issubclass(w.category, TruncatedTailWarning)]
    log.truncated = str(cuts[0].message) if cuts else None
    if cache and log.truncated is None:
        folder = log_cache.store(path, None, log, digest)
        if folder is not None:
            derived.attach_source(log, digest, folder)
    return log


def release_unused_memory() -> None:
    """Hand what the allocators hold but no longer use back to the system, after a large
    table was built. Pandas' Arrow-backed string columns allocate in Arrow's pool (mimalloc),
    which keeps what building tables and traces freed: 25 MB per 100,000 candidates of
    resident memory for nothing. The C heap (glibc's malloc, which numpy and Python's large
    objects use) keeps the parse's freed temporaries in its arenas too: 520 MB after a
    1,000,000-candidate log was read; ``malloc_trim`` returns them (where there is glibc)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):  # an older pyarrow: nothing to ask
        pass
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, or none to be found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl and the like: no such call
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def _cached(path: str, hit: dict | None, digest: str) -> ReplayLog | None:
    """The log from its table cache's fields (``replay_logs.cache.load``), marked as the
    source of what a replay derives from it (``replay_logs.derived``)."""
    if hit is None:
        return None
    from gfsim.replay_logs import derived

    folder = hit.pop("_folder")
    log = ReplayLog(path=path, **hit)
    derived.attach_source(log, digest, folder)
    return log


def _header_problem(rec: dict) -> tuple[str, str] | None:
    ids = [t["task_id"] for t in rec["tasks"]]
    dup = [t for t, n in Counter(ids).items() if n > 1]
    if dup:
        return "tasks", f"task_id {dup[0]!r} appears twice"
    return None


# What a record costs in memory once read, upper bounds measured on the 100,000-candidate
# synthetic log (tracemalloc peak and the process's resident set, imports apart): about 370 and
# 600 bytes a record through the fast reader, 740 and 1,700 through the validating one.
FAST_RECORD_BYTES = 600
CHECKED_RECORD_BYTES = 2000
_CHECK_EVERY = 1 << 16


class LogTooLargeError(LogError):
    """A log whose records, read so far, would need more memory than the budget allows."""


def check_columns_memory(path: str, line: int, records: int, per_record: int) -> None:
    """Refuse, in one line, a log whose ``records`` read by ``line`` would hold more than the
    memory budget (``GFSIM_MEMORY_BUDGET``) as columns: before it is read to the end, not
    after the machine has run out."""
    need = records * per_record
    budget = memory_budget_bytes()
    if need > budget:
        raise LogTooLargeError(path, line, f"its {records:,} records by this line would hold "
                               f"about {size_text(need)} in memory once read, above the "
                               f"{budget_text()}")


def _fast_columns(path: str, text: "LogText | bytes") -> dict | None:
    """The fast reader's columns, or None to leave the log to the validating reader (which
    reads the text again: a log it must decide is rare). ``text``: the log's ``LogText``, or
    its whole text bytes. A reader that gave up before the end first inflates the rest, so
    that what is wrong with the file as a whole (a bomb, corrupt gzip data) is said first."""
    text = LogText.of(path, (text, False) if isinstance(text, bytes) else text)
    chunks = LineChunks(path, text.pieces())
    lines = iter(chunks)
    try:
        cols = _fast_pass(path, lines)
    except LogError as exc:
        if exc.line is None or isinstance(exc, LogTooLargeError):
            raise
        cols = None  # a line too long: the validating reader names it after the lines before
    if not chunks.done:
        lines.close()  # (what it holds of the text goes now)
        text.check()
    elif chunks.tail or chunks.cut:
        return None  # a last line that may be cut: the validating reader decides
    return cols


def _fast_pass(path: str, chunks) -> dict | None:
    from gfsim.replay_logs.fastread import fast_columns

    _, first, n_lines = next(chunks, (1, b"", 0))
    nl = first.find(b"\n")
    if nl <= 0:
        return None
    try:
        text = first[:nl].decode("utf-8")
        header = loads_record(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if (not isinstance(header, dict) or header.get("kind") != "header" or check_record(header)
            or _header_problem(header) or "\\u" in text):  # escapes: the validating reader
        return None
    unknown = {k: v for k, v in header.items() if k != "kind" and k not in FIELDS["header"]}
    records = _after_header(path, first, nl + 1, n_lines - 1, chunks)
    del first  # (the chunk is held by ``records`` until it is decoded, not for the whole pass)
    cols = fast_columns(header, records)
    if cols is None:
        return None
    if unknown:
        cols["extras"]["header"] = [(1, unknown)]
    cols["header"] = header
    return cols


def _after_header(path: str, first: bytes, start: int, n_lines: int, chunks):
    """(first line number, bytes, offset of the first record, number of lines) of each chunk
    of the log's records: the first chunk past its header line, then the others whole; a log
    whose records would pass the memory budget is refused before its chunk is decoded."""
    check_columns_memory(path, 2, n_lines, FAST_RECORD_BYTES)
    yield 2, first, start, n_lines
    del first
    records = n_lines
    for line, data, n in chunks:
        records += n
        check_columns_memory(path, line, records, FAST_RECORD_BYTES)
        yield line, data, 0, n


def _validating_columns(path: str, loaded: "tuple[bytes, bool] | LogText") -> dict:
    """The columns, record by record, each checked in full and every problem reported."""
    header: dict | None = None
    runs: list[dict] = []
    steps: list[dict] = []
    cand: dict[str, list] = {k: [] for k in (
        "candidate_id", "search_id", "task_id", "parent_id", "step", "seq", "code_sha256",
        "has_code", "line", *("gen_" + g for g in _GEN_COLUMNS))}
    fc: dict[str, list] = {k: [] for k in (
        "candidate_id", "forecaster", "mode", "raw_probability_sum", "predicted_bin",
        "parse_failed", "input_tokens", "output_tokens", "latency_s", "repeat", "line")}
    probs: list[list[float]] = []
    dec: dict[str, list] = {k: [] for k in (
        "candidate_id", "policy", "action", "score", "reason", "line")}
    ev_fields = [f for f in FIELDS["evaluation"] if f not in ("imputed_by",)]
    ev: dict[str, list] = {k: [] for k in (*ev_fields, "imputed_by", "line")}
    extras: dict[str, list[tuple[int, dict]]] = {}

    search_ids: set[str] = set()
    cand_index: dict[str, int] = {}
    cand_search: list[str] = []
    search_task: dict[str, str] = {}
    evaluated: set[str] = set()
    counts: Counter = Counter()  # records by kind
    n_records = 0
    task_ids: set[str] = set()
    first_forecast_line: int | None = None
    fc_errors: list[dict] = []

    def fail(line, msg, fld=None):
        raise LogError(path, line, msg, fld)

    for line, rec in iter_records(path, loaded):
        problem = check_record(rec)
        if problem:
            fail(line, problem[1], problem[0])
        kind = rec["kind"]
        counts[kind] += 1
        n_records += 1
        if not n_records % _CHECK_EVERY:
            check_columns_memory(path, line, n_records, CHECKED_RECORD_BYTES)
        known = FIELDS[kind]
        unknown = {k: v for k, v in rec.items() if k != "kind" and k not in known}
        if unknown:
            extras.setdefault(kind, []).append((line, unknown))

        if kind == "header":
            if header is not None:
                fail(line, "a second header; a log has exactly one", "kind")
            if n_records != 1:
                fail(line, "the header must be the first record", "kind")
            problem = _header_problem(rec)
            if problem:
                fail(line, problem[1], problem[0])
            header = rec
            task_ids = {t["task_id"] for t in rec["tasks"]}
            continue
        if header is None:
            fail(line, f"the first record must be the header, got {kind!r}", "kind")

        if kind == "run":
            if rec["search_id"] in search_ids:
                fail(line, f"search {rec['search_id']!r} has a second run record", "search_id")
            search_ids.add(rec["search_id"])
            runs.append(rec)
        elif kind == "step":
            if rec["search_id"] not in search_ids:
                fail(line, f"unknown search {rec['search_id']!r} (no run record before it)",
                     "search_id")
            steps.append(rec)
        elif kind == "candidate":
            cid = rec["candidate_id"]
            if cid in cand_index:
                fail(line, f"candidate {cid!r} appears twice (first at line "
                     f"{cand['line'][cand_index[cid]]})", "candidate_id")
            if rec["task_id"] not in task_ids:
                fail(line, f"task {rec['task_id']!r} is not in the header's tasks", "task_id")
            if header["log_shape"] == "trajectory" and rec["search_id"] not in search_ids:
                fail(line, f"unknown search {rec['search_id']!r} (no run record before it)",
                     "search_id")
            if header["log_shape"] != "pairs":
                first = search_task.setdefault(rec["search_id"], rec["task_id"])
                if first != rec["task_id"]:
                    fail(line, f"search {rec['search_id']!r} is for task {first!r}; one task "
                         "per search", "task_id")
            parent = rec.get("parent_id")
            if parent is not None:
                if parent not in cand_index:
                    fail(line, f"parent {parent!r} is not an earlier candidate", "parent_id")
                if cand_search[cand_index[parent]] != rec["search_id"]:
                    fail(line, f"parent {parent!r} belongs to another search", "parent_id")
            cand_index[cid] = len(cand["candidate_id"])
            cand_search.append(rec["search_id"])
            for k in ("candidate_id", "search_id", "task_id", "step", "seq", "code_sha256"):
                cand[k].append(rec.get(k))
            cand["parent_id"].append(parent)
            cand["has_code"].append(rec.get("code") is not None)
            cand["line"].append(line)
            _flatten_candidate(rec, cand)
        else:
            cid = rec["candidate_id"]
            if cid not in cand_index:
                fail(line, f"unknown candidate {cid!r} (no candidate record before it)",
                     "candidate_id")
            if kind == "forecast" and rec.get("error"):
                # The forecaster gave no answer (server down, timeouts): the candidate stays
                # unforecast; the record is kept so that nothing disappears silently.
                fc_errors.append({"candidate_id": cid, "forecaster": rec["forecaster"],
                                  "error": str(rec["error"]), "line": line})
            elif kind == "forecast":
                first_forecast_line = first_forecast_line or line
                p = [float(x) for x in rec["probs"]]
                raw_sum = math.fsum(p)
                parse_failed = bool(rec.get("parse_failed")) or raw_sum == 0.0
                probs.append([x / raw_sum for x in p] if not parse_failed else [0.0] * 8)
                for k in ("candidate_id", "forecaster", "mode", "predicted_bin", "input_tokens",
                          "output_tokens", "latency_s"):
                    fc[k].append(rec.get(k))
                fc["raw_probability_sum"].append(
                    rec["raw_probability_sum"] if rec.get("raw_probability_sum") is not None
                    else raw_sum)
                fc["parse_failed"].append(parse_failed)
                fc["repeat"].append(rec.get("repeat") or 0)
                fc["line"].append(line)
            elif kind == "decision":
                for k in ("candidate_id", "policy", "action", "score", "reason"):
                    dec[k].append(rec.get(k))
                dec["line"].append(line)
            elif kind == "evaluation":
                if cid in evaluated:
                    fail(line, f"candidate {cid!r} has a second evaluation", "candidate_id")
                evaluated.add(cid)
                s, rt, ref = rec.get("speedup"), rec.get("runtime_ns"), rec.get("ref_runtime_ns")
                if s is not None and rt is not None and ref is not None:
                    if abs(ref / rt - s) > _SPEEDUP_RTOL * s:
                        fail(line, f"speedup {s} disagrees with ref_runtime_ns/runtime_ns = "
                             f"{ref / rt:.6g}", "speedup")
                for k in ev_fields:
                    ev[k].append(rec.get(k))
                ev["imputed_by"].append(rec.get("imputed_by"))
                ev["line"].append(line)

    if header is None:
        raise LogError(path, None, "empty log: no header record")
    if first_forecast_line is not None:
        for needed in ("forecast_bin_edges", "forecast_relative_to"):
            if header.get(needed) is None:
                raise LogError(path, 1, f"missing, but the log has forecasts (first at line "
                               f"{first_forecast_line})", needed)

    return {"header": header, "runs": runs, "steps": steps, "cand": cand, "fc": fc,
            "probs": probs, "dec": dec, "ev": ev, "extras": extras, "fc_errors": fc_errors,
            "counts": dict(counts), "first_forecast_line": first_forecast_line}


def _build(path: str, cols: dict) -> ReplayLog:
    """The tables of a log from its columns (whichever reader gathered them)."""
    header, cand, fc, dec, ev = cols["header"], cols["cand"], cols["fc"], cols["dec"], cols["ev"]
    candidates = _frame(cand)
    forecasts = _frame(fc)
    prob_arr = np.asarray(cols["probs"], dtype=float).reshape(-1, 8)
    for b, col in enumerate(PROB_COLUMNS):
        forecasts[col] = prob_arr[:, b]
    decisions = _frame(dec)
    evaluations = _frame(ev)
    for kind, rows in cols["extras"].items():
        table = {"candidate": candidates, "forecast": forecasts, "decision": decisions,
                 "evaluation": evaluations}.get(kind)
        if table is not None:
            by_line = dict(rows)
            table["extra"] = [by_line.get(ln) for ln in table["line"]]

    _derive_status(candidates, cols)
    return ReplayLog(path, header, cols["runs"], cols["steps"], candidates, forecasts,
                     decisions, evaluations, cols["counts"], forecast_errors=pd.DataFrame(
                         cols["fc_errors"], columns=["candidate_id", "forecaster", "error",
                                                     "line"]))


def _frame(columns: dict) -> pd.DataFrame:
    """``pd.DataFrame(columns)``, the fast reader's compact columns (``fastread.Column``)
    turned into Python values one at a time and into a Series at once: pandas infers from
    the same values, and the Python objects of only one column live at a time."""
    from gfsim.replay_logs.fastread import Column

    if not any(isinstance(v, Column) for v in columns.values()):
        return pd.DataFrame(columns)
    return pd.DataFrame({k: pd.Series(v.values()) if isinstance(v, Column) else v
                         for k, v in columns.items()})


def _derive_status(candidates: pd.DataFrame, cols: dict) -> None:
    """Each candidate's status, from the columns its tables were built from (set lookups on
    plain strings: pandas' ``isin`` on Arrow-backed strings costs seconds per 100,000)."""
    from gfsim.replay_logs.fastread import values

    ids = values(cols["cand"]["candidate_id"])
    status = np.full(len(ids), "not_attempted", dtype=object)
    failed = candidates["gen_failed_reason"].notna().to_numpy()
    status[failed] = "generation_failed"
    dec = cols["dec"]
    held_back = {c for c, a in zip(values(dec["candidate_id"]), values(dec["action"]))
                 if a != "measure"}
    if held_back:
        status[np.fromiter(map(held_back.__contains__, ids), bool, len(ids))] = "deferred"
    evaluated = set(values(cols["ev"]["candidate_id"]))
    if evaluated:
        status[np.fromiter(map(evaluated.__contains__, ids), bool, len(ids))] = "evaluated"
    candidates["status"] = status


def open_log(name_or_path: str | None, *, cache: bool = True):
    """``load_log`` of a shipped name or a path, through the columnar cache unless
    ``cache=False`` (``replay_logs.cache``); a shipped log keeps its name as its label."""
    from gfsim.replay_logs.shipped import DEFAULT_LOG, SHIPPED_LOGS, resolve_log

    log = load_log(resolve_log(name_or_path), cache=cache)
    name = name_or_path or DEFAULT_LOG
    if name in SHIPPED_LOGS:
        log.label = name
    return log
