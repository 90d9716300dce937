"""``gfsim replay``: replay a log under a policy, beside the measure-everything baseline."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from gfsim.cli import units
from gfsim.api.options import parse_capacity
from gfsim.cli.common import (
    BudgetOption,
    ChildrenOption,
    ConfigOption,
    console,
    CostOption,
    esc,
    ForecasterOption,
    handles_errors,
    JsonFlag,
    LogOption,
    print_json,
    SeedOption,
    SimulateFlag,
)

__all__ = ["replay", "parse_capacity", "step_progress"]


@handles_errors
def replay(
    policy: str = typer.Option("threshold:0.7", "--policy", "-p",
                               help="Policy spec, e.g. threshold:0.7, topk:4, random:0.5 "
                                    "(`gfsim policies` lists them)."),
    log: LogOption = None,
    cost: CostOption = "serverless-a100",
    budget: BudgetOption = None,
    seed: SeedOption = 0,
    baseline: str = typer.Option("all", "--baseline", help="Policy to compare against."),
    capacity: Optional[str] = typer.Option(None, "--capacity",
                                           help="Override resource slots, KEY=N pairs joined "
                                                "by commas (gen=4,gpus=2); keys: gen, forecast, "
                                                "compile, gpus."),
    gen_tokens: Optional[str] = typer.Option(None, "--gen-tokens",
                                             help="Prior for mutation tokens the log lacks: "
                                                  "IN,OUT or in=..,out=.. (an assumption; "
                                                  "counted in usd_imputed_share)."),
    pipeline: Optional[str] = typer.Option(None, "--pipeline",
                                           help="Stage order, names joined by commas; "
                                                "default: generate, forecast, decide, compile, "
                                                "check, time. Putting compile before forecast "
                                                "compiles on CPU before forecasting."),
    driver: str = typer.Option("trace", "--driver",
                               help="trace (the logged order, open loop), puct (re-run the "
                                    "reference search, closed loop) or closed (re-run each "
                                    "search's own algorithm, chosen from the log: "
                                    "evolutionary for OpenEvolve and ShinkaEvolve runs, "
                                    "PUCT otherwise)."),
    search: Optional[str] = typer.Option(None, "--search",
                                         help="puct presets: paper-standard (spp 4, F 1, k 4) "
                                              "or paper-filtered (spp 4, F 4, k 4)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="puct: steps (default 40)."),
    parents_per_step: Optional[int] = typer.Option(None, "--parents-per-step",
                                                   help="puct: parents per step (default 2)."),
    samples_per_parent: Optional[int] = typer.Option(None, "--samples-per-parent",
                                                     help="puct: samples per parent (4)."),
    overgen: Optional[int] = typer.Option(None, "--overgen",
                                          help="puct: overgeneration F; children per parent = "
                                               "samples x F."),
    k_per_parent: Optional[int] = typer.Option(None, "--k-per-parent",
                                               help="puct: measured and admitted per parent."),
    engine: str = typer.Option("auto", "--engine",
                               help="auto (closed-form fast path wherever no capacity binds), "
                                    "des (always the SimPy engine) or fast."),
    children: ChildrenOption = "auto",
    simulate: SimulateFlag = False,
    calibrate: str = typer.Option("none", "--calibrate",
                                  help="Recalibrate forecasts before any policy sees them: "
                                       "none, temperature or isotonic, fitted out of fold (by "
                                       "task)."),
    forecaster: ForecasterOption = None,
    measure_noise: Optional[str] = typer.Option(None, "--measure-noise",
                                                help="cv=0.02: keyed log-normal noise on "
                                                     "every measured runtime (an assumption); "
                                                     "reports the confirmed (re-measured) best "
                                                     "beside the raw best."),
    seeds: int = typer.Option(1, "--seeds", min=1,
                              help="Replay seeds --seed .. --seed+N-1 and report bootstrap 95% "
                                   "intervals (over tasks, then seeds; paired with the "
                                   "baseline). Seeds resample one log."),
    jobs: int = typer.Option(1, "--jobs", help="Processes for --seeds."),
    predict: int = typer.Option(
        0, "--predict", min=0,
        help="puct: predict one NEW search like the logged one, and its gain over the "
             "baseline: N searches per side simulated wholly on the world model (seeds "
             "--seed .. --seed+N-1) give a new search's spread, the replays (--seeds) the "
             "centre; 90% predictive intervals, and whether the gain is detectable."),
    plot: Optional[Path] = typer.Option(None, "--plot",
                                        help="Write anytime curves (best speedup against "
                                             "USD and wall-clock, bands over --seeds; "
                                             "labelled measured or SIMULATED) "
                                             "of the policy and its baseline to a PNG."),
    candidates_out: Optional[Path] = typer.Option(None, "--candidates-out",
                                                  help="Write the per-candidate table "
                                                       "(.csv or .parquet)."),
    as_json: JsonFlag = False,
    detail: bool = typer.Option(False, "--detail",
                                help="With --json: every anytime row of every search (one "
                                     "per measurement), not at most 100 per search.", metavar=""),
    config: ConfigOption = None,
) -> None:
    """Replay a logged search under a policy and cost model; compare with a baseline
    (``gfsim.compare`` in Python)."""
    from gfsim.api.compare import compare

    if candidates_out is not None:
        _check_table_path(candidates_out)  # before any work, not after the replay
    if plot is not None:
        _check_plot_path(plot)
    _check_outputs({"--plot": plot, "--candidates-out": candidates_out}, [log, cost, config])
    with step_progress("replay", off=as_json):
        cmp = compare(log, policy, baseline, cost=cost, budget=budget, seed=seed, seeds=seeds,
                      jobs=jobs, capacity=capacity, gen_tokens=gen_tokens, pipeline=pipeline,
                      driver=driver, search=search, steps=steps,
                      parents_per_step=parents_per_step, samples_per_parent=samples_per_parent,
                      overgen=overgen, k_per_parent=k_per_parent, engine=engine,
                      children=children, simulate=simulate, calibrate=calibrate,
                      forecaster=forecaster, measure_noise=measure_noise, predict=predict,
                      detail=detail)
    out = cmp.to_dict()
    if plot is not None:
        out["plot"] = str(cmp.plot(plot))
    if candidates_out is not None:
        _write_table(cmp.candidates(), candidates_out)
    if as_json:
        print_json(out)
    else:
        _print_report(out)


def _check_outputs(outputs: dict, reads: list) -> None:
    """No output over, or into, a file the command reads (``gfsim.core.inputs``)."""
    from gfsim.core.inputs import check_output

    for option, path in outputs.items():
        if path is not None:
            check_output(path, reads, option)


@contextmanager
def step_progress(command: str, off: bool):
    """A bar on stderr counting the search steps replayed (every search, policy and baseline,
    every seed), with the time elapsed; off with --json and where stderr is not a terminal.
    ``gfsim recommend`` and ``gfsim savings`` show it too."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gfsim.api.report import listening

    err = Console(stderr=True)
    with Progress(TextColumn(command), BarColumn(),
                  TextColumn("{task.completed:,.0f} search steps"), TimeElapsedColumn(),
                  console=err, transient=True, disable=off or not err.is_terminal) as bar:
        job = bar.add_task(command, total=None)
        with listening(lambda n: bar.advance(job, n)):
            yield


