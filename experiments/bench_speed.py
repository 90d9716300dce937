"""Where the time goes, and whether the speed targets are met (a benchmark, not a test).

    python experiments/bench_speed.py [--candidates 100000] [--repeat 3] [--skip-tune]
                                      [--million] [--counterfactual]
                                      [--markdown docs/experiments/benchmarks.md]

Every figure is measured in this run, on this machine, and each is put beside a baseline
measured in the same run (these machines are noisy; ratios travel better than seconds):

- reader: the JSON parse alone of a SYNTHETIC log (msgspec and orjson, the floor), a cold
  ``load_log`` (no cache), and a load from the columnar cache;
- end to end: ``gfsim replay --json`` in a fresh process, cold (no cache) and cached, minus
  the start-up (a process that imports what the command imports and exits);
- engines: the trace driver's SimPy engine and fast path on the same log; the puct driver's
  SimPy engine and fast path on the shipped paper-standard log, every seed of a replay in
  lockstep (``--lockstep-seeds``, as ``gfsim replay --seeds`` and ``gfsim tune`` run them);
- children: the same closed-loop replays with world-model children (``--children model``)
  against the fallback, and one search reading the learned cost model's forecasts against
  one reading the world's what-if forecasts (``bench_costmodel.py``'s search);
- compiled loops against their Python twins (the same answers): the world model's draws in
  model- and fresh-children replays, the closed-loop events in model- and logged-children
  replays, both in ``gfsim recommend`` and the 40-trial tune (``--only-draws``: this alone);
- plan: ``gfsim plan`` from a 100-candidate log in a fresh process (``--only-plan``: this alone);
- recommend: ``gfsim recommend`` on the shipped default log in a fresh process, with its
  default ``--jobs`` and with ``--jobs 1``;
- tuning: the 40-trial ``gfsim tune`` command of issue 39 in a fresh process, and
  ``bench_tune.py``'s workload (200 trials x 32 seeds, 2 jobs), every trial's value
  compared with the recorded values (``data/bench_tune_reference.json``);
- ``--counterfactual``: the default ``gfsim counterfactual`` (the family, 6 held-out seeds,
  fresh searches) in 2 processes (some 2 minutes: off by default);
- ``--million``: the peak memory of loading and replaying a 1,000,000-candidate log;
- many searches (``--many-searches N``, 100,000 by default; ``--only-many-searches`` alone):
  ``gfsim replay --json`` of N one-candidate searches, cold and warm, seconds and peak
  memory, and against one search of N candidates in the same run;
- Kernel Tuner: its simulation mode beside a gfsim replay of the same cache, both cold
  (``bench_kernel_tuner.py``), where a cache is found.

It prints a table of the targets, met or by how much they are missed, and the machine and its
load average before and after; ``--markdown`` writes the same as a page.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# This process imports the installed gfsim (its path starts at experiments/, not the working
# folder); every child it starts (`python -m gfsim.cli.main`, `python -c`) would put the working
# folder first, so that from the checkout's root the children would time the checkout's gfsim/
# beside a parent timing a regular install. Python's safe-path mode (-P) leaves the working
# folder off every child's path: parent and children time the same package.
os.environ["PYTHONSAFEPATH"] = "1"

from bench_replay import best_of  # noqa: E402  (experiments are scripts, not a package)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run(cmd, env=None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


# -- sections -----------------------------------------------------------------------------------
def reader(path: Path, repeat: int, rows: list, results: dict) -> None:
    import msgspec

    from gfsim.replay_logs import load_log
    from gfsim.replay_logs.io import decompress, read_raw

    data, _ = decompress(path, read_raw(path))
    t_msgspec, _ = best_of(lambda: msgspec.json.Decoder().decode_lines(data), repeat)
    try:
        import orjson

        t_orjson, _ = best_of(lambda: [orjson.loads(x) for x in data.splitlines()], repeat)
    except ImportError:  # orjson is not a gfsim dependency; msgspec's parse is the floor then
        t_orjson = float("inf")
    floor = min(t_msgspec, t_orjson)
    os.environ["GFSIM_LOG_CACHE"] = "off"
    t_cold, log = best_of(lambda: load_log(path), repeat)
    os.environ["GFSIM_LOG_CACHE"] = "on"
    load_log(path, cache=True)  # writes the cache
    t_cached, _ = best_of(lambda: load_log(path, cache=True), repeat)
    n = len(log.candidates)
    results["reader"] = {"candidates": n, "records": sum(log.counts.values()),
                         "bytes": len(data), "msgspec_parse_s": t_msgspec,
                         "orjson_parse_s": t_orjson, "cold_load_s": t_cold,
                         "cached_load_s": t_cached}
    rows.append(("cold load / the JSON parse alone", f"{t_cold:.2f} s vs parse {floor:.2f} s",
                 t_cold / floor, "x", 1.5, "<="))
    rows.append(("cold load / cached load", f"{t_cold:.2f} s vs {t_cached:.3f} s",
                 t_cold / t_cached, "x", None, None))


def end_to_end(path: Path, rows: list, results: dict) -> None:
    from gfsim.replay_logs import cache as log_cache
    from gfsim.replay_logs import load_log
    from gfsim.replay_logs.io import read_raw

    n = len(load_log(path).candidates)
    cmd = [sys.executable, "-m", "gfsim.cli.main", "replay", "--log", str(path),
           "--policy", "threshold:0.7", "--json"]
    startup_cmd = [sys.executable, "-c",
                   "import gfsim.cli.main, gfsim.cli.replay_cmd, gfsim.simulator.replay, "
                   "gfsim.replay_logs.log, gfsim.replay_logs.cache, gfsim.forecasts.whatif, "
                   "pandas, pyarrow, msgspec"]
    startup = min(run(startup_cmd) for _ in range(3))

    def clear():
        digest = log_cache._digest(read_raw(path))
        for folder in log_cache.cache_dir_for(path, digest):
            shutil.rmtree(folder, ignore_errors=True)

    colds = []
    for _ in range(2):
        clear()
        colds.append(run(cmd))
    cold = min(colds)
    cached = min(run(cmd) for _ in range(3))
    results["end_to_end"] = {"candidates": n, "startup_s": startup, "cold_s": cold,
                             "cached_s": cached}
    rate_cold = n / max(cold - startup, 1e-9)
    rate_cached = n / max(cached - startup, 1e-9)
    rows.append(("gfsim replay --json, cold", f"{cold:.2f} s, start-up {startup:.2f} s apart",
                 rate_cold, "candidates/s", 20_000, ">="))
    rows.append(("gfsim replay --json, cached", f"{cached:.2f} s, start-up {startup:.2f} s apart",
                 rate_cached, "candidates/s", 200_000, ">="))


def engines(path: Path, repeat: int, lockstep: int, rows: list, results: dict) -> None:
    from gfsim.cost_models import Capacities, load_cost_model
    from gfsim.policies import make_policy
    from gfsim.replay_logs import load_log, open_log
    from gfsim.simulator import Budget, build_traces
    from gfsim.simulator.trace.engine import SearchSimulation
    from gfsim.simulator.trace.fast import run_fast
    from gfsim.simulator.closed.engine import SEARCH_PRESETS
    from gfsim.simulator.replay import replay_many

    log = load_log(path)
    model = load_cost_model("serverless-a100")
    policy = make_policy("threshold:0.7")
    traces = build_traces(log, model)
    n = sum(len(t) for t in traces)
    wide = Capacities(generator=1024, forecaster=1024, compile_workers=1024, gpus=1024)
    t_des, _ = best_of(lambda: [SearchSimulation(t, policy, model, wide, Budget(), 0).run()
                                for t in traces], 1)
    t_fast, _ = best_of(lambda: [run_fast(t, policy, model, wide, Budget(), 0)
                                 for t in traces], repeat)
    rows.append(("trace driver: fast path / SimPy engine", f"{n / t_fast:,.0f} vs "
                 f"{n / t_des:,.0f} candidates/s", t_des / t_fast, "x", None, None))
    puct = open_log("synthetic-puct-v1")
    seeds = list(range(lockstep))
    out = {}
    for spec in ("all", "threshold:0.7"):
        def both(engine, spec=spec):
            return replay_many(puct, [make_policy(spec) for _ in seeds], model, seeds,
                               engine=engine, budget=Budget(usd=40),
                               search=SEARCH_PRESETS["paper-standard"], **PUCT)
        t_d, a = best_of(lambda: both("des"), 1)
        t_f, b = best_of(lambda: both("fast"), repeat)
        same = all(x.best_speedup == y.best_speedup for ra, rb in zip(a, b)
                   for x, y in zip(ra.searches, rb.searches))
        searches = sum(len(r.searches) for r in a)
        out[spec] = {"des_s": t_d, "fast_s": t_f, "searches": searches, "same_answers": same}
        rows.append((f"puct: fast path / SimPy engine, paper-standard, {spec}, $40",
                     f"{1e3 * t_f / searches:.1f} vs {1e3 * t_d / searches:.1f} ms per search, "
                     f"{lockstep} seeds x 6 searches in lockstep"
                     + ("" if same else " (ANSWERS DIFFER)"), t_d / t_f, "x", 20, ">="))
    results["engines"] = {"trace": {"candidates": n, "des_s": t_des, "fast_s": t_fast},
                          "puct": out}


# The closed-loop workload of the engine and children figures: the shipped PUCT log, $40.
PUCT = dict(driver="puct", orphans_dropped=False)


def children(repeat: int, lockstep: int, rows: list, results: dict) -> None:
    """World-model children against the fallback, and the learned cost model against the
    world's what-if forecasts, each pair in the same run."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.replay_logs import open_log
    from gfsim.simulator import Budget
    from gfsim.simulator.closed.engine import SEARCH_PRESETS
    from gfsim.simulator.replay import replay_many

    log = open_log("synthetic-puct-v1")
    model = load_cost_model("serverless-a100")
    seeds = list(range(lockstep))
    out = {}
    for preset in ("paper-standard", "paper-filtered"):
        def run(source, preset=preset):
            return replay_many(log, [make_policy("threshold:0.7") for _ in seeds], model,
                               seeds, budget=Budget(usd=40), search=SEARCH_PRESETS[preset],
                               children=source, **PUCT)
        run("model")  # the world model's fit and ensemble members, once per process
        t_fb, _ = best_of(lambda: run("fallback"), repeat)
        t_m, _ = best_of(lambda: run("model"), repeat)
        out[preset] = {"fallback_s": t_fb, "model_s": t_m}
        rows.append((f"children: model / fallback, {preset}, threshold:0.7, $40",
                     f"{t_m:.2f} vs {t_fb:.2f} s for {lockstep} seeds x 6 searches",
                     t_m / t_fb, "x", 1.5, "<="))
    results["children"] = out

    from dataclasses import replace

    from gfsim.forecasts.learned import LearnedForecaster
    from gfsim.worlds.protocol import resolve_world
    from gfsim.worlds.synth_puct import paper_standard, run_on_world

    _, factory, _ = resolve_world("h200:softmax")
    world = factory(0)
    task = world.tasks[0].task_id
    config = replace(paper_standard(10), overgen=4)
    spec = LearnedForecaster()

    def search(learning):
        return run_on_world(world, task, config, "threshold:0.7", seed=1, learning=learning)

    search(spec)  # warm: imports, the world's child cache
    t_w, _ = best_of(lambda: search(None), repeat)
    t_c, _ = best_of(lambda: search(spec), repeat)
    results["costmodel"] = {"whatif_s": t_w, "costmodel_s": t_c}
    rows.append(("forecasts: cost model / what-if, one search (h200:softmax, 10 steps, F 4)",
                 f"{1e3 * t_c:.0f} vs {1e3 * t_w:.0f} ms", t_c / t_w, "x", 2.0, "<="))


