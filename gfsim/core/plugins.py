"""Named plug-ins: what a spec's name can mean, gfsim's own and other packages'.

A ``Registry`` maps names to objects (a policy class, a cost-model factory, a world factory)
for one kind of plug-in. gfsim fills it with its own; another package adds its own in two ways:

- ``register_policy(MyPolicy)`` and its siblings, called from code (a notebook, a test, a
  script run before gfsim is used);
- an entry point in its package metadata, found the first time a name is looked up that gfsim
  does not know, or when the names are listed::

      [project.entry-points."gfsim.policies"]
      coin = "my_package.policies:CoinPolicy"

The entry-point groups are ``gfsim.policies``, ``gfsim.forecasters``, ``gfsim.cost_models``,
``gfsim.worlds`` and ``gfsim.importers`` (``GROUPS``). A plug-in cannot take a name gfsim
already uses; a broken entry point is an error that names it, raised when it is first needed,
not when gfsim starts.
``docs/how-to/write-a-plugin.md`` shows a whole plug-in package, ``examples/plugin`` its code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gfsim.core.errors import GfsimError

__all__ = ["GROUPS", "PluginError", "Registry"]

GROUPS = ("gfsim.policies", "gfsim.forecasters", "gfsim.cost_models", "gfsim.worlds",
          "gfsim.importers")


class PluginError(GfsimError):
    """A plug-in that cannot be registered or loaded (the message names it)."""


class Registry(Mapping):
    """The plug-ins of one kind: name -> object, gfsim's own first (``builtin``), then those
    registered in code or found through the entry-point ``group``. A read-only mapping; add
    with ``register``. ``check`` (optional) vets an object before it is added and returns the
    name it goes by (None: the name given)."""

    def __init__(self, group: str, kind: str, builtin: Mapping[str, Any],
                 check: Callable[[str | None, Any], str] | None = None):
        self.group, self.kind = group, kind
        self._items: dict[str, Any] = dict(builtin)
        self._builtin = frozenset(self._items)
        self._check = check
        self._loaded = False

    def register(self, obj: Any, name: str | None = None, *, replace: bool = False) -> str:
        """Add ``obj`` under ``name`` (or the name ``check`` reads off it); returns the name.
        A name gfsim uses itself is refused; another plug-in's only with ``replace``."""
        if self._check is not None:
            name = self._check(name, obj)
        if not isinstance(name, str) or not name or any(c in name for c in ":,=@ \t\n"):
            raise PluginError(f"{self.kind} plug-in {obj!r}: its name must be a non-empty word "
                              f"without ':', ',', '=', '@' or spaces, got {name!r}")
        if name in self._builtin:
            raise PluginError(f"{self.kind} plug-in {obj!r}: {name!r} names gfsim's own "
                              f"{self.kind}; choose another name")
        if name in self._items and self._items[name] is not obj and not replace:
            raise PluginError(f"{self.kind} plug-in {obj!r}: {name!r} is taken by "
                              f"{self._items[name]!r} (register(..., replace=True) to "
                              "replace it)")
        self._items[name] = obj
        return name

    def unregister(self, name: str) -> None:
        """Remove a plug-in (not one of gfsim's own)."""
        if name in self._builtin:
            raise PluginError(f"{name!r} names gfsim's own {self.kind}")
        self._items.pop(name, None)

    def _load_entry_points(self) -> None:
        """Every entry point of ``group``, registered once (broken ones at first use)."""
        if self._loaded:
            return
        self._loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            if ep.name not in self._items:
                self._items[ep.name] = _Deferred(ep, self)

    def __getitem__(self, name: str) -> Any:
        if name not in self._items:
            self._load_entry_points()
        got = self._items[name]
        if isinstance(got, _Deferred):
            got = got.load()
        return got

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self._load_entry_points()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self._load_entry_points()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._load_entry_points()
        return len(self._items)

    def builtin(self, name: str) -> bool:
        """Whether ``name`` is one of gfsim's own."""
        return name in self._builtin

    def builtins(self) -> list[str]:
        """gfsim's own names, in their order."""
        return [n for n in self._items if n in self._builtin]


class _Deferred:
    """An entry point not yet imported: imported, checked and registered when first needed."""

    def __init__(self, ep, registry: Registry):
        self.ep, self.registry = ep, registry

    def __repr__(self) -> str:
        return f"entry point {self.ep.name} = {self.ep.value} (group {self.registry.group})"

    def load(self) -> Any:
        reg = self.registry
        where = f"entry point {self.ep.name} = {self.ep.value} (group {reg.group})"
        try:
            obj = self.ep.load()
        except Exception as exc:  # another package's import: any error is theirs, named
            raise PluginError(f"{reg.kind} plug-in {where}: importing it failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        try:
            name = reg._check(self.ep.name, obj) if reg._check is not None else self.ep.name
            if name != self.ep.name:
                raise PluginError(f"the object is named {name!r}, not {self.ep.name!r}")
            del reg._items[self.ep.name]
            try:
                reg.register(obj, self.ep.name)
            except PluginError:
                reg._items[self.ep.name] = self
                raise
        except PluginError as exc:
            raise PluginError(f"{where}: {exc}") from None
        return obj
