"""Closed-loop replays of real imported searches against the bound on invented gains (issue 38).

Imports the OpenEvolve fixture (tests/data/openevolve, a real 16-iteration OpenEvolve 0.4.1 run)
and the search example (tests/data/search/small.jsonl, hand-written), then replays each under
``all`` with the puct driver at F = 1, 2, 4 with fallback and model children (``--simulate``:
both are too thin to replay closed loop by default). Prints a Markdown table of the best found
against the best each log measured, with what it rests on, and the targets: within 1.5x of the
log's best either way at F = 1, under 2x at F <= 4.

    python experiments/closed_loop_bounds.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GFSIM = [sys.executable, "-m", "gfsim.cli.main"]


def gfsim(*args: str) -> str:
    return subprocess.run([*GFSIM, *args], check=True, capture_output=True, text=True).stdout


def logged_best(path: Path) -> float:
    from gfsim.cost_models import load_cost_model
    from gfsim.replay_logs import open_log
    from gfsim.simulator.traces import build_traces

    t = build_traces(open_log(str(path)), load_cost_model("serverless-a100"))[0]
    return float(max(t.seed_speedup, np.nanmax(np.asarray(t.speedup, dtype=float))))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logs = {"OpenEvolve fixture": Path(tmp) / "oe.jsonl",
                "search example": Path(tmp) / "mine.jsonl"}
        gfsim("import", "openevolve", str(ROOT / "tests/data/openevolve/run"), "-o",
              str(logs["OpenEvolve fixture"]), "--runtime-metric", "runtime_ns")
        gfsim("import", "search", str(ROOT / "tests/data/search/small.jsonl"), "-o",
              str(logs["search example"]))
        print("| log (best measured) | children | F 1 | F 2 | F 4 | targets met |")
        print("|---|---|---|---|---|---|")
        for name, path in logs.items():
            best = logged_best(path)
            for children in ("fallback", "model"):
                cells, met = [], True
                for overgen in (1, 2, 4):
                    out = json.loads(gfsim("replay", "--log", str(path), "--policy", "all",
                                           "--driver", "puct", "--simulate", "--children",
                                           children, "--overgen", str(overgen), "--json"))
                    found = out["best_speedup"]
                    met &= found < 2 * best and (overgen > 1 or best / 1.5 <= found <= 1.5 * best)
                    cells.append(f"{found:.3f}x ({out['best_evidence']['label']})")
                print(f"| {name} ({best:.3f}x) | {children} | {' | '.join(cells)} | "
                      f"{'yes' if met else 'NO'} |")


if __name__ == "__main__":
    main()
