"""``gfsim live``: a real search (real forecasts, real measurements) that writes a replay log as it
goes; ``gfsim merge``: several logs into one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import (
    ConfigOption,
    console,
    esc,
    handles_errors,
    JsonFlag,
    print_json,
)

__all__ = ["live", "merge", "fidelity"]


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
             "its keys); learned (alias costmodel) "
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
    config: ConfigOption = None,
) -> None:
    """Run a live search with real parts and write its replay log as it goes; it ends with the
    replay of that log (the simulator checked against the run)."""
    from gfsim.api.live import live as run_live

    kwargs = dict(tasks=tasks, resume=resume, driver=driver, policy=policy,
                  forecaster=None if forecaster == "none" else forecaster, source=source,
                  measurer=measurer, preset=preset, steps=steps,
                  parents_per_step=parents_per_step, samples_per_parent=samples_per_parent,
                  overgen=overgen, k_per_parent=k_per_parent, budget=budget, seed=seed,
                  capacity=capacity, protocol=protocol, rse=rse, max_reps=max_reps,
                  energy_window=energy_window, max_minutes=max_minutes,
                  trust_candidates=trust_candidates, clock=clock,
                  trust_cpu_clock=trust_cpu_clock, cluster=cluster, gpus=gpus, config=config)
    if as_json:
        summary = run_live(out, **kwargs)
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
            job = None

            def progress(advance, total, text):
                nonlocal job
                if job is None:
                    job = bar.add_task(text, total=total)
                bar.update(job, advance=advance, description=text)

            summary = run_live(out, progress=progress, **kwargs)
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
    from gfsim.api.live import fidelity as compare

    result = compare(log)
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
    from gfsim.api.live import merge as merge_logs

    summary = merge_logs(logs, out)
    if as_json:
        print_json(summary)
        return
    console().print(f"[bold]gfsim merge[/bold]  {len(logs)} logs -> {esc(summary['out'], 400)}: "
                    f"{summary['searches']} searches, {summary['candidates']} candidates, "
                    f"{summary['records']} records")
