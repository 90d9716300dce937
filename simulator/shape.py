"""The shape of a closed-loop search, and whether the puct driver can replay a logged one.

A closed-loop (``puct``) replay re-runs each search of a log. Its shape (steps, parents per
step, samples per parent, measured per parent) is, in this order: one the caller gives for
every search (a ``SearchConfig``); else the shape the search's run recorded (a live or
synthesised search), with any fields the caller overrides (``OwnShape``); else the shape
inferred from the search's own candidates (``infer_shape``), with the same overrides. So an
imported search of 14 iterations of one child each is replayed as 14 steps of one child, not
as the paper's 40 steps of 2 x 4.

Whether the replay *reproduces* the logged search or *simulates* PUCT on its evidence is
measured, not assumed (``reproduction``): the search is replayed under ``all`` at F = 1 in its
own shape with only its logged children, and it is reproduced when every child PUCT asked
for was one the log holds for that node and expansion (``own`` draws): PUCT then chose the
logged parents at every step. Any other search (OpenEvolve's islands, an agent's linear
trajectory, a PUCT with other settings) is simulated, and a simulation needs evidence to draw
children from: at least ``MIN_PAIRS`` logged (parent, child) pairs with a measured parent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace

from gfsim.core.caches import on_object
from gfsim.core.errors import GfsimError
from gfsim.simulator.closed.engine import SearchConfig
from gfsim.simulator.traces import SearchTrace

__all__ = ["OwnShape", "infer_shape", "recorded_shape", "shapes_for", "evidence_pairs",
           "check_memory", "drawn_candidates", "BYTES_PER_CANDIDATE", "MIN_PAIRS",
           "Reproduction", "reproductions", "describe", "shape_from_dict"]

# A simulated child copies one of the K nearest logged (parent, child) pairs (the world model's
# K_NEAREST, 16); with fewer pairs than that there is nothing to choose between.
MIN_PAIRS = 16


@dataclass(frozen=True)
class OwnShape:
    """Each search in its own shape (recorded by its run, else inferred from its candidates),
    with the fields given here in place of its own (None: the search's own value).
    ``dataclasses.replace(shape, overgen=4)`` works as on a ``SearchConfig``."""

    steps: int | None = None
    parents_per_step: int | None = None
    samples_per_parent: int | None = None
    overgen: int | None = None
    k_per_parent: int | None = None
    capacity: int | None = None
    c_puct: float | None = None

    def overrides(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def on(self, base: SearchConfig) -> SearchConfig:
        return replace(base, **self.overrides())

    def as_dict(self) -> dict:
        return {"own": True, **self.overrides()}


def describe(shape: dict) -> str:
    """``40 steps x 2 parents x 4 samples x F 1, k 4`` for a shape's ``as_dict()``."""
    def n(v, word):
        return f"{v} {word}" + ("" if v == 1 else "s")

    return (f"{n(shape['steps'], 'step')} x {n(shape['parents_per_step'], 'parent')} x "
            f"{n(shape['samples_per_parent'], 'sample')} x F {shape['overgen']}, "
            f"k {shape['k_per_parent']}")


def shape_from_dict(shape: dict | None):
    """The shape an ``as_dict()`` came from: an ``OwnShape`` (``own`` set) or a
    ``SearchConfig``; None for None."""
    if not shape:
        return None
    if shape.get("own"):
        return OwnShape(**{k: v for k, v in shape.items() if k != "own"})
    return SearchConfig(**shape)


def _mode(values) -> int:
    """The most common value (ties: the larger one)."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


def infer_shape(trace: SearchTrace) -> SearchConfig:
    """A search's shape from its candidates: its number of steps, the usual number of parents
    a step expanded and of children an expansion had (the most common counts), and every
    child measured (k = samples per parent, as the reference's standard search)."""
    if not len(trace):
        raise GfsimError(f"search {trace.search_id!r}: no candidates to infer a shape from")
    groups = Counter(zip(trace.step, trace.parent))  # (step, parent) -> children
    per_step = Counter(step for step, _ in groups)
    samples = _mode(groups.values())
    return SearchConfig(steps=len(per_step), parents_per_step=_mode(per_step.values()),
                        samples_per_parent=samples, overgen=1, k_per_parent=samples)


def recorded_shape(log, search_id: str) -> SearchConfig | None:
    """The shape the search's run recorded (``configuration.search`` of its run record), if it
    is one this version reads."""
    for run in log.runs:
        if str(run.get("search_id")) != str(search_id):
            continue
        shape = (run.get("configuration") or {}).get("search")
        if isinstance(shape, dict) and shape:
            try:
                return SearchConfig(**shape)
            except (TypeError, ValueError, GfsimError):
                return None  # not a shape this version knows: inferred instead
    return None


def shapes_for(log, traces: list[SearchTrace], search) -> list[tuple[SearchConfig, str]]:
    """(shape, where it came from) per trace: ``given`` (a ``SearchConfig`` for every
    search), ``recorded`` or ``inferred`` (``search`` None or an ``OwnShape``; the latter's
    fields override, and the source then says so)."""
    if isinstance(search, SearchConfig):
        check_memory(log, [t.search_id for t in traces], [search] * len(traces))
        return [(search, "given")] * len(traces)
    own = search if isinstance(search, OwnShape) else OwnShape()
    changed = sorted(own.overrides())
    out = []
    for t in traces:
        base = recorded_shape(log, t.search_id)
        source = "recorded" if base is not None else "inferred"
        if base is None:
            base = infer_shape(t)
        else:
            _check_supported(log, t, base, set(changed))
            if len(set(t.step)) < base.steps:  # a run stopped (or not yet resumed) early
                base = replace(base, steps=len(set(t.step)))
                source = "recorded, steps as logged"
        out.append((own.on(base), source + (f", {', '.join(changed)} given" if changed
                                            else "")))
    check_memory(log, [t.search_id for t in traces], [s for s, _ in out])
    return out


# What a closed-loop replay holds per candidate it draws, all searches of a log in lockstep:
# measured at 1.0-1.2 KB (36,000 to 360,000 candidates over 6 searches, one seed or four),
# doubled for what the estimate leaves out.
BYTES_PER_CANDIDATE = 2048


def drawn_candidates(shape: SearchConfig) -> int:
    """The most candidates a search of this shape draws: steps x parents x samples x F."""
    return shape.steps * shape.parents_per_step * shape.children_per_parent


def check_memory(log, search_ids: list[str], shapes: list[SearchConfig]) -> None:
    """Refuse, in one line and before any work, shapes whose candidates (``drawn_candidates``
    of every search, ``BYTES_PER_CANDIDATE`` each) would not fit the memory budget
    (``gfsim.core.memory``): 10^7 children per parent ran for a minute into a MemoryError."""
    from gfsim.core.inputs import size_text
    from gfsim.core.memory import budget_text, memory_budget_bytes

    if not shapes:
        return
    counts = [drawn_candidates(s) for s in shapes]
    need = sum(counts) * BYTES_PER_CANDIDATE
    if need <= memory_budget_bytes():
        return
    k = max(range(len(counts)), key=counts.__getitem__)
    raise GfsimError(
        f"{getattr(log, 'display_name', log)}: a replay beyond the memory budget: "
        f"{len(shapes)} search{'es' if len(shapes) != 1 else ''} closed loop would draw "
        f"{sum(counts):,} candidates (about {size_text(need)}; the largest, search "
        f"{search_ids[k]!r}, {describe(shapes[k].as_dict())}), above the {budget_text()}; "
        "a smaller `steps`, `samples_per_parent` or `overgen` fits it")


def _check_supported(log, trace: SearchTrace, shape: SearchConfig, given: set[str]) -> None:
    """Refuse a run record's shape that the search's own candidates contradict: a run logs
    every child it drew, so some expansion holds its samples x F children; a record claiming
    far more (10^4 samples x F 10^3 on a log of 4 per parent) is not believed. (Parents per
    step are left to the memory budget: a short run's one step may expand only the seed.)
    Fields the caller gives are not the record's, and are not checked."""
    if not len(trace):
        return
    groups = Counter(zip(trace.step, trace.parent))
    held = max(groups.values())
    if not given & {"samples_per_parent", "overgen"} and shape.children_per_parent > held:
        raise GfsimError(
            f"{getattr(log, 'display_name', log)}: search {trace.search_id!r}: a shape the log "
            f"does not support: its run record says {shape.samples_per_parent:,} samples x F "
            f"{shape.overgen:,} = {shape.children_per_parent:,} children per parent, but no "
            f"expansion in the log holds more than {held:,} (give `samples_per_parent` and "
            "`overgen` to replay another)")


def evidence_pairs(trace: SearchTrace) -> int:
    """Logged (parent, child) pairs with a measured parent and a known fate (evaluated, or a
    generation that failed): what fallback and model draws are made from."""
    n = 0
    for i, p in enumerate(trace.parent):
        parent_speedup = trace.seed_speedup if p < 0 else trace.speedup[p]
        known = trace.outcome[i] is not None or bool(trace.gen_failed[i])
        if known and parent_speedup == parent_speedup and parent_speedup > 0:
            n += 1
    return n


@dataclass(frozen=True)
class Reproduction:
    """How PUCT replays a logged search of ``logged`` candidates under ``all`` at F = 1 in its
    own shape with only its logged children: it drew ``drawn`` children, ``own`` of them the
    log's own for that node and expansion. It reproduces the search when it drew exactly the
    logged candidates, each as its own: PUCT chose the logged parents at every step."""

    search_id: str
    logged: int
    drawn: int
    own: int
    pairs: int  # evidence_pairs

    @property
    def reproduced(self) -> bool:
        return self.drawn == self.logged and self.own == self.drawn

    def as_dict(self) -> dict:
        return {"reproduced": self.reproduced, "logged": self.logged, "own_draws": self.own,
                "draws": self.drawn, "evidence_pairs": self.pairs}


def reproductions(traces: list[SearchTrace], shapes: list[SearchConfig],
                  model) -> list[Reproduction]:
    """``Reproduction`` of each trace in its shape, kept on the trace (a tuning run asks for
    it on every trial; it depends on the trace and the shape only)."""
    from gfsim.policies.simple import AllPolicy
    from gfsim.simulator.budget import Budget
    from gfsim.simulator.closed.fast import fast_search, run_lockstep
    from gfsim.simulator.world_model import OwnChildren

    out: list[Reproduction | None] = []
    todo = []
    for t, shape in zip(traces, shapes):
        shape = replace(shape, overgen=1)
        got = on_object(t, "_reproduction", dict).get(shape)
        out.append(got)
        if got is None:
            todo.append((len(out) - 1, t, shape))
    if todo:
        runs = [fast_search(OwnChildren(t), shape, AllPolicy(), model, model.capacities,
                            Budget(), 0, search_id=t.search_id, task_id=t.task_id,
                            forecast_frame=t.forecast_frame, bin_edges=t.bin_edges)
                for _, t, shape in todo]
        for (k, t, shape), res in zip(todo, run_lockstep(runs)):
            draws = res.extra["draws"]
            got = Reproduction(t.search_id, len(t), sum(draws.values()), draws["own"],
                               evidence_pairs(t))
            on_object(t, "_reproduction", dict)[shape] = out[k] = got
    return out
