"""Many tiny searches against one big one: what a log's number of searches costs (issue 41's
benchmark; not a test).

    python experiments/bench_many_searches.py [--candidates 8000] [--repeat 2]
    python experiments/bench_many_searches.py --candidates 1000000 --write many.jsonl


Two SYNTHETIC logs of the same candidates (one task, a forecast and a successful evaluation
each): ``many``, every candidate its own search, and ``one``, one search of one candidate a
step. Each is loaded once, then priced (``build_traces``) and replayed (the trace driver under
``threshold:0.7`` and ``all``, as ``gfsim replay`` does) best of ``--repeat``; the ratio
many / one of each is the cost of a search beyond that of its candidates, measured in the same
run. Before issue 41 pricing was 6 ms per search and the replay 0.5 ms (ratios in the
hundreds); with 8,000 candidates the replay's ratio was 8.4x before issue 53's results as
columns and 1.6-2.0x after; docs/experiments/benchmarks.md has the figures.

``--write PATH`` only writes the ``many`` log (a search per candidate) for a run of the CLI,
e.g. ``/usr/bin/time -v gfsim replay --log PATH --json > /dev/null`` (issue 52's 10^6 case).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator import build_traces, replay

HEADER = {"kind": "header", "schema_version": 1, "log_id": "bench-many-searches",
          "created_at": "2026-12-05T00:00:00Z",
          "provenance": {"kind": "synthetic", "note": "SYNTHETIC: drawn by "
                         "experiments/bench_many_searches.py; nothing was measured"},
          "log_shape": "trajectory", "label_bin_convention": "reference-code",
          "forecast_bin_edges": [0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0],
          "forecast_relative_to": "reference", "hardware": {"device_name": "none"},
          "tasks": [{"task_id": "t", "reference_runtime_ns": 1000.0, "seed_speedup": 1.0}]}


def write_log(path: Path, n: int, many: bool) -> None:
    """The log, written a record at a time (10^6 candidates: about 1 GB of JSON lines)."""
    with open(path, "w") as f:
        for record in _records(n, many):
            f.write(json.dumps(record) + "\n")


def _records(n: int, many: bool):
    rng = random.Random(0)
    yield HEADER
    if not many:
        yield {"kind": "run", "search_id": "s", "driver": "trace"}
    for i in range(n):
        sid, step = (f"s{i}", 0) if many else ("s", i)
        if many:
            yield {"kind": "run", "search_id": sid, "driver": "trace"}
        yield {"kind": "step", "search_id": sid, "step": step, "parent_ids": []}
        yield {"kind": "candidate", "candidate_id": f"c{i}", "search_id": sid,
               "task_id": "t", "step": step, "seq": 0,
               "generation": {"started_s": 0.0, "completed_s": 30.0, "service_s": 30.0}}
        p = [rng.random() for _ in range(8)]
        yield {"kind": "forecast", "candidate_id": f"c{i}", "forecaster": "fc",
               "mode": "tool", "probs": [x / sum(p) for x in p], "latency_s": 40.0}
        yield {"kind": "evaluation", "candidate_id": f"c{i}", "outcome": "success",
               "speedup": round(rng.uniform(0.5, 2.0), 3), "compile_s": 1.0,
               "check_s": 2.0, "timing_s": 8.0}


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--write", type=Path, metavar="PATH",
                    help="write the many-searches log of --candidates searches and stop")
    args = ap.parse_args()
    if args.write is not None:
        write_log(args.write, args.candidates, many=True)
        return
    model = load_cost_model("serverless-a100")
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("many", "one"):
            path = Path(tmp) / f"{name}.jsonl"
            write_log(path, args.candidates, many=name == "many")
            log = load_log(path)
            price = best_of(lambda: build_traces(log, model), args.repeat)
            run = best_of(lambda: [replay(log, make_policy(p), model)
                                   for p in ("threshold:0.7", "all")], args.repeat)
            got[name] = {"build_traces_s": price, "replay_s": run}
    for k in ("build_traces_s", "replay_s"):
        got[f"ratio_{k}"] = got["many"][k] / got["one"][k]
    print(json.dumps({"candidates": args.candidates, **got}, indent=1))


if __name__ == "__main__":
    main()
