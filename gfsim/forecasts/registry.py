"""Forecaster names -> forecasters: gfsim's own and plug-ins.

A ``--forecaster`` spec is ``NAME[:rest]``; ``NAME`` picks a maker in ``FORECASTERS``, which
builds the forecaster (a ``gfsim.forecasts.protocol.Forecaster``) from the whole spec. gfsim's
own are the what-if models (``paper``, ``synthetic``) and the learned forecaster (``learned``,
alias ``costmodel``); the live LLM forecaster (``vllm``, in the ``live`` extra) comes through
gfsim's own entry point, as a plug-in's would. A plug-in adds a maker with
``register_forecaster`` or under the ``gfsim.forecasters`` entry-point group: any callable that
takes the spec and returns a ``Forecaster``, such as the class itself. A spec that names no maker
names forecasts the log already holds (``LoggedForecaster``), as does one the log holds under that
exact name, unless its maker draws from the log itself (what-if, learned: they are drawn again).
Every entry point that takes a forecaster takes a spec or a ``Forecaster`` object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gfsim.core.errors import GfsimError
from gfsim.core.plugins import PluginError, Registry
from gfsim.forecasts.protocol import Forecaster, LoggedForecaster

__all__ = ["FORECASTERS", "register_forecaster", "make_forecaster", "resolve", "kind_of",
           "maker"]

# A maker's kind when it draws its forecasts from the log's own outcomes (so a log that holds
# forecasts under the same name is drawn again, not read).
_DRAWN = ("whatif", "learned")
# Names whose maker needs the live extra: a missing one is said in one line.
_LIVE = ("vllm",)


def maker(kind: str):
    """Mark a maker function with the ``kind`` of the forecasters it makes (``kind_of`` reads it
    without building one); a ``Forecaster`` class carries its own."""
    def mark(fn):
        fn.kind = kind
        return fn
    return mark


@maker("whatif")
def _whatif(spec: str) -> Forecaster:
    from gfsim.forecasts.whatif import parse_whatif

    return parse_whatif(spec)


@maker("learned")
def _learned(spec: str) -> Forecaster:
    from gfsim.forecasts.learned import parse_learned

    return parse_learned(spec)


def _check(name: str | None, maker: Any) -> str:
    if not callable(maker):
        raise PluginError(f"forecaster plug-in {maker!r}: a maker is a callable that takes the "
                          "spec and returns a Forecaster (a Forecaster subclass will do)")
    name = name if name is not None else getattr(maker, "prefix", None)
    if name is None:
        raise PluginError(f"forecaster plug-in {maker!r}: give its name "
                          "(register_forecaster(maker, 'name'), or a class attribute prefix)")
    return name


FORECASTERS: Registry = Registry(
    "gfsim.forecasters", "forecaster",
    {"paper": _whatif, "synthetic": _whatif, "learned": _learned, "costmodel": _learned},
    check=_check)


def register_forecaster(maker: Callable[[str], Forecaster], name: str | None = None, *,
                        replace: bool = False):
    """Make ``NAME[:rest]`` specs build forecasters with ``maker(spec)`` (a callable, such as a
    ``Forecaster`` subclass whose constructor takes the spec; ``name``: the spec's head, else
    the maker's ``prefix`` attribute). Returns ``maker``, so it works as a class decorator.

    Examples:
        >>> from gfsim.forecasts import Forecast, Forecaster, make_forecaster, register_forecaster
        >>> @register_forecaster
        ... class Even(Forecaster):
        ...     prefix, mode, kind = "even", "even", "assumed"
        ...     def __init__(self, spec="even"):
        ...         self.name = spec
        ...     def forecast(self, request):
        ...         return Forecast(request.candidate_id, self.name, self.mode, [1 / 8] * 8)
        >>> make_forecaster("even:x").name
        'even:x'
        >>> FORECASTERS.unregister("even")
    """
    FORECASTERS.register(maker, name, replace=replace)
    return maker


def _head(spec: str) -> str:
    return spec.partition(":")[0].partition(",")[0]


def make_forecaster(spec: str | Forecaster | None) -> Forecaster | None:
    """The forecaster ``spec`` names (a ``Forecaster`` is returned as it is; None stays None):
    its maker's, else the forecasts a log holds under that name (``LoggedForecaster``)."""
    if spec is None or isinstance(spec, Forecaster):
        return spec
    if not isinstance(spec, str) or not spec:
        raise GfsimError(f"`forecaster`: expected a spec or a Forecaster, got {spec!r}")
    head = _head(spec)
    if head not in FORECASTERS:
        return LoggedForecaster(spec)
    if head in _LIVE:
        try:
            import httpx  # noqa: F401 - the live forecasters' client
        except ImportError as exc:
            raise GfsimError(f"`forecaster` {head}: a live forecaster needs the live extra "
                             f"(pip install 'gfsim[live]'): {exc}") from None
    maker = FORECASTERS[head]
    made = maker(spec)
    if not isinstance(made, Forecaster):
        raise PluginError(f"forecaster {head}: its maker {maker!r} returned {made!r}, not a "
                          "gfsim.forecasts.Forecaster")
    return made


def kind_of(spec: str | None) -> str:
    """What forecasts named ``spec`` rest on, from its maker alone (no forecaster is built):
    ``whatif``, ``learned``, ``llm``, a plug-in's word, or ``unknown``."""
    if not isinstance(spec, str) or not spec:
        return "unknown"
    head = _head(spec)
    if head not in FORECASTERS:
        return "unknown"
    try:
        return str(getattr(FORECASTERS[head], "kind", "unknown") or "unknown")
    except PluginError:  # a plug-in that cannot load: its kind is not known
        return "unknown"


def resolve(log, forecaster: str | Forecaster | None) -> tuple[Any, str | None]:
    """(log with the forecaster's forecasts, the name they go by) for a replay: a forecaster
    that draws from the log (what-if, learned) is drawn onto it in memory; a name the log holds
    reads those; any other forecaster adds its forecasts (``Forecaster.attach``)."""
    if forecaster is None:
        return log, None
    if isinstance(forecaster, str) and kind_of(forecaster) not in _DRAWN and \
            _holds(log, forecaster):
        return log, forecaster
    f = make_forecaster(forecaster)
    assert f is not None
    return f.attach(log), f.name


def _holds(log, name: str) -> bool:
    forecasts = getattr(log, "forecasts", None)
    return forecasts is not None and len(forecasts) > 0 and \
        bool((forecasts["forecaster"] == name).any())