def in_fresh_folder(cmd, env=None) -> float:
    """Seconds ``cmd`` takes in an empty temporary folder (what it writes is thrown away)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tmp, env=env)
        return time.perf_counter() - t0


def draws(repeat: int, lockstep: int, rows: list, results: dict) -> None:
    """The compiled loops against their Python twins, the same answers either way: the world
    model's draws (``simulator._invent_kernel``) in model- and fresh-children replays, the
    closed-loop fast path's events (``simulator.closed._events_kernel``) in model- and
    logged-children replays, each with the other loop as it is in both runs, in this process
    (the two alternated, the best of each);
    ``gfsim recommend`` and the 40-trial tune with both in fresh processes
    (``GFSIM_COMPILED=off`` the baseline; best of two runs each, alternated)."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.replay_logs import open_log
    from gfsim.simulator import Budget
    from gfsim.simulator import world_model as wm
    from gfsim.simulator.closed import fast
    from gfsim.simulator.closed.engine import SEARCH_PRESETS
    from gfsim.simulator.replay import replay_many

    log = open_log("synthetic-puct-v1")
    model = load_cost_model("serverless-a100")
    seeds = list(range(lockstep))
    out: dict = {}
    saved = wm.COMPILED, wm.COMPILE_AFTER, list(fast._EVENTS)
    try:
        wm.COMPILED, wm.COMPILE_AFTER = True, 0
        fast._EVENTS[:] = []
        events = fast._events_kernel()
        for loop, children_list in (("draws", ("model", "fresh")),
                                    ("events", ("model", "fallback"))):
            for children in children_list:
                def run(children=children):
                    return replay_many(log, [make_policy("threshold:0.7") for _ in seeds], model,
                                       seeds, budget=Budget(usd=40), children=children,
                                       search=SEARCH_PRESETS["paper-filtered"], **PUCT)

                def compiled(on: bool) -> None:  # the loop measured on or off, the other as-is
                    if loop == "draws":
                        wm.COMPILED = on
                        fast._EVENTS[:] = [None]
                    else:
                        wm.COMPILED = True
                        fast._EVENTS[:] = [events if on else None]

                compiled(True)
                run()  # the world model's fit, its members, Numba's cached code: once
                took: dict = {True: [], False: []}
                got: dict = {}
                for r in range(max(repeat, 2)):  # alternated: this machine's speed drifts
                    for on in ((True, False) if r % 2 == 0 else (False, True)):
                        compiled(on)
                        t = time.perf_counter()
                        got[on] = run()
                        took[on].append(time.perf_counter() - t)
                t_c, t_p, a, b = min(took[True]), min(took[False]), got[True], got[False]
                same = all(x.best_speedup == y.best_speedup and x.wall_s == y.wall_s
                           and x.total == y.total
                           for ra, rb in zip(a, b) for x, y in zip(ra.searches, rb.searches))
                out[f"{loop}/{children}"] = {"python_s": t_p, "compiled_s": t_c,
                                             "same_answers": same}
                what = "world-model draws" if loop == "draws" else "closed-loop events"
                rows.append((f"{what}: Python loop / compiled, {children} children, "
                             "paper-filtered, threshold:0.7, $40",
                             f"{t_p:.2f} vs {t_c:.2f} s for {lockstep} seeds x 6 searches"
                             + ("" if same else " (ANSWERS DIFFER)"), t_p / t_c, "x", None,
                             None))
    finally:
        wm.COMPILED, wm.COMPILE_AFTER = saved[:2]
        fast._EVENTS[:] = saved[2]
    for name, args in (("gfsim recommend, default log, default --jobs", ["recommend"]),
                       ("gfsim tune, the 40-trial run above", TUNE)):
        cmd = [sys.executable, "-m", "gfsim.cli.main", *args]
        took: dict = {"off": [], "on": []}
        for _ in range(2):
            for mode in ("off", "on"):
                took[mode].append(in_fresh_folder(cmd, {**os.environ, "GFSIM_COMPILED": mode}))
        off, on = min(took["off"]), min(took["on"])
        out[args[0]] = {"python_s": took["off"], "compiled_s": took["on"]}
        rows.append((f"{name}: Python loops / compiled loops (draws and events)",
                     f"{off:.1f} vs {on:.1f} s, fresh processes, best of 2", off / on, "x",
                     None, None))
    results["draws"] = out


