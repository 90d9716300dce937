"""The counterfactual benchmark: what ``gfsim counterfactual`` runs and prints."""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["counterfactual", "worlds"]

DEFAULT_POLICIES = "all,topk:4,threshold:0.7,threshold:coverage=0.5,ev:10"


def worlds() -> dict:
    """The benchmark's worlds: its frozen family (``gfsim.worlds.family.family()``: name, date,
    each world's kind and axes) and, as ``measured_tables``, the shipped H200 tables a world
    ``h200:TASK`` can name (not in the family)."""
    from gfsim.worlds.family import family
    from gfsim.worlds.measured import shipped_tables

    return {**family(), "measured_tables": list(shipped_tables())}


def counterfactual(world: str | Sequence[str] = ("family",), *,
                   policies: str | Sequence[str] = DEFAULT_POLICIES,
                   overgen: str | Sequence[int] = "1,2,4,8", seeds: int = 6,
                   split: str = "heldout", replay_seeds: int = 4, direct_reps: int = 2,
                   fresh_seeds: int = 6, steps: int = 40, cost: str = "serverless-a100",
                   children: str = "model", forecaster: str | None = None, jobs: int = 0,
                   cluster: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Log a standard search on each world, replay each (policy, F) from the log, run it
    directly on the world under the same budget, and measure how far the replay is off and
    whether its recommendation is right.

    Every keyword is the ``gfsim counterfactual`` option of the same name.

    Args:
        world: world specs: ``"family"`` (every built-in world), a built-in name,
            ``"kernel-tuner:CACHE"``, ``"h200:TASK"``, ``"PATH.py:NAME"``; a list or commas.
        policies: policy specs, a list or separated by ``;`` (or ``,`` between specs).
        overgen: the overgeneration factors compared, a list or ``"1,2,4"``.
        seeds: world seeds (>= 2: regret scores a pick on other seeds).
        jobs: processes (0: one per core).
        cluster: run the world seeds on a Ray cluster instead: ``"ray"`` (the one at
            ``$RAY_ADDRESS``) or ``"ray://HOST:PORT"``; the same results, seed for seed.
        progress: called as ``progress(done, total)`` as world seeds finish.

    Returns:
        What ``gfsim counterfactual --json`` prints: per world (``worlds``) the cells and
        its ``measures``: the rank agreement, the coverage of the predictive intervals, the
        recommendation's regret and each target asked and found (``measures["targets"]``);
        ``ran_on``: where the work ran.

    Examples:
        >>> import gfsim
        >>> out = gfsim.counterfactual("nk-light-fragile", policies=["all", "topk:2"],
        ...                            overgen=[1, 2], seeds=2, steps=4, replay_seeds=2,
        ...                            direct_reps=2, fresh_seeds=2, jobs=1)
        >>> first = out.get("worlds")[0]
        >>> sorted(first.get("measures").get("targets"))[:2]
        ['bias_interval', 'calibration']
    """
    from gfsim.core.errors import GfsimError
    from gfsim.worlds import benchmark as bm
    from gfsim.worlds.conformance import check_world
    from gfsim.worlds.family import family, world_names, world_seeds
    from gfsim.worlds.protocol import resolve_world

    world = [world] if isinstance(world, str) else list(world)
    if not isinstance(policies, str):
        policies = ";".join(policies)
    if not isinstance(overgen, str):
        overgen = ",".join(str(f) for f in overgen)
    sep = ";" if ";" in policies else ","
    specs = tuple(p.strip() for p in _split_policies(policies, sep) if p.strip())
    spec = bm.BenchSpec(policies=specs, overgens=_ints(overgen, "`overgen`"), steps=steps,
                        cost=cost, replay_seeds=replay_seeds, direct_reps=direct_reps,
                        children=children, forecaster=forecaster, fresh_seeds=fresh_seeds)
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy

    load_cost_model(cost)
    for p in specs:
        make_policy(p)
    if isinstance(seeds, bool) or seeds < 2:
        raise GfsimError(f"`seeds` must be >= 2 (regret scores a pick on other seeds), got "
                         f"{seeds}")
    names, optional = _world_specs(world)
    for name in names:  # every named world's spec, before any world is loaded
        if name not in optional:
            resolve_world(name)
    if any(name in world_names() for name in names):
        seed_list = world_seeds(split, seeds)
    else:
        seed_list = list(range(seeds))  # a user's world has no frozen split
    skipped = {}
    runnable = []
    for name in names:
        try:
            label, factory, _ = resolve_world(name)
            w0 = factory(seed_list[0])
        except GfsimError as exc:
            if name in optional:
                skipped[name] = str(exc)
                continue
            raise
        problems = check_world(w0, factory, seed=seed_list[0])
        if problems:
            raise GfsimError(f"`world` {name}: does not conform to the World protocol: "
                             + "; ".join(problems[:5]))
        runnable.append(name)
    if not runnable:
        raise GfsimError("no world could be loaded: " + "; ".join(skipped.values()))
    from gfsim.core.executor import make_executor

    n_jobs = jobs if jobs > 0 else bm.default_jobs()
    with make_executor(min(n_jobs, len(runnable) * len(seed_list)), cluster,
                       shared=spec) as executor:
        results = bm.run_benchmark(runnable, seed_list, spec, executor=executor,
                                   progress=progress)
        ran_on = executor.describe()
    out = {"benchmark": "gfsim counterfactual", "family": family()["family"],
           "split": split if seed_list[0] != 0 or split == "dev" else "user",
           "spec": spec.as_dict(), "world_seeds": seed_list, "worlds": results,
           "skipped": skipped,
           **({"against_fallback": bm.compare_sources(results)}
              if "fallback" in spec.children and len(spec.children) > 1 else {}),
           "note": _note(results), "ran_on": ran_on}
    return out


def _ints(text: str, option: str) -> tuple[int, ...]:
    from gfsim.core.errors import GfsimError

    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise GfsimError(f"{option}: expected whole numbers separated by commas, got "
                         f"{text!r:.80}") from None
    if not values:
        raise GfsimError(f"{option}: empty")
    return values


def _world_specs(values: list[str]) -> tuple[list[str], set[str]]:
    """The ``--world`` values (repeated, or separated by commas) as world specs in order,
    duplicates dropped, ``family`` expanded; and the set of those only ``family`` brought in
    (skipped, said, when they cannot load). A comma continues a ``kernel-tuner:`` or ``h200:``
    spec unless what follows is a built-in name or another spec:
    ``h200:softmax,layernorm,nk-heavy`` is two worlds."""
    from gfsim.core.errors import GfsimError
    from gfsim.worlds.family import FAMILY, world_names

    builtin = world_names()
    specs: list[str] = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            if ":" in part or part in builtin or part == FAMILY:
                specs.append(part)
            elif specs and specs[-1].startswith(("kernel-tuner:", "h200:")):
                specs[-1] += "," + part
            else:
                raise GfsimError(f"`world` {part!r}: no such world; valid: {FAMILY}, "
                                 f"{', '.join(builtin)}, kernel-tuner:CACHE, h200:TASK, "
                                 "PATH.py:NAME or module:NAME")
    if not specs:
        raise GfsimError("`world`: empty")
    named = [s for s in specs if s != FAMILY]
    if FAMILY in specs:
        specs = [n for s in specs for n in (world_names() if s == FAMILY else [s])]
    return list(dict.fromkeys(specs)), set(specs) - set(named)


def _note(results: list[dict]) -> str:
    kinds = {w["kind"] for w in results}
    if kinds == {"synthetic"}:
        return "SYNTHETIC worlds throughout. Intervals are over world seeds."
    return ("In a MEASURED world (Kernel Tuner caches, the H200 tables) the kernels' outcomes, "
            "runtimes and stage seconds are measurements; its searches' mutations, forecasts "
            "(what-if, unless --forecaster costmodel) and generation seconds are SYNTHETIC, as "
            "is every other world. Intervals are over world seeds.")


def _split_policies(text: str, sep: str) -> list[str]:
    """Policy specs separated by ';', or by ',' where a comma does not start a key=value of the
    previous spec (``threshold:coverage=0.5,ev:10`` is two specs)."""
    if sep == ";":
        return text.split(";")
    out: list[str] = []
    for part in text.split(","):
        if out and ":" not in part and "=" in part:
            out[-1] += "," + part
        else:
            out.append(part)
    return out
