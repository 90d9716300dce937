"""The fixture's evaluator: a task-suite softmax kernel, measured by gfsim (interpreter).
ShinkaEvolve runs it as ``python evaluate.py --program_path P --results_dir R``."""
import argparse
import json
import os

from gfsim.integrations.kernel_evaluator import evaluate_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--program_path", required=True)
ap.add_argument("--results_dir", required=True)
args = ap.parse_args()
m = evaluate_kernel(args.program_path, "softmax")
ok = "error" not in m
os.makedirs(args.results_dir, exist_ok=True)
with open(os.path.join(args.results_dir, "metrics.json"), "w") as f:
    json.dump({"combined_score": m["combined_score"],
               "public": {k: m[k] for k in ("speedup", "runtime_ns", "device") if k in m},
               "private": {"outcome": m.get("outcome", "success")},
               "text_feedback": m.get("error", "")}, f)
with open(os.path.join(args.results_dir, "correct.json"), "w") as f:
    json.dump({"correct": ok, "error": m.get("error")}, f)