# Issue 39's everyday tuning run, as a user types it.
TUNE = ["tune", "--policy", "threshold", "--param", "tau=0.3:0.99", "--param", "overgen=1:4:int",
        "--driver", "puct", "--budget", "usd=40", "--seeds", "32", "--trials", "40", "--jobs", "2"]


def tune_command(rows: list, results: dict) -> None:
    """Issue 39's everyday tuning run (``TUNE``), in a fresh process."""
    cmd = [sys.executable, "-m", "gfsim.cli.main", *TUNE]
    took = in_fresh_folder(cmd)
    results["tune_command"] = {"seconds": took, "command": " ".join(cmd[3:])}
    rows.append(("gfsim tune, threshold tau and F, puct, $40, 32 seeds, 40 trials, 2 jobs",
                 "a fresh process, start-up included", took, "s", 20, "<="))


def recommend_command(rows: list, results: dict) -> None:
    """``gfsim recommend`` on the shipped default log, as a user types it (its --jobs default:
    one process per core), and in one process, each in a fresh process (issue 53)."""
    for jobs, words in ((None, "default --jobs"), (1, "--jobs 1")):
        cmd = [sys.executable, "-m", "gfsim.cli.main", "recommend",
               *([] if jobs is None else ["--jobs", str(jobs)])]
        took = in_fresh_folder(cmd)
        results[f"recommend_jobs_{jobs or 'default'}"] = {"seconds": took,
                                                          "command": " ".join(cmd[3:])}
        rows.append((f"gfsim recommend, default log, {words}",
                     "a fresh process, start-up included", took, "s",
                     10 if jobs is None else None, "<="))


