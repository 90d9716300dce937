"""``gfsim forecast``: add a live forecaster's forecasts to any log whose candidates carry code.

The output log is the input's records (header first) followed by one ``forecast`` record per
forecast candidate, appended and fsynced as answers arrive. It is written to a temporary file
and renamed before any forecast is appended, so an output either holds the whole input or does
not exist. Running the same command again resumes: candidates that already have an answer from
this forecaster (same name and repeat) are skipped; ones whose last attempt got no answer at
all (``error``) are asked again; a parse failure is an answer and is kept. The header records
the forecaster (``forecasters``) and the log it came from (``derived_from``).

A forecast compares a candidate with its task's *reference* kernel (``reference_code`` in the
header's task entry), so the output's ``forecast_relative_to`` is ``reference`` and its bins are
the paper's (the prompt's); a log whose own forecasts use another frame or other edges cannot
hold both, and ``drop_existing`` leaves them out.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from gfsim.core.durable import replace
from gfsim.core.errors import GfsimError
from gfsim.core.inputs import check_output
from gfsim.forecasts.bins import PAPER_EDGES

__all__ = ["forecast_log", "requests_from_log"]

_FLUSH_EVERY = 16  # forecasts per appended batch (one gzip member each)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def requests_from_log(path) -> tuple[dict, list, list[str]]:
    """(header, ForecastRequests for candidates with code, ids of candidates without code)."""
    from gfsim.live.llm.forecaster import ForecastRequest
    from gfsim.replay_logs.io import iter_records

    header = None
    requests, no_code = [], []
    for line, rec in iter_records(path):
        if rec.get("kind") == "header":
            header = rec
            tasks = {t.get("task_id"): t for t in header.get("tasks") or []}
        elif rec.get("kind") == "candidate":
            code = rec.get("code")
            if not isinstance(code, str) or not code.strip():
                no_code.append(rec["candidate_id"])
                continue
            task = tasks.get(rec.get("task_id")) or {}
            ref = rec.get("anchor_code") or task.get("reference_code")  # a pair's own anchor
            if not isinstance(ref, str) or not ref.strip():
                i = list(tasks).index(rec.get("task_id")) if rec.get("task_id") in tasks else "?"
                raise GfsimError(f"{path}:1: field 'tasks[{i}].reference_code': missing for task "
                                 f"{rec.get('task_id')!r} (line {line} needs it): a forecaster "
                                 "compares each candidate with its task's reference kernel")
            requests.append(ForecastRequest(
                candidate_id=rec["candidate_id"], candidate_code=code, reference_code=ref,
                task=f"{rec.get('task_id')}: {task.get('description') or ''}".strip(": "),
                hardware=header.get("hardware") or {}))
    return header, requests, no_code


def _output_header(header: dict, log, src: Path, forecaster, drop_existing: bool) -> dict:
    has_forecasts = len(log.forecasts) > 0 and not drop_existing
    if has_forecasts:
        frame = header.get("forecast_relative_to")
        edges = tuple(header.get("forecast_bin_edges") or ())
        if frame != "reference" or edges != PAPER_EDGES:
            raise GfsimError(
                f"{src}: its forecasts are relative to {frame!r} with bin edges {list(edges)}; "
                "a live forecaster's are relative to the reference with the paper's edges, and "
                "one log cannot hold both: pass `drop_existing` to leave its forecasts out")
    out = dict(header)
    out["forecast_relative_to"] = "reference"
    out["forecast_bin_edges"] = list(PAPER_EDGES)
    out["forecasters"] = [*(header.get("forecasters") or []), forecaster.describe()]
    out["derived_from"] = {"log_id": header.get("log_id"), "path": str(src),
                           "sha256": _sha256(src),
                           "dropped_forecasts": bool(drop_existing and len(log.forecasts))}
    return out


def _write_copy(src: Path, out: Path, header: dict, drop_existing: bool) -> None:
    from gfsim.replay_logs import LogWriter
    from gfsim.replay_logs.io import iter_records

    # (keeps .gz: LogWriter compresses by suffix)
    tmp = out.with_name(out.stem + ".partial" + out.suffix)
    if tmp.exists():
        tmp.unlink()
    batch = [header]
    with LogWriter(tmp) as w:
        for _, rec in iter_records(src):
            kind = rec.get("kind")
            if kind == "header" or (drop_existing and kind == "forecast"):
                continue
            batch.append(rec)
            if len(batch) >= 5000:
                w.append_many(batch)
                batch = []
        w.append_many(batch)
    replace(tmp, out)  # and the directory fsynced


def forecast_log(src, forecaster, out, *, repeat: int = 0, drop_existing: bool = False,
                 limit: int | None = None, progress=None) -> dict:
    """Forecast every candidate of ``src`` that has code and no answer yet in ``out``; returns a
    summary. ``progress(total, done_now)`` is called once with the total (done_now = None),
    then after each forecast."""
    from gfsim.forecasts.whatif import WhatIfForecaster
    from gfsim.replay_logs import LogWriter, load_log, resolve_log

    src = resolve_log(str(src))
    out = Path(out)
    check_output(out, [src])  # (logs are append-only copies: never one over its input)
    log = load_log(src)
    if isinstance(forecaster, WhatIfForecaster):
        return _whatif(src, log, forecaster, out, repeat, drop_existing)
    from gfsim.forecasts.learned import LearnedForecaster

    if isinstance(forecaster, LearnedForecaster):
        return _costmodel(src, log, forecaster, out, drop_existing)
    header, requests, no_code = requests_from_log(src)
    if not requests:
        raise GfsimError(f"{src}: no candidate carries code, so there is nothing to show a "
                         "forecaster (the synthetic logs have none; h200-suite-v0 does)")
    resumed = out.exists()
    if resumed:
        prev = load_log(out)
        origin = (prev.header.get("derived_from") or {}).get("log_id")
        if origin != header.get("log_id"):
            raise GfsimError(f"{out}: exists and was derived from log {origin!r}, not "
                             f"{header.get('log_id')!r}; choose another `out`")
        fc = prev.forecasts
        done = set(fc.loc[(fc["forecaster"] == forecaster.name) & (fc["repeat"] == repeat),
                          "candidate_id"]) if len(fc) else set()
    else:
        _write_copy(src, out, _output_header(header, log, src, forecaster, drop_existing),
                    drop_existing)
        done = set()
    pending = [r for r in requests if r.candidate_id not in done]
    if limit is not None:
        pending = pending[:limit]
    counts = {"answered": 0, "parse_failed": 0, "error": 0}
    tokens = {"input": 0, "output": 0}
    latency = []
    buffer: list[dict] = []
    started = time.perf_counter()
    if progress is not None:
        progress(len(pending), None)
    with LogWriter(out) as writer:
        def on_result(f):
            f.repeat = repeat
            buffer.append(f.record())
            key = "error" if f.error else "parse_failed" if f.parse_failed else "answered"
            counts[key] += 1
            tokens["input"] += f.input_tokens
            tokens["output"] += f.output_tokens
            if not f.error:
                latency.append(f.latency_s)
            if len(buffer) >= _FLUSH_EVERY:
                writer.append_many(buffer)
                buffer.clear()
            if progress is not None:
                progress(len(pending), 1)

        try:
            forecaster.forecast_many(pending, on_result=on_result)
        finally:
            writer.append_many(buffer)
            forecaster.close()
    return {
        "log": str(src), "out": str(out), "forecaster": forecaster.describe(),
        "repeat": repeat, "resumed": resumed, "candidates_with_code": len(requests),
        "without_code": len(no_code), "already_forecast": len(done),
        "forecast_now": len(pending), **counts, "input_tokens": tokens["input"],
        "output_tokens": tokens["output"],
        "mean_latency_s": sum(latency) / len(latency) if latency else None,
        "seconds": time.perf_counter() - started,
        "note": "candidates with error got no answer (server down or timed out after retries): "
                "they stay unforecast, policies measure them, and a rerun asks again",
    }


def _already(out: Path, header: dict, name: str, repeat: int | None) -> set:
    """The candidates an existing output (derived from the same log) already has forecasts of
    by ``name`` (at ``repeat``, unless None)."""
    from gfsim.replay_logs import load_log

    prev = load_log(out)
    if (prev.header.get("derived_from") or {}).get("log_id") != header.get("log_id"):
        raise GfsimError(f"{out}: exists and was derived from another log; choose another "
                         "`out`")
    fc = prev.forecasts
    if not len(fc):
        return set()
    mask = fc["forecaster"] == name
    if repeat is not None:
        mask &= fc["repeat"] == repeat
    return set(fc.loc[mask, "candidate_id"])


def _derived_header(src: Path, log, header: dict, entry: dict, drop_existing: bool) -> dict:
    """The header of a copy of ``src`` that adds a forecaster's records in the paper's bins."""
    out_header = dict(header)
    if not (len(log.forecasts) and not drop_existing):
        out_header.setdefault("forecast_relative_to", "reference")
        out_header["forecast_bin_edges"] = list(PAPER_EDGES)
    elif tuple(header.get("forecast_bin_edges") or ()) != PAPER_EDGES:
        raise GfsimError(f"{src}: its forecasts use other bin edges than the paper's: pass "
                         "`drop_existing`")
    out_header["forecasters"] = [*(header.get("forecasters") or []), entry]
    out_header["derived_from"] = {"log_id": header.get("log_id"), "path": str(src),
                                  "sha256": _sha256(src)}
    return out_header


def _costmodel(src: Path, log, spec, out: Path, drop_existing: bool) -> dict:
    """Cost-model forecasts need no server: trees trained prequentially on the log's own
    measurements (``gfsim.forecasts.learned``); every candidate with features gets one. A
    rerun rewrites nothing: the forecasts of an existing output are kept."""
    from dataclasses import asdict

    from gfsim.forecasts.learned import prequential_records
    from gfsim.replay_logs import LogWriter
    from gfsim.replay_logs.io import iter_records

    header = next(rec for _, rec in iter_records(src) if rec.get("kind") == "header")
    t0 = time.perf_counter()
    recs, summary = prequential_records(log, spec)
    resumed = out.exists()
    if resumed:
        done = _already(out, header, spec.name, None)
    else:
        entry = {"name": spec.name, "mode": "costmodel", "params": asdict(spec),
                 "note": "a learned cost model (gradient-boosted trees over a candidate's "
                         "parameters and compile features), trained prequentially on the "
                         "log's own measurements: each step forecast from earlier steps only"}
        _write_copy(src, out, _derived_header(src, log, header, entry, drop_existing),
                    drop_existing)
        done = set()
    recs = [r for r in recs if r["candidate_id"] not in done]
    with LogWriter(out) as w:
        w.append_many(recs)
    return {"log": str(src), "out": str(out),
            "forecaster": {"name": spec.name, "mode": "costmodel", **asdict(spec)},
            "repeat": 0, "resumed": resumed, "candidates_with_code": 0, "without_code": 0,
            "already_forecast": len(done), "forecast_now": len(recs),
            "answered": len(recs), "parse_failed": 0, "error": 0, "input_tokens": 0,
            "output_tokens": 0, "mean_latency_s": None,
            "seconds": round(time.perf_counter() - t0, 3), "costmodel": summary,
            "note": "cost-model forecasts: prequential, from the candidates' source_meta "
                    "(variant, parameters, compile features)"}


def _whatif(src: Path, log, forecaster, out: Path, repeat: int, drop_existing: bool) -> dict:
    """What-if forecasts need no code and no server: they are drawn from each candidate's
    measured speedup (``gfsim.forecasts.whatif``), so every candidate with one gets a forecast."""
    from gfsim.forecasts.whatif import whatif_records
    from gfsim.replay_logs import LogWriter
    from gfsim.replay_logs.io import iter_records

    header = next(rec for _, rec in iter_records(src) if rec.get("kind") == "header")
    resumed = out.exists()
    if resumed:
        done = _already(out, header, forecaster.name, repeat)
    else:
        entry = {"name": forecaster.name, "mode": "whatif", "params": forecaster.params(),
                 "note": "a what-if forecaster: synthetic forecasts drawn from the log's own "
                         "measured speedups"}
        _write_copy(src, out, _derived_header(src, log, header, entry, drop_existing),
                    drop_existing)
        done = set()
    recs = [r for r in whatif_records(log, forecaster, repeat + 1) if r["repeat"] == repeat
            and r["candidate_id"] not in done]
    with LogWriter(out) as w:
        w.append_many(recs)
    return {"log": str(src), "out": str(out), "forecaster": {"name": forecaster.name,
                                                             "mode": "whatif",
                                                             **forecaster.params()},
            "repeat": repeat, "resumed": resumed, "candidates_with_code": 0,
            "without_code": 0, "already_forecast": len(done), "forecast_now": len(recs),
            "answered": sum(not r["parse_failed"] for r in recs),
            "parse_failed": sum(r["parse_failed"] for r in recs), "error": 0,
            "input_tokens": 0, "output_tokens": 0, "mean_latency_s": None, "seconds": 0.0,
            "note": "what-if forecasts: drawn from measured speedups, for candidates that have "
                    "one; tokens and latency come from the cost model's priors in a replay"}
