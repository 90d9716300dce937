"""What ``gfsim validate``, ``gfsim logs`` and ``gfsim policies`` show: a log described, the
shipped logs, and the policies with their parameters (plug-ins' marked)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["describe_log", "shipped_logs", "policies", "log_sha256"]


def log_sha256(log: str | Path | None) -> str | None:
    """The SHA-256 of a log's bytes (None: the shipped default's), as its cache knows it where
    it does; None where the file is not there (a live run's log before it is written)."""
    from gfsim.core.errors import GfsimError
    from gfsim.replay_logs import DEFAULT_LOG, resolve_log
    from gfsim.replay_logs.cache import _digest, known_digest
    from gfsim.replay_logs.io import read_raw

    try:
        path = Path(resolve_log(str(log) if log else DEFAULT_LOG))
        return known_digest(path, path.stat()) or _digest(read_raw(path))
    except (GfsimError, OSError):
        return None


def describe_log(path: str | Path, *, allow_truncated: bool = False) -> dict:
    """A log checked against schema v1 and described: its shape, provenance, tasks, searches,
    records, candidates by status, forecasters and caveats. A problem raises ``GfsimError``
    naming the file, line and field; a log whose end a crash cut raises too, unless
    ``allow_truncated`` (its complete records are kept).

    Examples:
        >>> import gfsim
        >>> out = gfsim.describe_log("synthetic-mini")
        >>> out["valid"], out["candidates"]
        (True, 368)
    """
    from gfsim.core.errors import GfsimError
    from gfsim.replay_logs import open_log

    log = open_log(str(path))
    if log.truncated and not allow_truncated:
        raise GfsimError(f"{log.truncated}; the records before the cut are valid (pass "
                         "`allow_truncated` to accept them)")
    return {"valid": True, **_summary(log)}


def shipped_logs() -> list[dict]:
    """The logs shipped with gfsim (usable as ``--log NAME``), each described."""
    from gfsim.replay_logs import DEFAULT_LOG, SHIPPED_LOGS, open_log

    return [{"name": name, "default": name == DEFAULT_LOG, "description": description,
             **_summary(open_log(name))} for name, (_, description) in SHIPPED_LOGS.items()]


def policies() -> list[dict]:
    """Every policy (gfsim's own, then plug-ins'), its summary and parameters with defaults."""
    from gfsim.policies import POLICIES

    rows = []
    for name, cls in POLICIES.items():
        params = [{"name": p.name, "default": p.default, "help": p.help,
                   "type": list(p.kind) if isinstance(p.kind, tuple) else p.kind.__name__}
                  for p in cls.params]
        rows.append({"name": name, "summary": cls.summary, "needs_forecast": cls.needs_forecast,
                     "params": params, "plugin": not POLICIES.builtin(name),
                     "module": cls.__module__})
    return rows


def _summary(log) -> dict:
    from gfsim.replay_logs import log_caveats

    return {
        "log": log.name,
        "path": log.path,
        "shape": log.shape,
        "provenance": log.header["provenance"].get("kind"),
        "tasks": [t["task_id"] for t in log.header["tasks"]],
        "searches": int(log.candidates["search_id"].nunique()) if len(log.candidates) else 0,
        "records": log.counts,
        "candidates": len(log.candidates),
        "statuses": log.status_counts(),
        "forecasters": log.forecasters(),
        "label_bin_convention": log.header["label_bin_convention"],
        "truncated": log.truncated,
        "forecast_relative_to": log.header.get("forecast_relative_to"),
        "caveats": log_caveats(log),
    }
