"""Variant spaces: a kernel family's points and the wide mutation operator's neighbourhood.

A space is ``{variant: {parameter: (value, ...)}}`` with ``defaults[variant]`` a valid point of
each variant; a point is ``(variant, params)``. The Triton tasks (``gfsim.live.tasks``) define
their spaces this way, and a measured world (``gfsim.worlds.measured``) reads its table's space
from the table's header, so both walk the same neighbourhood without the world importing the
live layer.

The neighbourhood of a point (``neighbours``): (1) its variant with one to ``same`` of its
tunable parameters changed, each to any other value of its list, and (2) every other variant
(an algorithmic rewrite) with the point's parameters carried over (``project``) and up to
``switch`` of that variant's parameters then changed to any other value. Distinct points only,
the point itself never, in a fixed order.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping

__all__ = ["SAME_VARIANT_CHANGES", "SWITCH_CHANGES", "points", "project", "neighbours",
           "point_key"]

SAME_VARIANT_CHANGES = 2
SWITCH_CHANGES = 2

Space = Mapping[str, Mapping[str, tuple]]


def point_key(variant: str, params: Mapping) -> str:
    """A point's identity as text: the variant and its parameters' canonical JSON."""
    return f"{variant}:{json.dumps(dict(params), sort_keys=True)}"


def points(space: Space) -> Iterator[tuple[str, dict]]:
    """Every point, variant by variant, each variant's grid in its parameters' order."""
    for variant, grid in space.items():
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            yield variant, dict(zip(keys, values))


def project(space: Space, defaults: Mapping, params: Mapping, variant: str) -> dict:
    """``params`` carried over to ``variant``: a shared parameter keeps its value where that
    value is valid there; every other parameter takes the variant's default."""
    return {k: (params[k] if params.get(k) in vals else defaults[variant][k])
            for k, vals in space[variant].items()}


def _changes(grid: Mapping, base: dict, most: int) -> Iterator[dict]:
    keys = [k for k in grid if len(grid[k]) > 1]
    for r in range(1, most + 1):
        for combo in itertools.combinations(keys, r):
            options = [[v for v in grid[k] if v != base[k]] for k in combo]
            for values in itertools.product(*options):
                yield {**base, **dict(zip(combo, values))}


def neighbours(space: Space, defaults: Mapping, variant: str, params: Mapping,
               same: int = SAME_VARIANT_CHANGES,
               switch: int = SWITCH_CHANGES) -> list[tuple[str, dict]]:
    """The neighbourhood of ``(variant, params)`` (module docstring)."""
    params = dict(params)
    out: dict[str, tuple[str, dict]] = {point_key(variant, params): None}

    def add(v: str, p: dict) -> None:
        out.setdefault(point_key(v, p), (v, p))

    for p in _changes(space[variant], params, same):
        add(variant, p)
    for other in space:
        if other == variant:
            continue
        base = project(space, defaults, params, other)
        add(other, base)
        for p in _changes(space[other], base, switch):
            add(other, p)
    del out[point_key(variant, params)]
    return list(out.values())
