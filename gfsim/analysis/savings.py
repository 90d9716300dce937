"""What a policy saves per search against a baseline (docs/concepts/design.md "Statistics").

Both are replayed for the same seeds (common random numbers), so every figure is a *paired*
difference per (seed, task), signed as baseline minus policy: positive means the policy saved.
Intervals are percentile bootstraps over tasks, then seeds; seeds resample one log.

- ``usd_saved_per_search`` (and seconds, joules): what the whole search cost.
- Cost to first reach a target T, for T at the 0.5, 0.75 and 0.9 quantiles (over seeds) of the
  baseline's final best on that task: censored at what the search spent when it never got there
  (the restricted mean cost), with the probability each side reaches T.
- ``speedup_gain_at_equal_cost``: the ratio of the best speedups the two had found once both
  had spent the smaller of their two totals (geometric mean; 1 = no gain).
- ``break_even``: the USD per forecast (and per mutation, when the policy generates more than
  the baseline) at which the saving would be zero, beside the price the cost model charges.
"""

from __future__ import annotations

import numpy as np

from gfsim.analysis.stats import NOTE, POINT_WORDS, interval, no_spread
from gfsim.simulator.results import best_at, first_reaching

__all__ = ["savings", "usd_text", "QUANTILES"]

QUANTILES = (0.5, 0.75, 0.9)


def savings(pairs, *, seed: int = 0, n_boot: int = 2000) -> dict:
    """``pairs``: per seed, (policy ReplayResult, baseline ReplayResult), searches in the same
    task order."""
    n_seeds = len(pairs)
    tasks = [s.task_id for s in pairs[0][0].searches]
    n_tasks = len(tasks)
    shape = (n_seeds, n_tasks)
    tot = {k: (np.zeros(shape), np.zeros(shape)) for k in ("usd", "seconds", "joules")}
    fc_n, fc_usd, gen_n, gen_usd = (np.zeros(shape) for _ in range(4))
    base_gen_n = np.zeros(shape)
    final_base = np.zeros(shape)
    gain = np.zeros(shape)
    for i, (pol, base) in enumerate(pairs):
        for j, (p, b) in enumerate(zip(pol.searches, base.searches)):
            pt, bt = p.total, b.total
            for k, (a, z) in tot.items():  # seconds: the search's wall-clock
                a[i, j] = p.wall_s if k == "seconds" else getattr(pt, k)
                z[i, j] = b.wall_s if k == "seconds" else getattr(bt, k)
            fc_n[i, j], fc_usd[i, j] = p.forecasts, p.stages["forecasting"].usd
            gen_n[i, j], gen_usd[i, j] = p.candidates, p.stages["generation"].usd
            base_gen_n[i, j] = b.candidates
            final_base[i, j] = b.best_speedup
            c = min(pt.usd, bt.usd)
            gain[i, j] = float(best_at(p.anytime, 1, c)) / float(best_at(b.anytime, 1, c))

    def iv(x, key, log=False):
        return interval(x, key=key, seed=seed, n_boot=n_boot, log=log)

    out: dict = {"tasks": tasks, "seeds": n_seeds}
    for k, (a, z) in tot.items():
        out[f"{k}_saved_per_search"] = iv(z - a, f"saved-{k}")
        out[f"{k}_per_search"] = {"policy": float(a.mean()), "baseline": float(z.mean())}
    out["speedup_gain_at_equal_cost"] = iv(gain, "gain", log=True)

    targets = {f"q{int(q * 100)}": np.quantile(final_base, q, axis=0) for q in QUANTILES}
    out["targets"] = {name: dict(zip(tasks, t.tolist())) for name, t in targets.items()}
    reach, cost = {}, {}
    for name, t in targets.items():
        cp, cb = np.zeros(shape), np.zeros(shape)
        rp, rb = np.zeros(shape, bool), np.zeros(shape, bool)
        for i, (pol, base) in enumerate(pairs):
            for j, (p, b) in enumerate(zip(pol.searches, base.searches)):
                cp[i, j], rp[i, j] = first_reaching(p.anytime, 1, t[j])
                cb[i, j], rb[i, j] = first_reaching(b.anytime, 1, t[j])
        reach[name] = {"policy": float(rp.mean()), "baseline": float(rb.mean())}
        cost[name] = {"policy_usd": float(cp.mean()), "baseline_usd": float(cb.mean()),
                      "saved_usd": iv(cb - cp, f"reach-{name}")}
    out["reach_probability"] = reach
    out["cost_to_target"] = cost

    saved = float((tot["usd"][1] - tot["usd"][0]).mean())
    per_fc = float(fc_usd.sum() / fc_n.sum()) if fc_n.sum() else None
    per_gen = float(gen_usd.sum() / gen_n.sum()) if gen_n.sum() else None
    extra_gen = float((gen_n - base_gen_n).mean())
    be_fc = per_fc + saved / float(fc_n.mean()) if per_fc is not None and fc_n.mean() > 0 \
        else None
    be_gen = per_gen + saved / extra_gen if per_gen is not None and extra_gen > 0 else None
    out["break_even"] = {
        "usd_per_forecast": be_fc,
        "current_usd_per_forecast": per_fc,
        "usd_per_mutation": be_gen,
        "current_usd_per_mutation": per_gen,
        "extra_mutations_per_search": extra_gen,
        "note": "the price at which the mean saving per search would be zero, other prices "
                "fixed (point estimates from the means); none where the policy makes no "
                "forecasts or no more mutations than the baseline; a negative price means it "
                "does not pay even when they are free",
        "summary": _break_even_text(be_fc, per_fc, be_gen, per_gen),
    }
    out["per_task"] = {
        task: {"usd_saved": float((tot["usd"][1] - tot["usd"][0])[:, j].mean()),
               "seconds_saved": float((tot["seconds"][1] - tot["seconds"][0])[:, j].mean()),
               "speedup_gain_at_equal_cost": float(np.exp(np.log(gain[:, j]).mean()))}
        for j, task in enumerate(tasks)}
    out["verdict"] = _verdict(out["usd_saved_per_search"], out["speedup_gain_at_equal_cost"])
    out["note"] = NOTE
    return out


