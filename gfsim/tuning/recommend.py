"""Which configuration to run next time, judged against the incumbent (what the user does now).

A tuned optimum is the best of many noisy replays; on its own it says nothing about whether a
new search will do better than measuring every child at F = 1. ``recommendation`` answers that:

- every configuration (a policy spec and, under the puct driver, a search shape) and the
  incumbent are replayed on the same seeds (common random numbers), and, under the puct
  driver, simulated as new searches wholly on the world model fitted to the log (``fresh``
  children: each seed a new search like the logged one) on the same fresh seeds;
- a configuration's gain over the incumbent is the paired difference in log2 best speedup
  (per seed: the mean over the log's tasks; where no seed can change a replay, per task);
- the recommendation is, among the configurations whose expected gain is adoptable
  (``simulator.predictive.adoptable``: its one-sided lower bound above 0 at the level, or, for
  a large expected gain, of at least ``LARGE_GAIN`` log2, at ``LARGE_LEVEL``), the one with the
  largest mean of the expected gain and the replays' mean gain; else the incumbent, said so;
- for a recommendation other than the incumbent, the GPU-hour and forecast prices between
  which its mean gain stays above 0 (the break-even prices), found by replaying both at
  scaled prices under the same USD budget.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from gfsim.core.drivers import is_closed_loop
from gfsim.core.errors import GfsimError

__all__ = ["Config", "parse_config", "config_label", "recommendation", "PRICE_STEPS"]

# New searches simulated wholly on the world model per configuration, unless asked otherwise
# (gfsim recommend's --fresh-seeds, and gfsim tune's recommendation at most): the expected
# gain's error is mostly the world model's misfit (0.75 of one search's spread: predictive.
# EXPECTED_MISFIT), which more searches do not shrink; at 8 the sampling part is 18% of its
# variance, at 32 it would be 5%, for four times the searches.
NEW_SEARCHES = 8
PRICE_STEPS = (2.0, 4.0, 8.0)  # price factors tried each way from today's, before bisecting


@dataclass(frozen=True)
class Config:
    """A configuration: the policy spec and the puct search shape (None under trace)."""

    spec: str
    search: object | None
    label: str


def config_label(spec: str, search) -> str:
    """``threshold:0.7 F=2``; ``F=own`` where each search keeps its own overgeneration."""
    if search is None:
        return spec
    f = getattr(search, "overgen", None)
    return f"{spec} F={'own' if f is None else f}"


def parse_config(text, driver: str, base, *, what: str = "`incumbent`") -> Config:
    """``POLICY[@F]`` (F a whole number, or ``own``: each search's own), or ``log`` (measure
    every child, each search in its own shape: the logged search as it ran); or a ``Policy``,
    or a ``(policy, F)`` pair, whose policy is named by its ``spec()`` (the replays rebuild it
    by name: in worker processes, a plug-in's through its entry point). ``base``: the search
    shape the configurations share (``search_config``'s)."""
    from gfsim.policies import Policy, make_policy

    if isinstance(text, tuple) and len(text) == 2:
        policy, f = text
        text = f"{policy.spec() if isinstance(policy, Policy) else policy}@{f}"
    elif isinstance(text, Policy):
        text = text.spec()
    if not isinstance(text, str):
        raise GfsimError(f"{what}: expected POLICY[@F], a Policy or a (policy, F) pair, got "
                         f"{text!r}")
    text = text.strip()
    if text == "log":
        text = "all@own"
    spec, at, f = text.partition("@")
    if not spec:
        raise GfsimError(f"{what}: {text!r} names no policy (POLICY[@F], or log)")
    make_policy(spec)  # an unknown policy or a bad parameter fails here, by name
    if not is_closed_loop(driver):
        if at:
            raise GfsimError(f"{what}: {text!r}: @F (the overgeneration factor) only with "
                             "`driver` puct")
        return Config(spec, None, spec)
    search = base
    if at:
        if f == "own":
            if hasattr(base, "overrides"):  # OwnShape: back to each search's own F
                search = replace(base, overgen=None)
        else:
            try:
                n = int(f)
            except ValueError:
                n = 0
            if n < 1 or str(n) != f:
                raise GfsimError(f"{what}: {text!r}: F must be a whole number >= 1 or own")
            search = replace(base, overgen=n)
    return Config(spec, search, config_label(spec, search))


def _values(results, per_task: bool) -> np.ndarray:
    """log2 best speedup per seed (the mean over tasks), or per task of the one replay."""
    from gfsim.core import libm

    block = np.array([[s.best_speedup for s in r.searches] for r in results], dtype=float)
    logs = libm.log2(block)
    return logs[0] if per_task else logs.mean(axis=1)


def recommendation(setup, candidates: list[Config], incumbent: Config, seeds, *,
                   fresh_seeds=(), level: float | None = None, prices: bool = True,
                   jobs: int = 1, pool=None, replayed: dict | None = None) -> dict:
    """The recommendation among ``candidates`` against ``incumbent`` for ``setup`` (a
    ``TrialSetup``: log, cost model, driver, budget, children), replayed on ``seeds`` and, under
    the puct driver, simulated as new searches on ``fresh_seeds``. ``prices``: find the
    break-even GPU-hour and forecast prices of a recommendation other than the incumbent.
    ``jobs``: processes the configurations are replayed in (1: this one); the same answer,
    seed for seed, whatever their number. ``pool``: a ``SeedPool`` of ``setup``'s already
    running (``gfsim tune``'s, warm from its trials) to replay them in instead; it is left
    running. ``replayed``: filled with (spec, search) -> each configuration's ``metric_rows``
    on ``seeds`` (``gfsim tune``'s out-of-sample scores read them, not replays of their own)."""
    if jobs < 1:
        raise GfsimError(f"`jobs` must be >= 1, got {jobs}")
    configs = [incumbent] + [c for c in dict.fromkeys(candidates)
                             if (c.spec, c.search) != (incumbent.spec, incumbent.search)]
    own = None  # processes started here, ended here
    if pool is None and min(jobs, len(configs)) > 1:
        from gfsim.tuning.trials import SeedPool

        pool = own = SeedPool(setup, min(jobs, len(configs)))
    try:
        out = _recommendation(setup, configs, seeds, fresh_seeds, level, prices, pool,
                              replayed)
    except BaseException:  # (an error, or Ctrl-C: the configurations not yet begun are not)
        if own is not None:
            own.shutdown(cancel=True)
        raise
    if own is not None:
        own.shutdown()
    return out


def _recommendation(setup, configs: list[Config], seeds, fresh_seeds, level, prices,
                    pool, replayed: dict | None = None) -> dict:
    """``recommendation`` of ``configs`` (the incumbent first), in ``pool`` if not None."""
    from gfsim.simulator.predictive import (
        LARGE_GAIN,
        LARGE_LEVEL,
        LEVEL,
        adoptable,
        adopted,
        expected_gain,
        fresh_children,
        new_search_gain,
        predictive_interval,
        ranking_gain,
    )
    level = LEVEL if level is None else level
    seeds, fresh_seeds = list(seeds), list(fresh_seeds)
    if not seeds:
        raise GfsimError("a recommendation needs at least one seed")
    incumbent = configs[0]
    per_task = len(seeds) == 1
    fresh_on = is_closed_loop(setup.driver) and len(fresh_seeds) >= 2
    fresh = (fresh_seeds, fresh_children(setup.children)) if fresh_on else None
    outcomes = _map(pool, setup, _config_outcome,
                    [(c, seeds, fresh, per_task, replayed is not None) for c in configs])
    surprise = None
    if fresh_on:  # (while the pool's processes replay the configurations)
        from gfsim.simulator.predictive import surprise_of_log

        surprise = _without_gc(lambda setup, _: surprise_of_log(
            setup.log, setup.model, seeds, fresh_seeds, children=setup.children,
            budget=setup.budget, driver=setup.driver, orphans_dropped=False,
            forecaster=setup.forecaster, learning=setup.learning, simulate=setup.simulate),
            setup, None)
    outcomes = list(outcomes)
    if replayed is not None:
        replayed.update({(c.spec, c.search): o.pop("metric_rows")
                         for c, o in zip(configs, outcomes)})
    rq = np.array([o["values"] for o in outcomes])  # configuration x sample
    fz = np.array([o["fresh"] for o in outcomes]) if fresh_on else None
    gains = rq - rq[0]
    fresh_gains = None if fz is None else fz - fz[0]
    eg = expected_gain(gains, fresh_gains, level)
    large_level = min(level, LARGE_LEVEL)
    large = expected_gain(gains, fresh_gains, large_level)
    pick = adopted(eg, 0, large, gains)
    can = adoptable(eg, large)
    ranked = ranking_gain(eg.mean, gains)
    gmid, glo, ghi = new_search_gain(gains, fresh_gains, level)
    blo, bhi = predictive_interval(rq, fz, level,
                                   surprise=surprise["factor"] if surprise else 1.0)
    rows = []
    for i, (c, o) in enumerate(zip(configs, outcomes)):
        row = {
            "config": c.label, "policy": c.spec,
            "search": c.search.as_dict() if c.search is not None else None,
            "incumbent": i == 0, "recommended": i == pick,
            "best_speedup": {"mean": 2.0 ** float(rq[i].mean()), "lo": 2.0 ** float(blo[i]),
                             "hi": 2.0 ** float(bhi[i])},
            **o["row"],
        }
        if i:
            finite = bool(np.isfinite(eg.lower[i]))
            row["expected_gain"] = {
                "mean": 2.0 ** float(eg.mean[i]),
                "lo": 2.0 ** float(eg.lo[i]) if finite else None,
                "hi": 2.0 ** float(eg.hi[i]) if finite else None,
                "lower_bound": 2.0 ** float(eg.lower[i]) if finite else None,
                "detectable": bool(eg.lower[i] > 0),
                "large_lower_bound": 2.0 ** float(large.lower[i]) if finite else None,
                "adoptable": bool(can[i]),
                "ranking_gain": 2.0 ** float(ranked[i]),
                "settled_by": None if can[i] else _settled_by(
                    eg, i, c, len(fresh_seeds) if fresh_on else rq.shape[1], fresh_on, level)}
            row["new_search_gain"] = {"mean": 2.0 ** float(gmid[i]), "lo": 2.0 ** float(glo[i]),
                                      "hi": 2.0 ** float(ghi[i])}
        rows.append(row)
    if per_task:
        over = (f"the log's {rq.shape[1]} tasks: no seed can change these replays, so the "
                "intervals are over tasks, not over new searches")
    elif fresh_on:
        over = (f"one new search like the logged one: its best speedup centred on {len(seeds)} "
                f"replays of the log, spread by {len(fresh_seeds)} searches simulated wholly "
                "on the world model fitted to the log (every child invented), plus the "
                "centre's error and the two's disagreement, times the log's surprise; its gain "
                "over the incumbent's centred on the expected gain, spread by one such "
                "search's variance and the expected gain's error; quantiles fitted on the "
                "counterfactual benchmark's dev worlds; gains paired by seed")
    else:
        over = (f"{len(seeds)} seeds of this log (replays: how much the log's own searches "
                "vary, not a new search's randomness); gains paired by seed")
    decides = (f"the recommendation adopts a configuration whose one-sided {level:.0%} lower "
               f"bound is above 1x, or, for an expected gain of at least "
               f"{2.0 ** LARGE_GAIN:.3f}x, whose one-sided {large_level:.0%} lower bound is "
               "(simulator.predictive.adoptable); of those, the one with the largest mean of "
               "it and the replays' mean gain")
    if fresh_on:
        expected_over = (
            f"the mean gain of many searches under the configuration against the incumbent's "
            f"(what adopting it gives), estimated by {len(fresh_seeds)} pairs of searches "
            "simulated wholly on the world model fitted to the log (every child invented, the "
            "same seed for both); its interval adds to their sampling error the world model's "
            "misfit, at quantiles fitted on the counterfactual benchmark's dev worlds "
            f"(simulator.predictive.EXPECTED_SCALE); {decides}")
    elif per_task:
        expected_over = (f"the mean gain over the log's {rq.shape[1]} tasks of its one replay "
                         f"(a t interval over tasks); {decides}")
    else:
        expected_over = (f"the mean gain over {len(seeds)} seeds of this log's replays (what "
                         "replaying this log gives; no child is invented, so no world model "
                         f"enters); {decides}")
    out = {
        "incumbent": incumbent.label, "level": level, "over": over,
        "expected_over": expected_over,
        "seeds": seeds, "fresh_seeds": fresh_seeds if fresh_on else [],
        "configs": rows, "choice": configs[pick].label, "keeps_incumbent": pick == 0,
        "adoption": {"level": level, "large_gain": 2.0 ** LARGE_GAIN,
                     "large_level": large_level},
        "log_surprise": surprise,
    }
    best_other = max(range(1, len(configs)), key=lambda i: eg.mean[i], default=None)
    out["verdict"] = _verdict(rows, pick, best_other, level, out["adoption"])
    if pick and prices:  # (on what the decision read: the fresh searches, where there are)
        out["prices"] = _break_even(setup, configs[pick], incumbent,
                                    fresh[0] if fresh else seeds, per_task,
                                    float(eg.mean[pick]), pool,
                                    children=fresh[1] if fresh else None,
                                    incumbent_values=fz[0] if fresh else rq[0])
    return out


def _map(pool, setup, fn, items: list):
    """``fn(setup, item)`` of every item, in order: in ``pool``'s workers (a ``SeedPool``; the
    search steps each replayed are ticked here as it comes in), or here (None)."""
    if pool is None:
        return [_without_gc(fn, setup, item) for item in items]
    from gfsim.simulator.progress import ticked_map

    return ticked_map(pool.executor, functools.partial(_without_gc, fn), items)


def _without_gc(fn, setup, item):
    """``fn(setup, item)`` with no cyclic garbage collection until it has returned: what its
    replays made (every search's children) is freed by reference counting as it returns, and
    not walked first by the collection that re-enabling would start."""
    from gfsim.core.memory import no_cyclic_gc

    with no_cyclic_gc():
        return fn(setup, item)


def _config_outcome(setup, job) -> dict:
    """One configuration's replays on ``seeds`` as log2 best speedups (``values``), its row's
    figures (``row``), (``fresh``: (seeds, child source), or None) its new searches', and
    (``scored``) the replays' ``metric_rows``."""
    from gfsim.simulator.replay import best_evidence, draw_shares
    from gfsim.tuning.trials import metric_rows

    config, seeds, fresh, per_task, scored = job
    r = setup.replay(config.spec, config.search, seeds)
    searches = [s for x in r for s in x.searches]
    evidence = best_evidence(replace(r[0], searches=searches))
    out = {"values": _values(r, per_task), "row": {
        "usd_per_search": float(np.mean([s.total.usd for s in searches])),
        "gpu_evals_per_search": float(np.mean([s.gpu_evals for s in searches])),
        "invented_share": draw_shares(r).get("invented_share", 0.0),
        "best_rests_on": evidence["label"],
        "simulated_searches": evidence["simulated_searches"]}}
    if scored:  # (gfsim tune's out-of-sample scores read these)
        out["metric_rows"] = metric_rows(setup, r)
    if fresh is not None:
        out["fresh"] = _values(setup.replay(config.spec, config.search, fresh[0],
                                            children=fresh[1]), False)
    return out


def _scaled_values(setup, job) -> np.ndarray:
    """log2 best speedups of one configuration replayed under cost model ``model``."""
    config, seeds, model, per_task, children = job
    return _values(setup.replay(config.spec, config.search, seeds, model=model,
                                children=children), per_task)


def _settled_by(eg, i: int, config: Config, samples: int, fresh: bool,
                level: float) -> str | None:
    """What evidence would settle whether configuration ``i``'s expected gain is real (None
    where it is detectable): more seeds where the sampling error of ``samples`` searches (or
    replays) is what hides it, with about how many; else what shrinks the world model's
    misfit; nothing where no gain is expected."""
    from gfsim.simulator.predictive import EXPECTED_DF, EXPECTED_SCALE, _t

    mean, lower = float(eg.mean[i]), float(eg.lower[i])
    if lower > 0:
        return None
    if mean <= 0:
        return ("nothing would show a gain: the estimate is at or below the incumbent's, and "
                "more evidence would more likely confirm the incumbent")
    sampling, misfit = float(eg.sampling[i]), float(eg.misfit[i])
    if not math.isfinite(sampling):
        return "more seeds: two or more (--seeds 2) before any gain can be claimed"
    # The one-sided quantile stays as it is (a fresh search's t law; the replays' t(n - 1) at
    # this n, a little generous for more); the lower bound reaches 0 once the spread is
    # mean / quantile: the seeds for that, or the misfit alone is too wide.
    one = EXPECTED_SCALE * _t(level, EXPECTED_DF) if fresh else _t(level, samples - 1)
    room = (mean / one) ** 2 - misfit
    if room > 0:
        need = math.ceil(sampling * samples / room)
        what = "searches simulated on the world model" if fresh else "replay seeds"
        return (f"more seeds: about {need} {what} instead of {samples} would show this gain, "
                "if it holds")
    if getattr(config.search, "overgen", 1) > 1:
        return ("a measured batch of its children at F > 1, or more logged searches: the "
                "world model invents them, and its misfit, which more seeds do not shrink, "
                "hides the gain")
    return ("more logged searches: the world model's misfit, which more seeds do not shrink, "
            "hides the gain")


def _verdict(rows: list[dict], pick: int, best_other: int | None, level: float,
             adoption: dict) -> str:
    """The recommendation in words: it decides on the expected gain; one new search's gain
    is said beside it, as what to expect of a single run."""
    from gfsim.analysis.stats import POINT_WORDS, no_spread

    inc = rows[0]["config"]
    if pick:
        r = rows[pick]
        e, g = r["expected_gain"], r["new_search_gain"]
        if no_spread(e):
            return (f"use {r['config']}: its best speedup is {e['mean']:.3f}x the incumbent's "
                    f"({inc}) in every replay ({POINT_WORDS})")
        if e["detectable"]:
            why = f"detectable: one-sided lower bound {e['lower_bound']:.3f}x"
        else:
            why = (f"a large gain, adopted at {adoption['large_level']:.0%}: one-sided lower "
                   f"bound {e['large_lower_bound']:.3f}x there, {e['lower_bound']:.3f}x at "
                   f"{level:.0%}")
        invented = r.get("invented_share") or 0.0
        rests = (f"; its replays' children {invented:.0%} invented by the world model (what "
                 "the gain rests on)" if invented > 0 else "")
        return (f"use {r['config']}: adopting it is expected to give {e['mean']:.3f}x the "
                f"incumbent's ({inc}) best speedup, {level:.0%} interval [{e['lo']:.3f}x, "
                f"{e['hi']:.3f}x] ({why}); "
                f"one new search's gain may land anywhere in [{g['lo']:.3f}x, {g['hi']:.3f}x]"
                f"{rests}")
    if best_other is None:
        return f"keep the incumbent ({inc}): no other configuration was given"
    r = rows[best_other]
    e = r["expected_gain"]
    if e["lo"] is not None and no_spread(e):
        return (f"keep the incumbent ({inc}): no configuration beats it (the best, "
                f"{r['config']}, {e['mean']:.3f}x in every replay; {POINT_WORDS})")
    bound = "none: too few samples" if e["lower_bound"] is None \
        else f"{e['lower_bound']:.3f}x"
    return (f"keep the incumbent ({inc}): no configuration's expected gain over it is "
            f"detectable at {level:.0%}, nor one of {adoption['large_gain']:.3f}x or more at "
            f"{adoption['large_level']:.0%} (the best, {r['config']}, {e['mean']:.3f}x, lower "
            f"bound {bound}); what would settle it: {e['settled_by']}")


def _break_even(setup, pick: Config, incumbent: Config, seeds: list[int],
                per_task: bool, gain_now: float, pool=None, children: str | None = None,
                incumbent_values: np.ndarray | None = None) -> dict:
    """The GPU-hour and forecast prices between which the pick's mean gain over the incumbent
    stays above 0, each price scaled alone (the other at today's), both replayed on the same
    seeds under the same budget (with ``children`` in place of the setup's where given: the
    fresh searches the decision read; ``incumbent_values``: the incumbent's values on them at
    today's prices): factors 2, 4, 8 each way, then one bisection (geometric) of the step
    where the gain turned; both prices' probes replayed together, in ``pool``'s processes."""
    from gfsim.cost_models import PresetCostModel, with_prices
    from gfsim.policies import make_policy

    model = setup.model
    if not isinstance(model, PresetCostModel):
        return {"note": "prices are scaled only on a preset cost model"}
    if math.isinf(setup.budget.usd):
        return {"note": "the budget has no USD limit: prices change no search's course, only "
                        "its bill, so the gain in best speedup holds at any price"}
    forecasts = make_policy(pick.spec).needs_forecast or make_policy(incumbent.spec).needs_forecast
    now = {"gpu": model.gpu.usd_per_hour,
           "forecaster": model.forecaster.usd_per_m_output}
    out: dict = {"rule": "the price at which the expected gain over the incumbent (the mean "
                         "gain of the searches the decision read) reaches 0, that price scaled "
                         "alone under the same USD budget and seeds (factors 2, 4 and 8 each "
                         "way, then one bisection); 'from'/'to' None: still a gain at the last "
                         "factor tried"}
    units = {"gpu": "USD per GPU-hour", "forecaster": "USD per 1M forecast output tokens"}
    if not forecasts:
        out["forecaster"] = {"note": "neither configuration forecasts: the forecast price does "
                                     "not matter"}
    scanned = [w for w in units if w not in out]
    # An incumbent that reads no forecast replays alike at any forecast price: its values at
    # today's prices serve.
    fixed = {w: w == "forecaster" and incumbent_values is not None
             and not make_policy(incumbent.spec).needs_forecast for w in scanned}

    def gains(probes: list[tuple[str, float]]) -> list[float]:
        """The mean gain at each (price, factor), every replay of every probe in one map."""
        jobs, at = [], []
        for what, f in probes:
            at.append(len(jobs))
            jobs += [(c, seeds, with_prices(model, **{what: f}), per_task, children)
                     for c in ((pick,) if fixed[what] else (pick, incumbent))]
        got = list(_map(pool, setup, _scaled_values, jobs))
        return [float((got[i] - (incumbent_values if fixed[what] else got[i + 1])).mean())
                for (what, _), i in zip(probes, at)]

    ways = {"to": list(PRICE_STEPS), "from": [1 / s for s in PRICE_STEPS]}
    tried = {w: {1.0: gain_now} for w in scanned}
    probes = [(w, f) for w in scanned for fs in ways.values() for f in fs]
    for (w, f), g in zip(probes, gains(probes)):
        tried[w][f] = g
    turned = {}  # (price, direction) -> (the last factor with a gain, the first without)
    for w in scanned:
        for direction, factors in ways.items():
            last_ok = 1.0
            for f in factors:
                if tried[w][f] <= 0:
                    turned[w, direction] = (last_ok, f)
                    break
                last_ok = f
    mids = {key: math.sqrt(a * f) for key, (a, f) in turned.items()}
    for ((w, _), mid), g in zip(mids.items(), gains([(w, m) for (w, _), m in mids.items()])):
        tried[w][mid] = g
    for w in scanned:
        bounds = {}
        for direction in ways:
            if (w, direction) not in turned:
                bounds[direction] = None
                continue
            (a, f), mid = turned[w, direction], mids[w, direction]
            edge = (mid, f) if tried[w][mid] > 0 else (a, mid)
            # the break-even price lies between the edge's two factors: report the middle
            bounds[direction] = math.sqrt(edge[0] * edge[1])
        out[w] = {
            "unit": units[w], "now": now[w],
            "from": None if bounds["from"] is None else now[w] * bounds["from"],
            "to": None if bounds["to"] is None else now[w] * bounds["to"],
            "gain_at": {f"x{f:.4g}": 2.0 ** g for f, g in sorted(tried[w].items())},
        }
    return {k: out[k] for k in ("rule", *units) if k in out}
