"""``gfsim live``: a real search (real forecasts, real measurements) that writes a replay log as it
goes; ``gfsim merge``: several logs into one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import (
    CONFIG_HELP,
    JsonFlag,
    console,
    esc,
    handles_errors,
    load_config,
    parse_capacities,
    print_json,
    search_config,
)

__all__ = ["live", "merge", "fidelity"]


def _environment(interpret: bool) -> dict:
    """The header's hardware block: the GPU, its driver, and the software versions."""
    import platform

    import torch

    import gfsim

    hw: dict = {"python": platform.python_version(), "torch": torch.__version__,
                "gfsim": gfsim.__version__}
    try:
        import triton

        hw["triton"] = triton.__version__
    except ImportError:
        pass
    if interpret or not torch.cuda.is_available():
        hw["device_name"] = "cpu (Triton interpreter)"
        hw["cpu"] = platform.processor() or platform.machine()
        return hw
    hw["device_name"] = torch.cuda.get_device_name(0)
    hw["cuda"] = torch.version.cuda
    try:
        import pynvml

        pynvml.nvmlInit()
        hw["driver"] = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(hw["driver"], bytes):
            hw["driver"] = hw["driver"].decode()
    except Exception:  # noqa: BLE001 - no NVML: the driver version stays unknown
        pass
    return hw


def _refuse_cpu_clock(interpret: bool, clock: str, protocol: str, trusted: bool) -> None:
    """Refuse, before anything starts, a run whose options put its timing on the CPU clock
    (whose times a candidate can forge) without --trust-cpu-clock. Where the GPU clock merely
    fails to start, the run refuses after timing its seed kernel (``LiveRun``)."""
    from gfsim.core.errors import GfsimError

    if trusted:
        return
    why = ("--measurer interpret" if interpret else "--clock wall" if clock == "wall" else
           "--protocol reference" if protocol == "reference" and clock != "gpu" else None)
    if why:
        raise GfsimError(f"{why} times candidates on the CPU clock, whose times a candidate's "
                         "own process reports and can forge; pass --trust-cpu-clock to record "
                         "such times as successes, marked untrusted")


