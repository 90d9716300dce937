"""The cost-model forecaster scored beside what-if presets, as the table in
docs/concepts/forecasters.md ("A learned cost model").

    python experiments/costmodel_scores.py            # about a minute on 2 cores

Per measured H200 world: a measure-all standard search (20 steps, world seed 1) logged with
``gfsim synth``, then forecast by the cost model (prequential: each step from earlier steps
only) and by the what-if preset ``paper:gemini3-flash``, and scored by ``gfsim score``. Then the
shipped live log ``h200-live-v1`` (its own what-if forecasts beside the cost model's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

METRICS = ("accuracy", "ece", "crps", "nll", "aurc")


def gfsim(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gfsim.cli.main", *args], capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return proc.stdout


def scores(log: Path) -> dict:
    return {r["forecaster"]: r for r in json.loads(gfsim("score", "--log", str(log), "--json"))}


def main() -> None:
    from gfsim.worlds.measured import shipped_tables

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for task in shipped_tables():
            raw = d / f"{task}.jsonl"
            gfsim("synth", "--world", f"h200:{task}", "--driver", "puct", "--steps", "20",
                  "--seed", "1", "-o", str(raw))
            gfsim("forecast", "-l", str(raw), "-f", "costmodel", "-o", str(d / f"{task}-cm.jsonl"),
                  "--drop-existing")
            gfsim("forecast", "-l", str(d / f"{task}-cm.jsonl"), "-f", "paper:gemini3-flash",
                  "-o", str(d / f"{task}-both.jsonl"))
            s = scores(d / f"{task}-both.jsonl")
            rows += [(f"`h200:{task}` (synth, 20 steps)", name, s[name])
                     for name in ("costmodel", "paper:gemini3-flash")]
        gfsim("forecast", "-l", "h200-live-v1", "-f", "costmodel", "-o", str(d / "live.jsonl"))
        s = scores(d / "live.jsonl")
        rows += [("`h200-live-v1` (live)", name, s[name])
                 for name in ("costmodel", "paper:gemini3-flash")]
    print("| log | forecaster | n | " + " | ".join(METRICS) + " |")
    print("|---|---|---|" + "---|" * len(METRICS))
    for log, name, r in rows:
        print(f"| {log} | `{name}` | {r['n']} | "
              + " | ".join(f"{r[m]:.3f}" for m in METRICS) + " |")


if __name__ == "__main__":
    main()
