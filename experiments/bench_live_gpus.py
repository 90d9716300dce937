"""A live search on this machine's GPU against the same search on every GPU of a one-host Ray
cluster (issue 56's live measurement; a benchmark, not a test). Needs CUDA, the live and
cluster extras.

    python experiments/bench_live_gpus.py [--tasks softmax] [--steps 3] [--out result.json]

Runs ``gfsim live`` twice in fresh processes, with the same search: without ``--cluster`` (the
one GPU torch sees, measured in this process's sandbox), then with ``--cluster ray`` on a
one-host cluster started here with all the machine's GPUs (``ray start --head --block``,
stopped by its process id). It prints, for each run, the candidates measured, the session's
seconds and the measurements per second, and for the cluster run each measurer's count and
its timing of the seed kernel, whose spread across GPUs is the agreement of their timings.
With one GPU the ratio is Ray's overhead; with N it is the throughput against one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cluster import start_cluster  # noqa: E402


def live(args: list[str], out: Path, env: dict) -> dict:
    res = subprocess.run([sys.executable, "-m", "gfsim", "live", *args, "--out", str(out),
                          "--json"], capture_output=True, text=True, env=env, timeout=3600,
                         cwd=out.parent)
    if res.returncode != 0:
        raise SystemExit(f"gfsim live {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def facts(summary: dict, log: Path) -> dict:
    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    evals = [r for r in recs if r["kind"] == "evaluation" and "reused_from" not in r]
    runs = [r for r in recs if r["kind"] == "run"]
    measured = len(evals)
    session = summary["session_s"]
    by = Counter(f"{(r.get('measured_on') or {}).get('host')}:gpu"
                 f"{(r.get('measured_on') or {}).get('gpu')}" for r in evals)
    return {"measured": measured, "session_s": round(session, 2),
            "per_s": round(measured / session, 3) if session else None,
            "gpu_busy_s": round(sum(r.get("wall_s", 0.0) for r in evals), 2),
            "outcomes": dict(Counter(r["outcome"] for r in evals)),
            "by_measurer": dict(by),
            "seed": [{"task": r["search_id"], "speedup": r["seed_speedup"],
                      "ref_runtime_ns": (r.get("seed_evaluation") or {}).get("ref_runtime_ns"),
                      "on_each": [(e["measured_on"].get("gpu"), e.get("speedup"),
                                   e.get("ref_runtime_ns"))
                                  for e in r.get("seed_on_measurers") or []]}
                     for r in runs],
            "measurers": summary.get("measurers"),
            "fidelity_wall_error": (summary.get("fidelity") or {}).get("total", {})
            .get("wall_error")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="softmax")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        raise SystemExit("no CUDA GPU")
    search = ["--tasks", a.tasks, "--steps", str(a.steps), "--parents-per-step", "2",
              "--samples-per-parent", "4", "--k-per-parent", "4", "--policy", "all"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    work = Path(tempfile.mkdtemp(prefix="gfsim-live-gpus."))
    local = facts(live(search, work / "local.jsonl", env), work / "local.jsonl")
    print("one GPU, this process:", json.dumps(local), flush=True)
    head, address, tmp = start_cluster(min(os.cpu_count() or 1, 8))
    try:
        clustered = facts(live([*search, "--cluster", "ray"], work / "cluster.jsonl",
                               {**env, "RAY_ADDRESS": address}), work / "cluster.jsonl")
    finally:
        head.send_signal(signal.SIGTERM)
        head.wait(60)
    print(f"{gpus} GPUs, Ray actors:", json.dumps(clustered), flush=True)
    ratio = (clustered["per_s"] / local["per_s"]) if local["per_s"] else None
    result = {"gpus": gpus, "device": torch.cuda.get_device_name(0), "local": local,
              "cluster": clustered, "throughput_ratio": ratio}
    print(f"measurements per second: one GPU here {local['per_s']}, {gpus} GPUs on Ray "
          f"{clustered['per_s']}: {ratio:.2f}x")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
