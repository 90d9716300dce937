"""Run the hostile-candidate suite (gfsim.live.hostile) against the sandboxed measurer and print
its table: every row must be contained. On a machine without CUDA the rows run under the Triton
interpreter's CPU mode, timed by wall clock; with a GPU every row runs, side streams included.

    python experiments/hostile_suite.py [--task softmax] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gfsim.live.hostile import ROWS, Context, format_table, honest_code, run_suite
from gfsim.live.measurer import MeasurerConfig, TritonMeasurer
from gfsim.live.tasks import get_task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="softmax")
    ap.add_argument("--json", help="write the rows (records included) here")
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    task = get_task(args.task)
    if device == "cuda":
        cfg = MeasurerConfig(timing_timeout_s=60, check_timeout_s=60, memory_limit_mb=8000)
    else:
        cfg = MeasurerConfig(cpu_timing=True, rse_target=0.05, max_reps=40,
                             cpu_shapes=({"M": 64, "N": 4096},), timing_timeout_s=20,
                             check_timeout_s=30, memory_limit_mb=3000, energy_window_s=0)
    rows = [r for r in ROWS if not args.rows or r.name in args.rows.split(",")]
    ctx = Context(honest_code(task, device), device)
    t0 = time.perf_counter()
    with TritonMeasurer(task.name, cfg) as m:
        fac = m.facilities
        print(f"sandbox on this machine: {fac.as_dict()}", file=sys.stderr)
        out = run_suite(m, ctx, rows, device)
        spawn = sorted(m.spawn_s)
    ctx.close()
    print(format_table(out))
    median_spawn = spawn[len(spawn) // 2]
    print(f"\n{sum(r['contained'] for r in out)} of {len(out)} rows contained on {device}; "
          f"a fresh sandboxed process took {median_spawn:.3f} s (median of {len(spawn)}, "
          f"max {spawn[-1]:.3f} s); the suite ran {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "facilities": fac.as_dict(), "spawn_s": spawn,
                       "rows": out}, f, indent=1, default=str)
    return 0 if all(r["contained"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
