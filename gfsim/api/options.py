"""The options every entry point shares (the ``gfsim`` commands and ``gfsim.api``): where a
closed-loop replay's children come from, the search's shape, resource slots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfsim.core.drivers import is_closed_loop

__all__ = ["resolve_children", "puct_children", "learning_spec", "search_config",
           "CAPACITY_KEYS", "parse_capacities", "parse_capacity", "ReplayInputs",
           "replay_inputs", "open_log_arg", "add_provenance"]


def resolve_children(driver: str, children: str) -> str:
    """--children's value with ``auto`` resolved: the world model under the puct driver,
    else ``fallback`` (the trace driver draws no children)."""
    if children == "auto":
        return "model" if is_closed_loop(driver) else "fallback"
    return children


def puct_children(driver: str, children: str, simulate: bool = False) -> dict:
    """The replay keywords for --children and --simulate: checked, and only for the puct
    driver."""
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.world_model import check_children

    children = resolve_children(driver, children)
    check_children(children)
    if not is_closed_loop(driver):
        if children != "fallback" or simulate:
            flag = "`children`" if children != "fallback" else "`simulate`"
            raise GfsimError(f"{flag}: only a closed-loop driver (the puct driver, or closed) "
                             "draws children; the trace "
                             "driver replays the logged order")
        return {}
    return {"children": children, "simulate": simulate}


def learning_spec(forecaster):
    """The learned forecaster where --forecaster names one (a spec or the object): the replay
    lets it learn only from what the replayed search measured (``replay_many``'s
    ``learning``); else None."""
    from gfsim.forecasts.learned import LearnedForecaster
    from gfsim.forecasts.registry import kind_of, make_forecaster

    if isinstance(forecaster, str) and kind_of(forecaster) == "learned":
        forecaster = make_forecaster(forecaster)
    return forecaster if isinstance(forecaster, LearnedForecaster) else None


def search_config(driver: str, preset: str | None, log=None, **knobs):
    """The puct search shape from --search and the knobs; an error if given to the trace
    driver, where they mean nothing. Without --search, each search of the log in its own shape
    (recorded by its run, else inferred from its candidates: ``simulator.shape``) with the
    knobs given in place of its own; with no ``log`` (a new, live search), paper-standard."""
    from gfsim.core.errors import GfsimError
    from gfsim.simulator.closed.engine import SEARCH_PRESETS, replace_config
    from gfsim.simulator.shape import OwnShape

    given = {k: v for k, v in knobs.items() if v is not None}
    if not is_closed_loop(driver):
        if preset is not None or given:
            flags = ", ".join(["`search`"] * (preset is not None) + [f"`{k}`" for k in given])
            raise GfsimError(f"{flags}: only with `driver` puct (or closed)")
        return None
    if preset is None and log is not None:
        return OwnShape(**given)
    preset = preset or "paper-standard"
    if preset not in SEARCH_PRESETS:
        raise GfsimError(f"`search`: unknown preset {preset!r}; valid: "
                         f"{', '.join(SEARCH_PRESETS)}")
    return replace_config(SEARCH_PRESETS[preset], **given)


# -- one vocabulary for resource slots ------------------------------------------------------
# Every command that takes --capacity reads the same keys; the older spellings still work.
CAPACITY_KEYS = ("gen", "forecast", "compile", "gpus")
_CAPACITY_ALIASES = {"generator": "gen", "forecaster": "forecast", "compile_workers": "compile",
                     "gpu": "gpus", "eval": "gpus"}


def parse_capacities(text: str | None, option: str, keys=CAPACITY_KEYS) -> dict[str, int]:
    """``gen=4,gpus=2`` as {key: slots}, keys of ``CAPACITY_KEYS`` (``keys``: those this
    command has), each a whole number >= 1; one line naming the option otherwise."""
    from gfsim.core.errors import SpecError
    from gfsim.core.specs import parse_kv

    out: dict[str, int] = {}
    for key, raw in parse_kv(text or "", option):
        if key is None:
            raise SpecError(f"{option}: {raw!r} needs a key (KEY=N; keys: {', '.join(keys)})")
        canon = _CAPACITY_ALIASES.get(key, key)
        if canon not in keys:
            raise SpecError(f"{option}: unknown key {key!r}; valid: {', '.join(keys)}")
        try:
            out[canon] = int(raw)
        except ValueError:
            raise SpecError(f"{option}: {key}={raw!r} is not a whole number") from None
        if out[canon] < 1:
            raise SpecError(f"{option}: {key} must be >= 1")
    return out


_CAPACITY_FIELDS = {"gen": "generator", "forecast": "forecaster", "compile": "compile_workers",
                    "gpus": "gpus"}


def parse_capacity(text: str | None, base):
    """``gpus=2,gen=8`` over a preset's capacities (``base``, a ``Capacities``)."""
    import dataclasses

    if not text:
        return base
    changes = {_CAPACITY_FIELDS[k]: n for k, n in parse_capacities(text, "capacity").items()}
    return dataclasses.replace(base, **changes)


