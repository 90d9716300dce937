"""The counterfactual check of the puct driver (SYNTHETIC): replay vs the landscape itself.

    python experiments/counterfactual_puct.py [--seeds 8] [--plot counterfactual.png]

For each seed, the standard search is logged on a synthetic landscape (2 tasks, 40 steps); each
policy and overgeneration factor F is then replayed from that log and run directly on the
landscape. Prints, per (policy, F), the mean fallback share and the bias of the replay's best
speedup (log2, replay minus direct, mean +- standard error over seeds and tasks).
"""

from __future__ import annotations

import argparse
import time

from gfsim.worlds.counterfactual import compare, summarize

POLICIES = ["all", "topk:4", "threshold:0.7"]
OVERGENS = [1, 2, 4, 8]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--plot", default=None, help="PNG: log2 bias against fallback share")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = compare(range(1, args.seeds + 1), POLICIES, OVERGENS)
    table = summarize(rows)
    print(f"SYNTHETIC: {args.seeds} landscape seeds x 2 tasks, 40-step searches "
          f"({time.perf_counter() - t0:.0f} s)\n")
    print("| policy | F | fallback share | log2 bias (replay - direct) | replay best | "
          "direct best | GPU evals replay / direct |")
    print("|---|---|---|---|---|---|---|")
    for s in table:
        print(f"| `{s['policy']}` | {s['overgen']} | {s['fallback_share']:.0%} | "
              f"{s['log2_bias_mean']:+.3f} +- {s['log2_bias_se']:.3f} | "
              f"{s['replay_best_geomean']:.2f}x | {s['direct_best_geomean']:.2f}x | "
              f"{s['replay_evals']:.0f} / {s['direct_evals']:.0f} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for policy in POLICIES:
            pts = [s for s in table if s["policy"] == policy]
            ax.errorbar([s["fallback_share"] for s in pts], [s["log2_bias_mean"] for s in pts],
                        yerr=[s["log2_bias_se"] for s in pts], marker="o", capsize=3,
                        label=policy)
            for s in pts:
                ax.annotate(f"F={s['overgen']}", (s["fallback_share"], s["log2_bias_mean"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", linewidth=1)
        ax.axvline(0.25, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="fallback share of drawn children",
               ylabel="log2 best speedup, replay - direct",
               title="puct replay vs the landscape (SYNTHETIC)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
