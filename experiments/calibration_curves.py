"""Calibration curves of the predictive intervals for a new search, from saved
``gfsim counterfactual --json`` runs, as the tables and the figure of
docs/experiments/counterfactual.md ("Calibration") and counterfactual-benchmark.md.

    python experiments/calibration_curves.py \\
        --run "dev (fitted on)=experiments/data/calibration_dev.json" \\
        --run "held-out=experiments/data/calibration_heldout.json" \\
        --run "H200 (measured)=experiments/data/calibration_h200.json" \\
        --png docs/calibration.png

Each run is one ``gfsim counterfactual --children model --fresh-seeds 6 --json``: per world, how
often the 50/80/90/95% predictive interval of a new search held a single direct run
(``coverage_curve``), how often the 90% interval of a gain over F = 1 ``all`` held a direct
run's gain (``coverage_90_difference``), and the regret of the recommendation beside the plain
argmax and always F = 1 ``all``. Prints a markdown table per run; ``--png`` draws the curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LEVELS = ("0.50", "0.80", "0.90", "0.95")


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def table(out: dict) -> str:
    rows = ["| world | 50% | 80% | 90% | 95% | gains, 90% | regret: recommendation / argmax "
            "/ F=1 `all` | targets: 90% in 85-95% / 50, 80, 95% within 5 points / regret |",
            "|---|---|---|---|---|---|---|---|"]
    for w in out["worlds"]:
        m, t = w["measures"], w["measures"]["targets"]
        name = f"`{w['world']}`" + (" (measured)" if w["kind"] != "synthetic" else "")
        curve = m["coverage_curve"]

        def met(k):
            v = t[k]
            if v["met"] is None:
                return "n/a"
            return "met" if v["met"] else f"missed by {v['miss']:.3g}"

        rows.append(
            f"| {name} | " + " | ".join(_pct(curve.get(k)) for k in LEVELS)
            + f" | {_pct(m['coverage_90_difference'])} | "
            f"{m['regret_of_replay_pick']:.1%} / {m['regret_of_argmax']:.1%} / "
            f"{m['regret_of_all_f1']:.1%} | {met('coverage')} / {met('calibration')} / "
            f"{met('regret')} |")
    return "\n".join(rows)


def plot(runs: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [float(k) for k in LEVELS]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 4.2), squeeze=False)
    for ax, (label, out) in zip(axes[0], runs):
        ax.fill_between(levels, [x - 0.05 for x in levels], [x + 0.05 for x in levels],
                        color="0.9", label="within 5 points")
        ax.plot(levels, levels, color="0.5", lw=1, ls="--")
        for w in out["worlds"]:
            curve = w["measures"]["coverage_curve"]
            ax.plot(levels, [curve[k] for k in LEVELS], marker="o", ms=3, lw=1.2,
                    label=w["world"])
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("nominal level")
        ax.set_xlim(0.45, 1.0)
        ax.set_ylim(0.25, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    axes[0][0].set_ylabel("share of direct runs inside")
    fig.suptitle("predictive intervals for a new search: coverage of single direct runs\n"
                 "(SYNTHETIC searches; measured outcomes in the Kernel Tuner and H200 worlds)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True,
                    help="LABEL=PATH of a gfsim counterfactual --json output (repeat)")
    ap.add_argument("--png", type=Path, default=None, help="Write the curves here.")
    args = ap.parse_args()
    runs = []
    for item in args.run:
        label, _, path = item.rpartition("=")
        if not label:
            ap.error(f"--run {item!r}: LABEL=PATH")
        out = json.loads(Path(path).read_text())
        spec = out["spec"]
        print(f"### {label}\n\nworld seeds {out['world_seeds'][0]}..{out['world_seeds'][-1]}; "
              f"{spec['steps']} steps; {spec['replay_seeds']} replays, {spec['fresh_seeds']} "
              f"fresh searches and {spec['direct_reps']} direct runs per cell\n")
        print(table(out) + "\n")
        runs.append((label, out))
    if args.png is not None:
        plot(runs, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
