"""Merging logs: the searches of several logs in one (e.g. live runs with different seeds, or of
different tasks, made on the same machine under the same timing protocol)."""

from __future__ import annotations

from pathlib import Path

from gfsim.core.durable import replace
from gfsim.core.errors import GfsimError

__all__ = ["merge_logs", "MUST_AGREE"]

# Header fields that must be equal for the searches to be comparable in one log.
MUST_AGREE = ("log_shape", "label_bin_convention", "forecast_bin_edges", "forecast_relative_to",
              "duration_basis", "timing_protocol")


def merge_logs(paths, out) -> dict:
    """Validate every input, check that they agree (``MUST_AGREE``, the GPU, no search or
    candidate twice), and write one log: the first header with the union of the tasks, then
    every input's records in order. Written to a temporary file, fsynced, then renamed."""
    from gfsim.replay_logs.io import LogWriter, iter_records
    from gfsim.replay_logs.log import load_log
    from gfsim.replay_logs.shipped import resolve_log

    paths = [str(resolve_log(str(p))) for p in paths]  # shipped names or paths
    if len(paths) < 2:
        raise GfsimError("merge: give at least two logs")
    out = Path(out)
    if out.exists():
        raise GfsimError(f"{out} exists; merge writes a new log")
    logs = [load_log(p) for p in paths]
    first = logs[0].header
    device = first["hardware"].get("device_name")
    tasks = {t["task_id"]: t for t in first["tasks"]}
    searches: dict[str, str] = {}
    candidates: dict[str, str] = {}
    for k, (path, log) in enumerate(zip(paths, logs)):
        h = log.header
        for key in MUST_AGREE:
            if h.get(key) != first.get(key):
                raise GfsimError(f"{path}: header {key} {h.get(key)!r} differs from "
                                 f"{paths[0]}'s {first.get(key)!r}; such logs do not merge")
        if h["hardware"].get("device_name") != device:
            raise GfsimError(f"{path}: measured on {h['hardware'].get('device_name')!r}, "
                             f"{paths[0]} on {device!r}; such logs do not merge")
        for t in h["tasks"]:
            tasks.setdefault(t["task_id"], t)
        for sid in log.candidates["search_id"].unique().tolist() + [r["search_id"]
                                                                   for r in log.runs]:
            if searches.setdefault(sid, k) != k:
                raise GfsimError(f"{path}: search {sid!r} is also in {paths[searches[sid]]} "
                                 "(run the second with another `seed`)")
        for cid in log.candidates["candidate_id"]:
            if candidates.setdefault(cid, k) != k:
                raise GfsimError(f"{path}: candidate {cid!r} is also in "
                                 f"{paths[candidates[cid]]}")
    header = {**first, "tasks": list(tasks.values()),
              "merged_from": [{"path": p, "log_id": log.header["log_id"],
                               "created_at": log.header["created_at"]}
                              for p, log in zip(paths, logs)]}
    tmp = out.with_name(".partial-" + out.name)  # same suffix: gzipped iff the output is
    tmp.unlink(missing_ok=True)
    n = 1
    try:
        with LogWriter(tmp) as w:
            w.append(header)
            for p in paths:
                batch = [rec for _, rec in iter_records(p) if rec.get("kind") != "header"]
                w.append_many(batch)
                n += len(batch)
        load_log(tmp)  # the result must be a valid log before it takes the name
        replace(tmp, out)  # and the directory fsynced
    finally:
        tmp.unlink(missing_ok=True)
    return {"out": str(out), "inputs": paths, "searches": len(searches),
            "candidates": len(candidates), "records": n}
