"""How good must a surrogate be to pay off? What-if forecasters swept over quality.

    python experiments/whatif_sensitivity.py --seeds 8 --jobs 2 --plot docs/whatif_sensitivity.png

On a shipped log (default: the SYNTHETIC ``synthetic-puct-v1``), the policy (default
``threshold:0.7``) reads a what-if forecaster (``gfsim.forecasts.whatif``) instead of the logged
one, for a grid of spreads sigma and temperatures (beta 0.7), two other slopes beta, two
parse-failure rates, and the five ``paper:`` presets; under serverless A100 and reserved H100
prices. For each: the forecaster's accuracy and ECE on the log's measured candidates, and ``gfsim
savings`` against measuring everything: USD saved per search and the best speedup at equal spend
(baseline = 1), with bootstrap 95% intervals over tasks, then seeds. Each seed draws the forecasts
afresh (forecast seed = replay seed), so the intervals include the forecaster's own noise. The puct
driver (paper-standard, closed loop) by default: a skipped candidate never enters the archive, so a
policy bears what it skips; ``--driver trace`` keeps the logged order, where skipped parents'
children are still replayed (orphans) and a poor forecaster looks better than it is.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gfsim.analysis.savings import savings
from gfsim.analysis.stats import interval
from gfsim.cost_models import load_cost_model
from gfsim.forecasts.scoring import forecaster_rows, score_rows
from gfsim.forecasts.whatif import PRESETS, WhatIfForecaster, attach, parse_whatif
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator.replay import replay_with_baseline

PRESET_COSTS = ["serverless-a100", "reserved-h100"]
SIGMAS = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0]
TEMPS = [0.3, 1.0]


def forecasters() -> list[tuple[str, dict]]:
    grid = [(f"synthetic:sigma={s:g},beta=0.7,temp={t:g}", dict(sigma=s, beta=0.7, temp=t))
            for t in TEMPS for s in SIGMAS]
    grid += [(f"synthetic:sigma=1,beta={b:g},temp={t:g}", dict(sigma=1.0, beta=b, temp=t))
             for t in TEMPS for b in (0.4, 1.0)]
    grid += [(f"synthetic:sigma=1,beta=0.7,temp=1,parse_fail={pf:g}",
              dict(sigma=1.0, beta=0.7, temp=1.0, parse_fail=pf)) for pf in (0.2, 0.5)]
    grid += [(f"paper:{p}", None) for p in PRESETS]
    return grid


def _make(name: str, kw: dict | None, seed: int) -> WhatIfForecaster:
    if kw is None:
        f = parse_whatif(name)
        return WhatIfForecaster(f.name, f.sigma, f.beta, f.temp, f.parse_fail, seed)
    return WhatIfForecaster(name, seed=seed, **kw)


def _job(args):
    log_name, policy, cost, name, kw, seed, driver = args
    log = open_log(log_name)
    f = _make(name, kw, seed)
    with_f = attach(log, f)
    res, base = replay_with_baseline(with_f, make_policy(policy), load_cost_model(cost),
                                     seed=seed, forecaster=f.name, orphans_dropped=False,
                                     driver=driver)
    for r in (res, base):
        for s in r.searches:
            s.table = {}
    quality = score_rows(forecaster_rows(with_f, f.name)) if cost == PRESET_COSTS[0] else None
    return (cost, name, seed), (res, base), quality


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", default="synthetic-puct-v1")
    ap.add_argument("--policy", default="threshold:0.7")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--driver", default="puct", help="puct (closed loop, default) or trace")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    started = time.perf_counter()
    grid = forecasters()
    jobs = [(args.log, args.policy, c, name, kw, s, args.driver) for c in PRESET_COSTS
            for name, kw in grid for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_job, jobs, chunksize=2))
    pairs, quality = {}, {}
    for (cost, name, seed), pair, q in results:
        pairs.setdefault((cost, name), []).append(pair)
        if q is not None:
            quality.setdefault(name, []).append((q["accuracy"], q["ece"]))
    rows = []
    for cost in PRESET_COSTS:
        for name, _ in grid:
            ps = pairs[(cost, name)]
            s = savings(ps, n_boot=1000)
            acc, ece = np.mean(quality[name], axis=0)
            final = np.array([[a.best_speedup / b.best_speedup for a, b in zip(
                pol.searches, base.searches)] for pol, base in ps])
            rows.append({"cost": cost, "forecaster": name, "accuracy": float(acc),
                         "ece": float(ece), "usd_saved": s["usd_saved_per_search"],
                         "gain": s["speedup_gain_at_equal_cost"],
                         "final": interval(final, key="final", n_boot=1000, log=True),
                         "usd_policy": s["usd_per_search"]["policy"]})
    kind = open_log(args.log).header["provenance"].get("kind", "?").upper()
    print(f"log `{args.log}` ({kind}), policy `{args.policy}` vs `all`, {args.driver} driver, "
          f"{args.seeds} seeds (forecasts redrawn per seed); 95% intervals over tasks, then "
          f"seeds ({time.perf_counter() - started:.0f} s)\n")
    for cost in PRESET_COSTS:
        print(f"**{cost}**\n")
        print("| forecaster | accuracy | ECE | USD saved per search [95%] | final best vs all "
              "[95%] | best at equal spend vs all [95%] |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            if r["cost"] != cost:
                continue
            u, g, fb = r["usd_saved"], r["gain"], r["final"]
            print(f"| `{r['forecaster']}` | {r['accuracy']:.3f} | {r['ece']:.3f} | "
                  f"{u['mean']:+.2f} [{u['lo']:+.2f}, {u['hi']:+.2f}] | "
                  f"{fb['mean']:.3f}x [{fb['lo']:.3f}, {fb['hi']:.3f}] | "
                  f"{g['mean']:.3f}x [{g['lo']:.3f}, {g['hi']:.3f}] |")
        print()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.plot:
        _plot(rows, args)


def _plot(rows, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, label in ((axes[0], "accuracy", "accuracy (bins, on the log's candidates)"),
                           (axes[1], "ece", "ECE")):
        for cost, colour in zip(PRESET_COSTS, ("tab:blue", "tab:orange")):
            sel = [r for r in rows if r["cost"] == cost]
            x = [r[key] for r in sel]
            y = [r["usd_saved"]["mean"] for r in sel]
            err = [[r["usd_saved"]["mean"] - r["usd_saved"]["lo"] for r in sel],
                   [r["usd_saved"]["hi"] - r["usd_saved"]["mean"] for r in sel]]
            ax.errorbar(x, y, yerr=err, fmt="o", color=colour, capsize=2, ms=4, label=cost)
            for r in sel:
                if r["forecaster"].startswith("paper:"):
                    ax.annotate(r["forecaster"][6:], (r[key], r["usd_saved"]["mean"]),
                                fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", linewidth=1)
        ax.set(xlabel=label, ylabel="USD saved per search (policy vs measure-all)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"what-if forecasters on `{args.log}` (SYNTHETIC), policy {args.policy}; "
                 "bars: bootstrap 95% over tasks, then seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)
    print(f"figure: {args.plot}")


if __name__ == "__main__":
    main()
