"""The ``World`` protocol: what a closed-loop search can ask of the world it searches.

A world stands for the real thing a kernel search runs against: an LLM that proposes mutations
of a kernel and a GPU that measures them. gfsim uses a world two ways: to *log* a standard
search (``gfsim synth --world``), and to run any policy and overgeneration factor *directly*
on it, as the truth a replay of that log is checked against (``gfsim counterfactual``). The
synthetic landscape (``gfsim.worlds.landscape``) is one world; ``gfsim.worlds.nk`` and
``gfsim.worlds.kernel_tuner`` are two more; a user can bring their own (``MODULE:NAME``, a
``.py`` file, or a plug-in's name: ``register_world``, the ``gfsim.worlds`` entry point).

A world has tasks and a keyed tree of kernels per task:

- ``tasks``: a sequence of task objects with ``task_id`` (str), ``seed_speedup`` (the seed
  kernel's speedup over the task's reference, > 0), ``reference_runtime_ns`` (> 0) and
  ``header_entry()`` (the task's entry in a log header: at least those three fields);
- ``task(task_id)``: the task with that id;
- ``root(task_id)``: the seed kernel, a node whose outcome is ``success`` at ``seed_speedup``;
- ``child(parent, index)``: the ``index``-th mutation of ``parent`` (index a whole number >= 0).
  *Keyed*: the same (parent, index) gives the same child whatever was asked before and in
  whatever order; gfsim asks for index ``replicate * 1_000_000 + expansion * 1000 + slot``, so
  a new replicate is a fresh set of LLM draws from the same parents;
- ``generation(node)``: the candidate's ``generation`` record fields (``service_s``, and
  ``failed_reason`` when the mutator returned no kernel; optionally ``input_tokens`` and
  ``output_tokens``);
- ``forecast(node, forecaster, repeat)``: a ``forecast`` record (schema v1: ``probs`` over the
  paper's 8 bins relative to the reference, ``parse_failed``, ``latency_s``, tokens);
- ``evaluation(node)``: an ``evaluation`` record (``outcome``; on success ``speedup`` and
  ``runtime_ns`` = reference runtime / speedup; stage seconds ``cold_start_s``, ``compile_s``,
  ``check_s``, ``timing_s``, ``wall_s``);
- optionally ``describe(node)``: what the kernel is, written as the candidate record's
  ``source_meta`` (a measured world gives its variant, parameters and compile features, which
  the cost-model forecaster reads);
- ``provenance()``: a dict for the log header: ``kind`` (``synthetic`` or ``measured``), a
  ``note`` saying what in the world is real and what is assumed, and anything else worth keeping.

A node has ``node_id`` (unique in the world: distinct paths give distinct ids), ``task_id``,
``parent_id`` (None at the root), ``outcome`` (a schema outcome, or ``generation_failed``) and
``speedup`` (the measured speedup of a success, else None); optionally ``code_id``, the
kernel's identity for the archive's duplicate check (default: ``node_id``, every node a new
kernel).

A world is loaded by ``--world SPEC``: a built-in name (``gfsim counterfactual --list-worlds``),
``kernel-tuner:CACHE[,CACHE...]``, ``h200:TASK[,TASK...]`` (a measured world,
``gfsim.worlds.measured``), or ``PATH.py:NAME`` / ``module:NAME`` where ``NAME`` is a
world or a callable taking ``seed=`` that makes one (a callable gives a different world per seed;
an instance is one world whatever the seed). ``gfsim.worlds.conformance.check_world`` is the
test every world must pass (keyed determinism, record fields, units).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gfsim.core.errors import GfsimError
from gfsim.core.plugins import PluginError, Registry

__all__ = ["World", "WorldNode", "WorldTask", "WorldFactory", "WORLDS", "register_world",
           "resolve_world", "code_id",
           "REPLICATE_STRIDE", "EXPANSION_STRIDE"]

EXPANSION_STRIDE = 1000  # child index = replicate * REPLICATE_STRIDE + expansion * 1000 + slot
REPLICATE_STRIDE = 1_000_000


@runtime_checkable
class WorldTask(Protocol):
    task_id: str
    seed_speedup: float
    reference_runtime_ns: float

    def header_entry(self) -> dict: ...


@runtime_checkable
class WorldNode(Protocol):
    node_id: str
    task_id: str
    parent_id: str | None
    outcome: str
    speedup: float | None


@runtime_checkable
class World(Protocol):
    """See the module docstring for what each method must return."""

    @property
    def tasks(self) -> Sequence[Any]: ...

    def task(self, task_id: str) -> Any: ...

    def root(self, task_id: str) -> Any: ...

    def child(self, parent: Any, index: int) -> Any: ...

    def generation(self, node: Any) -> dict: ...

    def forecast(self, node: Any, forecaster: str = ..., repeat: int = 0) -> dict: ...

    def evaluation(self, node: Any) -> dict: ...

    def provenance(self) -> dict: ...


WorldFactory = Callable[[int], World]


def code_id(node) -> str:
    """The kernel identity the archive's duplicate check compares."""
    return getattr(node, "code_id", None) or node.node_id


