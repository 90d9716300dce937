"""How long does tuning take? Trials x seeds of the puct driver on the shipped PUCT log.

    python experiments/bench_tune.py [--trials 200] [--seeds 32] [--jobs 2] [--baseline-trials 3]

Runs ``gfsim tune``'s machinery (TPE over tau and the overgeneration factor, threshold policy,
puct driver, 40-step searches, $40 budget per search) on ``synthetic-puct-v1``; first a few
trials with the trace cache off (the path before it existed, same run, same machine), then
``--trials`` with it on. Prints seconds per trial, trials per minute and, where fewer trials
ran than 200, the projection to 200 trials x ``--seeds`` (labelled as a projection).
``--profile`` prints the top functions of one trial's replays.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def run(trials: int, seeds: int, jobs: int, cache: bool, folder: Path, name: str) -> float:
    from gfsim.cost_models import load_cost_model
    from gfsim.replay_logs import open_log
    from gfsim.simulator import Budget
    from gfsim.simulator.puct_engine import SEARCH_PRESETS
    from gfsim.simulator.replay import trace_cache
    from gfsim.tuning.study import Objective, make_sampler, make_storage, open_study, run_study
    from gfsim.tuning.trials import TrialSetup, parse_objectives, parse_param

    trace_cache(cache)
    params = [parse_param("tau=0.3:0.99", "threshold", "puct"),
              parse_param("overgen=1:4", "threshold", "puct")]
    objectives = parse_objectives("best_speedup")
    setup = TrialSetup(open_log("synthetic-puct-v1"), load_cost_model("serverless-a100"),
                       "threshold", "puct", Budget(usd=40), list(range(seeds)),
                       SEARCH_PRESETS["paper-standard"])
    study = open_study(make_storage(f"sqlite:///{folder}/{name}.db"), name, ["maximize"],
                       make_sampler("tpe", 0, False))
    obj = Objective(setup, params, objectives, None, jobs)
    if jobs > 1 and not cache:
        # Worker processes keep their own caches: turn them off there too.
        from concurrent.futures import ProcessPoolExecutor

        obj._pool = ProcessPoolExecutor(jobs, initializer=trace_cache, initargs=(False,))
    t = time.perf_counter()
    run_study(study, obj, trials=trials)
    took = time.perf_counter() - t
    trace_cache(True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--baseline-trials", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        if args.baseline_trials:
            s = run(args.baseline_trials, args.seeds, args.jobs, False, Path(tmp), "before")
            rows.append(("trace cache off (before)", args.baseline_trials, s))
        s = run(args.trials, args.seeds, args.jobs, True, Path(tmp), "after")
        rows.append(("trace cache on (after)", args.trials, s))
    print(f"synthetic-puct-v1, puct driver, threshold tau x overgen, {args.seeds} seeds per "
          f"trial, {args.jobs} processes\n")
    print("| path | trials | seconds | s per trial | 200 trials (min) |")
    print("|---|---|---|---|---|")
    for label, n, secs in rows:
        proj = 200 * secs / n / 60
        print(f"| {label} | {n} | {secs:.1f} | {secs / n:.2f} | {proj:.1f}"
              + (" (projected)" if n != 200 else "") + " |")
    if args.profile:
        import cProfile
        import pstats

        from gfsim.cost_models import load_cost_model
        from gfsim.policies import make_policy
        from gfsim.replay_logs import open_log
        from gfsim.simulator import Budget, replay

        log, model = open_log("synthetic-puct-v1"), load_cost_model("serverless-a100")
        prof = cProfile.Profile()
        prof.enable()
        for seed in range(4):
            replay(log, make_policy("threshold:0.7"), model, driver="puct", seed=seed,
                   budget=Budget(usd=40), orphans_dropped=False)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
