"""Replay throughput on a 100k-candidate synthetic log (issue 3's benchmark; not a test).

    python experiments/bench_replay.py [--candidates 100000] [--repeat 3]

Reports candidates per second of simulation, best of --repeat runs, for
  des      the SimPy event engine under contention (capacities that bind),
  fast     the closed-form fast path (capacities that never bind),
  numpy    a plain vectorised evaluation of the fast path's decisions (totals and best per
           search from precomputed per-candidate prices): a floor on what any replay costs,
and the ratios between them, measured in the same run. Loading the log and pricing it
(build_traces) are timed apart: they are paid once per log, not per policy.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from gfsim.cost_models import Capacities, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator import Budget, build_traces
from gfsim.simulator.trace.engine import SearchSimulation
from gfsim.simulator.trace.fast import run_fast
from gfsim.worlds.synth import synthesize

CONTENDED = Capacities(generator=4, forecaster=4, compile_workers=2, gpus=2)
WIDE = Capacities(generator=1024, forecaster=1024, compile_workers=1024, gpus=1024)


def best_of(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def numpy_totals(traces, fast_results):
    """Totals and best per search from the fast path's decisions, with nothing but numpy."""
    usd = joules = 0.0
    best = []
    for t, r in zip(traces, fast_results):
        state = np.asarray(r.table["state"], dtype=object)
        measured = state == "measured"
        generated = (state != "budget_stopped") & (state != "orphan_dropped")
        reads = np.asarray(r.table["action"], dtype=object) != None  # noqa: E711
        u = t.price["generation"][0][generated].sum() + t.price["forecasting"][0][
            reads & t.has_forecast].sum()
        j = t.price["generation"][1][generated].sum() + t.price["forecasting"][1][
            reads & t.has_forecast].sum()
        for stage in ("cold_start", "compilation", "check", "timing"):
            u += t.price[stage][0][measured].sum()
            j += t.price[stage][1][measured].sum()
        usd, joules = usd + u, joules + j
        s = np.asarray(t.speedup)[measured]
        best.append(max([t.seed_speedup, *s[~np.isnan(s)]]))
    return usd, joules, float(np.exp(np.mean(np.log(best))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--candidates", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--policy", default="threshold:0.7")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jsonl.gz"
        t_synth, _ = best_of(lambda: synthesize(path, seed=5, candidates=args.candidates,
                                                tasks=args.tasks), 1)
        t_load, log = best_of(lambda: load_log(path), 1)
    model = load_cost_model("serverless-a100")
    policy = make_policy(args.policy)
    t_price, traces = best_of(lambda: build_traces(log, model), 1)
    n = sum(len(t) for t in traces)

    def des():
        return [SearchSimulation(t, policy, model, CONTENDED, Budget(), 0).run() for t in traces]

    def fast():
        return [run_fast(t, policy, model, WIDE, Budget(), 0) for t in traces]

    t_des, des_results = best_of(des, args.repeat)
    t_fast, fast_results = best_of(fast, args.repeat)
    t_np, np_out = best_of(lambda: numpy_totals(traces, fast_results), args.repeat)
    fast_usd = sum(r.total.usd for r in fast_results)
    assert abs(np_out[0] - fast_usd) <= 1e-6 * fast_usd, (np_out[0], fast_usd)

    rate = {"des": n / t_des, "fast": n / t_fast, "numpy": n / t_np}
    report = {
        "machine": f"{platform.processor() or platform.machine()}, python "
                   f"{platform.python_version()}",
        "log": f"gfsim synth --seed 5 --candidates {args.candidates} --tasks {args.tasks} "
               "(SYNTHETIC)",
        "policy": policy.spec(),
        "candidates": n,
        "seconds": {"synth": t_synth, "load_log": t_load, "build_traces": t_price,
                    "des": t_des, "fast": t_fast, "numpy": t_np},
        "candidates_per_s": rate,
        "ratios": {"fast_over_des": rate["fast"] / rate["des"],
                   "numpy_over_fast": rate["numpy"] / rate["fast"]},
        "des_capacities": vars(CONTENDED),
        "des_gpu_evals": sum(r.gpu_evals for r in des_results),
        "goals": {"des": 20_000, "fast": 500_000},
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{n:,} candidates ({report['log']}), policy {report['policy']}, best of "
          f"{args.repeat}")
    print(f"  once per log: synth {t_synth:.1f} s, load_log {t_load:.2f} s, "
          f"build_traces (pricing) {t_price:.2f} s")
    for k in ("des", "fast", "numpy"):
        goal = report["goals"].get(k)
        tail = f"   (goal >= {goal:,}/s: {'met' if rate[k] >= goal else 'NOT met'})" if goal \
            else ""
        print(f"  {k:6s} {report['seconds'][k]:7.3f} s  {rate[k]:>12,.0f} candidates/s{tail}")
    print(f"  fast / des = {report['ratios']['fast_over_des']:.1f}x, numpy / fast = "
          f"{report['ratios']['numpy_over_fast']:.1f}x")


if __name__ == "__main__":
    main()
