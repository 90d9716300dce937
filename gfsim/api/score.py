"""Score the forecasts in a log: what ``gfsim score`` runs and prints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gfsim.replay_logs import ReplayLog

__all__ = ["score"]


def score(log: ReplayLog | str | Path | None = None, *, forecaster: str | None = None,
          task: str | None = None, by_task: bool = False, selective: str = "maxprob",
          calibrate: str = "none", plot: str | Path | None = None) -> list[dict]:
    """Score each forecaster's forecasts in ``log`` against the measured outcomes: accuracy,
    ECE, Brier, CRPS, NLL, the speedup recovered when measuring the top b% and the area under
    the risk-coverage curve.

    Every keyword is the ``gfsim score`` option of the same name (``selective`` is
    ``--score``).

    Args:
        log: a ``ReplayLog``, a path, or a shipped log's name; None: the shipped default.
        forecaster: score only this forecaster; task: only this task.
        calibrate: ``none``, ``temperature`` or ``isotonic`` (fitted out of fold, by task).
        plot: write a reliability diagram and a risk-coverage curve to this PNG.

    Returns:
        One dict a forecaster, as ``gfsim score --json`` prints them; each says whose forecasts
        they are (``forecast_source``) and the log's known caveats.

    Examples:
        >>> import gfsim
        >>> (r,) = gfsim.score("synthetic-mini")
        >>> r.get("forecast_source").get("synthetic"), 0 <= r.get("ece") <= 1
        (True, True)
    """
    from gfsim.api.options import open_log_arg
    from gfsim.forecasts.provenance import forecast_source
    from gfsim.forecasts.scoring import score_log
    from gfsim.replay_logs import log_caveats

    the_log = open_log_arg(log)
    results = score_log(the_log, forecaster=forecaster, task=task, by_task=by_task,
                        score=selective, calibrate=calibrate)
    if plot is not None:
        from gfsim.analysis.plots import plot_scores

        plot_scores([{"name": r["forecaster"], "ece": r["ece"], "aurc": r["aurc"], **r["_curves"]}
                     for r in results], plot,
                    title=f"gfsim score: log {the_log.name}"
                    + (" (SYNTHETIC: nothing measured)" if the_log.is_synthetic else ""))
    clean = [_without_curves(r) for r in results]
    # A score is the forecaster's only where the forecasts are its own: say whose they are
    # (a what-if column is a model's draws, not the named LLM's accuracy).
    for r in clean:
        r["forecast_source"] = forecast_source(the_log, r["forecaster"])
        r["log_caveats"] = log_caveats(the_log)
    return clean


def _without_curves(r: dict) -> dict:
    out = {k: v for k, v in r.items() if k != "_curves"}
    if "by_task" in out:
        out["by_task"] = {t: _without_curves(v) for t, v in out["by_task"].items()}
    return out
