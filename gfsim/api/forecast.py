"""Add a forecaster's forecasts to a log: what ``gfsim forecast`` runs and prints."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

__all__ = ["forecast", "make_forecaster"]


def forecast(log: str | Path, forecaster, out: str | Path, *, repeat: int = 0,
             drop_existing: bool = False, limit: int | None = None,
             progress: Callable | None = None) -> dict:
    """Write ``log`` with ``forecaster``'s forecasts added to ``out`` (resumable: an existing
    ``out`` is completed, not redone).

    ``forecaster`` is the ``gfsim forecast --forecaster`` spec (or what ``make_forecaster``
    made of one): a real server (``vllm:URL,model=NAME,mode=logprobs``), a what-if one drawn
    from the measured speedups (``paper:gemini3-flash``, ``synthetic:...``), the learned one
    (``learned``, alias ``costmodel``) or a plug-in's (``gfsim.forecasts.registry``).

    Args:
        log: a path or a shipped log's name.
        out: the log to write; an existing one is resumed.
        repeat: the repeat index written into each forecast.
        drop_existing: leave the input's own forecasts out of ``out``.
        limit: a live forecaster asks about at most this many candidates now (a what-if or
            learned forecaster forecasts every candidate it can at once).
        progress: called as ``progress(total, None)`` once, then ``progress(total, n)``.

    Returns:
        What ``gfsim forecast --json`` prints: how many candidates were forecast now, already
        there, parse failures, tokens and latency.

    Examples:
        >>> import gfsim, tempfile, os
        >>> out = os.path.join(tempfile.mkdtemp(), "f.jsonl")
        >>> s = gfsim.forecast("synthetic-mini", "paper:gemini3-flash", out)
        >>> s.get("forecast_now") > 0, s.get("forecaster").get("mode")
        (True, 'whatif')
    """
    from gfsim.forecasts.learned import LearnedForecaster
    from gfsim.live.llm.forecast_log import forecast_log

    the_forecaster = make_forecaster(forecaster)
    return forecast_log(str(log), the_forecaster, out, repeat=repeat,
                        drop_existing=drop_existing, limit=limit,
                        **({"progress": progress} if progress is not None and
                           not isinstance(the_forecaster, LearnedForecaster) else {}))


def make_forecaster(spec):
    """The forecaster a ``gfsim forecast --forecaster`` spec names (``gfsim.forecasts.registry``;
    a ``Forecaster`` is returned as it is). A name no forecaster goes by is refused in one
    line that lists the names; a live one without the ``live`` extra is refused in one line."""
    from gfsim.core.errors import SpecError
    from gfsim.forecasts import FORECASTERS, LoggedForecaster
    from gfsim.forecasts import make_forecaster as make

    made = make(spec)
    if isinstance(made, LoggedForecaster):
        raise SpecError(f"`forecaster` {spec!r}: no forecaster goes by "
                        f"{spec.partition(':')[0]!r}; known: {', '.join(FORECASTERS)} (e.g. "
                        "vllm:URL,model=NAME, paper:gemini3-flash, learned)")
    return made