def open_log_arg(log):
    """A ``ReplayLog`` as given, else the shipped log or file it names (None: the default)."""
    if log is None or isinstance(log, (str, Path)):
        from gfsim.replay_logs import open_log

        return open_log(None if log is None else str(log))
    return log


@dataclass
class ReplayInputs:
    """What a replay of a log needs, resolved once from the options every command shares:
    the log (with the forecasts its policies read), the cost model, and ``settings``, the
    ``ReplaySettings`` every replay of the command reads (budget, driver, search shape,
    forecaster, where closed-loop children come from, learning). The other fields are views
    of the same settings, for the command's output."""

    log: Any
    model: Any
    settings: Any

    @property
    def forecaster(self) -> str | None:
        return self.settings.forecaster

    @property
    def learning(self):
        return self.settings.learning

    @property
    def search(self):
        return self.settings.search

    @property
    def children(self) -> str:
        return self.settings.children

    @property
    def budget(self):
        return self.settings.budget

    @property
    def puct_only(self) -> dict:
        """The closed loop's own settings, {} under the trace driver."""
        s = self.settings
        return {"children": s.children, "simulate": s.simulate} if s.closed_loop else {}


def replay_inputs(log, *, forecaster, cost: str, driver: str, search: str | None,
                  children: str, simulate: bool, budget: str | None,
                  **knobs) -> ReplayInputs:
    """``ReplayInputs`` from the shared options (``knobs``: the PUCT search's, such as
    ``overgen``); each option checked, with a one-line error naming it."""
    from gfsim.cost_models import load_cost_model
    from gfsim.forecasts.registry import resolve
    from gfsim.simulator import parse_budget
    from gfsim.simulator.settings import ReplaySettings

    learning = learning_spec(forecaster)
    the_log, forecaster = resolve(open_log_arg(log), forecaster)
    model = load_cost_model(cost)
    config = search_config(driver, search, the_log, **knobs)
    children = resolve_children(driver, children)
    puct_only = puct_children(driver, children, simulate)
    settings = ReplaySettings(budget=parse_budget(budget), forecaster=forecaster,
                              learning=learning, driver=driver, search=config, **puct_only)
    return ReplayInputs(the_log, model, settings)


def add_provenance(out: dict, log, forecaster, model, read: bool) -> None:
    """Where the forecasts came from, the log's known caveats and a price for another GPU:
    as fields of ``out`` and as notes appended to ``out["notes"]``
    (``gfsim.forecasts.provenance``). ``read``: whether a policy reads the forecasts."""
    from gfsim.forecasts.provenance import provenance, provenance_notes

    prov = provenance(log, forecaster, model, read=read)
    out.update(prov)
    out["notes"] = [*out.get("notes", []), *provenance_notes(prov, log.name)]