def plan_command(tmp: Path, rows: list, results: dict) -> None:
    """``gfsim plan`` from a 100-candidate log (``gfsim synth -n 100 -k 1``: one SYNTHETIC
    search) with its default candidates (the recommendation included), in a fresh process:
    issue 55's target."""
    from gfsim.worlds.synth import synthesize

    path = tmp / "plan-100.jsonl"
    synthesize(path, seed=0, candidates=100, tasks=1)
    cmd = [sys.executable, "-m", "gfsim.cli.main", "plan", "--log", str(path), "--budget",
           "usd=40"]
    took = in_fresh_folder(cmd)
    results["plan"] = {"seconds": took, "command": " ".join(cmd[3:])}
    rows.append(("gfsim plan, a 100-candidate log, its default candidates",
                 "a fresh process, start-up included", took, "s", 10, "<="))


def counterfactual(rows: list, results: dict) -> None:
    """The default ``gfsim counterfactual`` (the family, 6 held-out seeds, its fresh
    searches; model children since issue 54 made them its default, fallback before: 189 s
    both on one machine), 2 jobs: issue 53's target."""
    cmd = [sys.executable, "-m", "gfsim.cli.main", "counterfactual", "--jobs", "2", "--json"]
    took = in_fresh_folder(cmd)
    results["counterfactual"] = {"seconds": took, "command": " ".join(cmd[3:])}
    rows.append(("gfsim counterfactual, its defaults (the family, 6 seeds, fresh searches), "
                 "2 jobs", "a fresh process, start-up included", took, "s", 120, "<="))


