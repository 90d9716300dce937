"""The overgeneration question on the measured H200 worlds, as docs/experiments/h200-worlds.md.

    python experiments/h200_worlds.py --seeds 24 --steps 10 --jobs 2
    python experiments/h200_worlds.py --from experiments/data/h200_worlds.json
    python experiments/h200_worlds.py --forecaster costmodel --seeds 8 --steps 10 --jobs 2

Runs ``gfsim counterfactual --world h200:TASK`` for every shipped table: per world seed a
standard (measure-all) search is logged on the measured world, and every (policy, F) is run
directly on it under the USD that search spent (the exact answer: every kernel the search can
reach was measured) and replayed from the log with fallback and model children (the real-data
row of the counterfactual benchmark). Writes every figure to ``--json`` and the tables between
the markers of ``--doc``; ``--from`` re-renders them from a saved JSON. With ``--forecaster
costmodel`` the policies read the learned cost model, trained in each search (direct or
replayed) on what that search measured, instead of the worlds' what-if forecasts; its figures
go to their own JSON and between their own markers.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "results"


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _speed(e) -> str:
    if not math.isfinite(e["lo"]):
        return f"{2 ** e['mean']:.3f}x"
    return f"{2 ** e['mean']:.3f}x ({2 ** e['lo']:.3f}-{2 ** e['hi']:.3f})"


def render(runs: list[dict]) -> str:
    first = runs[0]
    spec = first["spec"]
    fc = spec.get("forecaster")
    opt = f" --forecaster {fc}" if fc else ""
    lines = [
        f"Run: `python experiments/h200_worlds.py{opt} --seeds {len(first['world_seeds'])} "
        f"--steps {spec['steps']}` (per world: `gfsim counterfactual --world h200:TASK{opt} "
        f"--seeds {len(first['world_seeds'])} --steps {spec['steps']} --children "
        f"{','.join(spec['children'])} --replay-seeds {spec['replay_seeds']} --direct-reps "
        f"{spec['direct_reps']}`; world seeds {first['world_seeds'][0]}.."
        f"{first['world_seeds'][-1]}; cost model `{spec['cost']}`), "
        f"{sum(r['seconds'] for r in runs) / 60:.1f} minutes on this machine's 2 cores.",
        "",
        first["note"],
        "",
    ]
    for run in runs:
        by = {w["children"]: w for w in run["worlds"]}
        w0 = next(iter(by.values()))
        prov = run["provenance"]
        t = prov["tables"][0]
        noise = t["noise"]
        lines += [
            f"### `{w0['world']}`", "",
            f"{t['measured_points']} of {t['points']} points measured ({t['coverage']:.0%}, "
            f"{t['distinct_binaries']} distinct binaries in the space) on {t['device']}, "
            f"{t['hardware'].get('triton', '?')} Triton; re-measured kernels moved by a median "
            f"{_f(noise['median_abs_log2'], '{:.4f}')} log2 (largest "
            f"{_f(noise['max_abs_log2'], '{:.4f}')}, {noise['remeasured']} re-measurements). "
            f"Budget ${w0['usd_budget_mean']:.2f} per search (what the logged standard search "
            f"spent, mean over world seeds); "
            + (f"forecasts from the learned cost model `{fc}`, trained in each search on "
               "what it measured (step 0: its stated prior)" if fc else
               f"forecasts from `{prov['forecaster']}` (SYNTHETIC)")
            + ", generation seconds assumed.",
            "",
            "| policy | F | direct best at equal USD (95%) | GPU evaluations | "
            + " | ".join(f"replay, {c}" for c in by) + " |",
            "|---|---|---|---|" + "---|" * len(by),
        ]
        cells = w0["cells"]
        best = max(c["direct_log2"]["mean"] for c in cells)
        for i, c in enumerate(cells):
            mark = " **(best)**" if c["direct_log2"]["mean"] == best else ""
            lines.append(
                f"| `{c['policy']}` | {c['overgen']} | {_speed(c['direct_log2'])}{mark} | "
                f"{c['direct_gpu_evals']:.0f} | "
                + " | ".join(f"{2 ** by[k]['cells'][i]['replay_log2']['mean']:.3f}x "
                             f"({by[k]['cells'][i]['invented_share']:.0%} invented)"
                             for k in by) + " |")
        lines += ["", "| children | noise ceiling tau | replay tau | pairs > 0.1 ordered | "
                  "regret of replay's pick | regret of F=1 `all` | 90% coverage |",
                  "|---|---|---|---|---|---|---|"]
        for k, w in by.items():
            m = w["measures"]
            lines.append(
                f"| {k} | {_f(m['noise_ceiling_tau'])} | {_f(m['tau'])} | "
                f"{_f(m['pairs_ordered'], '{:.0%}')} of {m['pairs_over_margin']} | "
                f"{_f(m['regret_of_replay_pick'], '{:.1%}')} | "
                f"{_f(m['regret_of_all_f1'], '{:.1%}')} | {m['coverage_90']:.0%} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def _run(task: str, args) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "gfsim.cli.main", "counterfactual", "--world", f"h200:{task}",
           "--seeds", str(args.seeds), "--steps", str(args.steps), "--jobs", str(args.jobs),
           "--children", args.children, "--replay-seeds", str(args.replay_seeds),
           "--direct-reps", str(args.direct_reps), "--json"]
    if args.forecaster:
        cmd += ["--forecaster", args.forecaster]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    out = json.loads(proc.stdout)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    from gfsim.worlds.measured import MeasuredWorld

    out["provenance"] = MeasuredWorld([task]).provenance()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--children", default="fallback,model")
    ap.add_argument("--replay-seeds", type=int, default=2)
    ap.add_argument("--direct-reps", type=int, default=2)
    ap.add_argument("--tasks", default=None, help="comma-separated (default: every shipped "
                    "table)")
    ap.add_argument("--forecaster", default=None, help="costmodel[:k=v,...]: policies read "
                    "the learned cost model (default: the worlds' what-if forecasts)")
    ap.add_argument("--from", dest="source", default=None, help="a saved JSON to render")
    ap.add_argument("--json", default=None, help="default: experiments/data/h200_worlds.json "
                    "(h200_worlds_costmodel.json with --forecaster)")
    ap.add_argument("--doc", default=str(ROOT / "docs/experiments/h200-worlds.md"))
    args = ap.parse_args()
    suffix = "_costmodel" if args.forecaster else ""
    args.json = args.json or str(ROOT / f"experiments/data/h200_worlds{suffix}.json")
    if args.source:
        runs = json.loads(Path(args.source).read_text())
    else:
        from gfsim.worlds.measured import shipped_tables

        tasks = args.tasks.split(",") if args.tasks else shipped_tables()
        runs = [_run(t, args) for t in tasks]
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
        print(f"wrote {args.json}")
    doc = Path(args.doc)
    marker = MARKER + ("-costmodel" if runs[0]["spec"].get("forecaster") else "")
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in doc.read_text():
        raise SystemExit(f"{doc}: no {start} ... {end} markers to write the tables between")
    block = f"{start}\n{render(runs)}\n{end}"
    doc.write_text(re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block,
                          doc.read_text(), flags=re.S))
    print(f"wrote the tables into {doc}")


if __name__ == "__main__":
    main()
