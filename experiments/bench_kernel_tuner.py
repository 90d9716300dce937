"""Replay throughput on a real Kernel Tuner cache, beside Kernel Tuner's own simulation mode.

    python experiments/bench_kernel_tuner.py [--repeats 3] \
        [--cache gfsim/worlds/data/kernel_tuner/dedispersion_milo_A100.json.gz]

Both replay the same configurations (brute force over the cached ones), cold: Kernel Tuner with
``tune_kernel(..., cache=..., simulation_mode=True)``, which reads its cache file on every
call; gfsim with a measure-everything replay on one GPU of the imported ``config_space`` log,
read from its file (no columnar cache) and priced again on every repeat (no trace cache),
by its closed-form fast path and by the SimPy engine. Prints configurations per second (best
of ``--repeats``) and the ratios, all from this run, and the booked compile + verification +
benchmark totals of both; ``--json`` prints them as one object.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=ROOT / "gfsim/worlds/data/kernel_tuner/"
                    "dedispersion_milo_A100.json.gz")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import kernel_tuner

    from gfsim.cost_models import Capacities, load_cost_model
    from gfsim.importers.kernel_tuner import import_kernel_tuner
    from gfsim.policies import make_policy
    from gfsim.replay_logs import load_log
    from gfsim.simulator import replay
    from gfsim.simulator.replay import trace_cache

    doc = json.loads(gzip.decompress(args.cache.read_bytes()))
    keys, tp = set(doc["cache"]), doc["tune_params"]

    def cached(p):
        return ",".join(str(p[k]) for k in tp) in keys

    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "cache.json"
        plain.write_text(json.dumps(doc))
        kt_best, kt_total = float("inf"), None
        for _ in range(args.repeats):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, env = kernel_tuner.tune_kernel(
                    doc["kernel_name"], "__global__ void k() {}", doc["problem_size"], [], tp,
                    cache=str(plain), simulation_mode=True, strategy="brute_force",
                    quiet=True, restrictions=cached)
            kt_best = min(kt_best, time.perf_counter() - t)
            kt_total = env["simulated_time"] / 1e3
        log_path = Path(tmp) / "log.jsonl.gz"
        t = time.perf_counter()
        import_kernel_tuner(args.cache, log_path)
        import_s = time.perf_counter() - t
        model = load_cost_model("reserved-a100")
        one = Capacities(generator=1, forecaster=1, compile_workers=1, gpus=1)
        rows = []
        trace_cache(False)
        for engine in ("auto", "des"):
            best = float("inf")
            for _ in range(args.repeats):
                t = time.perf_counter()
                log = load_log(log_path)
                r = replay(log, make_policy("all"), model, capacities=one, engine=engine,
                           orphans_dropped=False)
                best = min(best, time.perf_counter() - t)
            st = r.stages
            rows.append((f"gfsim replay ({r.searches[0].engine})", best,
                         st["compilation"].seconds + st["check"].seconds + st["timing"].seconds))
    trace_cache(True)
    n = len(keys)
    if args.json:
        print(json.dumps({"cache": args.cache.name, "configurations": n, "kt_s": kt_best,
                          "gfsim_s": rows[0][1], "gfsim_des_s": rows[1][1],
                          "import_s": import_s}))
        return
    print(f"{args.cache.name}: {n:,} configurations; best of {args.repeats}; import "
          f"{import_s:.2f} s (once)\n")
    print("| runner | seconds | configurations/s | vs Kernel Tuner | booked compile+verify+"
          "benchmark s |")
    print("|---|---|---|---|---|")
    print(f"| Kernel Tuner simulation mode | {kt_best:.3f} | {n / kt_best:,.0f} | 1.00x | "
          f"{kt_total:,.3f} |")
    for name, secs, total in rows:
        print(f"| {name} | {secs:.3f} | {n / secs:,.0f} | {kt_best / secs:.2f}x | "
              f"{total:,.3f} |")


if __name__ == "__main__":
    main()
