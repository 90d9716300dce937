"""A ShinkaEvolve run as a gfsim trajectory log (``gfsim import shinka RUN_DIR -o LOG``): a thin
adapter over the bring-your-own-search format (``gfsim.importers.search``).

Supported: the run folders ShinkaEvolve 0.0.x writes (``SUPPORTED``; tested with 0.0.7). A run
does not record the version that wrote it, so the database is checked table by table and column
by column, and ``shinka_version`` (``--shinka-version``), when given, must be in the range; any
other version is refused in one line.

What is read from ``RUN_DIR``:

- the run's SQLite database: ``programs.sqlite`` (every released version), else
  ``evolution_db.sqlite`` (the old runner's configured name), else a file named ``None`` (an
  old default), or the one ``db`` (``--db``) names. It is read from a private copy of the
  database and its ``-wal`` file, so a run that is still writing (WAL mode) is never touched;
  what its writer had committed is imported.
- table ``programs``: one row per evaluated program (``id``, ``parent_id``, ``generation``,
  ``timestamp``, ``correct``, ``combined_score``, ``metadata``; ``public_metrics``,
  ``private_metrics``, ``island_idx``, ``code``, ``text_feedback`` where the version has them).
- table ``attempt_log`` (0.0.5 on; optional): proposals that failed before evaluation (the
  LLM call, the patch, the novelty check or the submission), which have no program row.

Mapping (one candidate per program, in the order ``generation``, ``timestamp``, id, with the
failed proposals at their generation):

- island copies (``metadata._is_island_copy``, ``_spawned_island``: a program copied to
  another island, not evaluated again) are not candidates; a child of a copy is linked to the
  original (``_original_program_id``, ``_spawned_from_program_id``).
- a program whose metrics say ``gfsim_skipped`` (gfsim's surrogate chose not to evaluate it):
  ``not_measured``.
- ``correct`` true and the metric (``metric``, default ``combined_score``; ``public.NAME`` or
  ``private.NAME`` for a key of those metrics) a finite number > 0: a success whose speedup is
  value / reference (``lower_is_better``: reference / value, for a runtime), the reference
  being ``reference`` or the seed program's value (the first root); ``correct`` true without
  one: ``incorrect`` (it ran and gave no usable value).
- ``correct`` false: ``incorrect`` (ShinkaEvolve does not tell compile errors from wrong
  answers), or the schema outcome its metrics name under ``outcome``; the error text is its
  ``text_feedback`` or the end of its ``metadata.stderr_log``.
- an ``attempt_log`` row: ``generation_failed``, with its stage and reason as the error, its
  parent from ``details.parent_id``.
- seconds: ``evaluation_s`` from ``metadata.evaluation_seconds`` (``compute_time`` in older
  runs), ``generation_s`` from ``metadata.sampling_seconds`` (which in the async runner also
  holds the wait for an evaluation slot; ``shinka.queue_wait_s`` keeps the wait after
  evaluation), else its ``sampling_started_at``/``sampling_finished_at`` (what a failed
  proposal's ``attempt_log`` details record: its LLM call's seconds); tokens from
  ``metadata.llm_result`` (thinking tokens count as output tokens, the split is kept).
  ShinkaEvolve does not split an evaluation's seconds into stages; replays split them
  (``simulator.log_seconds``).
- kept on each candidate under ``shinka``: generation, island, timestamp, correct,
  combined_score, the metrics, the model, patch type and name, the API dollars (LLM, embedding,
  novelty) and the pipeline seconds; the table and row it came from.
- the header's ``generator``: the models that wrote the programs, the API dollars the run's
  own accounting charged, and the prices of the run's ``pricing_snapshot.json``, where it has
  one (``gfsim.importers.shinka_prices``).

A problem (a missing table or column, a row whose JSON does not parse, a parent no row holds,
a file that is not a SQLite database, an unsupported version) is one line naming the file,
table, row and field, and nothing is written unless the whole import validates.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import tempfile
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.importers.evolution_settings import recorded_selection as _selection
from gfsim.importers.evolution_settings import shinka_selection
from gfsim.importers.common import (BadField, check_version, is_number, json_loads,
                                    read_surrogate_log, source_name)
from gfsim.importers.shinka_prices import run_prices
from gfsim.replay_logs.io import read_input

__all__ = ["import_shinka", "read_run", "SUPPORTED", "TESTED", "DB_NAMES"]

SUPPORTED = ((0, 0), (0, 1))  # [0.0, 0.1)
TESTED = "0.0.7"
DB_NAMES = ("programs.sqlite", "evolution_db.sqlite", "None")
_REQUIRED = ("id", "parent_id", "generation", "timestamp", "correct", "combined_score",
             "metadata")
_OPTIONAL = ("public_metrics", "private_metrics", "island_idx", "code", "text_feedback",
             "language")
_ATTEMPT_COLUMNS = ("id", "generation", "stage", "status", "details", "created_at")
_OUTCOMES = ("compile_failed", "runtime_error", "incorrect", "timeout", "infrastructure_failure")


def find_database(run: Path, db: str | None = None) -> Path:
    """The run's database file: ``db`` (a name inside the run folder, or a path), else the
    first of ``DB_NAMES`` that exists."""
    if not run.is_dir():
        raise GfsimError(f"{run}: no such folder")
    if db is not None:
        path = Path(db) if Path(db).is_absolute() else run / db
        if not path.is_file():
            raise GfsimError(f"{path}: `db`: no such file")
        return path
    for name in DB_NAMES:
        if (run / name).is_file():
            return run / name
    raise GfsimError(f"{run}: no ShinkaEvolve database ({', '.join(DB_NAMES)}); name it with "
                     "`db` (is it a ShinkaEvolve results folder?)")


def _snapshot(path: Path, root: Path | None, tmp: Path) -> tuple[sqlite3.Connection, str]:
    """A connection to a private copy of the database (and its write-ahead log, where one is
    beside it), and the SHA-256 of what was copied: the run's own files are only read, within
    the input limits, and (``root``) only inside the run folder."""
    data = read_input(path, root=root)
    if not data.startswith(b"SQLite format 3\x00"):
        raise BadField(path, None, "not a SQLite database (is it a ShinkaEvolve results folder?)")
    digest = hashlib.sha256(data)
    copy = tmp / "programs.sqlite"
    copy.write_bytes(data)
    wal = path.with_name(path.name + "-wal")
    if wal.is_file():
        wal_data = read_input(wal, root=root)
        digest.update(wal_data)
        (tmp / "programs.sqlite-wal").write_bytes(wal_data)
    del data
    try:
        con = sqlite3.connect(str(copy))
        con.execute("PRAGMA query_only = 1")
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise BadField(path, None, f"cannot be read as a SQLite database ({exc})") from None
    return con, digest.hexdigest()


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f"PRAGMA table_info({table})")]


def _json(where: str, field: str, text) -> dict:
    """A JSON object column (``None`` or empty: ``{}``)."""
    if text is None or text == "":
        return {}
    if not isinstance(text, (str, bytes)):
        raise BadField(where, field, f"expected JSON text, got {type(text).__name__}")
    try:
        value = json_loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadField(where, field, f"not valid JSON ({str(exc)[:120]})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadField(where, field, "expected a JSON object")
    return value


def read_run(run_dir, db: str | None = None) -> dict:
    """The programs and failed proposals of a run, checked: ``{"programs": [...],
    "attempts": [...], "database": Path, "sha256": str, "tables": [...], "columns": [...]}``.
    Each program is a dict of its columns with its JSON columns parsed and ``where`` (the
    file, table and row to name in a problem)."""
    run = Path(run_dir)
    path = find_database(run, db)
    root = None if db is not None and Path(db).is_absolute() else run
    with tempfile.TemporaryDirectory(prefix="gfsim-shinka-") as tmp:
        con, sha = _snapshot(path, root, Path(tmp))
        try:
            return _read_tables(con, path, sha)
        except sqlite3.DatabaseError as exc:
            raise BadField(path, None, f"cannot be read ({exc})") from None
        finally:
            con.close()


def _read_tables(con: sqlite3.Connection, path: Path, sha: str) -> dict:
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    if "programs" not in tables:
        raise BadField(path, None, f"no table 'programs' (tables: {', '.join(tables) or 'none'}; "
                               "is it a ShinkaEvolve database?)")
    cols = _columns(con, "programs")
    for c in _REQUIRED:
        if c not in cols:
            raise BadField(f"{path}: table programs", None,
                       f"no column {c!r} (not a ShinkaEvolve 0.0.x programs table)")
    wanted = [c for c in (*_REQUIRED, *_OPTIONAL) if c in cols]
    programs = []
    for row in con.execute(f"SELECT {', '.join(wanted)} FROM programs ORDER BY rowid"):
        rec = dict(zip(wanted, row))
        pid = rec["id"]
        if not isinstance(pid, str) or not pid:
            raise BadField(f"{path}: table programs, row {len(programs) + 1}", "id",
                       "missing or not text")
        where = f"{path}: table programs, id {pid[:80]!r}"
        if rec["parent_id"] is not None and not (isinstance(rec["parent_id"], str)
                                                 and rec["parent_id"]):
            raise BadField(where, "parent_id", "expected text or NULL")
        if not isinstance(rec["generation"], int) or rec["generation"] < 0:
            raise BadField(where, "generation", "expected a whole number >= 0")
        if not is_number(rec["timestamp"]):
            raise BadField(where, "timestamp", "expected a finite number")
        if rec["correct"] not in (0, 1, True, False):
            raise BadField(where, "correct", f"expected 0 or 1, got {str(rec['correct'])[:40]!r}")
        if rec["combined_score"] is not None and not isinstance(rec["combined_score"],
                                                                (int, float)):
            raise BadField(where, "combined_score", "expected a number or NULL")
        for field in ("metadata", "public_metrics", "private_metrics"):
            rec[field] = _json(where, field, rec.get(field))
        if rec.get("island_idx") is not None and not isinstance(rec["island_idx"], int):
            raise BadField(where, "island_idx", "expected a whole number or NULL")
        if rec.get("code") is not None and not isinstance(rec["code"], str):
            raise BadField(where, "code", "expected text")
        rec["where"] = where
        programs.append(rec)
    if not programs:
        raise BadField(f"{path}: table programs", None, "no programs (a run that has not "
                                                     "evaluated its seed yet?)")
    attempts = []
    if "attempt_log" in tables:
        acols = _columns(con, "attempt_log")
        for c in _ATTEMPT_COLUMNS:
            if c not in acols:
                raise BadField(f"{path}: table attempt_log", None, f"no column {c!r}")
        for row in con.execute(f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM attempt_log "
                               "ORDER BY id"):
            rec = dict(zip(_ATTEMPT_COLUMNS, row))
            where = f"{path}: table attempt_log, id {rec['id']}"
            if not isinstance(rec["generation"], int) or rec["generation"] < 0:
                raise BadField(where, "generation", "expected a whole number >= 0")
            if not is_number(rec["created_at"]):
                raise BadField(where, "created_at", "expected a finite number")
            rec["details"] = _json(where, "details", rec["details"])
            rec["where"] = where
            attempts.append(rec)
    return {"programs": programs, "attempts": attempts, "database": path, "sha256": sha,
            "tables": tables, "columns": cols}


def _metric(rec: dict, metric: str):
    """The metric's value for a program: ``combined_score``, or ``public.NAME`` /
    ``private.NAME``."""
    if metric == "combined_score":
        return rec["combined_score"]
    scope, _, name = metric.partition(".")
    return rec[f"{scope}_metrics"].get(name)


def _skipped(rec: dict) -> bool:
    return any(rec[f"{s}_metrics"].get("gfsim_skipped") is True for s in ("public", "private"))


def _error_text(rec: dict) -> str | None:
    fb = rec.get("text_feedback")
    if isinstance(fb, str) and fb.strip():
        return fb.strip()[-4000:]
    err = rec["metadata"].get("stderr_log")
    if isinstance(err, str) and err.strip():
        return err.strip()[-4000:]
    return None


def _outcome(rec: dict, metric: str) -> tuple[str, float | None, str | None]:
    """What a program row says happened: ``(outcome, the metric's value for a success, error
    text)``, by the rules of the module doc."""
    if _skipped(rec):
        return "not_measured", None, None
    if not rec["correct"]:
        stated = rec["public_metrics"].get("outcome") or rec["private_metrics"].get("outcome")
        return (stated if stated in _OUTCOMES else "incorrect"), None, (
            _error_text(rec) or "ShinkaEvolve marked it incorrect (correct = 0)")
    v = _metric(rec, metric)
    if is_number(v) and v > 0:
        return "success", float(v), None
    return "incorrect", None, (f"correct, but no {metric} > 0 (got {str(v)[:60]})"
                               if v is not None else f"correct, but no {metric}")


def _seconds(meta: dict, *keys: str) -> float | None:
    for k in keys:
        v = meta.get(k)
        if is_number(v) and v >= 0:
            return float(v)
    return None


def _sampling_s(meta: dict) -> float | None:
    """Seconds of the LLM sampling: ``sampling_seconds``, else its two timestamps
    (``sampling_finished_at`` - ``sampling_started_at``: all a failed proposal's
    ``attempt_log`` details record)."""
    got = _seconds(meta, "sampling_seconds")
    start, end = meta.get("sampling_started_at"), meta.get("sampling_finished_at")
    if got is None and is_number(start) and is_number(end) and end >= start:
        got = float(end - start)
    return got


def _usd(meta: dict) -> dict:
    out = {}
    for k in ("api_costs", "embed_cost", "novelty_cost"):
        v = meta.get(k)
        if is_number(v) and v >= 0:
            out[k] = float(v)
    return out


def import_shinka(run_dir, out, *, metric: str = "combined_score",
                  lower_is_better: bool = False, reference: float | None = None,
                  db: str | None = None, shinka_version: str | None = None,
                  task: str = "task", device: str = "unknown", provenance: str = "measured",
                  log_id: str | None = None, surrogate_log=None) -> dict:
    """Write a trajectory log for a ShinkaEvolve run folder; returns a summary (see the module
    doc for the mapping). ``metric`` is ``combined_score`` or ``public.NAME`` /
    ``private.NAME``; ``lower_is_better`` when it is a runtime; ``reference`` is in its
    unit. ``surrogate_log``: the log ``gfsim.integrations.shinka``'s gate wrote during the
    run; each program gets the gate's forecast of the same code (the k-th program with a code,
    in evaluation order, the k-th gate candidate with it) and the header's ``selection`` names
    the gate's policy."""
    from gfsim.core.inputs import check_output
    from gfsim.importers.search import import_records

    run, out = Path(run_dir), Path(out)
    check_output(out, [*(run / name for name in DB_NAMES), Path(db) if db is not None
                       else None, run, surrogate_log])
    version = check_version(shinka_version, "`shinka_version`", "ShinkaEvolve", SUPPORTED,
                            TESTED)
    if reference is not None and not (is_number(reference) and reference > 0):
        raise GfsimError("`reference`: expected a number > 0")
    if metric != "combined_score" and not re.fullmatch(r"(public|private)\.\S+", metric):
        raise GfsimError(f"`metric`: {metric!r}: expected combined_score, public.NAME or "
                         "private.NAME")
    surrogate = read_surrogate_log(Path(surrogate_log)) if surrogate_log is not None else None
    matched = 0
    got = read_run(run, db)
    programs, attempts, path = got["programs"], got["attempts"], got["database"]
    if metric != "combined_score" and not any(
            metric.partition(".")[2] in p[f"{metric.partition('.')[0]}_metrics"]
            for p in programs):
        names = sorted({f"{s}.{k}" for p in programs for s in ("public", "private")
                        for k, v in p[f"{s}_metrics"].items() if is_number(v)})
        raise GfsimError(f"{path}: `metric` {metric!r}: no program has it (numeric metrics: "
                         f"{', '.join(names)[:300] or 'none'})")
    # island copies: not candidates; links through them go to the original
    original = {}
    for p in programs:
        meta = p["metadata"]
        src = meta.get("_original_program_id") if meta.get("_is_island_copy") is True else \
            meta.get("_spawned_from_program_id") if meta.get("_spawned_island") is not None \
            else None
        if isinstance(src, str) and src and src != p["id"]:
            original[p["id"]] = src

    def resolve(pid):
        seen = set()
        while pid in original and pid not in seen:
            seen.add(pid)
            pid = original[pid]
        return pid

    rows = []
    for p in programs:
        if p["id"] in original:
            continue
        parent = resolve(p["parent_id"]) if p["parent_id"] else None
        rows.append(((p["generation"], 0, float(p["timestamp"]), p["id"]), p, parent))
    for a in attempts:
        d = a["details"]
        parent = d.get("parent_id")
        if parent is not None and not (isinstance(parent, str) and parent):
            raise BadField(a["where"], "details.parent_id", "expected text or null")
        rows.append(((a["generation"], 1, float(a["created_at"]), f"attempt-{a['id']}"), a,
                     resolve(parent) if parent else None))
    rows.sort(key=lambda r: r[0])
    known = {r[0][3] for r in rows}
    for key, rec, parent in rows:
        if parent is not None and parent not in known:
            raise BadField(rec["where"], "parent_id" if key[1] == 0 else "details.parent_id",
                       f"{parent[:80]!r} is held by no program row (a missing parent)")
    ref = reference
    seed = None
    if ref is None:
        seed = next((rec for key, rec, parent in rows if key[1] == 0 and parent is None), None)
        if seed is None:
            raise GfsimError(f"{path}: no seed program (a row with no parent); give "
                             "`reference`")
        outcome, value, _ = _outcome(seed, metric)
        if outcome != "success":
            raise BadField(seed["where"], metric, "the seed program has no value > 0 to measure "
                                              "speedups against; give `reference`")
        ref = value
    records = []
    counts: dict[str, int] = {}
    for order, (key, rec, parent) in enumerate(rows):
        cid = key[3]
        out_rec = {"id": cid, "parent": parent, "order": order, "task": task,
                   "search": log_id or source_name(run) or "shinka"}
        if key[1] == 1:  # a failed proposal
            d = rec["details"]
            reason = " ".join(str(x) for x in (rec["stage"], d.get("failure_class"),
                                               d.get("failure_reason") or d.get("reason"))
                              if x) or "failed before evaluation"
            out_rec.update(outcome="generation_failed", error=reason[:4000], shinka={
                "generation": rec["generation"], "stage": rec["stage"],
                "status": rec["status"], "created_at": rec["created_at"],
                "model": d.get("model_name"), "patch_type": d.get("patch_type"),
                "usd": _usd(d), "table": "attempt_log", "row": rec["id"]})
            gen = _sampling_s(d)  # the LLM call the proposal spent before it failed
            if gen is not None:
                out_rec["generation_s"] = gen
        else:
            outcome, value, error = _outcome(rec, metric)
            out_rec.update(outcome=outcome, code=rec.get("code") or None, error=error)
            if surrogate is not None and rec.get("code"):
                queue = surrogate["by_code"].get(
                    hashlib.sha256(rec["code"].encode()).hexdigest())
                if queue:
                    forecast = surrogate["forecasts"].get(queue.pop(0))
                    if forecast is not None:
                        out_rec["forecast"] = forecast
                    matched += 1
            if outcome == "success":
                out_rec["speedup"] = ref / value if lower_is_better else value / ref
            meta = rec["metadata"]
            ev = _seconds(meta, "evaluation_seconds", "compute_time")
            if ev is not None:
                out_rec["evaluation_s"] = ev
            gen = _sampling_s(meta)
            if gen is not None:
                out_rec["generation_s"] = gen
            llm = meta.get("llm_result") if isinstance(meta.get("llm_result"), dict) else {}
            tokens = {k: llm.get(k) for k in ("input_tokens", "output_tokens",
                                              "thinking_tokens")
                      if isinstance(llm.get(k), int) and not isinstance(llm.get(k), bool)
                      and 0 <= llm[k] < 2**53}
            if "input_tokens" in tokens:
                out_rec["input_tokens"] = tokens["input_tokens"]
            if "output_tokens" in tokens:
                out_rec["output_tokens"] = tokens["output_tokens"] + tokens.get(
                    "thinking_tokens", 0)
            out_rec["shinka"] = {
                "generation": rec["generation"], "island": rec.get("island_idx"),
                "timestamp": rec["timestamp"], "correct": bool(rec["correct"]),
                "combined_score": rec["combined_score"],
                "public_metrics": rec["public_metrics"],
                "private_metrics": rec["private_metrics"],
                "model": meta.get("model_name") or llm.get("model_name"),
                "patch_type": meta.get("patch_type"), "patch_name": meta.get("patch_name"),
                "usd": _usd(meta), "tokens": tokens or None,
                "queue_wait_s": _seconds(meta, "post_eval_queue_wait_seconds"),
                "pipeline_s": _seconds(meta, "pipeline_seconds"),
                "table": "programs", "row": rec["id"]}
        counts[out_rec["outcome"]] = counts.get(out_rec["outcome"], 0) + 1
        records.append((rec["where"], out_rec))
    if surrogate is not None and not matched:
        raise GfsimError(f"{surrogate_log}: `surrogate_log`: no candidate's code_sha256 is the "
                         f"code of a program in {path} (a gate log of another run?)")
    islands = sorted({p.get("island_idx") for p in programs if p.get("island_idx") is not None})
    usd = sum(sum(r["shinka"]["usd"].values()) for _, r in records)
    prov = {"kind": provenance,
            "note": f"imported by gfsim import shinka from the ShinkaEvolve run {source_name(run)}",
            "source": source_name(run), "database": path.name,
            "database_sha256": got["sha256"],
            "shinka": {"version": version or "not stated (the run does not record it)",
                       "format": "ShinkaEvolve 0.0.x programs database",
                       "tables": got["tables"]},
            "metric": metric, "lower_is_better": bool(lower_is_better),
            "reference": ({"given": reference} if reference is not None
                          else {"seed_program_value": ref, "seed_program": seed["id"]})}
    summary = import_records(
        records, out, source=path, provenance=prov, device=device,
        log_id=log_id or source_name(run),
        header_fields={"generator": {"model": "ShinkaEvolve's LLM ensemble (see each "
                                              "candidate's shinka.model)",
                                     **run_prices(run, records)},
                       **({"selection": surrogate["selection"]}
                          if surrogate is not None and surrogate["selection"] else {})},
        run_configuration={"shinka": {
            "islands": len(islands), "database": path.name,
            "evaluation": "one program at a time (no parent batches)",
            **_selection(shinka_selection(run, len(islands)))}},
        driver="shinka",
        task_fields={task: {"reference_code": seed["code"]}}
        if seed is not None and seed.get("code") else None)
    summary.update(source=str(run), database=path.name, programs=len(programs),
                   island_copies=len(original), failed_proposals=len(attempts),
                   metric=metric, reference=ref, outcomes=counts,
                   api_usd=round(usd, 6))
    if surrogate is not None:
        summary.update(surrogate_matched=matched, surrogate_candidates=surrogate["candidates"])
    return summary