def tuning(rows: list, results: dict, trials: int, seeds: int, jobs: int) -> None:
    from bench_tune import run_workload

    took, values = run_workload(trials, seeds, jobs)
    ref = json.loads((HERE / "data" / "bench_tune_reference.json").read_text())
    pairs = [(r, v) for r, v in zip(ref["trials"], values)]

    def same(a: dict, b: dict) -> bool:
        """The same parameters, a float's last bits aside: Optuna's sampler runs numpy's
        SIMD code, which on another CPU may propose a tau one bit away."""
        return a.keys() == b.keys() and all(
            a[k] == b[k] or (isinstance(a[k], float) and isinstance(b[k], float)
                             and abs(a[k] - b[k]) <= 1e-12 * abs(a[k])) for k in a)

    worst = max((abs(v["values"][0] - r["values"][0]) / abs(r["values"][0])
                 for r, v in pairs if same(r["params"], v["params"])), default=float("nan"))
    same_params = all(same(r["params"], v["params"]) for r, v in pairs)
    matched = sum(same(r["params"], v["params"]) for r, v in pairs)
    first = next((k for k, (r, v) in enumerate(pairs) if not same(r["params"], v["params"])),
                 None)
    results["tuning"] = {"trials": trials, "seeds": seeds, "jobs": jobs, "seconds": took,
                         "max_rel_diff": worst, "same_params": same_params,
                         "trials_with_the_same_params": matched, "first_other_params": first,
                         "reference_seconds": ref["seconds"]}
    rows.append((f"tuning: {trials} trials x {seeds} seeds, {jobs} jobs",
                 "the SimPy engine: 515.8 s (measured quiet)", took, "s", 60, "<="))
    rows.append(("tuning: largest relative difference from the values before",
                 f"over the {matched} of {len(pairs)} trials with the reference's parameters"
                 + ("" if same_params else f" (the sampler proposed others from trial {first})"),
                 worst, "", 1e-12, "<="))


