"""Importers of other packages: ``gfsim import plugin NAME SOURCE -o OUT``.

An importer plug-in is a function ``(source: Path, **options: str) -> list[dict]`` that reads
another tool's run and returns a log's records, header first (the schema of
``docs/reference/log-format.md``; ``gfsim.testing.LogBuilder`` builds them). gfsim writes them,
checks them as a log and keeps the file only if they validate, so an import leaves a whole log
or nothing, as gfsim's own importers do. Register one with ``register_importer`` or the
``gfsim.importers`` entry point (``gfsim.core.plugins``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gfsim.core.errors import GfsimError, SpecError
from gfsim.core.plugins import PluginError, Registry

__all__ = ["BUILTIN", "IMPORTERS", "import_with", "register_importer"]

# gfsim's own importers: `gfsim import NAME` subcommands (a plug-in cannot take their names).
BUILTIN = ("kernel-tuner", "search", "openevolve", "shinka", "kernelbench",
           "gpu-forecasters-events", "gpu-forecasters-eval-set", "plugin")


def _importer(name: str | None, fn) -> str:
    if name is None:
        raise PluginError(f"importer plug-in {fn!r}: give it a name")
    if name in BUILTIN:
        raise PluginError(f"importer plug-in {fn!r}: {name!r} names gfsim's own importer")
    if not callable(fn):
        raise PluginError(f"importer plug-in {name!r}: not callable (an importer is a function "
                          "of the source path and string options returning records)")
    return name


IMPORTERS = Registry("gfsim.importers", "importer", {}, check=_importer)


def register_importer(name: str, fn, *, replace: bool = False):
    """Make ``fn`` the importer ``gfsim import plugin NAME`` runs; returns it."""
    IMPORTERS.register(fn, name, replace=replace)
    return fn


def import_with(name: str, source: str | Path, out: str | Path,
                options: dict[str, str] | None = None) -> dict:
    """Run importer plug-in ``name`` on ``source`` with ``options`` and write its records to
    ``out`` (all or nothing); returns the summary ``gfsim import`` prints."""
    from gfsim.importers.common import write_validated

    if name not in IMPORTERS:
        known = ", ".join(IMPORTERS) or "none installed"
        raise SpecError(f"unknown importer plug-in {name!r}; plug-ins: {known} (gfsim's own "
                        f"are subcommands: gfsim import {{{','.join(BUILTIN[:-1])}}})")
    source, out = Path(source), Path(out)
    if not source.exists():
        raise GfsimError(f"{source}: no such file or folder")
    fn = IMPORTERS[name]
    try:
        records = fn(source, **(options or {}))
    except TypeError as exc:  # most likely an option it does not take
        raise GfsimError(f"importer {name!r} on {source}: {exc}") from None
    if not isinstance(records, (list, tuple)) or not records or \
            not all(isinstance(r, dict) for r in records):
        raise PluginError(f"importer {name!r} on {source}: it returned "
                          f"{type(records).__name__}, not a non-empty list of records (dicts)")
    write_validated(list(records), out, source)
    kinds = Counter(str(r.get("kind")) for r in records)
    return {"out": str(out), "source": str(source), "importer": name,
            "candidates": kinds.get("candidate", 0), "evaluations": kinds.get("evaluation", 0),
            "forecasts": kinds.get("forecast", 0)}
