"""How a log is replayed, as one frozen object: every setting a replay reads besides the log,
the policies, the cost model and the seeds.

The front door builds it once from its options (``gfsim.api.options.replay_inputs``) and
passes it down whole: ``replay``, ``replay_many``, ``replay_with_baseline``, the predictive
interval's fresh searches and the tuner's trials read the same object, so a setting cannot
be lost or changed on the way. ``replace`` gives a copy with some settings changed (the
baseline's search without overgeneration, say).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gfsim.core.drivers import is_closed_loop
from gfsim.core.errors import GfsimError
from gfsim.cost_models.presets import Capacities
from gfsim.simulator.budget import Budget
from gfsim.simulator.noise import MeasureNoise
from gfsim.simulator.pipeline import DEFAULT_PIPELINE, Pipeline

__all__ = ["ReplaySettings", "DRIVERS", "ENGINES"]

DRIVERS = ("trace", "puct", "closed", "evolution")  # simulator.drivers: the closed-loop ones
ENGINES = ("auto", "des", "fast")


@dataclass(frozen=True)
class ReplaySettings:
    """Every setting of a replay (``gfsim replay``'s options, resolved):

    - ``budget``: the per-search limits; ``capacities``: resource slots (None: the cost
      model's); ``pipeline``: the stage order; ``noise``: keyed noise on every measurement;
    - ``forecaster``: the name of the forecasts the policies read (None: the log's first);
      ``learning``: a learned forecaster trained on what each replay measures, or None;
    - ``driver``: ``trace`` (the logged order) or a closed loop (``puct``, ``closed``,
      ``evolution``); ``engine``: ``auto``, ``des`` (SimPy) or ``fast``;
    - closed loop only: ``search`` (a ``SearchConfig`` for every search, an ``OwnShape``, or
      None: each search in its own shape), ``children`` (where children the log never held
      come from), ``simulate`` (simulate a search PUCT does not reproduce on thin evidence);
    - trace only: ``orphans_dropped`` (also replay with candidates whose parent was never
      measured dropped, so both can be reported).
    """

    budget: Budget = Budget()
    capacities: Capacities | None = None
    forecaster: str | None = None
    orphans_dropped: bool = True
    pipeline: Pipeline = DEFAULT_PIPELINE
    engine: str = "auto"
    driver: str = "trace"
    search: Any = None
    noise: MeasureNoise | None = None
    children: str = "fallback"
    learning: Any = None
    simulate: bool = False

    def __post_init__(self):
        if self.driver not in DRIVERS:
            raise GfsimError(f"`driver`: unknown driver {self.driver!r}; valid: "
                             f"{', '.join(DRIVERS)}")
        if self.engine not in ENGINES:
            raise GfsimError(f"`engine`: unknown engine {self.engine!r}; valid: "
                             f"{', '.join(ENGINES)}")

    @property
    def closed_loop(self) -> bool:
        """Whether the driver re-runs a search (closed loop) rather than the logged order."""
        return is_closed_loop(self.driver)

    def replace(self, **changes) -> ReplaySettings:
        """A copy with ``changes`` (settings by name); an unknown name is an error."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise GfsimError(f"unknown replay setting(s) {', '.join(sorted(unknown))}; valid: "
                             f"{', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, settings: ReplaySettings | None = None, **changes) -> ReplaySettings:
        """``settings`` (None: the defaults) with ``changes``: what an entry point that takes
        both a settings object and keywords replays with."""
        base = settings if settings is not None else cls()
        return base.replace(**changes) if changes else base
