"""Why did the baseline timings of the H200 live run differ between sessions (fp8_quant 4.64 ms
in one session, 0.58 ms in the next)? Time each task's PyTorch baseline with the measurer's own
code (``TritonMeasurer.reference_times``, protocol gfsim) in fresh processes: alone, three times
in a row, and while another Python thread of the same process keeps the GIL busy (as the live
driver's other batch threads can while one thread times the baseline).

    PYTHONPATH=. python3 experiments/ref_drift.py --out drift.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer
task, spin = sys.argv[1], sys.argv[2] == "1"
m = TritonMeasurer(task, MeasurerConfig())
stop = threading.Event()
def busy():
    x = 0
    while not stop.is_set():
        x = sum(range(2000)) + x % 7  # pure Python: holds the GIL
if spin:
    threading.Thread(target=busy, daemon=True).start()
out = []
for rep in range(3):
    m._ref_cache.clear()
    t = [m.reference_times(d)["value_ms"] for d in m.task.bench_shapes]
    out.append(t)
stop.set()
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="drift.json")
    ap.add_argument("--tasks", default="fp8_quant,matmul,softmax")
    ap.add_argument("--processes", type=int, default=3)
    args = ap.parse_args()
    report = {}
    for task in args.tasks.split(","):
        for spin in ("0", "1"):
            runs = []
            for _ in range(args.processes):
                res = subprocess.run([sys.executable, "-c", CHILD, task, spin],
                                     capture_output=True, text=True, timeout=300)
                runs.append(json.loads(res.stdout.strip().splitlines()[-1]) if
                            res.returncode == 0 else res.stderr[-500:])
            report[f"{task} gil_busy={spin}"] = runs
            print(task, "gil busy" if spin == "1" else "alone", runs, flush=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
