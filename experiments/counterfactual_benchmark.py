"""The counterfactual benchmark on the frozen family, as the tables of
docs/experiments/counterfactual-benchmark.md.

    python experiments/counterfactual_benchmark.py --seeds 12 --jobs 2
    python experiments/counterfactual_benchmark.py --from experiments/data/counterfactual_model.json

Runs ``gfsim counterfactual`` (held-out world seeds, every built-in world, the default policies and
F; the fallback pool and the world model replayed against the same direct runs) and writes every
figure to ``--json`` and the tables between the markers of ``--doc``. ``--from`` re-renders the
tables from a saved JSON without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the blocks of docs/experiments/counterfactual-benchmark.md this fills
MARKERS = ("results", "model-choice")


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _speed(e) -> str:
    return f"{2 ** e['mean']:.2f}x ({2 ** e['lo']:.2f}-{2 ** e['hi']:.2f})"


def _bias(e) -> str:
    return f"{e['mean']:+.2f} ({e['lo']:+.2f}, {e['hi']:+.2f})"


def _by_world(out: dict) -> dict:
    by: dict = {}
    for w in out["worlds"]:
        by.setdefault(w["world"], {})[w["children"]] = w
    return by


def _pair(values, fmt) -> str:
    return " / ".join(_f(v, fmt) for v in values)


def _miss(t: dict) -> str:
    if t["met"] is None:
        return "n/a"
    return "met" if t["met"] else f"missed by {t['miss']:.3g}"


def render(out: dict, seconds: float | None, cells: bool = True) -> str:
    spec = out["spec"]
    seeds = out["world_seeds"]
    sources = spec["children"]
    by = _by_world(out)
    # A run from before issue 40 holds neither the calibration curve nor the argmax's regret:
    # it is rendered as it was then.
    new = all("coverage_curve" in w["measures"] for w in out["worlds"])
    lines = [
        f"Run: `gfsim counterfactual --seeds {len(seeds)} --split {out['split']} --children "
        f"{','.join(sources)} --replay-seeds {spec['replay_seeds']}"
        + (f" --fresh-seeds {spec.get('fresh_seeds', 0)}" if new else "")
        + " --json` (world seeds "
        f"{seeds[0]}..{seeds[-1]}; {spec['steps']} steps; {spec['replay_seeds']} replays per "
        f"child source and {spec['direct_reps']} direct runs per world seed, the direct runs "
        f"shared by every source; cost model `{spec['cost']}`; policies "
        f"{', '.join(f'`{p}`' for p in spec['policies'])}; F in "
        f"{', '.join(map(str, spec['overgens']))})"
        + (f", {seconds / 60:.0f} minutes on this machine's 2 cores." if seconds else "."),
        "",
        out["note"],
        "",
        *([f"(Ran as {out['ran_as']}.)", ""] if out.get("ran_as") else []),
        f"Each cell: {' / '.join(f'`{c}`' for c in sources)}.",
        "",
        *(["| world | kind | invented share at F >= 2 | noise ceiling tau | replay tau | pairs "
            "> 0.1 ordered | regret of the recommendation | of the replay's argmax | of F=1 "
            "`all` | max abs cell bias | new searches in 50/80/90/95% intervals (sources apart "
            "by ;) | median 90% width | interval score |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"] if new else
          ["| world | kind | invented share at F >= 2 | noise ceiling tau | replay tau | pairs "
           "> 0.1 ordered | regret of replay's pick | regret of F=1 `all` | max abs cell bias | "
           "90% coverage | median width | interval score |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]),
    ]
    for world, ws in by.items():
        rows = [ws[c] for c in sources if c in ws]
        m = [w["measures"] for w in rows]
        inv = [sum(c["invented_share"] for c in w["cells"] if c["overgen"] >= 2)
               / max(sum(c["overgen"] >= 2 for c in w["cells"]), 1) for w in rows]
        worst = [max(abs(c["bias_log2"]["mean"]) for c in w["cells"]) for w in rows]
        lines.append(
            f"| `{world}` | {rows[0]['kind']} | {_pair(inv, '{:.0%}')} | "
            f"{_f(m[0]['noise_ceiling_tau'])} | {_pair([x['tau'] for x in m], '{:.2f}')} | "
            f"{_pair([x['pairs_ordered'] for x in m], '{:.0%}')} of "
            f"{m[0]['pairs_over_margin']} | "
            f"{_pair([x['regret_of_replay_pick'] for x in m], '{:.1%}')} | "
            + (f"{_pair([x['regret_of_argmax'] for x in m], '{:.1%}')} | " if new else "")
            + f"{_f(m[0]['regret_of_all_f1'], '{:.1%}')} | {_pair(worst, '{:.2f}')} | "
            + (" ; ".join("/".join(_f(x["coverage_curve"][k], "{:.0%}")
                                   for k in ("0.50", "0.80", "0.90", "0.95")) for x in m)
               if new else _pair([x['coverage_90'] for x in m], '{:.0%}'))
            + " | "
            f"{_pair([x['interval_width_median'] for x in m], '{:.2f}')} | "
            f"{_pair([x['interval_score_mean'] for x in m], '{:.2f}')} |")
    for name, why in out.get("skipped", {}).items():
        lines.append(f"\nSkipped `{name}`: {why}")
    for src in sources:
        if src == "fallback":
            continue
        lines += ["", f"Targets, `{src}`:", "",
                  "| world | tau >= 0.8 x ceiling | pairs ordered >= 90% | every cell's bias "
                  + ("interval in +-0.15 | regret <= 5% and <= F=1 `all` + 0.5% | 90% "
                     "coverage 85-95% | 50/80/95% within 5 points |" if new else
                     "interval in +-0.15 | regret <= 5% and <= F=1 `all` | coverage 85-95% |"),
                  "|---|---|---|---|---|---|---|" if new else "|---|---|---|---|---|---|"]
        keys = ("tau", "pairs_ordered", "bias_interval", "regret", "coverage") + (
            ("calibration",) if new else ())
        for world, ws in by.items():
            if src not in ws:
                continue
            t = ws[src]["measures"]["targets"]
            lines.append(f"| `{world}` | " + " | ".join(_miss(t[k]) for k in keys) + " |")
    for world, ws in by.items() if cells else ():
        rows = [ws[c] for c in sources if c in ws]
        m = rows[0]["measures"]
        lines += [
            "", f"### `{world}`", "",
            f"{rows[0]['kind'].upper()}; tasks {', '.join(f'`{t}`' for t in rows[0]['tasks'])}; "
            f"budget ${rows[0]['usd_budget_mean']:.2f} per search (mean over world seeds of what "
            f"the logged standard search spent). Direct best: `{m['direct_best']['policy']}` at "
            f"F = {m['direct_best']['overgen']}. The replay's picks: "
            + "; ".join(f"`{w['children']}`: " + ", ".join(
                f"{k} ({v})" for k, v in w["measures"]["replay_picks"].items()) for w in rows)
            + ".",
            "",
            "| policy | F | invented | direct best (95%) | replay best | bias log2 (95%) | SE | "
            "GPU evals replay / direct |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, c in enumerate(rows[0]["cells"]):
            cs = [w["cells"][i] for w in rows]
            lines.append(
                f"| `{c['policy']}` | {c['overgen']} | "
                f"{_pair([x['invented_share'] for x in cs], '{:.0%}')} | "
                f"{_speed(c['direct_log2'])} | "
                + " / ".join(f"{2 ** x['replay_log2']['mean']:.2f}x" for x in cs) + " | "
                + " / ".join(_bias(x["bias_log2"]) for x in cs) + " | "
                + " / ".join(f"{max(x['se'].values()):.3f}" for x in cs) + " | "
                + " / ".join(f"{x['replay_gpu_evals']:.0f}" for x in cs)
                + f" / {c['direct_gpu_evals']:.0f} |")
        for w in rows:
            for note in w["warnings"]:
                lines += ["", f"Note (`{w['children']}`): {note}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--from", dest="source", default=None, help="a saved JSON to render")
    ap.add_argument("--children", default="fallback,model")
    ap.add_argument("--replay-seeds", type=int, default=4)
    ap.add_argument("--marker", default="results", choices=MARKERS,
                    help="the block of --doc to fill: results (held-out figures) or "
                         "model-choice (the dev-seed comparison the model was chosen by)")
    ap.add_argument("--cells", action="store_true",
                    help="also write each world's table of cells (on by default for results)")
    ap.add_argument("--json", default=str(ROOT / "experiments/data/counterfactual_model.json"))
    ap.add_argument("--doc", default=str(ROOT / "docs/experiments/counterfactual-benchmark.md"))
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
                               "--split", args.split, "--children", args.children,
                               "--replay-seeds", str(args.replay_seeds), "--json"],
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
    start, end = f"<!-- {args.marker}:start -->", f"<!-- {args.marker}:end -->"
    cells = args.cells or args.marker == "results"
    block = f"{start}\n{render(out, seconds, cells)}\n{end}"
    new = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    doc.write_text(new)
    print(f"wrote the tables into {doc}")


if __name__ == "__main__":
    main()
