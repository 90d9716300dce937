"""Replay logs: schema v1 (``schema``), the crash-safe append-only reader and writer (``io``),
validation and the columnar in-memory form (``log``), the shipped logs (``shipped``) and merging
runs (``merge``). It imports only ``gfsim.core``: nothing of forecasts, the simulator or above.
"""

from gfsim.replay_logs.io import LogWriter, TruncatedTailWarning, iter_records
from gfsim.replay_logs.log import (
    CANDIDATE_STATUSES,
    PROB_COLUMNS,
    ReplayLog,
    load_log,
    open_log,
)
from gfsim.replay_logs.schema import KINDS, OUTCOMES, SCHEMA_VERSION
from gfsim.replay_logs.shipped import (
    DEFAULT_LOG,
    SHIPPED_CAVEATS,
    SHIPPED_LOGS,
    log_caveats,
    resolve_log,
)

__all__ = [
    "CANDIDATE_STATUSES",
    "DEFAULT_LOG",
    "KINDS",
    "LogWriter",
    "OUTCOMES",
    "PROB_COLUMNS",
    "ReplayLog",
    "SCHEMA_VERSION",
    "SHIPPED_CAVEATS",
    "SHIPPED_LOGS",
    "TruncatedTailWarning",
    "iter_records",
    "load_log",
    "log_caveats",
    "open_log",
    "resolve_log",
]
