"""Measure every hand-written candidate of every task once on a real GPU (issue 6's figures).

    PYTHONPATH=. python3 experiments/measure_gpu.py --out results.json

For each task: each candidate measured with the gfsim protocol (L2 flush) and with the
reference protocol (the paper's: no flush, input clone timed); one kernel timed 10 times in
separate requests for the run-to-run spread; idle power read apart. Prints the medians of
compile seconds, timing seconds per protocol, joules per measurement and GPU-seconds per
evaluated candidate, the run-to-run CV, and a per-candidate table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace

from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
from gfsim.live.tasks import TASKS, get_task


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, f: str) -> str:
    return "-" if v is None else format(v, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="gpu-measurements.json")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--repeats", type=int, default=10, help="timings of one kernel for the CV")
    args = ap.parse_args()
    import torch
    import triton

    started = time.perf_counter()
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d"), "tasks": {}}
    base = MeasurerConfig()
    for name in args.tasks.split(","):
        task = get_task(name)
        rows = []
        for protocol in ("gfsim", "reference"):
            with TritonMeasurer(name, replace(base, protocol=protocol)) as m:
                if protocol == "gfsim":
                    report.setdefault("idle_w_with_context", m.idle_power_w(2.0))
                for cand in task.candidates():
                    r = m.measure(cand)
                    r.update(protocol=protocol, variant=cand.variant, params=cand.params)
                    rows.append(r)
                    print(f"{name:10s} {protocol:9s} {cand.variant:20s} {r['outcome']:14s} "
                          f"speedup {r.get('speedup', float('nan')):7.3f} compile "
                          f"{r['compile_s']:6.2f}s timing {r['timing_s']:6.2f}s wall "
                          f"{r['wall_s']:6.2f}s", flush=True)
                if protocol == "gfsim":
                    # Run-to-run spread: the same kernel timed in separate requests.
                    first = task.candidates()[0]
                    means = []
                    for _ in range(args.repeats):
                        r = m.measure(first)
                        if r["outcome"] == "success":
                            means.append(r["runtime_ns"])
                    cv = statistics.stdev(means) / statistics.fmean(means) if len(means) > 1 \
                        else None
                    report["tasks"].setdefault(name, {})["repeat_cv"] = cv
                    report["tasks"][name]["repeat_means_ns"] = means
        ok = [r for r in rows if r["outcome"] == "success"]
        t = report["tasks"].setdefault(name, {})
        t["rows"] = rows
        t["outcomes"] = {o: sum(r["outcome"] == o for r in rows) for o in {r["outcome"]
                                                                          for r in rows}}
        t["median_compile_s"] = _median([r["compile_s"] for r in rows])
        for protocol in ("gfsim", "reference"):
            t[f"median_timing_s_{protocol}"] = _median([r["timing_s"] for r in ok
                                                        if r["protocol"] == protocol])
        t["median_energy_j"] = _median([r.get("energy_j") for r in ok])
        t["median_joules_per_call"] = _median([r.get("joules_per_call") for r in ok])
        # GPU-seconds per evaluated candidate, without the optional NVML energy window.
        t["median_gpu_s_per_candidate"] = _median([r["wall_s"] - r.get("energy_loop_s", 0.0)
                                                   for r in rows])
        t["best_speedup"] = max((r["speedup"] for r in ok), default=None)
    report["seconds"] = time.perf_counter() - started
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(f"\n{report['gpu']}, torch {report['torch']}, triton {report['triton']}; idle with a "
          f"CUDA context {report.get('idle_w_with_context')} W; {report['seconds']:.0f} s")
    print("| task | outcomes | compile s | timing s gfsim | timing s reference | J/measurement"
          " | J/call | GPU-s per candidate | run-to-run CV | best speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t in report["tasks"].items():
        print(f"| {name} | {t['outcomes']} | {fmt(t['median_compile_s'], '.2f')} | "
              f"{fmt(t['median_timing_s_gfsim'], '.3f')} | "
              f"{fmt(t['median_timing_s_reference'], '.3f')} | "
              f"{fmt(t['median_energy_j'], '.1f')} | {fmt(t['median_joules_per_call'], '.4f')} | "
              f"{fmt(t['median_gpu_s_per_candidate'], '.2f')} | "
              f"{fmt(t['repeat_cv'], '.2%')} | {fmt(t['best_speedup'], '.3f')} |")


if __name__ == "__main__":
    main()
