"""The spec grammar shared by policies, budgets and capacities: ``NAME``, ``NAME:VALUE`` or
``NAME:key=value,...``. A bare value binds the first parameter; unknown keys are errors that
list the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gfsim.core.errors import SpecError

__all__ = ["Param", "parse_spec", "parse_kv", "bind_params", "format_spec"]


@dataclass(frozen=True)
class Param:
    """One parameter of a registered component: name, type, default and a one-line help."""

    name: str
    kind: type | tuple[str, ...]  # float, int, str, bool, or a tuple of allowed strings
    default: Any
    help: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the minimum itself is excluded (a fraction that must be > 0)

    def convert(self, raw: str | Any, owner: str) -> Any:
        kind = self.kind
        if isinstance(kind, tuple):
            if raw not in kind:
                raise SpecError(
                    f"{owner}: {self.name}={raw!r} is not one of: {', '.join(kind)}"
                )
            return raw
        try:
            if kind is bool:
                value = _to_bool(raw)
            elif kind is int:
                value = int(raw)
            elif kind is float:
                value = float(raw)
            else:
                value = kind(raw)
        except (TypeError, ValueError):
            raise SpecError(f"{owner}: {self.name}={raw!r} is not a valid "
                            f"{kind.__name__}") from None
        if kind in (int, float):
            if value != value:  # NaN
                raise SpecError(f"{owner}: {self.name} must be a number, got {raw!r}")
            self._check_range(value, owner)
        return value

    def _check_range(self, value: float, owner: str) -> None:
        """Refuse a value outside [low, high] (low excluded with ``low_open``), naming the range."""
        span = self.valid_range()
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            word = "not above" if self.low_open else "below"
            raise SpecError(f"{owner}: {self.name}={value} is {word} its minimum {self.low}{span}")
        if self.high is not None and value > self.high:
            raise SpecError(f"{owner}: {self.name}={value} is above its maximum "
                            f"{self.high}{span}")

    def valid_range(self) -> str:
        """The valid range in words, e.g. " (range 0 to 1)", " (valid: k >= 1)"."""
        if self.low is not None and self.high is not None:
            excluded = f", {self.low:g} excluded" if self.low_open else ""
            return f" (range {self.low:g} to {self.high:g}{excluded})"
        if self.low is not None:
            return f" (valid: {self.name} {'>' if self.low_open else '>='} {self.low:g})"
        if self.high is not None:
            return f" (valid: {self.name} <= {self.high:g})"
        return ""


def _to_bool(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def parse_kv(text: str, what: str) -> list[tuple[str | None, str]]:
    """Split ``a=1,b=2`` (or a bare ``1``) into pairs; a bare value has key None."""
    pairs: list[tuple[str | None, str]] = []
    if not text.strip():
        return pairs
    for i, item in enumerate(text.split(",")):
        item = item.strip()
        if not item:
            raise SpecError(f"{what}: empty item in {text!r}")
        if "=" in item:
            key, _, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not key or not value:
                raise SpecError(f"{what}: expected key=value, got {item!r}")
            pairs.append((key, value))
        elif i == 0:
            pairs.append((None, item))
        else:
            raise SpecError(f"{what}: only the first item may be a bare value, got {item!r}")
    return pairs


def parse_spec(spec: str) -> tuple[str, list[tuple[str | None, str]]]:
    """``threshold:tau=0.7,score=margin`` -> ("threshold", [("tau", "0.7"),
    ("score", "margin")])."""
    if spec is None or not str(spec).strip():
        raise SpecError("empty spec")
    name, _, rest = str(spec).strip().partition(":")
    name = name.strip()
    if not name:
        raise SpecError(f"spec {spec!r} has no name")
    return name, parse_kv(rest, name)


def bind_params(owner: str, params: tuple[Param, ...], pairs) -> dict[str, Any]:
    """Bind parsed pairs to declared params; a bare value binds the first one."""
    by_name = {p.name: p for p in params}
    values: dict[str, Any] = {}
    for key, raw in pairs:
        if key is None:
            if not params:
                raise SpecError(f"{owner} takes no parameters, got {raw!r}")
            key = params[0].name
        if key not in by_name:
            valid = ", ".join(by_name) or "(none)"
            raise SpecError(f"{owner}: unknown parameter {key!r}; valid: {valid}")
        if key in values:
            raise SpecError(f"{owner}: parameter {key!r} given twice")
        values[key] = by_name[key].convert(raw, owner)
    return values


def format_spec(name: str, values: dict[str, Any]) -> str:
    if not values:
        return name
    return name + ":" + ",".join(f"{k}={v}" for k, v in values.items())
