"""Numbers as a person reads them: seconds in the unit that fits their size, dollars with the
cents a small figure needs, energy in J, kJ or kWh. A row that compares several figures (a
policy, its baseline, their difference; an interval) takes one unit from the first, so they
read side by side."""

from __future__ import annotations

import math

__all__ = ["duration_unit", "duration", "usd", "energy_unit", "energy", "signed"]

# (unit, its size, the smallest figure it is used for): hours up to 4 days, as compute is
# usually counted in hours
_DURATIONS = (("d", 86400.0, 4 * 86400.0), ("h", 3600.0, 3600.0), ("min", 60.0, 60.0),
              ("s", 1.0, 1.0), ("ms", 1e-3, 0.0))
_ENERGIES = (("kWh", 3.6e6, 3.6e6), ("kJ", 1e3, 1e3), ("J", 1.0, 0.0))


def _fit(x: float, units, zero: str) -> tuple[str, float]:
    a = abs(x)
    if not math.isfinite(a) or a == 0:
        return next((name, size) for name, size, _ in units if name == zero)
    for name, size, smallest in units:
        if a >= smallest:
            return name, size
    return units[-1][:2]


def _num(v: float) -> str:
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if a >= 0.01 or a == 0 else f"{v:.2g}"


def duration_unit(seconds: float) -> tuple[str, float]:
    """The unit ``seconds`` reads best in: (name, seconds per unit); 0 reads in s."""
    return _fit(seconds, _DURATIONS, "s")


def _in_unit(x: float, unit: tuple[str, float]) -> str:
    return f"{_num(x / unit[1])} {unit[0]}" if math.isfinite(x) else str(x)


def duration(seconds: float, unit: tuple[str, float] | None = None) -> str:
    """``5400`` -> ``1.50 h``; ``42`` -> ``42.0 s``; ``0.004`` -> ``4.00 ms``."""
    return _in_unit(seconds, unit or duration_unit(seconds))


def usd(x: float) -> str:
    """Dollars: cents from $0.01 on, two significant digits below it, thousands separated."""
    if not math.isfinite(x):
        return str(x)
    a = abs(x)
    body = f"{a:,.2f}" if a >= 0.01 or a == 0 else f"{a:.2g}"
    return f"-${body}" if x < 0 else f"${body}"


def energy_unit(joules: float) -> tuple[str, float]:
    return _fit(joules, _ENERGIES, "J")


def energy(joules: float, unit: tuple[str, float] | None = None) -> str:
    """``7.2e6`` -> ``2.00 kWh``; ``350`` -> ``350 J``."""
    return _in_unit(joules, unit or energy_unit(joules))


def signed(text: str, value: float) -> str:
    """A difference with its sign: ``+1.50 h``, ``-$0.20`` (a minus is already there)."""
    return ("+" + text) if value > 0 else text
