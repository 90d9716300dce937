"""Does the configuration that was run reproduce the log? The closed-loop drivers on real runs.

Imports the real OpenEvolve fixtures (tests/data/openevolve, tests/data/openevolve-trace) and the
ShinkaEvolve fixture (tests/data/shinka), then replays each as it ran (``all``, F = 1, its own
shape) under ``--driver closed`` (the run's own evolutionary algorithm) and ``--driver puct``
(the reference search, as before issue 51) on ``--seeds`` seeds, with world-model children.
Prints a Markdown table: the best the log measured, the replays' geometric mean, its 90%
predictive interval for a new search (``simulator.predictive.predictive_interval``: replays,
searches simulated wholly on the world model, the log's surprise, as ``gfsim recommend``), and
whether the log's best is within 10% of the mean and inside the interval.

    python experiments/closed_loop_reproduction.py --seeds 20
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent


def reproduction(path: Path, driver: str, seeds: list[int]) -> dict:
    from gfsim.cost_models import load_cost_model
    from gfsim.replay_logs.log import load_log
    from gfsim.simulator.predictive import reproduce_log

    return reproduce_log(load_log(path), load_cost_model("serverless-a100"), seeds,
                         driver=driver, simulate=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    from gfsim.importers.openevolve import import_openevolve
    from gfsim.importers.shinka import import_shinka

    seeds = list(range(args.seeds))
    data = ROOT / "tests" / "data"
    with tempfile.TemporaryDirectory() as tmp:
        logs = {}
        for name in ("openevolve", "openevolve-trace"):
            logs[name] = Path(tmp) / f"{name}.jsonl"
            import_openevolve(data / name / "run", logs[name], runtime_metric="runtime_ns")
        logs["shinka"] = Path(tmp) / "shinka.jsonl"
        import_shinka(data / "shinka" / "run", logs["shinka"])
        print(f"| fixture | driver | logged best | replayed ({args.seeds} seeds) | "
              "90% interval | within 10% | inside |")
        print("|---|---|---|---|---|---|---|")
        for name, path in logs.items():
            for driver in ("closed", "puct"):
                r = reproduction(path, driver, seeds)
                print(f"| {name} | {driver} ({r['driver']}) | {r['logged']:.3f}x | "
                      f"{r['mean']:.3f}x | [{r['lo']:.3f}x, {r['hi']:.3f}x] | "
                      f"{'yes' if r['within_10'] else 'no'} | "
                      f"{'yes' if r['inside'] else 'no'} |")


if __name__ == "__main__":
    main()
