"""The counterfactual benchmark on the frozen family, as the tables of docs/counterfactual.md.

    python experiments/counterfactual_benchmark.py --seeds 12 --jobs 2
    python experiments/counterfactual_benchmark.py --from experiments/data/counterfactual_fallback.json

Runs ``gfsim counterfactual`` (held-out world seeds, every built-in world, the default policies
and F) and writes every figure to ``--json`` and the tables between the markers of
``--doc``. ``--from`` re-renders the tables from a saved JSON without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _speed(e) -> str:
    return f"{2 ** e['mean']:.2f}x ({2 ** e['lo']:.2f}-{2 ** e['hi']:.2f})"


def _bias(e) -> str:
    return f"{e['mean']:+.2f} ({e['lo']:+.2f}, {e['hi']:+.2f})"


def render(out: dict, seconds: float | None) -> str:
    spec = out["spec"]
    seeds = out["world_seeds"]
    lines = [
        f"Run: `gfsim counterfactual --seeds {len(seeds)} --children {spec['children']} --json` "
        f"(split `{out['split']}`, world seeds {seeds[0]}..{seeds[-1]}; {spec['steps']} steps; "
        f"{spec['replay_seeds']} replays and {spec['direct_reps']} direct runs per world seed; "
        f"cost model `{spec['cost']}`; policies {', '.join(f'`{p}`' for p in spec['policies'])}; "
        f"F in {', '.join(map(str, spec['overgens']))})"
        + (f", {seconds / 60:.0f} minutes on this machine's 2 cores." if seconds else "."),
        "",
        out["note"],
        "",
        "| world | kind | fallback share at F >= 2 | noise ceiling tau | replay tau | pairs > 0.1 "
        "ordered | regret of replay's pick | regret of F=1 `all` | 90% coverage | median "
        "width | interval score | max cell SE (direct) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in out["worlds"]:
        m = w["measures"]
        fb = [c["fallback_share"] for c in w["cells"] if c["overgen"] >= 2]
        lines.append(
            f"| `{w['world']}` | {w['kind']} | {sum(fb) / max(len(fb), 1):.0%} | "
            f"{_f(m['noise_ceiling_tau'])} | {_f(m['tau'])} | "
            f"{_f(m['pairs_ordered'], '{:.0%}')} of {m['pairs_over_margin']} | "
            f"{_f(m['regret_of_replay_pick'], '{:.1%}')} | {_f(m['regret_of_all_f1'], '{:.1%}')} | "
            f"{m['coverage_90']:.0%} | {m['interval_width_median']:.3f} | "
            f"{m['interval_score_mean']:.2f} | {m['max_cell_se']:.3f} "
            f"({m.get('max_direct_se', math.nan):.3f}) |")
    for name, why in out.get("skipped", {}).items():
        lines.append(f"\nSkipped `{name}`: {why}")
    for w in out["worlds"]:
        m = w["measures"]
        lines += [
            "", f"### `{w['world']}`", "",
            f"{w['kind'].upper()}; tasks {', '.join(f'`{t}`' for t in w['tasks'])}; budget "
            f"${w['usd_budget_mean']:.2f} per search (mean over world seeds of what the logged "
            f"standard search spent). Direct best: `{m['direct_best']['policy']}` at "
            f"F = {m['direct_best']['overgen']}; the replay's picks: "
            + ", ".join(f"{k} ({v})" for k, v in m["replay_picks"].items()) + ".",
            "",
            "| policy | F | fallback | replay best (95%) | direct best (95%) | bias log2 (95%) | "
            "SE | GPU evals replay / direct | USD replay / direct |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in w["cells"]:
            lines.append(
                f"| `{c['policy']}` | {c['overgen']} | {c['fallback_share']:.0%} | "
                f"{_speed(c['replay_log2'])} | {_speed(c['direct_log2'])} | "
                f"{_bias(c['bias_log2'])} | {max(c['se'].values()):.3f} | "
                f"{c['replay_gpu_evals']:.0f} / {c['direct_gpu_evals']:.0f} | "
                f"{c['replay_usd']:.2f} / {c['direct_usd']:.2f} |")
        for note in w["warnings"]:
            lines += ["", f"Note: {note}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--from", dest="source", default=None, help="a saved JSON to render")
    ap.add_argument("--json", default=str(ROOT / "experiments/data/counterfactual_fallback.json"))
    ap.add_argument("--doc", default=str(ROOT / "docs/counterfactual.md"))
    args = ap.parse_args()
    seconds = None
    if args.source:
        out = json.loads(Path(args.source).read_text())
        seconds = out.get("seconds")
    else:
        import subprocess
        import sys

        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gfsim.cli.main", "counterfactual",
                               "--seeds", str(args.seeds), "--jobs", str(args.jobs),
                               "--split", args.split, "--json"],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(proc.stderr)
        seconds = time.perf_counter() - t0
        out = json.loads(proc.stdout)
        out["seconds"] = round(seconds, 1)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    doc = Path(args.doc)
    text = doc.read_text()
    block = f"{START}\n{render(out, seconds)}\n{END}"
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    doc.write_text(new)
    print(f"wrote the tables into {doc}")


if __name__ == "__main__":
    main()
