"""A tunable-kernel world whose structure is not the landscape's: an NK fitness landscape.

SYNTHETIC. A kernel is a vector of ``sites`` discrete choices (think tile sizes, stages, a
loop order), each one of ``values`` options. Its log2 runtime is a sum of one contribution per
site that depends on that site and the next ``k`` (cyclically): epistasis, so that a change
helps or hurts depending on the rest of the kernel (Kauffman's NK model). A mutation changes
one site to another value (with probability ``p_two_sites``, two sites), so children of a good
kernel are near it, and the same kernel can be reached twice (its ``code_id`` is the choice
vector, so the archive sees the duplicate). Unlike the landscape there is no drift, no
reversion and no tree: every kernel's speed is a fixed function of what it is.

- contribution of site i = effect_scale * clip(StudentT(effect_df), +-4) in log2, one keyed
  table per (task, site); ``effect_df`` small gives heavy-tailed steps;
- a kernel whose neighbouring choices form an *illegal pair* (each pair of values of sites i,
  i + 1 is illegal with probability ``p_illegal_pair``) fails to compile; otherwise it fails at
  run time with probability ``p_runtime_error`` and gives wrong output with ``p_incorrect``
  (keyed by the kernel: the same kernel always fails the same way); a mutation returns no
  kernel with ``p_generation_failed``;
- speedup = 2 ** (log2 runtime of the task's reference choice - the kernel's) x LogNormal(0,
  ``measure_noise_sigma``), a fresh noise draw per measured node;
- forecasts from a what-if forecaster (``gfsim.forecasts.whatif``) of the stated quality,
  centred on the latent log2 speedup (a failed kernel's on its parent's);
- stage, generation and forecast times: the landscape's defaults (``gfsim.worlds.kit.Priors``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream, uniform
from gfsim.worlds.kit import KitNode, KitTask, KitWorld, Priors, node_id_of, whatif_of
from gfsim.worlds.landscape import GENERATION_FAILED

__all__ = ["NKParams", "NKWorld"]


@dataclass(frozen=True)
class NKParams:
    """ALL ASSUMPTIONS (SYNTHETIC): the shape of an NK world."""

    sites: int = 12
    values: int = 4
    k: int = 2
    effect_scale: float = 0.2
    effect_df: float = 3.0
    p_two_sites: float = 0.2
    p_illegal_pair: float = 0.04
    p_runtime_error: float = 0.04
    p_incorrect: float = 0.05
    p_generation_failed: float = 0.02
    measure_noise_sigma: float = 0.02
    forecaster: dict = dataclasses.field(
        default_factory=lambda: {"sigma": 0.7, "beta": 0.7, "temp": 1.0, "parse_fail": 0.01})

    def __post_init__(self):
        for name, lo, hi in (("sites", 2, 64), ("values", 2, 16), ("k", 0, 8)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise GfsimError(f"nk world: {name} must be a whole number in {lo}..{hi}, "
                                 f"got {v!r}")
        if self.k >= self.sites:
            raise GfsimError("nk world: k must be smaller than sites")
        for name in ("p_two_sites", "p_illegal_pair", "p_runtime_error", "p_incorrect",
                     "p_generation_failed"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v < 1.0):
                raise GfsimError(f"nk world: {name} must be in [0, 1), got {v!r}")
        for name in ("effect_scale", "effect_df", "measure_noise_sigma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 100.0) or (
                    name == "effect_df" and v < 0.5):
                raise GfsimError(f"nk world: {name} out of range, got {v!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class NKWorld(KitWorld):
    """``n_tasks`` NK tasks drawn from ``seed`` (see the module docstring)."""

    _failed_reason = "synthetic: the mutator returned no kernel"

    def __init__(self, params: NKParams | None = None, seed: int = 0, n_tasks: int = 2):
        self.seed = self._check_seed(seed)
        self.params = p = params if params is not None else NKParams()
        self.priors = Priors()
        self.whatif = whatif_of(p.forecaster, self.seed)
        self.tasks: list[KitTask] = []
        self._tables: dict[str, np.ndarray] = {}
        self._illegal: dict[str, np.ndarray] = {}
        self._ref: dict[str, float] = {}
        self._roots: dict[str, KitNode] = {}
        # The tables as flat lists (C order), read a kernel at a time: numpy's per-element
        # indexing was most of a child's cost. Same values, same order of additions.
        self._flat: dict[str, tuple[list, list]] = {}
        # (task, choices) -> [log2 speedup, illegal, code id, failure draw (once needed)]
        self._kernels: dict[tuple, list] = {}
        width = max(2, len(str(n_tasks - 1)))
        for i in range(int(n_tasks)):
            tid = f"nk-{i:0{width}d}"
            rng = stream(self.seed, "nk-task", tid)
            shape = (p.sites,) + (p.values,) * (p.k + 1)
            t = rng.standard_t(p.effect_df, size=shape) if math.isfinite(p.effect_df) \
                else rng.standard_normal(shape)
            self._tables[tid] = p.effect_scale * np.clip(t, -4.0, 4.0)
            self._illegal[tid] = rng.random((p.sites, p.values, p.values)) < p.p_illegal_pair
            self._flat[tid] = (self._tables[tid].ravel().tolist(),
                               self._illegal[tid].ravel().tolist())
            ref_ns = float(round(20_000.0 * math.exp(0.8 * rng.standard_normal()), 3))
            reference = self._legal_config(tid, rng)
            root = self._legal_config(tid, rng)
            self._ref[tid] = self._log2_runtime(tid, reference)
            log2_s = self._ref[tid] - self._log2_runtime(tid, root)
            seed_speedup = float(f"{2.0 ** log2_s:.6g}")
            self.tasks.append(KitTask(
                tid, f"SYNTHETIC NK task {i}: {p.sites} choices x {p.values} values, "
                     f"epistasis k={p.k}; nothing was measured", ref_ns, seed_speedup))
            self._roots[tid] = KitNode(f"{tid}-root", tid, None, 0, _code(root), root,
                                       math.log2(seed_speedup), None, "success", seed_speedup)
        self._index_tasks()

    # --- the model -----------------------------------------------------------------------

    def _legal_config(self, tid: str, rng) -> tuple:
        p = self.params
        for _ in range(10_000):
            x = tuple(int(v) for v in rng.integers(0, p.values, p.sites))
            if not self._has_illegal(tid, x):
                return x
        raise GfsimError("nk world: p_illegal_pair leaves no legal kernel")

    def _has_illegal(self, tid: str, x: tuple) -> bool:
        """Whether a neighbouring pair of choices is illegal (``_illegal[tid][i, x[i],
        x[i + 1]]`` for some site i, cyclically)."""
        ill, v, n = self._flat[tid][1], self.params.values, len(x)
        return any(ill[(i * v + x[i]) * v + x[(i + 1) % n]] for i in range(n))

    def _log2_runtime(self, tid: str, x: tuple) -> float:
        """The sum over sites i of ``_tables[tid][i, x[i], ..., x[i + k]]`` (cyclically), added
        in site order."""
        tab, v, n, k = self._flat[tid][0], self.params.values, len(x), self.params.k
        total = 0.0
        for i in range(n):
            at = i
            for j in range(k + 1):
                at = at * v + x[(i + j) % n]
            total += tab[at]
        return total

    # --- the World protocol (the rest is KitWorld's) --------------------------------------

    def child(self, parent: KitNode, index: int) -> KitNode:
        index = self._check_child(parent, index)
        p, tid = self.params, parent.task_id
        nid = node_id_of(tid, parent.node_id, index)
        rng = stream(self.seed, tid, parent.node_id, index)
        u = rng.random(3)
        sites = rng.permutation(p.sites)[:2 if u[0] < p.p_two_sites else 1]
        shifts = rng.integers(1, p.values, 2)
        x = list(parent.state)
        for s, d in zip(sites, shifts):
            x[s] = (x[s] + int(d)) % p.values
        x = tuple(x)
        gen_s, stage = self.priors.draw_times(self.seed, nid)
        kernel = self._kernels.get((tid, x))
        if kernel is None:  # what the kernel is: fixed by its choices, reached many times
            kernel = self._kernels[(tid, x)] = [self._ref[tid] - self._log2_runtime(tid, x),
                                                self._has_illegal(tid, x), _code(x), None]
        log2_s, illegal, code, v = kernel
        if u[1] < p.p_generation_failed:
            outcome = GENERATION_FAILED
        elif illegal:
            outcome = "compile_failed"
        else:
            if v is None:  # keyed by the kernel: drawn once per kernel
                v = kernel[3] = uniform(self.seed, "nk-fail", tid, code)
            outcome = ("runtime_error" if v < p.p_runtime_error else
                       "incorrect" if v < p.p_runtime_error + p.p_incorrect else "success")
        speedup = None
        if outcome == "success":
            noise = math.exp(p.measure_noise_sigma * float(rng.standard_normal()))
            speedup = float(f"{2.0 ** log2_s * noise:.6g}")
        return KitNode(nid, tid, parent.node_id, parent.depth + 1, code, x, log2_s,
                       parent.log2_speedup, outcome, speedup, stage, gen_s)

    def provenance(self) -> dict:
        return {"kind": "synthetic", "world": "nk",
                "note": ("SYNTHETIC: an NK world (gfsim.worlds.nk); nothing was generated by "
                         "an LLM or measured on a GPU; every parameter is an assumption"),
                "seed": self.seed, "params": self.params.as_dict(),
                "forecaster": self.whatif.name, "priors": self.priors.as_dict()}


_HEX = "0123456789abcdef"  # a choice is one hex digit: values <= 16


def _code(x: tuple) -> str:
    return "nk:" + "".join([_HEX[v] for v in x])