# The peak resident memory of the process that runs this, in KiB: Linux's VmHWM (this
# process's own memory since it started its program), not getrusage's ru_maxrss, which also
# counts the memory of the process it was started from (Linux keeps the larger of the two
# at exec, so a child of this benchmark, which by then holds gigabytes, reported them).
PEAK_KB = (
    "import resource\n"
    "def peak_kb():\n"
    "    try:\n"
    "        for line in open('/proc/self/status'):\n"
    "            if line.startswith('VmHWM:'):\n"
    "                return int(line.split()[1])\n"
    "    except OSError:\n"
    "        pass\n"
    "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n")


def million(tmp: Path, rows: list, results: dict) -> None:
    path = tmp / "million.jsonl"
    from gfsim.worlds.synth import synthesize

    t0 = time.perf_counter()
    synthesize(path, seed=5, candidates=1_000_000, tasks=100)
    synth_s = time.perf_counter() - t0
    code = PEAK_KB + ("import time; from gfsim.replay_logs import load_log; "
            "from gfsim.policies import make_policy; from gfsim.cost_models import "
            "load_cost_model; from gfsim.simulator import replay; t=time.perf_counter(); "
            f"log=load_log({str(path)!r}); l=time.perf_counter()-t; "
            "r=replay(log, make_policy('threshold:0.7'), load_cost_model('serverless-a100'), "
            "orphans_dropped=False); print(l, peak_kb())")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={**os.environ, "GFSIM_LOG_CACHE": "off"}).stdout
    load_s, rss_kb = out.split()
    rss_gb = int(rss_kb) * 1024 / 1e9  # KiB to GB (10^9 bytes, as the target is stated)
    results["million"] = {"synth_s": synth_s, "load_s": float(load_s), "peak_rss_gb": rss_gb}
    rows.append(("1,000,000 candidates: peak memory of a load and a replay",
                 f"load {float(load_s):.1f} s; the process's own peak (VmHWM)", rss_gb, "GB",
                 2.0, "<"))


# Runs the CLI in this process and leaves its peak resident memory (VmHWM, KiB) in a file.
CLI_PEAK = PEAK_KB + (
    "import atexit, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(str(peak_kb())))\n"
    "from gfsim.cli.main import main\n"
    "sys.argv[0] = 'gfsim'\n"
    "main()\n")


def cli_peak(args: list[str], env: dict, tmp: Path) -> tuple[float, float]:
    """(seconds, peak GB) of ``gfsim ARGS`` in a fresh process, its output discarded."""
    out = tmp / "peak.txt"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CLI_PEAK, str(out), *args], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    took = time.perf_counter() - t0
    return took, int(out.read_text()) * 1024 / 1e9  # KiB to GB (10^9 bytes, as targets are)


