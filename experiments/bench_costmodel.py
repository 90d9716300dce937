"""What the learned cost model costs inside a search (not a test).

    python experiments/bench_costmodel.py [--world h200:softmax] [--steps 10] [--overgen 4]

Runs one search directly on a measured world (``gfsim counterfactual``'s direct runs) under
``threshold:0.7``, reading (a) the world's what-if forecasts and (b) the cost model learning
in the search (``simulator.learning.LearningChildren``), and prints the seconds per search (best
of ``--repeat``) and their ratio, measured in the same run, against the target (issue 39: a
cost-model search at most 2x the what-if one). (c) fits with scikit-learn's own
``HistGradientBoostingRegressor.fit`` instead of ``costmodel._Boosted`` (the same trees, bit for
bit: the search's result is checked equal), to show what driving its histogram and splitter
directly saves; (d) as (c) with scikit-learn's OpenMP threads left on, to show what
``costmodel._one_thread`` saves there: the fits are small, and on a busy machine threads cost
more than they give.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    from gfsim.forecasts import costmodel
    from gfsim.forecasts.learned import LearnedForecaster
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import paper_standard, run_on_world

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="h200:softmax")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--overgen", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    _, factory, _ = resolve_world(args.world)
    world = factory(0)
    task = world.tasks[0].task_id
    config = replace(paper_standard(args.steps), overgen=args.overgen)
    spec = LearnedForecaster()

    def search(learning):
        return run_on_world(world, task, config, "threshold:0.7", seed=1, learning=learning)

    hashes = {"ours": search(spec)[0].trace_hash}  # warm: imports, the world's child cache
    whatif = _best(lambda: search(None), args.repeat)
    learned = _best(lambda: search(spec), args.repeat)
    kept_handles, kept_thread = costmodel._Boosted.handles, costmodel._one_thread
    try:
        costmodel._Boosted.handles = staticmethod(lambda spec, x: False)  # sklearn's own fit
        hashes["sklearn"] = search(spec)[0].trace_hash
        own = _best(lambda: search(spec), args.repeat)
        from contextlib import nullcontext

        costmodel._one_thread = nullcontext  # scikit-learn's own threading
        threaded = _best(lambda: search(spec), args.repeat)
    finally:
        costmodel._Boosted.handles, costmodel._one_thread = kept_handles, kept_thread
    if hashes["ours"] != hashes["sklearn"]:
        raise SystemExit("the two fits gave different searches: _Boosted is not sklearn's fit")
    print(f"{args.world}, {args.steps} steps, F {args.overgen}, threshold:0.7, best of "
          f"{args.repeat}; the same search (trace hash) with either fit")
    print("| forecasts | s per search | ratio to what-if (target <= 2x) |")
    print("|---|---|---|")
    for label, s in (("what-if (the world's)", whatif),
                     ("cost model (_Boosted fit)", learned),
                     ("cost model, scikit-learn's fit, one thread", own),
                     ("cost model, scikit-learn's fit, OpenMP threads", threaded)):
        print(f"| {label} | {s:.3f} | {s / whatif:.2f}x |")


if __name__ == "__main__":
    main()
