"""The real selective-surrogate run against its prediction, as docs/experiments/live-threshold.md.

    python experiments/live_threshold.py             # prints the page's results block
    python experiments/live_threshold.py --doc docs/experiments/live-threshold.md

Two live runs on one H200 (experiments/live_threshold_h200.sh), shipped as the logs
``h200-costmodel-all`` (policy ``all``) and ``h200-costmodel-threshold`` (policy
``threshold:0.7``): the same tasks, seeds and search shape, both forecast by the learned cost
model. The measure-all log is replayed under ``threshold:0.7`` three ways, and each replay's
prediction of what the threshold run spent (GPU evaluations, GPU-busy seconds, wall-clock) and
found (best measured speedup) is set beside what the threshold run recorded:

- ``trace, learned``: the logged order (open loop), the cost model retrained on what the
  replayed policy measured (``--forecaster costmodel``; gfsim.simulator.learning);
- ``trace, recorded``: the logged order, reading the forecasts the measure-all run recorded
  (whose model had learned from every measurement);
- ``puct, recorded``: the search re-run closed loop with the run's own shape, children the
  log lacks drawn from the fallback pool, reading the recorded forecasts;
- ``puct, learned``: the same, the cost model learning inside the re-run search from what it
  measured in earlier steps.

Every replay uses the live run's cost model (``gfsim.live.fidelity.live_cost_model``: the run's
capacities, reserved billing). Intervals are percentile bootstraps over the searches
(resampling the (task, seed) searches with replacement), of the ratio of summed predicted to
summed observed cost, and of the geometric mean of predicted over observed best.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALL_LOG, THRESHOLD_LOG = "h200-costmodel-all", "h200-costmodel-threshold"
POLICY = "threshold:0.7"
MARKER = "results"
N_BOOT = 10_000
_GPU_STAGES = ("cold_start", "compilation", "check", "timing")


def observed(log) -> dict[str, dict]:
    """Per search, what the live run recorded: its step records' wall-clock and GPU-busy
    seconds, its evaluations, and its best measured speedup."""
    ev = log.evaluations
    cand = log.candidates
    search_of = dict(zip(cand["candidate_id"], cand["search_id"]))
    task_of = dict(zip(cand["search_id"], cand["task_id"]))
    out = {sid: {"task": task_of[sid], "gpu_evals": 0, "gpu_s": 0.0, "wall_s": 0.0,
                 "best": 0.0, "candidates": int((cand["search_id"] == sid).sum())}
           for sid in cand["search_id"].unique()}
    for cid, outcome, speedup in zip(ev["candidate_id"], ev["outcome"], ev["speedup"]):
        row = out[search_of[cid]]
        row["gpu_evals"] += 1
        if outcome == "success" and speedup == speedup:
            row["best"] = max(row["best"], float(speedup))
    for step in log.steps:
        live = step.get("live") or {}
        out[step["search_id"]]["wall_s"] += live.get("wall_s", 0.0)
        out[step["search_id"]]["gpu_s"] += live.get("gpu_busy_s", 0.0)
    return out


def predicted(result) -> dict[str, dict]:
    """Per search, what a replay says the run spent and found."""
    return {r.search_id: {"task": r.task_id, "gpu_evals": r.gpu_evals,
                          "gpu_s": sum(r.stages[k].seconds for k in _GPU_STAGES),
                          "wall_s": r.wall_s, "best": r.best_speedup,
                          "orphans": r.orphans, "candidates": r.candidates}
            for r in result.searches}


def _bootstrap(obs: dict, pred: dict, key: str, ratio_of_sums: bool, seed: int = 0):
    """(point, lo, hi): predicted over observed, resampling searches."""
    ids = sorted(obs)
    o = np.array([obs[s][key] for s in ids], dtype=float)
    p = np.array([pred[s][key] for s in ids], dtype=float)

    def stat(idx):
        if ratio_of_sums:
            return p[idx].sum() / o[idx].sum()
        return float(np.exp(np.mean(np.log(p[idx] / o[idx]))))

    rng = np.random.default_rng(seed)
    draws = [stat(rng.integers(0, len(ids), len(ids))) for _ in range(N_BOOT)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(stat(np.arange(len(ids)))), float(lo), float(hi)


def run() -> dict:
    from gfsim.forecasts.learned import parse_learned
    from gfsim.forecasts.registry import resolve
    from gfsim.live.fidelity import live_cost_model
    from gfsim.policies import make_policy
    from gfsim.replay_logs import open_log
    from gfsim.simulator.closed.engine import SearchConfig
    from gfsim.simulator.replay import replay

    t0 = time.perf_counter()
    all_log, thr_log = open_log(ALL_LOG), open_log(THRESHOLD_LOG)
    config = all_log.runs[0]["configuration"]
    for r in all_log.runs + thr_log.runs:  # the two runs must be the same searches
        c = r["configuration"]
        assert (c["search"], c["forecaster"], c["seed"] in (0, 1)) == (
            config["search"], config["forecaster"], True), r["search_id"]
    model = live_cost_model(config)
    spec = parse_learned("costmodel")
    obs = observed(thr_log)
    base = observed(all_log)
    learned_log, name = resolve(all_log, "costmodel")
    replays = {
        "trace, learned": replay(learned_log, make_policy(POLICY), model, seed=0,
                                 forecaster=name, learning=spec),
        "trace, recorded": replay(all_log, make_policy(POLICY), model, seed=0,
                                  forecaster="costmodel"),
        "puct, recorded": replay(all_log, make_policy(POLICY), model, seed=0,
                                 forecaster="costmodel", driver="puct",
                                 search=SearchConfig(**config["search"])),
        "puct, learned": replay(learned_log, make_policy(POLICY), model, seed=0,
                                forecaster=name, learning=spec, driver="puct",
                                search=SearchConfig(**config["search"])),
    }
    out = {"logs": [ALL_LOG, THRESHOLD_LOG], "policy": POLICY, "searches": len(obs),
           "cost_model": model.name, "observed": obs, "measure_all": base,
           "predictions": {}, "seconds": 0.0,
           "device": all_log.header["hardware"]["device_name"],
           "search": config["search"]}
    for label, result in replays.items():
        pred = predicted(result)
        assert set(pred) == set(obs), (label, set(pred) ^ set(obs))
        out["predictions"][label] = {
            "per_search": pred,
            "notes": [n for n in result.notes if "learned" in n],
            "gpu_evals": _bootstrap(obs, pred, "gpu_evals", True),
            "gpu_s": _bootstrap(obs, pred, "gpu_s", True),
            "wall_s": _bootstrap(obs, pred, "wall_s", True),
            "best": _bootstrap(obs, pred, "best", False),
        }
    out["seconds"] = time.perf_counter() - t0
    return out


def _short(sid: str) -> str:
    return sid.replace("live-", "")


def render(out: dict) -> str:
    obs, base = out["observed"], out["measure_all"]
    ids = sorted(obs, key=lambda s: (obs[s]["task"], s))
    tot = {k: sum(obs[s][k] for s in ids) for k in ("gpu_evals", "gpu_s", "wall_s",
                                                     "candidates")}
    btot = {k: sum(base[s][k] for s in ids) for k in ("gpu_evals", "gpu_s", "wall_s")}
    s = out["search"]
    lines = [
        f"Run: `python experiments/live_threshold.py` ({out['seconds']:.0f} s on this "
        f"machine's 2 cores), on the shipped logs `{out['logs'][0]}` and `{out['logs'][1]}` "
        f"({out['device']}; {out['searches']} searches: 3 tasks x 2 seeds, "
        f"{s['steps']} steps x {s['parents_per_step']} parents x {s['samples_per_parent']} "
        f"children, F {s['overgen']}, k {s['k_per_parent']}). Cost model: the live run's "
        f"(`{out['cost_model']}`, its capacities).",
        "",
        f"What the live runs did ({tot['candidates']} candidates per run):",
        "",
        "| search | measure-all: GPU evals / GPU-s / best | threshold: GPU evals / GPU-s / "
        "best |",
        "|---|---|---|",
    ]
    for sid in ids:
        b, o = base[sid], obs[sid]
        lines.append(f"| `{_short(sid)}` | {b['gpu_evals']} / {b['gpu_s']:.0f} / "
                     f"{b['best']:.3f}x | {o['gpu_evals']} / {o['gpu_s']:.0f} / "
                     f"{o['best']:.3f}x |")
    lines.append(f"| all | {btot['gpu_evals']} / {btot['gpu_s']:.0f} / "
                 f"{_geo([base[i]['best'] for i in ids]):.3f}x (geo-mean) | "
                 f"{tot['gpu_evals']} / {tot['gpu_s']:.0f} / "
                 f"{_geo([obs[i]['best'] for i in ids]):.3f}x (geo-mean) |")
    lines += [
        "",
        "Predicted (replays of the measure-all log under `threshold:0.7`) against observed "
        "(the threshold run), over all searches: predicted / observed, with a 95% bootstrap "
        f"interval over the {out['searches']} searches:",
        "",
        "| replay | GPU evals | GPU-busy s | wall-clock s | best found |",
        "|---|---|---|---|---|",
        f"| observed (threshold run) | {tot['gpu_evals']} | {tot['gpu_s']:.0f} | "
        f"{tot['wall_s']:.0f} | {_geo([obs[i]['best'] for i in ids]):.3f}x |",
    ]
    for label, p in out["predictions"].items():
        per = p["per_search"]
        cells = []
        for key, fmt in (("gpu_evals", "{:.0f}"), ("gpu_s", "{:.0f}"), ("wall_s", "{:.0f}")):
            total = sum(per[i][key] for i in ids)
            r, lo, hi = p[key]
            cells.append(f"{fmt.format(total)} ({r:.2f}x; {lo:.2f}-{hi:.2f})")
        r, lo, hi = p["best"]
        cells.append(f"{_geo([per[i]['best'] for i in ids]):.3f}x ({r:.3f}x; "
                     f"{lo:.3f}-{hi:.3f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Per search, predicted by `trace, learned` against observed:", "",
              "| search | GPU evals | GPU-busy s | best found |", "|---|---|---|---|"]
    per = out["predictions"]["trace, learned"]["per_search"]
    for sid in ids:
        o, p = obs[sid], per[sid]
        lines.append(f"| `{_short(sid)}` | {p['gpu_evals']} / {o['gpu_evals']} | "
                     f"{p['gpu_s']:.0f} / {o['gpu_s']:.0f} | {p['best']:.3f}x / "
                     f"{o['best']:.3f}x |")
    return "\n".join(lines)


def _geo(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", help="Write the block between this page's results markers.")
    args = ap.parse_args()
    out = run()
    block = render(out)
    print(block)
    if args.doc:
        path = Path(args.doc)
        text = path.read_text()
        pattern = re.compile(re.escape(f"<!-- {MARKER}:start -->") + r"\n.*?\n"
                             + re.escape(f"<!-- {MARKER}:end -->"), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no <!-- {MARKER}:start/end --> markers")
        path.write_text(pattern.sub(lambda _: f"<!-- {MARKER}:start -->\n{block}\n"
                                    f"<!-- {MARKER}:end -->", text))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