def many_searches(tmp: Path, n: int, rows: list, results: dict) -> None:
    """``gfsim replay --json`` of n one-candidate searches against one search of the same n
    candidates (bench_many_searches.py's SYNTHETIC logs), under threshold:0.7 and all, cold
    (no cache) and warm (the log's cache written by an earlier run): seconds and peak memory,
    and the ratio many / one, measured in this run (issue 52: 10^5 searches under 10 s and
    1 GB; before, 68 s and 2.2 GB cold, 87 s and 3.7 GB warm; issue 53: many at most 3x one,
    the target printed; the page's runs before 2026-12-08 printed issue 52's 1.5x)."""
    from bench_many_searches import write_log

    got: dict = {}
    for name in ("many", "one"):
        path = tmp / f"{name}-{n}.jsonl"
        write_log(path, n, many=name == "many")
        for mode in ("cold", "warm"):
            env = {**os.environ, "GFSIM_LOG_CACHE": "off" if mode == "cold" else "on"}
            for policy in ("threshold:0.7", "all"):
                args = ["replay", "--log", str(path), "--policy", policy, "--json"]
                if mode == "warm":
                    cli_peak(args, env, tmp)  # writes the log's cache
                got[name, mode, policy] = cli_peak(args, env, tmp)
    results["many_searches"] = {f"{a}/{b}/{c}": {"s": s, "peak_gb": gb}
                                for (a, b, c), (s, gb) in got.items()}
    for mode in ("cold", "warm"):
        secs = max(got["many", mode, p][0] for p in ("threshold:0.7", "all"))
        peak = max(got["many", mode, p][1] for p in ("threshold:0.7", "all"))
        base = max(got["one", mode, p][0] for p in ("threshold:0.7", "all"))
        rows.append((f"{n:,} one-candidate searches, replay --json, {mode}",
                     "the slower of threshold:0.7 and all, start-up included", secs, "s",
                     10.0, "<"))
        rows.append((f"{n:,} one-candidate searches, peak memory, {mode}",
                     "the larger of the two; the process's own peak (VmHWM)", peak, "GB",
                     1.0, "<"))
        rows.append((f"{n:,} one-candidate searches against one search of {n:,}, {mode}",
                     f"seconds, many / one (one: {base:.1f} s)", secs / base, "x", 3.0, "<="))


def kernel_tuner(rows: list, results: dict) -> None:
    cache = HERE.parent / "gfsim/worlds/data/kernel_tuner/dedispersion_milo_A100.json.gz"
    cache = Path(os.environ.get("GFSIM_KT_CACHE", cache))
    if not cache.exists():
        rows.append(("Kernel Tuner simulation mode, cold on both sides",
                     f"skipped: no cache at {cache}", None, "", None, None))
        return
    out = subprocess.run([sys.executable, str(HERE / "bench_kernel_tuner.py"), "--cache",
                          str(cache), "--json"], check=True, capture_output=True,
                         text=True).stdout
    kt = json.loads(out)
    results["kernel_tuner"] = kt
    rows.append((f"Kernel Tuner cache ({kt['configurations']:,} configurations), cold on both "
                 "sides: Kernel Tuner / gfsim", f"{kt['kt_s']:.3f} s vs {kt['gfsim_s']:.3f} s",
                 kt["kt_s"] / kt["gfsim_s"], "x", None, None))


# -- report --------------------------------------------------------------------------------------
def verdict(value, target, sense) -> str:
    if target is None or value is None:
        return ""
    ok = {"<=": value <= target, ">=": value >= target, "<": value < target}[sense]
    if ok:
        return "met"
    factor = value / target if sense in ("<=", "<") else target / value
    return f"missed by {factor:.1f}x"


