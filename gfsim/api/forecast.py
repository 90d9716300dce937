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
    from the measured speedups (``paper:gemini3-flash``, ``synthetic:...``) or a learned cost
    model (``costmodel``).

    Args:
        log: a path or a shipped log's name.
        out: the log to write; an existing one is resumed.
        repeat: the repeat index written into each forecast.
        drop_existing: leave the input's own forecasts out of ``out``.
        limit: a live forecaster asks about at most this many candidates now (a what-if or
            cost-model forecaster forecasts every candidate it can at once).
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
    from gfsim.forecasts.costmodel import CostModelSpec
    from gfsim.live.forecast_log import forecast_log

    the_forecaster = make_forecaster(forecaster) if isinstance(forecaster, str) else forecaster
    return forecast_log(str(log), the_forecaster, out, repeat=repeat,
                        drop_existing=drop_existing, limit=limit,
                        **({"progress": progress} if progress is not None and
                           not isinstance(the_forecaster, CostModelSpec) else {}))


def make_forecaster(spec: str):
    """The forecaster a ``--forecaster`` spec names (a cost model's spec, a what-if forecaster
    or a live one); a live one without the ``live`` extra is refused in one line."""
    from gfsim.core.errors import GfsimError
    from gfsim.forecasts.costmodel import is_costmodel, parse_costmodel
    from gfsim.forecasts.whatif import is_whatif, parse_whatif

    if is_costmodel(spec):
        return parse_costmodel(spec)
    if is_whatif(spec):
        return parse_whatif(spec)
    try:
        import httpx  # noqa: F401 - the live forecaster's client
    except ImportError as exc:
        raise GfsimError(f"--forecaster {spec.partition(',')[0]}: a live forecaster needs the "
                         f"live extra (pip install 'gfsim[live]'): {exc}") from None
    from gfsim.live.forecaster import parse_forecaster

    return parse_forecaster(spec)