def _check_plot_path(path: Path) -> None:
    from gfsim.core.errors import GfsimError

    if path.suffix.lower() != ".png":
        raise GfsimError(f"{path}: --plot writes a .png")
    if not path.parent.exists():
        raise GfsimError(f"{path}: folder {path.parent} does not exist")


# The interval table's metrics, each row in one unit (taken from the policy's mean).
_HUMAN = {
    "best_speedup": ("best speedup", lambda ref: lambda x: f"{x:.3f}x"),
    "usd": ("USD", lambda ref: units.usd),
    "wall_s": ("wall-clock", lambda ref: lambda x, u=units.duration_unit(ref):
               units.duration(x, u)),
    "joules": ("energy", lambda ref: lambda x, u=units.energy_unit(ref): units.energy(x, u)),
    "gpu_evals": ("GPU evaluations", lambda ref: lambda x: f"{x:,.0f}"),
}


def _print_intervals(con, iv: dict) -> None:
    from gfsim.api.report import POINT_WORDS, no_spread
    from gfsim.cli.common import Table

    table = Table(title=f"{iv['seeds']} seeds: mean [95% interval]", show_edge=False)
    for col in ("", "policy", "baseline", "delta (policy - baseline)"):
        table.add_column(col, justify="right" if col else "left")
    for m, e in iv["overall"].items():
        label, make = _HUMAN.get(m, (m, lambda ref: lambda x: f"{x:,.3g}"))
        fmt = make(e["policy"]["mean"] if "policy" in e else e["delta"]["mean"])

        def cell(d, fmt=fmt):
            if no_spread(d):
                return f"{fmt(d['mean'])} (point)"
            return f"{fmt(d['mean'])} [{fmt(d['lo'])}, {fmt(d['hi'])}]"

        delta = cell(e["delta"]) + (" (includes 0)" if e["delta"]["includes_zero"]
                                    and not no_spread(e["delta"]) else "")
        table.add_row(label, cell(e["policy"]), cell(e["baseline"]), delta)
    con.print(table)
    if any(no_spread(d) for e in iv["overall"].values() for d in e.values()
           if isinstance(d, dict) and "lo" in d):
        con.print(f"[dim](point): {POINT_WORDS}[/dim]")
    con.print(f"[dim]note: {iv['note']}[/dim]")


