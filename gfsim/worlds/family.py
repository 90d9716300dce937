"""The built-in family of worlds for the counterfactual benchmark (``gfsim counterfactual``).

The family lives in ``data/family.json``, committed before any model of counterfactual
children was built and frozen since (a test pins its hash): seven worlds that differ along the
axes a replay's honesty depends on (heavy vs light-tailed steps, strong vs no lineage drift,
high vs low failure rates, good, poor and overconfident forecasters), three kinds of structure
(the landscape, an NK world, real Kernel Tuner caches, shipped in ``data/kernel_tuner``) and two
seed splits: ``dev`` seeds are free for tuning and model choice, ``heldout`` seeds are for final
figures only.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from gfsim.core.errors import GfsimError

__all__ = ["family", "world_names", "is_builtin", "builtin_factory", "world_seeds", "SPLITS",
           "FAMILY"]

SPLITS = ("dev", "heldout")
FAMILY = "family"  # the --world spec that means every built-in world


@functools.lru_cache(maxsize=1)
def family() -> dict:
    """The frozen family file, parsed."""
    text = resources.files("gfsim.worlds").joinpath("data/family.json").read_text("utf-8")
    return json.loads(text)


def world_names() -> list[str]:
    return [w["name"] for w in family()["worlds"]]


def is_builtin(name: str) -> bool:
    return name in world_names()


def _entry(name: str) -> dict:
    for w in family()["worlds"]:
        if w["name"] == name:
            return w
    raise GfsimError(f"`world` {name!r}: no such built-in world; valid: "
                     f"{', '.join(world_names())}, {FAMILY}")


def builtin_factory(name: str):
    """seed -> the built-in world ``name`` drawn with that seed."""
    w = _entry(name)
    if w["kind"] == "landscape":
        from gfsim.worlds.landscape import Landscape, LandscapeParams

        params = LandscapeParams(**w["params"])
        return lambda seed: Landscape(params, seed, w["tasks"])
    if w["kind"] == "nk":
        from gfsim.worlds.nk import NKParams, NKWorld

        params = NKParams(**w["params"])
        return lambda seed: NKWorld(params, seed, w["tasks"])
    if w["kind"] == "kernel-tuner":
        from gfsim.worlds.kernel_tuner import KernelTunerWorld, shipped_cache_dir

        # The family's caches ship with it (package data): the frozen worlds read those
        # copies on any install, never a file of the same name elsewhere.
        caches = [str(shipped_cache_dir() / name) for name in w["caches"]]
        return lambda seed: KernelTunerWorld(caches, seed=seed, forecaster=w["forecaster"])
    raise GfsimError(f"family.json: world {name!r} has an unknown kind {w['kind']!r}")


def world_seeds(split: str, n: int) -> list[int]:
    """The first ``n`` world seeds of a split."""
    if split not in SPLITS:
        raise GfsimError(f"`split`: unknown split {split!r}; valid: {', '.join(SPLITS)}")
    first = int(family()["seeds"][split]["first"])
    return list(range(first, first + n))
