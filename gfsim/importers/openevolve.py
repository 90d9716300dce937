"""An OpenEvolve run as a gfsim trajectory log (``gfsim import openevolve RUN_DIR -o LOG``): a
thin adapter over the bring-your-own-search format (``gfsim.importers.search``).

Supported: the program databases OpenEvolve 0.4.x writes (``SUPPORTED``; tested with 0.4.1,
whose format 0.4.0 shares). A run folder does not record the version that wrote it, so the
format is checked field by field, and ``openevolve_version`` (``--openevolve-version``), when
given, must be in the range; any other version is refused in one line.

What is read from ``RUN_DIR`` (OpenEvolve's output folder):

- ``checkpoints/checkpoint_N/programs/*.json``: one program per file (``id``, ``code``,
  ``parent_id``, ``generation``, ``timestamp``, ``iteration_found``, ``metrics``,
  ``metadata``, ``artifacts_json``). The candidates are the union of every checkpoint's programs
  by id; where two checkpoints hold the same program, the later checkpoint's copy is kept.
  ``checkpoint_N/metadata.json`` gives the islands (the last checkpoint's go on the run record).
- ``logs/*.log``: ``Iteration I: Program ID (parent: P) completed in Ss`` (the iteration's
  seconds: the LLM call and the evaluation) and ``Evaluated program ID in Es`` (the
  evaluation's seconds). A program the log names but no checkpoint holds (the database dropped
  it between checkpoints) is a candidate with outcome ``not_attempted``: its parent and
  iteration come from the log, nothing else is invented.

Mapping (each program one candidate, in the order ``iteration_found``, ``timestamp``, id; the
log's order for the log-only ones):

- migrant copies (``metadata.migrant``: the same program copied to another island, never
  evaluated again) are not candidates; a child of a copy is linked to the original.
- ``metrics.gfsim_skipped`` true (gfsim's surrogate in front of the evaluator,
  ``gfsim.integrations.openevolve``, chose not to evaluate it): ``not_measured`` (deferred).
- ``metrics.timeout`` true: ``timeout``. A metric ``error`` (OpenEvolve's and most evaluators'
  failure mark): a failure, ``runtime_error`` unless ``metrics.outcome`` names a schema outcome
  (``compile_failed``, ``incorrect``, ...); its text is the error when it is one, else the
  artifacts' ``stderr``/``error_message``.
- otherwise the metric ``runtime_metric``: a finite number > 0 is a success whose speedup is
  reference / runtime (or, with ``higher_is_better``, score / reference score), the reference
  being ``reference_runtime`` or the seed program's value of that metric; a program without one
  is ``incorrect`` (it ran and gave no time).
- seconds: ``evaluation_s`` from the evaluation line, ``generation_s`` = iteration seconds minus
  evaluation seconds; tokens from ``metadata.token_usage``. OpenEvolve does not split an
  evaluation's seconds into stages; replays split them (``simulator.log_seconds``).
- kept on each candidate under ``openevolve``: island, generation, iteration, timestamp,
  metrics, the model that wrote it, and the program file it came from. The seed program's code
  is the task's ``reference_code`` when it is the reference (what ``gfsim forecast`` shows a
  live forecaster).

With an evolution trace (``evolution_trace`` enabled in the run's config: ``evolution_trace.jsonl``
in the run folder, or ``trace``, ``--trace FILE``), which keeps every evaluated child, the children
no checkpoint holds are imported from it with their metrics, parent, island, iteration seconds and
tokens (instead of ``not_attempted``), and the iterations of its failures file
(``evolution_trace_failures.jsonl``, ``include_failures``) become ``generation_failed`` candidates
with their error. The summary's ``sources`` says what was read.

With ``surrogate_log`` (``--surrogate-log``, the log ``gfsim.integrations.openevolve``'s
surrogate wrote during the run), each program gets the surrogate's forecast of the same code
(the k-th program with a given code the k-th surrogate candidate with it, in evaluation order),
so the imported log has the run's parent links and the real forecasts together; the header's
``selection`` names the surrogate's policy (``gfsim score`` then also reports metrics weighted
by the inverse propensity of being measured). A surrogate log that shares no code with the run
is refused.

A problem (a program file that is cut or lacks a field, a parent no checkpoint holds and no log
names, a checkpoint with no programs, an unsupported version) is one line naming the file and
field, and nothing is written unless the whole import validates.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.importers.evolution_settings import openevolve_selection
from gfsim.importers.evolution_settings import recorded_selection as _selection
from gfsim.importers.common import (BadField, check_version, is_number, json_loads, load_json,
                                    parse_key, read_surrogate_log, source_name)
from gfsim.replay_logs.io import MAX_LINE_BYTES, iter_input_lines, read_input

__all__ = ["import_openevolve", "read_run", "outcome_of", "SUPPORTED", "TESTED"]

SUPPORTED = ((0, 4), (0, 5))  # [0.4, 0.5)
TESTED = "0.4.1"
_OUTCOMES = ("compile_failed", "runtime_error", "incorrect", "timeout", "infrastructure_failure")
_REQUIRED = {"id": str, "code": str, "generation": int, "iteration_found": int,
             "timestamp": (int, float), "metrics": dict, "metadata": dict}
_ITERATION = re.compile(r"Iteration (\d+): Program (\S+) \(parent: (\S+)\) completed in "
                        r"([0-9.]+)s")
_EVALUATED = re.compile(r"Evaluated program (\S+) in ([0-9.]+)s")
_ITER_ERROR = re.compile(r"Iteration (\d+) error")


def _program(path: Path, run: Path) -> dict:
    prog = load_json(path, run)
    if not isinstance(prog, dict):
        raise BadField(path, None, "expected a JSON object (an OpenEvolve 0.4 program)")
    for field, kind in _REQUIRED.items():
        v = prog.get(field)
        if v is None or not isinstance(v, kind) or isinstance(v, bool):
            raise BadField(path, field, "missing or of the wrong type for an OpenEvolve 0.4 "
                                    "program")
    if prog["id"] != path.stem:
        raise BadField(path, "id", f"{prog['id'][:80]!r} differs from the file's name")
    if prog.get("parent_id") is not None and not isinstance(prog["parent_id"], str):
        raise BadField(path, "parent_id", "expected a string or null")
    return prog


def _checkpoints(run: Path) -> list[Path]:
    if not run.is_dir():
        raise GfsimError(f"{run}: no such folder")
    root = run / "checkpoints"
    if not root.is_dir():
        raise GfsimError(f"{run}: no checkpoints/ folder (is it an OpenEvolve output folder?)")
    found = []
    for d in root.iterdir():
        m = re.fullmatch(r"checkpoint_([0-9]{1,18})", d.name)  # (not '²', nor 5,000 digits)
        if m and d.is_dir():
            found.append((int(m.group(1)), d))
    if not found:
        raise GfsimError(f"{root}: no checkpoint_N folders")
    return [d for _, d in sorted(found)]


def _logs(run: Path) -> dict:
    """What the run's logs say: per program id, its iteration, parent and seconds."""
    said: dict[str, dict] = {}
    errors = 0
    files, note = _log_files(run)
    for f in files:
        # Streamed line by line, each cut at a megabyte: the iteration lines are short, and
        # a log read whole (a sparse 1 GiB one) cost five times its size.
        for _, line in iter_input_lines(f, root=run, cut_long=True):
            text = line.decode("utf-8", errors="replace")
            if (m := _ITERATION.search(text)):
                said.setdefault(m.group(2), {}).update(
                    iteration=parse_key(m.group(1), f, "iteration"), parent=m.group(3),
                    iteration_s=float(m.group(4)), log=f.name)
            elif (m := _EVALUATED.search(text)):
                said.setdefault(m.group(1), {}).setdefault("evaluation_s", float(m.group(2)))
            elif _ITER_ERROR.search(text):
                errors += 1
    return {"programs": said, "files": [f.name for f in files], "iteration_errors": errors,
            "note": note}


