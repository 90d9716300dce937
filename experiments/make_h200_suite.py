"""Write the shipped MEASURED log ``h200-suite-v0``: real H200 timings of the Triton task suite,
with every candidate's code, the code of the kernel it is timed against, and no forecasts.

    python experiments/make_h200_suite.py [--measurements docs/h200-measurements.json] [--out PATH]

Source: ``docs/h200-measurements.json``, written by ``experiments/measure_gpu.py`` on the lent
H200 (8 hand-written candidates per task for softmax, layernorm and matmul, each compiled, checked
and timed by gfsim's TritonMeasurer under the ``gfsim`` protocol, L2 flushed, median; the
paper's ``reference`` protocol timings of the same kernels ride along as
``reference_protocol``). A candidate's code is re-rendered from its
(variant, params) and must hash to the measured ``candidate_id``, so the code in the log is the
code that was timed. The log's shape is ``pairs`` (each candidate against its task's PyTorch
baseline, no search order): it is for ``gfsim forecast`` and ``gfsim score``, not ``replay``.
The output is one gzip member with mtime 0: the same input gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.live.tasks import Candidate, get_task
from gfsim.replay_logs import SCHEMA_VERSION, LogWriter

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IN = ROOT / "docs/h200-measurements.json"
DEFAULT_OUT = ROOT / "replay_logs/data/h200-suite-v0.jsonl.gz"
_EVAL_FIELDS = ("outcome", "speedup", "runtime_ns", "ref_runtime_ns", "compile_s", "check_s",
                "timing_s", "wall_s", "service_s", "energy_j")
_EXTRA_FIELDS = ("timing_statistic", "timing_reps", "timing_rse", "protocol",
                 "network_isolated", "energy_window_s")


def build(measurements: dict) -> list[dict]:
    tasks, body = [], []
    for task_id, block in measurements["tasks"].items():
        task = get_task(task_id)
        rows = [r for r in block["rows"] if r["protocol"] == "gfsim"]
        # The same candidates timed under the paper's protocol (no L2 flush, mean), kept beside.
        other = {r["candidate_id"]: r for r in block["rows"] if r["protocol"] == "reference"}
        tasks.append({"task_id": task_id, "description": task.describe(),
                      "reference_runtime_ns": statistics.median(r["ref_runtime_ns"]
                                                                for r in rows),
                      "seed_speedup": 1.0, "reference_code": task.reference_code(),
                      "dtype": task.dtype, "bench_shapes": task.bench_shapes})
        for seq, r in enumerate(rows):
            cand = Candidate(task_id, r["variant"], task.complete(r["variant"], r["params"]))
            if cand.candidate_id != r["candidate_id"]:
                raise GfsimError(f"{task_id} {r['variant']} {r['params']}: the rendered code "
                                 f"hashes to {cand.candidate_id}, the measured one was "
                                 f"{r['candidate_id']}: the templates changed since")
            code = cand.code
            body.append({"kind": "candidate", "candidate_id": cand.candidate_id,
                         "search_id": f"{task_id}-suite", "task_id": task_id, "parent_id": None,
                         "step": 0, "seq": seq, "code": code,
                         "code_sha256": hashlib.sha256(code.encode()).hexdigest(),
                         "variant": r["variant"], "params": r["params"]})
            ev = {"kind": "evaluation", "candidate_id": cand.candidate_id}
            ev.update({k: r[k] for k in _EVAL_FIELDS if r.get(k) is not None})
            ev.update({k: r[k] for k in _EXTRA_FIELDS if r.get(k) is not None})
            ref = other.get(cand.candidate_id)
            if ref is not None and ref.get("outcome") == "success":
                ev["reference_protocol"] = {k: ref[k] for k in ("speedup", "runtime_ns",
                                                                "ref_runtime_ns")}
            body.append(ev)
    m = measurements
    header = {
        "kind": "header", "schema_version": SCHEMA_VERSION, "log_id": "h200-suite-v0",
        "created_at": f"{m['date']}T00:00:00Z",
        "provenance": {
            "kind": "measured",
            "note": (f"MEASURED on one {m['gpu']} ({m['date']}; torch {m['torch']}, Triton "
                     f"{m['triton']}, Python {m['python']}) by experiments/measure_gpu.py: "
                     "hand-written Triton candidates (not LLM mutations), each compiled, "
                     "checked and timed by gfsim's TritonMeasurer against the task's PyTorch "
                     "baseline; no forecasts"),
            "generator": "experiments/make_h200_suite.py from docs/h200-measurements.json",
        },
        "log_shape": "pairs",
        "label_bin_convention": "paper",
        "forecast_bin_edges": list(PAPER_EDGES),
        "forecast_relative_to": "reference",
        "hardware": {"device_name": m["gpu"]},
        "tasks": tasks,
        "timing_protocol": {"l2_flush": True, "input_clone_timed": False, "statistic": "median",
                            "rse_target": 0.001, "max_reps": 100},
        "duration_basis": "service",
        "generator": {"model": "none (hand-written candidates)"},
    }
    return [header, *body]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measurements", type=Path, default=DEFAULT_IN)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    records = build(json.loads(args.measurements.read_text()))
    if args.out.exists():
        args.out.unlink()
    with LogWriter(args.out) as w:  # gzip members are written with mtime 0
        w.append_many(records)
    print(f"wrote {args.out}: {sum(r['kind'] == 'candidate' for r in records)} candidates")


if __name__ == "__main__":
    main()