def _check_table_path(path: Path) -> None:
    from gfsim.core.errors import GfsimError

    if path.suffix not in (".csv", ".parquet"):
        raise GfsimError(f"{path}: --candidates-out takes a .csv or .parquet path")
    if not path.parent.is_dir():
        raise GfsimError(f"{path}: --candidates-out: folder {path.parent} does not exist")


def _write_table(df, path: Path) -> None:
    _check_table_path(path)
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)


_DRAW_NAMES = {"own": "own", "other_expansion": "other expansions", "fallback": "fallback",
               "model": "model", "world": "world"}


def _print_search(con, out: dict) -> None:
    """The closed-loop shape, where it came from, and where the children came from."""
    from gfsim.api.report import describe_shape as describe

    shapes = {repr(sorted(v.items())) for v in out["search_per_search"].values()}
    shape = describe(out["search"]) if len(shapes) == 1 else \
        f"{len(shapes)} shapes (per search in --json), the first {describe(out['search'])}"
    con.print(f"search: {shape} ({'; '.join(out['shape_source'])}; baseline F "
              f"{out['baseline']['search']['overgen']})")
    drawn = ", ".join(f"{_DRAW_NAMES.get(k, k)} {v:.0%}" for k, v in out["draw_shares"].items())
    con.print(f"children drawn: {drawn}; invented {out['invented_share']:.0%}"
              + (" [bold red]EXTRAPOLATED[/bold red]" if out["extrapolated"] else ""))


def _print_new_search(con, p: dict) -> None:
    from gfsim.api.report import POINT_WORDS, no_spread

    b, g, e = p["best_speedup"], p["gain_over_baseline"], p["expected_gain"]
    point = f"({esc(POINT_WORDS)})"
    con.print(f"[bold]a new search[/bold] ({p['level']:.0%} predictive intervals; every child "
              f"of the {p['fresh_searches']} simulated searches per side invented): best "
              f"{b['mean']:.3f}x "
              + (point if no_spread(b) else esc(f"[{b['lo']:.3f}x, {b['hi']:.3f}x]"))
              + f"; against {esc(g['baseline'])}: x{g['mean']:.3f} "
              + (point if no_spread(g) else esc(f"[x{g['lo']:.3f}, x{g['hi']:.3f}]")))
    expected = "no interval: too few searches" if e["lo"] is None else \
        esc(f"[x{e['lo']:.3f}, x{e['hi']:.3f}]")
    con.print(f"[bold]adopting it[/bold] (the expected gain, {p['level']:.0%} interval): "
              f"x{e['mean']:.3f} {expected}, "
              + ("a detectable gain" if e["detectable"] else
                 "no detectable gain: keep the baseline"))
    surprise = p.get("log_surprise") or {}
    if surprise.get("factor", 1.0) > 1.0:
        con.print(f"the logged search sits off the model's new searches of it ("
                  f"{2 ** surprise['log_log2']:.3f}x against "
                  f"{2 ** surprise['fresh_log2_mean']:.3f}x"
                  f"): the best speedup's interval is widened x{surprise['factor'] ** 0.5:.2f}",
                  markup=False, highlight=False)
    con.print(f"[dim]over: {esc(p['over'], 1000)}[/dim]")