def _break_even_text(be_fc, per_fc, be_gen, per_gen) -> str:
    parts = []
    for be, now, what in ((be_fc, per_fc, "forecast"), (be_gen, per_gen, "mutation")):
        if be is None:
            continue
        if be < 0:
            parts.append(f"does not pay even at $0 per {what} (now ${now:.4f})")
        else:
            parts.append(f"pays up to ${be:.4f} per {what} (now ${now:.4f})")
    return "; ".join(parts) or "no forecasts and no extra mutations: no break-even price"


def usd_text(x: float) -> str:
    """-$3.00, $2.05: the sign before the dollar."""
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def _verdict(usd: dict, gain: dict) -> str:
    m, lo, hi = usd["mean"], usd["lo"], usd["hi"]
    band = (f"(the same in every replay; {POINT_WORDS})" if no_spread(usd) else
            f"(saving, 95% interval: {usd_text(lo)} to {usd_text(hi)})")
    money = (f"the policy saves {usd_text(m)} per search {band}" if m >= 0
             else f"the policy costs {usd_text(-m)} MORE per search {band}")
    if usd["includes_zero"] and not no_spread(usd):
        money += " (the interval includes zero: no detectable difference in cost)"
    g = gain
    speed = f"at equal spend its best speedup is {g['mean']:.3f}x the baseline's"
    if no_spread(g):
        speed += " in every replay"
    else:
        speed += f" [{g['lo']:.3f}, {g['hi']:.3f}]"
        if g["includes_one"]:
            speed += " (includes 1: no detectable difference)"
    return f"{money}; {speed}"