def _log_files(run: Path) -> tuple[list[Path], str | None]:
    """The run's ``logs/*.log`` and, where there are none, a note saying what that loses (the
    programs only the logs name). A ``logs/`` that leads out of the run folder (a symlink) is
    refused in one line, as its files would be."""
    folder = run / "logs"
    try:
        inside = folder.resolve().is_relative_to(run.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise GfsimError(f"{folder}: leads outside {run} (a symlink?); only the run's own files "
                         "are read: copy the logs into the run folder")
    files = sorted(folder.glob("*.log")) if folder.is_dir() else []
    if files:
        return files, None
    where = "holds no .log files" if folder.is_dir() else "is missing"
    return [], (f"logs/ {where}: programs that only the logs name (iterations no checkpoint "
                "kept) are not imported, and no iteration seconds were read")


def read_run(run_dir) -> dict:
    """The programs of a run (the union of its checkpoints), its checkpoints' metadata and what
    its logs say, checked: ``{"programs": {id: (program, file)}, "metadata": {...},
    "checkpoints": [...], "logs": {...}}``."""
    run = Path(run_dir)
    programs: dict[str, tuple[dict, Path]] = {}
    metadata: dict = {}
    cps = _checkpoints(run)
    for cp in cps:
        files = sorted((cp / "programs").glob("*.json")) if (cp / "programs").is_dir() else []
        if not files:
            raise BadField(cp / "programs", None, "a checkpoint with no programs (an interrupted "
                                              "save?)")
        for f in files:
            prog = _program(f, run)
            programs[prog["id"]] = (prog, f)  # a later checkpoint's copy wins
        meta_path = cp / "metadata.json"
        if meta_path.is_file():
            meta = load_json(meta_path, run)
            if not isinstance(meta, dict) or not isinstance(meta.get("islands", []), list):
                raise BadField(meta_path, "islands", "expected an object with a list of islands")
            metadata = meta
    return {"programs": programs, "metadata": metadata, "checkpoints": [c.name for c in cps],
            "logs": _logs(run)}


TRACE_NAMES = ("evolution_trace.jsonl", "evolution_trace.jsonl.gz")


def read_trace(run: Path, trace=None) -> dict | None:
    """OpenEvolve's evolution trace (``evolution_trace`` in its config: one JSON line per
    evaluated child, with its parent, metrics, island, generation and iteration seconds, and,
    with ``include_failures``, ``<stem>_failures.jsonl``: the iterations that made no
    program). ``trace`` names the file; by default the run folder's, if it has one. Returns
    ``{"children": {id: (where, record)}, "failures": [(where, record)], "files": [...]}``."""
    if trace is None:
        trace = next((run / n for n in TRACE_NAMES if (run / n).is_file()), None)
        if trace is None:
            return None
    trace = Path(trace)
    if not trace.is_file():
        raise GfsimError(f"{trace}: `trace`: no such file")
    root = run if trace.resolve().is_relative_to(run.resolve()) else None

    def lines(path: Path):
        for n, raw in iter_input_lines(path, root=root, max_line_bytes=MAX_LINE_BYTES):
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                rec = json_loads(line)
            except (ValueError, RecursionError) as exc:
                raise BadField(where, None, f"not valid JSON ({str(exc)[:120]}; a cut line?)") \
                    from None
            if not isinstance(rec, dict):
                raise BadField(where, None, "expected a JSON object (an evolution trace entry)")
            yield where, rec

    children: dict[str, tuple[str, dict]] = {}
    for where, rec in lines(trace):
        for field, kind in (("child_id", str), ("iteration", int), ("child_metrics", dict)):
            if not isinstance(rec.get(field), kind) or isinstance(rec.get(field), bool):
                raise BadField(where, field, "missing or of the wrong type for an OpenEvolve "
                                         "evolution trace entry")
        if rec.get("parent_id") is not None and not isinstance(rec["parent_id"], str):
            raise BadField(where, "parent_id", "expected a string or null")
        children[rec["child_id"]] = (where, rec)
    name = trace.name[:-len(".gz")] if trace.name.endswith(".gz") else trace.name
    stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
    failures_path = next((trace.with_name(f"{stem}_failures.jsonl{gz}") for gz in ("", ".gz")
                          if trace.with_name(f"{stem}_failures.jsonl{gz}").is_file()), None)
    failures = []
    if failures_path is not None:
        for where, rec in lines(failures_path):
            if not isinstance(rec.get("iteration"), int) or isinstance(rec["iteration"], bool):
                raise BadField(where, "iteration", "expected a whole number")
            if rec.get("parent_id") is not None and not isinstance(rec["parent_id"], str):
                raise BadField(where, "parent_id", "expected a string or null")
            failures.append((where, rec))
    return {"children": children, "failures": failures,
            "files": [trace.name] + ([failures_path.name] if failures_path else [])}


def _shown(where, run: Path) -> str:
    """A file (or ``file:line``) as a log keeps it: inside the run folder, its path there;
    elsewhere, its name; never the user's absolute path."""
    text, base = str(where), str(run)
    if text.startswith(base + "/") or text.startswith(base + "\\"):
        return text[len(base) + 1:]
    return Path(text).name


def _models(records: list) -> dict:
    """The models that wrote the run's programs (``metadata.llm_model``; programs each) and
    where prices stand: OpenEvolve records tokens per program, but no price."""
    models: dict[str, int] = {}
    for _, rec in records:
        name = (rec.get("openevolve") or {}).get("llm_model")
        if isinstance(name, str) and name:
            models[name] = models.get(name, 0) + 1
    return {"models": dict(sorted(models.items())),
            "prices": {"source": "not recorded: an OpenEvolve run folder keeps each "
                                 "program's model and tokens (metadata.llm_model, "
                                 "token_usage), but no price"}}


def _tokens(usage) -> dict:
    """The generating call's tokens from OpenEvolve's ``token_usage`` (OpenAI's names)."""
    if not isinstance(usage, dict):
        return {}
    return {ours: usage[theirs] for ours, theirs in (("input_tokens", "prompt_tokens"),
                                                     ("output_tokens", "completion_tokens"))
            if isinstance(usage.get(theirs), int) and usage[theirs] >= 0}


def _artifact_error(artifacts_json) -> str | None:
    try:
        arts = json_loads(artifacts_json or "{}")
    except (ValueError, TypeError, RecursionError):  # not JSON, or nested too deeply
        return None
    for key in ("error_message", "stderr", "stage2_stderr", "stage3_stderr", "traceback"):
        if isinstance(arts, dict) and isinstance(arts.get(key), str) and arts[key].strip():
            return arts[key].strip()[-4000:]
    return None


def outcome_of(metrics: dict, metric: str, artifact_error: str | None = None
               ) -> tuple[str, float | None, str | None]:
    """What OpenEvolve metrics say happened: ``(outcome, the metric's value for a success,
    error text)``, by the rules of the module doc (shared with the surrogate wrapper)."""
    if metrics.get("gfsim_skipped") is True:
        return "not_measured", None, None
    err = metrics.get("error")
    text = err.strip()[:4000] if isinstance(err, str) and err.strip() else artifact_error
    if metrics.get("timeout") is True:
        return "timeout", None, text or "timeout"
    if "error" in metrics:
        stated = metrics.get("outcome")
        outcome = stated if stated in _OUTCOMES else "runtime_error"
        return outcome, None, text or f"error metric {str(err)[:200]}"
    v = metrics.get(metric)
    if is_number(v) and v > 0:
        return "success", float(v), None
    return "incorrect", None, (f"no {metric} > 0 in its metrics (got {str(v)[:60]})"
                               if v is not None else f"no {metric} in its metrics")


def _outcome(prog: dict, metric: str) -> tuple[str, float | None, str | None]:
    return outcome_of(prog["metrics"], metric, _artifact_error(prog.get("artifacts_json")))


def import_openevolve(run_dir, out, *, runtime_metric: str | None = None,
                      higher_is_better: bool = False, reference_runtime: float | None = None,
                      openevolve_version: str | None = None, task: str = "task",
                      device: str = "unknown", provenance: str = "measured",
                      log_id: str | None = None, surrogate_log=None, trace=None) -> dict:
    """Write a trajectory log for an OpenEvolve run folder; returns a summary (see the module
    doc for the mapping). ``runtime_metric`` names the metric that is a runtime (lower is
    better) or, with ``higher_is_better``, a score; ``reference_runtime`` is in that metric's
    unit. ``trace``: the run's evolution trace (default: ``evolution_trace.jsonl`` in the run
    folder, if there is one), whose children the checkpoints dropped are imported with their
    metrics, and whose failures file's iterations become ``generation_failed`` candidates."""
    from gfsim.core.inputs import check_output
    from gfsim.importers.search import import_records

    run, out = Path(run_dir), Path(out)
    check_output(out, [run, surrogate_log, trace])
    version = check_version(openevolve_version, "`openevolve_version`", "OpenEvolve",
                            SUPPORTED, TESTED)
    if reference_runtime is not None and not (is_number(reference_runtime)
                                              and reference_runtime > 0):
        raise GfsimError("`reference_runtime`: expected a number > 0")
    got = read_run(run)
    programs, said = got["programs"], got["logs"]["programs"]
    surrogate = read_surrogate_log(Path(surrogate_log)) if surrogate_log is not None else None
    numeric = ", ".join(sorted({k for p, _ in programs.values()
                                for k, v in p["metrics"].items() if is_number(v)}))[:300]
    if not runtime_metric:
        raise GfsimError(f"{run}: give `runtime_metric` NAME (this run's numeric metrics: "
                         f"{numeric or 'none'})")
    if not any(runtime_metric in p["metrics"] for p, _ in programs.values()):
        raise GfsimError(f"{run}: `runtime_metric` {runtime_metric!r}: no program of this run "
                         f"has that metric (its numeric metrics: {numeric or 'none'})")
    # migrant copies: not candidates; links through them go to the original
    original = {pid: p["parent_id"] for pid, (p, _) in programs.items()
                if p["metadata"].get("migrant") is True and p.get("parent_id")}

    def resolve(pid):
        seen = set()
        while pid in original and pid not in seen:
            seen.add(pid)
            pid = original[pid]
        return pid

    rows = []
    for pid, (p, f) in programs.items():
        if pid in original:
            continue
        parent = resolve(p.get("parent_id")) if p.get("parent_id") else None
        rows.append(((p["iteration_found"], 0, p["timestamp"], pid), f, p, parent))
    traced = read_trace(run, trace)
    from_trace = {pid: v for pid, v in (traced or {"children": {}})["children"].items()
                  if pid not in programs}
    for pid, (where, t) in from_trace.items():  # children the checkpoints dropped
        parent = resolve(t["parent_id"]) if t.get("parent_id") else None
        rows.append(((t["iteration"], 1, float(t.get("timestamp") or 0.0), pid), where, None,
                     parent))
    failed = []
    for k, (where, t) in enumerate((traced or {"failures": []})["failures"]):
        fid = f"failed-iteration-{t['iteration']}-{k}"
        failed.append(fid)
        parent = resolve(t["parent_id"]) if t.get("parent_id") else None
        rows.append(((t["iteration"], 2, float(t.get("timestamp") or 0.0), fid), where, t,
                     parent))
    log_only = [pid for pid in said if pid not in programs and pid not in from_trace
                and "iteration" in said[pid]]
    for pid in log_only:
        s = said[pid]
        parent = None if s["parent"] == "None" else resolve(s["parent"])
        rows.append(((s["iteration"], 3, 0.0, pid), run / "logs" / s["log"], None, parent))
    rows.sort(key=lambda r: r[0])
    known = {r[0][3] for r in rows}
    for key, f, p, parent in rows:
        if parent is not None and parent not in known:
            raise BadField(f, "parent_id", f"{parent[:80]!r} is held by no checkpoint and named by "
                                       "no log line (a missing parent)")
    # the reference: given, or the seed program's (the first root) value of the metric
    ref, seed = reference_runtime, None
    if ref is None:
        seed = next(((f, p) for key, f, p, parent in rows
                     if parent is None and p is not None and key[1] == 0), None)
        if seed is None:
            raise GfsimError(f"{run}: no seed program in any checkpoint; give "
                             "`reference_runtime`")
        outcome, value, _ = _outcome(seed[1], runtime_metric)
        if outcome != "success":
            raise BadField(seed[0], f"metrics.{runtime_metric}", "the seed program has no value > 0"
                                                             " to measure speedups against; "
                                                             "give `reference_runtime`")
        ref = value
    records = []
    matched = 0
    for order, (key, f, p, parent) in enumerate(rows):
        pid = key[3]
        rec = {"id": pid, "parent": parent, "order": order, "task": task,
               "search": log_id or source_name(run) or "openevolve"}
        s = said.get(pid, {})
        if key[1] == 2:  # an iteration that made no program (the trace's failures file)
            rec.update(outcome="generation_failed",
                       error=str(p.get("error") or "the iteration made no program")[:4000],
                       openevolve={"iteration": p["iteration"], "island": p.get("island_id"),
                                   "evolution_mode": p.get("evolution_mode"),
                                   "file": _shown(f, run)})
            rec.update(_tokens(p.get("token_usage")))
            records.append((str(f), rec))
            continue
        if p is None and pid in from_trace:  # evaluated, dropped by the checkpoints
            t = from_trace[pid][1]
            arts = t.get("artifacts") if isinstance(t.get("artifacts"), dict) else None
            outcome, value, error = outcome_of(
                t["child_metrics"], runtime_metric,
                _artifact_error(json.dumps(arts)) if arts else None)
            rec.update(outcome=outcome, error=error,
                       code=t.get("child_code") if isinstance(t.get("child_code"), str)
                       and t.get("child_code") else None)
            if outcome == "success":
                rec["speedup"] = value / ref if higher_is_better else ref / value
            meta = t.get("metadata") if isinstance(t.get("metadata"), dict) else {}
            if s.get("evaluation_s") is not None:
                rec["evaluation_s"] = s["evaluation_s"]
                if is_number(meta.get("iteration_time")):
                    rec["generation_s"] = max(0.0, meta["iteration_time"] - s["evaluation_s"])
            rec.update(_tokens(meta.get("token_usage")))
            rec["openevolve"] = {
                "island": t.get("island_id"), "generation": t.get("generation"),
                "iteration": t["iteration"], "timestamp": t.get("timestamp"),
                "metrics": t["child_metrics"], "llm_model": meta.get("llm_model"),
                "file": _shown(f, run),
                "note": "from the evolution trace; no checkpoint holds it",
                **({"iteration_s": meta["iteration_time"]}
                   if is_number(meta.get("iteration_time")) else {})}
            records.append((str(f), rec))
            continue
        if p is None:
            rec.update(outcome="not_attempted",
                       openevolve={"iteration": s["iteration"], "log": s["log"],
                                   "note": "named by the log, held by no checkpoint",
                                   **{k: s[k] for k in ("iteration_s", "evaluation_s")
                                      if k in s}})
            if s.get("evaluation_s") is not None and s.get("iteration_s") is not None:
                rec["generation_s"] = max(0.0, s["iteration_s"] - s["evaluation_s"])
            records.append((f"{f}: program {pid}", rec))
            continue
        outcome, value, error = _outcome(p, runtime_metric)
        rec.update(outcome=outcome, code=p["code"], error=error)
        if outcome == "success":
            rec["speedup"] = value / ref if higher_is_better else ref / value
        if s.get("evaluation_s") is not None:
            rec["evaluation_s"] = s["evaluation_s"]
            if s.get("iteration_s") is not None:
                rec["generation_s"] = max(0.0, s["iteration_s"] - s["evaluation_s"])
        rec.update(_tokens(p["metadata"].get("token_usage")))
        if surrogate is not None:
            queue = surrogate["by_code"].get(hashlib.sha256(p["code"].encode()).hexdigest())
            if queue:
                rec["forecast"] = surrogate["forecasts"].get(queue.pop(0))
                matched += 1
        rec["openevolve"] = {
            "island": p["metadata"].get("island"), "generation": p["generation"],
            "iteration": p["iteration_found"], "timestamp": p["timestamp"],
            "metrics": p["metrics"], "llm_model": p["metadata"].get("llm_model"),
            "file": str(f.relative_to(run)),
            **({"iteration_s": s["iteration_s"]} if "iteration_s" in s else {})}
        records.append((str(f), rec))
    if surrogate is not None and not matched:
        raise GfsimError(f"{surrogate_log}: `surrogate_log`: no candidate's code_sha256 is the "
                         f"code of a program in {run} (a surrogate log of another run?)")
    counts: dict[str, int] = {}
    for _, r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    islands = got["metadata"].get("islands") or []
    digest = hashlib.sha256()
    for pid in sorted(programs):
        digest.update(read_input(programs[pid][1], root=run))
    prov = {"kind": provenance,
            "note": "imported by gfsim import openevolve from the OpenEvolve run "
                    f"{source_name(run)}",
            "source": source_name(run), "programs_sha256": digest.hexdigest(),
            "openevolve": {"version": version or "not stated (the run does not record it)",
                           "format": "OpenEvolve 0.4 program database",
                           "checkpoints": got["checkpoints"], "logs": got["logs"]["files"],
                           "evolution_trace": traced["files"] if traced else None},
            "runtime_metric": runtime_metric, "higher_is_better": bool(higher_is_better),
            "reference": ({"given": reference_runtime} if reference_runtime is not None
                          else {"seed_program_value": ref})}
    summary = import_records(
        records, out, source=run, provenance=prov, device=device, log_id=log_id or source_name(run),
        header_fields={"generator": {"model": "OpenEvolve's LLM ensemble (see each "
                                              "candidate's openevolve.llm_model)",
                                     **_models(records)},
                       **({"selection": surrogate["selection"]}
                          if surrogate is not None and surrogate["selection"] else {})},
        run_configuration={"openevolve": {
            "islands": len(islands), "island_programs": [len(i) for i in islands],
            "last_iteration": got["metadata"].get("last_iteration"),
            "evaluation": "one program at a time (no parent batches)",
            **_selection(openevolve_selection(run, len(islands)))}},
        driver="openevolve",
        # what a live forecaster (gfsim forecast) compares each program with: the seed program,
        # when it is the reference
        task_fields={task: {"reference_code": seed[1]["code"]}} if seed is not None else None)
    summary.update(
        source=str(run), checkpoints=len(got["checkpoints"]),
        sources=("checkpoints, logs and the evolution trace (" + ", ".join(traced["files"])
                 + ")") if traced else "checkpoints and logs (no evolution trace)",
        trace_only=len(from_trace), failed_iterations=len(failed),
        migrant_copies=len(original), log_only=len(log_only),
        **({"logs_note": got["logs"]["note"]} if got["logs"].get("note") else {}),
        iterations_without_a_program=got["logs"]["iteration_errors"],
        reference=ref, runtime_metric=runtime_metric, outcomes=counts,
        not_attempted_share=round(len(log_only) / max(1, len(records)), 4))
    if surrogate is not None:
        summary.update(surrogate_matched=matched, surrogate_candidates=surrogate["candidates"])
    return summary