def shown(value, unit: str) -> str:
    if value is None:
        return ""
    if unit == "x":
        return f"{value:.3g}x"
    if unit == "candidates/s":
        return f"{value:,.0f}/s"
    if unit == "":
        return f"{value:.2g}"
    return f"{value:.3g} {unit}"


def report(rows, started_load: str, header: str) -> str:
    lines = [header, "", f"Machine: {machine()}; load average (1, 5, 15 min) before "
             f"{started_load}, after {load_average()}.", "",
             "| measure | detail | value | target | verdict |", "|---|---|---|---|---|"]
    for name, figure, value, unit, target, sense in rows:
        tgt = "" if target is None else f"{sense} {shown(target, unit)}"
        lines.append(f"| {name} | {figure} | {shown(value, unit)} | {tgt} | "
                     f"{verdict(value, target, sense)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--skip-kernel-tuner", action="store_true")
    ap.add_argument("--lockstep-seeds", type=int, default=16,
                    help="seeds per closed-loop replay in the engine and children figures")
    ap.add_argument("--million", action="store_true")
    ap.add_argument("--counterfactual", action="store_true")
    ap.add_argument("--many-searches", type=int, default=100_000, metavar="N",
                    help="one-candidate searches in the many-searches figures (0: skip)")
    ap.add_argument("--only-plan", action="store_true",
                    help="only gfsim plan's figure (issue 55)")
    ap.add_argument("--only-draws", action="store_true",
                    help="only the compiled loops (draws, events) against their Python twins")
    ap.add_argument("--only-many-searches", action="store_true",
                    help="measure the many-searches figures alone")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path, help="also write every figure as JSON")
    args = ap.parse_args()
    started = load_average()
    rows: list = []
    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["GFSIM_CACHE_DIR"] = str(tmp / "user-cache")
        from gfsim.worlds.synth import synthesize

        if args.only_plan:
            plan_command(tmp, rows, results)
            print(report(rows, started, "# gfsim plan\n\nMade by `python experiments/"
                         "bench_speed.py --only-plan` on a SYNTHETIC log (nothing measured)."))
            return
        if args.only_draws:
            draws(args.repeat, args.lockstep_seeds, rows, results)
            print(report(rows, started, "# The compiled loops\n\nMade by "
                         "`python experiments/bench_speed.py --only-draws` on the shipped "
                         "SYNTHETIC logs (nothing measured)."))
            return
        if args.only_many_searches:
            many_searches(tmp, args.many_searches, rows, results)
            text = report(rows, started, "# Many searches\n\nMade by `python experiments/"
                          f"bench_speed.py --only-many-searches --many-searches "
                          f"{args.many_searches}` on SYNTHETIC logs (nothing measured).")
            print(text)
            return
        path = tmp / f"bench-{args.candidates}.jsonl"
        synthesize(path, seed=5, candidates=args.candidates, tasks=args.tasks)
        reader(path, args.repeat, rows, results)
        end_to_end(path, rows, results)
        engines(path, args.repeat, args.lockstep_seeds, rows, results)
        children(args.repeat, args.lockstep_seeds, rows, results)
        draws(args.repeat, args.lockstep_seeds, rows, results)
        recommend_command(rows, results)
        plan_command(tmp, rows, results)
        if not args.skip_tune:
            tune_command(rows, results)
            tuning(rows, results, args.trials, args.seeds, args.jobs)
        if args.counterfactual:
            counterfactual(rows, results)
        if args.million:
            million(tmp, rows, results)
        if args.many_searches:
            many_searches(tmp, args.many_searches, rows, results)
        if not args.skip_kernel_tuner:
            kernel_tuner(rows, results)
    header = (f"# Benchmarks\n\nMade by `python experiments/bench_speed.py"
              f"{' --million' if args.million else ''}"
              f"{' --counterfactual' if args.counterfactual else ''}` on a SYNTHETIC log "
              f"(`gfsim synth --seed 5 --candidates {args.candidates:,} --tasks {args.tasks}`; "
              "nothing in it was measured on a GPU). Ratios compare two figures of the same run.")
    text = report(rows, started, header)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
