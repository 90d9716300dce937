"""Print the README's policy table: every core policy replayed on the shipped default log under
both cost presets, beside the measure-everything baseline (same seed, trace driver).

    python experiments/readme_table.py            # markdown to stdout
"""

from __future__ import annotations

import argparse
import time

from gfsim.cost_models import load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import DEFAULT_LOG, open_log
from gfsim.simulator import replay

POLICIES = ["all", "threshold:0.7", "threshold:0.9", "threshold:coverage=0.5",
            "topk:2", "random:0.5", "oracle:0.5"]
PRESETS = ["serverless-a100", "serverless-a100:forecaster=gpt-oss-20b", "reserved-h100"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log", default=DEFAULT_LOG)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    log = open_log(args.log)
    print(f"log `{log.name}` ({log.header['provenance']['kind'].upper()}), seed {args.seed}, "
          "trace driver, orphans kept\n")
    started = time.perf_counter()
    print("| cost preset | policy | best speedup | GPU evals | forecasts | wall h | USD | kWh "
          "| orphan share | USD imputed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset in PRESETS:
        model = load_cost_model(preset)
        for spec in POLICIES:
            f = replay(log, make_policy(spec), model, seed=args.seed,
                       orphans_dropped=False).figures()
            print(f"| {preset} | `{spec}` | {f['best_speedup']:.3f}x | {f['gpu_evals']} | "
                  f"{f['forecasts']} | {f['wall_s'] / 3600:.2f} | ${f['usd']:.2f} | "
                  f"{f['joules'] / 3.6e6:.2f} | {f['orphan_share']:.0%} | "
                  f"{f['usd_imputed_share']:.0%} |")
    print(f"\n({time.perf_counter() - started:.1f} s for {len(PRESETS) * len(POLICIES)} replays)")


if __name__ == "__main__":
    main()
