"""The paper's budget-matched comparison, replayed: which measurement policy finds the fastest
kernel for the same GPU evaluations, and for the same dollars?

    python experiments/budget_matched.py --seeds 8 --jobs 2 --plot docs/budget_matched.png

On a shipped trajectory log (default: the SYNTHETIC ``synthetic-puct-v1``), the puct driver
re-runs the reference search (40 steps x 2 parents x 4 samples, k = 4) under each row's policy
and overgeneration factor F, for two cost presets (serverless A100 as in the paper, reserved
H100). Every row is run three ways, each for every seed:

- the whole 40-step search (what the row spends);
- at equal GPU evaluations: a per-search budget of ``--evals`` measurements;
- at equal USD: a per-search budget of ``--usd-share`` x what paper-standard spends per search
  under that preset (computed in the same run, and printed).

Cells are best measured speedups, geometric mean over tasks and mean over seeds, with bootstrap
95% intervals over tasks, then seeds; "vs standard" is the paired difference from
paper-standard on the same (task, seed). Seeds resample one log (fallback draws, calibration
splits), not new searches. Rows whose children are mostly borrowed from other parents (fallback
share > 25%) are EXTRAPOLATED; because the shipped log is synthetic, the landscape that made it
is known, and the "landscape" column runs the same search on it directly at equal GPU
evaluations, so the reader can see how far each replay is off.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from gfsim.analysis.stats import NOTE, SeedTable, summarize_seeds
from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import open_log
from gfsim.simulator import Budget, replay
from gfsim.simulator.closed.engine import EXTRAPOLATED_SHARE, SEARCH_PRESETS
from gfsim.simulator.replay import calibration_batch
from gfsim.simulator.results import ReplayResult, geometric_mean
from gfsim.simulator.traces import build_traces
from gfsim.worlds.landscape import Landscape, LandscapeParams
from gfsim.worlds.synth_puct import run_on_landscape

# (label, policy spec, overgeneration factor F); paper-standard comes first (the reference).
ROWS = [
    ("paper-standard", "all", 1),
    ("paper-filtered", "topk:4", 4),
    ("threshold (tau)", "threshold:0.7", 1),
    ("threshold (tau)", "threshold:0.7", 4),
    ("threshold (coverage)", "threshold:coverage=0.5", 1),
    ("threshold (coverage)", "threshold:coverage=0.5", 4),
    ("ev", "ev:10", 1),
    ("ev", "ev:10", 4),
]
PRESETS = ["serverless-a100", "reserved-h100"]
_LOGS: dict = {}


def _config(overgen: int):
    return replace(SEARCH_PRESETS["paper-standard"], overgen=overgen)


def _replay_job(args) -> ReplayResult:
    log_name, preset, spec, overgen, budget, seed, children = args
    if log_name not in _LOGS:
        _LOGS[log_name] = open_log(log_name)
    res = replay(_LOGS[log_name], make_policy(spec), load_cost_model(preset), seed=seed,
                 budget=budget, driver="puct", search=_config(overgen), children=children)
    for s in res.searches:
        s.table = {}  # not needed here; keeps what crosses the process boundary small
    return res


def _landscape(log) -> tuple[Landscape, int] | None:
    """The landscape a synthetic puct log was drawn from (its header says how), else None."""
    prov = log.header["provenance"]
    if prov.get("kind") != "synthetic" or "params" not in prov:
        return None
    params = LandscapeParams(**{k: v["value"] for k, v in prov["params"].items()})
    return Landscape(params, int(prov["seed"]), len(log.tasks)), int(prov["seed"])


def _direct_job(args) -> list[float]:
    log_name, preset, spec, overgen, budget, seed = args
    if log_name not in _LOGS:
        _LOGS[log_name] = open_log(log_name)
    log = _LOGS[log_name]
    land, _ = _landscape(log)
    model = load_cost_model(preset)
    policy = make_policy(spec)  # fitted on the log's forecasts, as the replay fits it
    policy.fit(calibration_batch(build_traces(log, model)), seed)
    return [run_on_landscape(land, task, _config(overgen), policy, seed=seed, cost=preset,
                             budget=budget, capacities=model.capacities)[0].best_speedup
            for task in log.tasks]


def _table(seeds, results) -> SeedTable:
    return SeedTable.from_results(list(seeds), results)


def _cell(e: dict, fmt="{:.2f}x") -> str:
    return f"{fmt.format(e['mean'])} [{fmt.format(e['lo'])}, {fmt.format(e['hi'])}]"


def _delta(e: dict) -> str:
    d = e["delta"]
    if d["lo"] == d["hi"] == d["mean"] == 0:
        return "0"
    return f"{d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", default="synthetic-puct-v1")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--evals", type=int, default=150,
                    help="GPU evaluations per search at equal evaluations (default 150)")
    ap.add_argument("--usd-share", type=float, default=0.5,
                    help="equal-USD budget per search, as a share of paper-standard's spend")
    ap.add_argument("--plot", default=None, help="PNG of anytime curves (whole searches)")
    ap.add_argument("--json", default=None, help="also write every figure to this JSON file")
    ap.add_argument("--children", default="fallback",
                    help="where the replays' unlogged children come from: fallback, model, "
                         "model:crb, model:gbm or own (gfsim replay --children)")
    args = ap.parse_args()
    started = time.perf_counter()
    log = open_log(args.log)
    seeds = list(range(args.seeds))
    land = _landscape(log)

    def run_all(fn, jobs):
        if args.jobs <= 1:
            return [fn(j) for j in jobs]
        with ProcessPoolExecutor(args.jobs) as pool:
            return list(pool.map(fn, jobs, chunksize=1))

    keys = [(p, spec, f) for p in PRESETS for _, spec, f in ROWS]
    full_jobs = [(args.log, p, spec, f, Budget(), s, args.children) for p, spec, f in keys
                 for s in seeds]
    full = dict(zip(full_jobs, run_all(_replay_job, full_jobs)))
    usd_cap = {}
    for p in PRESETS:
        std = [full[(args.log, p, "all", 1, Budget(), s, args.children)] for s in seeds]
        per_search = np.mean([r.total.usd / len(r.searches) for r in std])
        usd_cap[p] = round(float(per_search) * args.usd_share, 2)
    budgets = {p: {"evals": Budget(gpu_evals=args.evals), "usd": Budget(usd=usd_cap[p])}
               for p in PRESETS}
    more_jobs = [(args.log, p, spec, f, budgets[p][b], s, args.children) for p, spec, f in keys
                 for b in ("evals", "usd") for s in seeds]
    more = dict(zip(more_jobs, run_all(_replay_job, more_jobs)))
    direct = {}
    if land is not None:
        djobs = [(args.log, p, spec, f, budgets[p][b], s) for p, spec, f in keys
                 for b in ("evals", "usd") for s in seeds]
        direct = dict(zip(djobs, run_all(_direct_job, djobs)))

    def results(p, spec, f, b):
        src = full if b is None else more
        budget = Budget() if b is None else budgets[p][b]
        return [src[(args.log, p, spec, f, budget, s, args.children)] for s in seeds]

    kind = log.header["provenance"].get("kind", "?").upper()
    print(f"log `{log.name}` ({kind}), {len(log.tasks)} tasks, {args.seeds} seeds, puct driver "
          f"(40 steps x 2 parents x 4 samples x F, k 4); {NOTE}\n")
    out = {"log": log.name, "seeds": args.seeds, "evals": args.evals, "usd_cap": usd_cap,
           "children": args.children,
           "note": NOTE, "rows": []}
    for p in PRESETS:
        print(f"**{p}**: equal evaluations = {args.evals} GPU evaluations per search; equal "
              f"USD = ${usd_cap[p]:.2f} per search ({args.usd_share:.0%} of paper-standard's "
              "spend)\n")
        print(f"| search | policy | F | {args.children} draws "
              "| 40 steps: best, evals, USD per search "
              f"| <= {args.evals} evals: best | vs standard "
              + ("| landscape, same search " if direct else "")
              + f"| <= ${usd_cap[p]:.0f}: best | vs standard "
              + ("| landscape, same search " if direct else "") + "| evals used |")
        print("|---|---|---|---|---|---|---|" + ("---|" if direct else "") + "---|---|"
              + ("---|" if direct else "") + "---|")
        std = {b: _table(seeds, results(p, "all", 1, b)) for b in (None, "evals", "usd")}
        for label, spec, f in ROWS:
            rs = {b: results(p, spec, f, b) for b in (None, "evals", "usd")}
            s = {b: summarize_seeds(_table(seeds, rs[b]), std[b], n_boot=1000)["overall"]
                 for b in rs}
            # The share of children the log never held (fallback or model draws).
            fb = float(np.mean([x.extra.get("invented_share", x.extra["fallback_share"])
                                for r in rs[None] for x in r.searches]))
            n_search = len(rs[None][0].searches)
            evals = np.mean([r.figures()["gpu_evals"] / n_search for r in rs[None]])
            usd = np.mean([r.total.usd / n_search for r in rs[None]])
            used = np.mean([r.figures()["gpu_evals"] / n_search for r in rs["usd"]])
            most = max(x.gpu_evals for r in rs["evals"] for x in r.searches)
            flag = " EXTRAPOLATED" if fb > EXTRAPOLATED_SHARE else ""
            row = {"preset": p, "search": label, "policy": spec, "overgen": f,
                   "fallback_share": fb, "extrapolated": bool(flag),
                   "full": {"best_speedup": s[None]["best_speedup"]["policy"],
                            "gpu_evals_per_search": float(evals),
                            "usd_per_search": float(usd)},
                   "equal_evals": {"best_speedup": s["evals"]["best_speedup"]["policy"],
                                   "vs_standard": s["evals"]["best_speedup"]["delta"],
                                   "max_gpu_evals": most},
                   "equal_usd": {"best_speedup": s["usd"]["best_speedup"]["policy"],
                                 "vs_standard": s["usd"]["best_speedup"]["delta"],
                                 "gpu_evals_per_search": float(used)}}
            truth = {"evals": "", "usd": ""}
            for b in truth if direct else ():
                d = [direct[(args.log, p, spec, f, budgets[p][b], sd)] for sd in seeds]
                g = float(np.mean([geometric_mean(x) for x in d]))
                row[f"landscape_equal_{b}"] = g
                truth[b] = f"| {g:.2f}x "
            out["rows"].append(row)
            print(f"| {label} | `{spec}` | {f} | {fb:.0%}{flag} | "
                  f"{s[None]['best_speedup']['policy']['mean']:.2f}x, {evals:.0f}, ${usd:.2f} | "
                  f"{_cell(s['evals']['best_speedup']['policy'])} | "
                  f"{_delta(s['evals']['best_speedup'])} {truth['evals']}| "
                  f"{_cell(s['usd']['best_speedup']['policy'])} | "
                  f"{_delta(s['usd']['best_speedup'])} {truth['usd']}| {used:.0f} |")
        print()
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    if args.plot:
        extrapolated = {f"{r['policy']} F{r['overgen']}" for r in out["rows"]
                        if r["extrapolated"]}
        _plot(args.plot, log, {p: {f"{spec} F{f}": results(p, spec, f, None)
                                   for _, spec, f in ROWS} for p in PRESETS}, extrapolated)


def _plot(path, log, series_by_preset, extrapolated) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gfsim.analysis.plots import anytime_panels

    fig, axes = plt.subplots(len(series_by_preset), 2, figsize=(12, 4.6 * len(series_by_preset)),
                             squeeze=False)
    for row, (preset, series) in zip(axes, series_by_preset.items()):
        labels = {k: f"{k} (extrapolated)" if k in extrapolated else k for k in series}
        series = {labels[k]: v for k, v in series.items()}
        anytime_panels(series, row, styles={labels[k]: {"linestyle": "--"}
                                            for k in extrapolated if k in labels})
        for ax in row:
            ax.set_title(preset, fontsize=9)
    kind = log.header["provenance"].get("kind", "?").upper()
    fig.suptitle(f"replays of whole 40-step puct searches on `{log.name}` ({kind}); mean over "
                 "seeds, band: middle 95% of seeds; dashed: > 25% of children borrowed "
                 "(extrapolated)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