def _as_factory(obj, spec: str) -> tuple[WorldFactory, bool]:
    """(factory, whether the seed changes the world)."""
    if not inspect.isclass(obj) and isinstance(obj, World):
        return (lambda seed: obj), False
    if callable(obj):
        def make(seed: int, _f=obj):
            try:
                world = _f(seed=seed)
            except TypeError as exc:
                raise GfsimError(f"`world` {spec}: calling it with seed={seed} failed: "
                                 f"{exc}") from None
            if not isinstance(world, World):
                raise GfsimError(f"`world` {spec}: {type(world).__name__} is not a world; "
                                 f"missing: {', '.join(_missing(world))}")
            return world
        return make, True
    raise GfsimError(f"`world` {spec}: {type(obj).__name__} is neither a world nor a callable "
                     f"that makes one; missing: {', '.join(_missing(obj))}")


def _missing(obj) -> list[str]:
    need = ["tasks", "task", "root", "child", "generation", "forecast", "evaluation",
            "provenance"]
    return [n for n in need if not hasattr(obj, n)] or ["(attributes of the wrong kind)"]


def _load_object(spec: str):
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        from gfsim.worlds.family import world_names

        raise GfsimError(f"`world` {spec!r}: no such world; valid: a built-in name "
                         f"({', '.join(world_names())}), kernel-tuner:CACHE, h200:TASK, "
                         "PATH.py:NAME or module:NAME")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise GfsimError(f"`world` {spec}: {path}: no such file")
        mod_name = f"gfsim_user_world_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise GfsimError(f"`world` {spec}: {path}: not a Python file it can import")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:  # a user's file: any error is theirs, said in one line
                del sys.modules[mod_name]
                raise GfsimError(f"`world` {spec}: {path}: importing it failed: "
                                 f"{type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise GfsimError(f"`world` {spec}: cannot import module {target!r}: "
                             f"{type(exc).__name__}: {exc}") from None
    if not hasattr(module, name):
        raise GfsimError(f"`world` {spec}: {target} has no {name!r}")
    return getattr(module, name)


def _plugin_world(name: str | None, obj) -> str:
    from gfsim.worlds.family import is_builtin

    if name is None:
        raise PluginError(f"world plug-in {obj!r}: give it a name")
    if is_builtin(name) or name in ("h200", "kernel-tuner"):
        raise PluginError(f"world plug-in {obj!r}: {name!r} is one of gfsim's own worlds")
    if not callable(obj) and not isinstance(obj, World):
        raise PluginError(f"world plug-in {name!r}: {type(obj).__name__} is neither a world "
                          "nor a callable that makes one from a seed")
    return name


# Worlds of other packages (``register_world``, the ``gfsim.worlds`` entry point): a name -> a
# world, or a function of ``seed`` that makes one. gfsim's own are resolved before these.
WORLDS = Registry("gfsim.worlds", "world", {}, check=_plugin_world)


def register_world(name: str, world, *, replace: bool = False):
    """Make ``world`` (a ``World``, or a function ``seed -> World``) a world that ``--world``
    and ``gfsim.counterfactual`` name ``name``; returns it."""
    WORLDS.register(world, name, replace=replace)
    return world


def resolve_world(spec: str) -> tuple[str, WorldFactory, bool]:
    """(display name, factory seed -> World, whether the seed changes the world) for a
    ``--world`` spec (see the module docstring)."""
    from gfsim.worlds.family import builtin_factory, is_builtin

    if not isinstance(spec, str) or not spec.strip():
        raise GfsimError("`world`: empty spec")
    spec = spec.strip()
    if is_builtin(spec):
        return spec, builtin_factory(spec), True
    if ":" not in spec and "/" not in spec and not spec.endswith(".py") and spec in WORLDS:
        factory, seeded = _as_factory(WORLDS[spec], spec)
        return spec, factory, seeded
    if spec.startswith("kernel-tuner:"):
        from gfsim.worlds.kernel_tuner import KernelTunerWorld

        paths = [p for p in spec.partition(":")[2].split(",") if p]
        if not paths:
            raise GfsimError("`world` kernel-tuner: needs a cache path, kernel-tuner:FILE")
        KernelTunerWorld.check_paths(paths)
        return spec, (lambda seed: KernelTunerWorld(paths, seed=seed)), True
    if spec.startswith("h200:"):
        from gfsim.worlds.measured import MeasuredWorld, find_table

        names = [p for p in spec.partition(":")[2].split(",") if p]
        if not names:
            raise GfsimError("`world` h200: needs a task, h200:TASK (shipped: gfsim "
                             "counterfactual `list_worlds`) or h200:PATH/TASK.jsonl.gz")
        for n in names:
            find_table(n)
        return spec, (lambda seed: MeasuredWorld(names, seed=seed)), True
    factory, seeded = _as_factory(_load_object(spec), spec)
    return spec, factory, seeded