def _print_report(out: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    base = out["baseline"]
    con.print(f"[bold]gfsim replay[/bold]  log={esc(out['log'], 400)}  "
              f"policy={esc(out['policy'])}  cost={esc(out['cost_model'])}  seed={out['seed']}")
    chosen = (f"{out['driver_requested']}, chose {out['driver']} from the log"
              if out.get("driver_requested") == "closed" else out["driver"])
    con.print(f"[dim]driver {esc(chosen)}; pipeline {out['pipeline']}; engine "
              f"{', '.join(out['engines'])}; simulated in {out['simulation_s']:.2f} s[/dim]")
    if "search" in out:
        _print_search(con, out)
    for sid, fit in (out.get("selection_fit") or {}).items():
        from gfsim.api.report import describe_fit

        con.print(describe_fit(sid, fit), markup=False, highlight=False)
    table = Table(show_edge=False)
    for col in ("", "policy", f"baseline ({esc(base['policy'])})", "delta"):
        table.add_column(col, justify="right" if col else "left")
    evidence = out["best_evidence"], base["best_evidence"]
    measured = all(e["basis"] == "measured" for e in evidence)
    simulated = any(e["simulated_searches"] for e in evidence)
    rows = [
        ("best speedup (geo-mean, measured)" if measured else
         "best speedup (geo-mean, SIMULATED)" if simulated else "best speedup (geo-mean)",
         "best_speedup", "{:.3f}x"),
        *([("  confirmed (best re-measured)", "confirmed_speedup", "{:.3f}x"),
           ("  true (noise-free, same kernel)", "true_best_speedup", "{:.3f}x")]
          if out.get("measure_noise") else []),
        ("GPU evaluations", "gpu_evals", "{:,.0f}"),
        ("candidates generated", "candidates", "{:,.0f}"),
        ("forecasts", "forecasts", "{:,.0f}"),
        # counted, not hidden: candidates a forecast-reading policy decided with no forecast
        ("  decided with no forecast", "unforecast", "{:,.0f}"),
        ("wall-clock", "wall_s", lambda x, u=units.duration_unit(out["wall_s"]):
         units.duration(x, u)),
        ("USD", "usd", units.usd),
        ("energy", "joules", lambda x, u=units.energy_unit(out["joules"]):
         units.energy(x, u)),
    ]
    for label, key, fmt in rows:
        if isinstance(fmt, str):
            fmt = fmt.format
        mine, theirs = out[key], base[key]
        delta = mine - theirs
        table.add_row(label, fmt(mine), fmt(theirs), units.signed(fmt(delta), delta))
        if key == "best_speedup" and not measured:
            table.add_row("  rests on", *(f"[bold red]{e['label']}[/bold red]"
                                          if e["invented_bests"] else e["label"]
                                          for e in evidence), "")
    con.print(table)
    if not measured:
        con.print("[dim]rests on: measured = kernels the log measured, reached through kernels "
                  "it measured; invented N% = share of the nodes from the seed down to each "
                  "search's best that the log never held (drawn by the fallback or the world "
                  "model); simulated = PUCT run on the evidence of a log whose own search "
                  "PUCT does not reproduce[/dim]")
    stages = Table(title="cost by stage (policy)", show_edge=False)
    for col in ("stage", "resource time", "USD", "energy"):
        stages.add_column(col, justify="right" if col != "stage" else "left")
    # one unit a column, from its largest figure
    t_unit = units.duration_unit(max((c["s"] for c in out["stages"].values()), default=0.0))
    e_unit = units.energy_unit(max((c["joules"] for c in out["stages"].values()), default=0.0))
    for name, c in out["stages"].items():
        stages.add_row(name, units.duration(c["s"], t_unit), units.usd(c["usd"]),
                       units.energy(c["joules"], e_unit))
    con.print(stages)
    prior = out["gen_tokens_prior"]
    con.print(f"USD resting on imputed usage (priors, not the log): "
              f"{out['usd_imputed_share']:.0%} (policy), {base['usd_imputed_share']:.0%} "
              f"(baseline); mutation-token prior {prior['input']:,.0f} in / "
              f"{prior['output']:,.0f} out (assumption)")
    con.print(f"orphans (children of candidates this policy never measured): "
              f"{out['orphan_share']:.0%}", end="")
    if "orphans_dropped" in out:
        d = out["orphans_dropped"]
        con.print(f"; with orphans dropped: best {d['best_speedup']:.3f}x, "
                  f"{d['gpu_evals']} GPU evaluations, ${d['usd']:,.2f}")
    else:
        con.print()
    if out["stopped_by"]:
        con.print(f"stopped by budget: {', '.join(out['stopped_by'])}")
    if "intervals" in out:
        _print_intervals(con, out["intervals"])
    if "seeds_note" in out:
        con.print(out["seeds_note"])
    if "new_search" in out:
        _print_new_search(con, out["new_search"])
    if "plot" in out:
        con.print(f"anytime curves: {esc(out['plot'], 400)}")
    for note in out["notes"]:
        con.print(f"[dim]note: {esc(note, 2000)}[/dim]")
