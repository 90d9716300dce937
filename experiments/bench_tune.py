"""How long does tuning take? Trials x seeds of the puct driver on the shipped PUCT log.

    python experiments/bench_tune.py [--trials 200] [--seeds 32] [--jobs 2] [--profile]

Runs ``gfsim tune``'s machinery (TPE, sampler seed 0, over tau=0.3:0.99 and overgen=1:4,
threshold policy, puct driver, paper-standard, $40 budget per search, serverless-a100) on
``synthetic-puct-v1`` (SYNTHETIC), with ``gfsim tune``'s default storage (a JournalStorage
file; ``--storage sqlite:///TMP/bench.db`` for the SQLite one), and compares every trial's
parameters and value with the recorded ones (``data/bench_tune_reference.json``: recorded
after issue 38 held invented children to the log's best; the SimPy engine's values, from
commit 7300207, were within 3% of them). Prints the seconds, trials per minute and the largest
relative difference. ``--profile`` prints the top functions of one trial's replays.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_workload(trials: int, seeds: int, jobs: int, storage: str | None = None
                 ) -> tuple[float, list[dict]]:
    """(seconds, every trial's number, parameters and values) of the workload; ``storage``:
    an Optuna URL (``TMP`` stands for a temporary folder), default ``gfsim tune``'s."""
    from gfsim.cost_models import load_cost_model
    from gfsim.replay_logs import open_log
    from gfsim.simulator import Budget
    from gfsim.simulator.closed.engine import SEARCH_PRESETS
    from gfsim.tuning.study import (Objective, make_sampler, make_storage, open_study,
                                    run_study, storage_url)
    from gfsim.tuning.trials import TrialSetup, parse_objectives, parse_param

    params = [parse_param("tau=0.3:0.99", "threshold", "puct"),
              parse_param("overgen=1:4", "threshold", "puct")]
    setup = TrialSetup(open_log("synthetic-puct-v1"), load_cost_model("serverless-a100"),
                       "threshold", "puct", Budget(usd=40), list(range(seeds)),
                       SEARCH_PRESETS["paper-standard"])
    with tempfile.TemporaryDirectory() as tmp:
        url = storage if storage else storage_url(None, f"{tmp}/bench", 1)
        study = open_study(make_storage(url.replace("TMP", tmp)), "bench", ["maximize"],
                           make_sampler("tpe", 0, False))
        objective = Objective(setup, params, parse_objectives("best_speedup"), None, jobs)
        t = time.perf_counter()
        run_study(study, objective, trials=trials)
        took = time.perf_counter() - t
        values = [{"number": tr.number, "params": tr.params, "values": tr.values}
                  for tr in study.trials]
    return took, values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--storage", help="an Optuna URL, e.g. sqlite:///TMP/bench.db (TMP: a "
                    "temporary folder); default gfsim tune's (a JournalStorage file)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    took, values = run_workload(args.trials, args.seeds, args.jobs, args.storage)
    ref = json.loads((HERE / "data" / "bench_tune_reference.json").read_text())["trials"]
    pairs = list(zip(ref, values))
    same = all(r["params"] == v["params"] for r, v in pairs)
    worst = max((abs(v["values"][0] - r["values"][0]) / abs(r["values"][0]) for r, v in pairs),
                default=float("nan"))
    print(f"synthetic-puct-v1, puct driver, threshold tau x overgen, {args.seeds} seeds per "
          f"trial, {args.jobs} processes: {args.trials} trials in {took:.1f} s "
          f"({60 * args.trials / took:.0f} trials/min; goal <= 60 s for 200 x 32)")
    print(f"against the recorded values ({len(pairs)} trials): parameters "
          f"{'the same' if same else 'DIFFER'}, largest relative difference {worst:.1e}")
    if args.profile:
        import cProfile
        import pstats

        from gfsim.cost_models import load_cost_model
        from gfsim.policies import make_policy
        from gfsim.replay_logs import open_log
        from gfsim.simulator import Budget
        from gfsim.simulator.replay import replay_many

        log, model = open_log("synthetic-puct-v1"), load_cost_model("serverless-a100")
        prof = cProfile.Profile()
        prof.enable()
        replay_many(log, [make_policy("threshold:0.7") for _ in range(16)], model, range(16),
                    driver="puct", budget=Budget(usd=40), orphans_dropped=False)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