@handles_errors
def live(
    tasks: str = typer.Option("softmax,layernorm,matmul", "--tasks",
                              help="Comma-separated task names (see gfsim.live.tasks)."),
    out: Path = typer.Option(..., "--out", "-o", help="The log to write (.jsonl or .jsonl.gz)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out: nothing it "
                                                        "recorded is done again.", metavar=""),
    driver: str = typer.Option("puct", "--driver", help="puct (the only live driver)."),
    policy: str = typer.Option("all", "--policy", "-p", help="Policy spec (gfsim policies)."),
    forecaster: Optional[str] = typer.Option(
        None, "--forecaster", "-f",
        help="vllm:URL,model=NAME,mode=logprobs (a real server; `gfsim forecast -h` lists "
             "its keys); costmodel "
             "(gradient-boosted trees over parameters and compile features, trained on this "
             "run's measurements as they come: any policy); or a what-if one, paper:NAME / "
             "synthetic:..., which draws its forecast from the measured speedup and so only "
             "annotates a run whose policy does not read forecasts."),
    source: str = typer.Option("mutate", "--source",
                               help="mutate (the task's mutation operator), mutate-wide (its "
                                    "wide neighbourhood), log:PATH (code "
                                    "stored in a log) or llm:URL,model=NAME[,...]."),
    measurer: str = typer.Option("triton", "--measurer",
                                 help="triton (on the GPU) or interpret (TRITON_INTERPRET=1 "
                                      "on the CPU, timed by wall clock: interpreter times, "
                                      "which a candidate can forge; needs --trust-cpu-clock)."),
    preset: Optional[str] = typer.Option(None, "--search",
                                         help="Search preset: paper-standard (default) or "
                                              "paper-filtered."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1,
                                        help="Steps of the search (the preset's: 40)."),
    parents_per_step: Optional[int] = typer.Option(None, "--parents-per-step", min=1,
                                                   help="Parents expanded per step (2)."),
    samples_per_parent: Optional[int] = typer.Option(None, "--samples-per-parent", min=1,
                                                     help="Children asked of the source per "
                                                          "parent, before overgeneration (4)."),
    overgen: Optional[int] = typer.Option(None, "--overgen", min=1,
                                          help="Overgeneration F: children per parent = "
                                               "samples x F (paper-standard 1, "
                                               "paper-filtered 4)."),
    k_per_parent: Optional[int] = typer.Option(None, "--k-per-parent", min=1,
                                               help="At most this many of a parent's children "
                                                    "measured and admitted (4)."),
    budget: Optional[str] = typer.Option(None, "--budget",
                                         help="Per-search limits, KEY=VALUE pairs joined by "
                                              "commas (gpu_evals=40,steps=10); keys: "
                                              "gpu_evals, seconds, steps."),
    seed: int = typer.Option(0, "--seed", help="Seed of the search, the sources and the "
                                               "measurer's inputs (keyed streams)."),
    capacity: str = typer.Option("gen=4,forecast=4", "--capacity",
                                 help="Generations and forecasts in flight at once, KEY=N "
                                      "pairs joined by commas; keys: gen, forecast."),
    protocol: str = typer.Option("gfsim", "--protocol", help="Timing protocol: gfsim (L2 "
                                                             "flush, median) or reference."),
    rse: float = typer.Option(0.001, "--rse", help="Stop timing at this relative std error."),
    max_reps: int = typer.Option(100, "--max-reps", min=1,
                                 help="At most this many timed repetitions per shape."),
    energy_window: float = typer.Option(1.0, "--energy-window",
                                        help="Seconds of back-to-back calls for NVML energy "
                                             "per call (0: off)."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes",
                                                help="Stop this session at a step boundary "
                                                     "after this long (resume later)."),
    trust_candidates: bool = typer.Option(
        False, "--trust-candidates",
        help="Run candidate code even where this machine lacks part of the sandbox (user, "
             "PID, network or mount namespaces, Landlock >= 6, seccomp); without it such a "
             "machine refuses to run LLM-written kernels.", metavar=""),
    clock: str = typer.Option(
        "auto", "--clock",
        help="Whose clock a GPU timing is: gpu (the measurer times every call on the GPU "
             "itself, over memory it shares with the candidate's process), wall (the "
             "candidate's process times its loop, judged by the measurer's wall clock), or "
             "auto (gpu where it can run; each evaluation's timing_clock says which)."),
    trust_cpu_clock: bool = typer.Option(
        False, "--trust-cpu-clock",
        help="Record successes timed on the CPU clock (--measurer interpret, --clock wall, "
             "--protocol reference, or a GPU where the GPU clock cannot run): there the "
             "candidate's own process reports its times, and a candidate can forge them (it "
             "need only replace the timing loop in its process). The log's header, each "
             "evaluation (timing_trusted false) and the summary say so. Without it such a run "
             "refuses to start.", metavar=""),
    cluster: Optional[str] = typer.Option(
        None, "--cluster", metavar="ray|ray://HOST:PORT",
        help="Measure on the GPUs of a Ray cluster instead of this machine's: 'ray' joins the "
             "one at $RAY_ADDRESS, 'ray://HOST:PORT' a named one; one sandboxed measurer per "
             "GPU, on any host (pip install 'gfsim[cluster]'; every host needs the same "
             "gfsim and the sandbox)."),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", min=1,
        help="Measure on this many GPUs at once, one Ray actor each, placed by Ray on any host "
             "of --cluster (default: every GPU the cluster has); each candidate goes to a free "
             "one. Under --measurer interpret, CPU measurers (default 2). Without --cluster: "
             "1, this machine's GPU."),
    as_json: JsonFlag = False,
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, is_eager=True,
                                          callback=load_config),
) -> None:
    """Run a live search with real parts and write its replay log as it goes; it ends with the
    replay of that log (the simulator checked against the run)."""
    import datetime
    import math
    import sys

    from gfsim.core.errors import GfsimError
    from gfsim.forecasts.whatif import is_whatif, parse_whatif
    from gfsim.live.driver import LiveOptions, LiveRun
    from gfsim.live.sources import parse_source
    from gfsim.live.tasks import get_task
    from gfsim.simulator.budget import parse_budget

    if driver != "puct":
        raise GfsimError(f"--driver {driver}: a live run re-runs the closed-loop search; only "
                         "puct is live (replay a log with --driver trace)")
    if measurer not in ("triton", "interpret"):
        raise GfsimError(f"--measurer {measurer!r}: valid: triton, interpret")
    from gfsim.core.inputs import check_output

    check_output(out, [config])  # (the settings file it was given)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    for name in names:
        get_task(name)  # unknown names: an error listing the valid ones
    if len(set(names)) != len(names):
        raise GfsimError(f"--tasks {tasks}: a task is named twice")
    given = parse_capacities(capacity, "--capacity", keys=("gen", "forecast"))
    caps = {"generator": given.get("gen", 4), "forecaster": given.get("forecast", 4)}
    search = search_config("puct", preset, steps=steps, parents_per_step=parents_per_step,
                           samples_per_parent=samples_per_parent, overgen=overgen,
                           k_per_parent=k_per_parent)
    options = LiveOptions(tasks=names, search=search, policy=policy, seed=seed,
                          budget=parse_budget(budget), generator_slots=caps["generator"],
                          forecaster_slots=caps["forecaster"],
                          max_session_s=max_minutes * 60 if max_minutes else math.inf,
                          trust_cpu_clock=trust_cpu_clock)
    the_forecaster = None
    if forecaster and forecaster != "none":
        from gfsim.forecasts.costmodel import is_costmodel

        if is_whatif(forecaster):
            the_forecaster = parse_whatif(forecaster)
        elif is_costmodel(forecaster):
            from gfsim.live.costmodel import make_costmodel

            the_forecaster = make_costmodel(forecaster)
        else:
            from gfsim.live.forecaster import parse_forecaster

            the_forecaster = parse_forecaster(forecaster)
    the_source = parse_source(source)

    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        raise GfsimError(f"gfsim live needs the live extra (pip install 'gfsim[live]'): "
                         f"{exc}") from None
    from gfsim.live.measurer import MeasurerConfig, TritonMeasurer

    interpret = measurer == "interpret"
    if clock not in ("auto", "gpu", "wall"):
        raise GfsimError(f"--clock {clock!r}: expected auto, gpu or wall")
    if gpus is not None and gpus > 1 and not cluster:
        raise GfsimError(f"--gpus {gpus}: more than one GPU needs --cluster (one Ray actor per "
                         "GPU; on one machine: ray start --head, then --cluster ray)")
    if not interpret and not cluster and not torch.cuda.is_available():
        raise GfsimError("--measurer triton needs a CUDA GPU, and torch sees none; use "
                         "--measurer interpret to run the kernels under the Triton "
                         "interpreter on the CPU (interpreter times, not GPU times, which a "
                         "candidate can forge: with --trust-cpu-clock)")
    _refuse_cpu_clock(interpret, clock, protocol, trust_cpu_clock)
    # Under the interpreter a call takes milliseconds to seconds: time it less tightly.
    mconfig = MeasurerConfig(protocol=protocol, rse_target=0.05 if interpret else rse,
                             max_reps=min(max_reps, 10) if interpret else max_reps,
                             energy_window_s=0.0 if interpret else energy_window,
                             interpret=interpret, cpu_timing=interpret,
                             trust_candidates=trust_candidates, clock=clock)
    from gfsim.live.gpus import local_pool, on_cluster, ray_pool
    from gfsim.live.sandbox import MISSING_HELP, probe_subprocess

    hardware = _environment(interpret)
    if cluster:  # the candidates run on the cluster's hosts, each probed by its measurer
        pool = ray_pool(cluster, mconfig, gpus, trust_candidates=trust_candidates)
        on_cluster(pool, hardware)
    else:
        facilities = probe_subprocess()
        missing = facilities.missing()
        if missing and not trust_candidates:
            why = "; ".join(facilities.errors) or "see gfsim.live.sandbox"
            raise GfsimError(f"this machine cannot confine candidate code: no "
                             f"{', '.join(missing)} ({why}); {MISSING_HELP}")
        if missing:
            print(f"sandbox incomplete, running anyway (--trust-candidates): no "
                  f"{', '.join(missing)}", file=sys.stderr)
        hardware["sandbox"] = facilities.as_dict()
        pool = local_pool(lambda task_name: TritonMeasurer(task_name, mconfig), interpret)
    timing = {"protocol": "cpu-wallclock" if interpret else protocol,
              "l2_flush": protocol == "gfsim" and not interpret,
              "input_clone_timed": protocol == "reference" and not interpret,
              "statistic": "median" if protocol == "gfsim" or interpret else "mean",
              "rse_target": mconfig.rse_target, "max_reps": mconfig.max_reps,
              "ref_retime_every": mconfig.ref_retime_every}
    note = ("a live gfsim search: every evaluation was measured by gfsim's TritonMeasurer" +
            (" under the Triton interpreter on a CPU, timed by wall clock: the speedups are "
             "interpreter speedups and say nothing about a GPU" if interpret else
             f" on a {hardware['device_name']}") +
            (f", {pool.size} measurers of a Ray cluster at once (hosts "
             f"{', '.join(pool.placement['hosts'])})" if cluster else ""))
    provenance = {"kind": "measured", "source": "gfsim live", "note": note,
                  "command": " ".join(["gfsim", *sys.argv[1:]]),
                  "date": datetime.date.today().isoformat(),
                  "candidates_from": the_source.describe()}
    if the_forecaster is not None and is_whatif(forecaster):
        provenance["forecasts"] = (
            f"what-if forecasts ({the_forecaster.name}): synthetic, drawn after each "
            "measurement from the measured speedup (gfsim.forecasts.whatif; every parameter an "
            "assumption); no LLM forecaster ran")
    elif the_forecaster is not None:
        provenance["forecasts"] = f"live forecaster {the_forecaster.describe()}"
    try:
        run = LiveRun(out, options, the_source, None, the_forecaster, resume=resume,
                      hardware=hardware, provenance=provenance, timing_protocol=timing,
                      pool=pool)
    except BaseException:
        pool.close()
        raise
    if as_json:
        summary = run.run()
    else:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(TextColumn("live {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True)) as bar:
            job = bar.add_task("steps", total=search.steps * len(names))

            def on_step(s, step):
                bar.update(job, advance=1, description=f"{s.task.name} step {step}: best "
                           f"{s.best:.3f}x, {s.evals} measured")

            run.on_step = on_step
            summary = run.run()
    from gfsim.live.fidelity import fidelity

    try:
        summary["fidelity"] = fidelity(out)
    except GfsimError as exc:
        summary["fidelity"] = {"error": str(exc)}
    if as_json:
        print_json(summary)
        return
    _print(summary)


@handles_errors
def fidelity(
    log: str = typer.Option(..., "--log", "-l", help="A live log (path or shipped name)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON.", metavar=""),
) -> None:
    """Replay a live log with the live run's own capacities and compare wall-clock and
    GPU-busy time with what the run recorded, search by search."""
    from gfsim.live.fidelity import fidelity as compare
    from gfsim.replay_logs import open_log

    result = compare(open_log(log))
    if as_json:
        print_json(result)
        return
    _print_fidelity(result)


def _print_fidelity(fid: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    t = Table("search", "steps", "measured", "live wall s", "replay wall s", "error",
              "live GPU s", "replay GPU s", "error",
              title=f"{esc(fid['log'], 400)}: replayed with the run's capacities")
    for r in fid["searches"]:
        t.add_row(esc(r["search_id"], 80), str(r["steps"]), str(r["gpu_evals"]),
                  f"{r['live_wall_s']:.2f}", f"{r['replay_wall_s']:.2f}",
                  f"{r['wall_error']:+.2%}", f"{r['live_gpu_busy_s']:.2f}",
                  f"{r['replay_gpu_busy_s']:.2f}", f"{r['gpu_busy_error']:+.2%}")
    tot = fid["total"]
    t.add_row("all", "", str(tot["gpu_evals"]), f"{tot['live_wall_s']:.2f}",
              f"{tot['replay_wall_s']:.2f}", f"{tot['wall_error']:+.2%}",
              f"{tot['live_gpu_busy_s']:.2f}", f"{tot['replay_gpu_busy_s']:.2f}",
              f"{tot['gpu_busy_error']:+.2%}")
    con.print(t)
    verdict = "within" if fid["within_tolerance"] else "OUTSIDE"
    con.print(f"{verdict} tolerance (every search: wall {fid['tolerance']['wall']:.0%}, GPU "
              f"busy {fid['tolerance']['gpu_busy']:.0%}); capacities {fid['capacities']}")
    for n in fid["notes"]:
        con.print(f"note: {esc(n, 2000)}")


def _print(summary: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    con.print(f"[bold]gfsim live[/bold]  {esc(summary['log'], 400)}  session "
              f"{summary['session']} ({summary['session_s']:.0f} s)"
              + (f"  stopped: {esc(summary['stopped'])}"
                                                   if summary["stopped"] else ""))
    if summary["dropped_tail"]:
        con.print("the log's last write had been cut by a crash; it was dropped before "
                  "resuming")
    if summary.get("timing_trust"):
        con.print(f"[bold red]{esc(summary['timing_trust'], 1000)}[/bold red]")
    placed = summary.get("measurers") or {}
    if placed.get("placement") == "ray":
        con.print(f"measured on {placed['measurers']} measurers of the Ray cluster at "
                  f"{placed['address']} (hosts {', '.join(placed['hosts'])})"
                  + (f"; {len(placed['lost'])} lost mid-run, their candidates measured again "
                     "elsewhere (each evaluation's 'lost')" if placed.get("lost") else ""),
                  markup=False, highlight=False)
    t = Table("search", "steps", "candidates", "measured", "seed", "best", "live s",
              "GPU busy s", "stopped by")
    for s in summary["searches"]:
        t.add_row(esc(s["search_id"], 80), str(s["steps"]), str(s["candidates"]),
                  str(s["gpu_evals"]),
                  f"{s['seed_speedup']:.3f}x", f"{s['best_speedup']:.3f}x",
                  f"{s['live_wall_s']:.1f}", f"{s['live_gpu_busy_s']:.1f}",
                  str(s["stopped_by"] or "-"))
    con.print(t)
    for s in summary["searches"]:
        if s.get("seed_speedup_by_measurer"):
            each = s["seed_speedup_by_measurer"]
            con.print(f"{esc(s['search_id'], 80)}: the seed on each of {len(each)} measurers "
                      f"{', '.join(f'{v:.3f}x' for v in each)} (spread "
                      f"{s['seed_spread']:.1%} of the median)", markup=False, highlight=False)
    fid = summary.get("fidelity") or {}
    if "error" in fid:
        con.print(f"fidelity: not compared ({esc(fid['error'], 2000)})")
        return
    _print_fidelity(fid)


@handles_errors
def merge(
    logs: list[str] = typer.Argument(..., help="Logs to merge (their searches must differ)."),
    out: Path = typer.Option(..., "--out", "-o", help="The merged log (must not exist)."),
    as_json: JsonFlag = False,
) -> None:
    """Merge logs of the same hardware and timing protocol (e.g. live runs with different seeds
    or tasks) into one; every input is validated first, and the output written atomically."""
    from gfsim.replay_logs.merge import merge_logs

    summary = merge_logs(logs, out)
    if as_json:
        print_json(summary)
        return
    console().print(f"[bold]gfsim merge[/bold]  {len(logs)} logs -> {esc(summary['out'], 400)}: "
                    f"{summary['searches']} searches, {summary['candidates']} candidates, "
                    f"{summary['records']} records")
