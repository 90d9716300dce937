"""``gfsim plan``: what the next search will cost and find, before it runs, from past runs."""

from __future__ import annotations

from typing import List, Optional

import typer

from gfsim.cli.common import (
    ChildrenOption,
    ClusterOption,
    ConfigOption,
    console,
    CostOption,
    esc,
    ForecasterOption,
    handles_errors,
    JsonFlag,
    print_json,
    print_ran_on,
    SeedOption,
    SimulateFlag,
)

__all__ = ["plan", "print_plan"]


@handles_errors
def plan(
    log: Optional[List[str]] = typer.Option(
        None, "--log", "-l",
        help="A past run: a log path or shipped name (any importer's output). Repeat for "
             "several runs of the same search; their run-to-run spread then counts."),
    budget: str = typer.Option(..., "--budget", "-b",
                               help="What one search may spend, KEY=VALUE pairs joined by "
                                    "commas: usd=N (never exceeded), gpu_hours=H or "
                                    "gpu_evals=N (no evaluation starts once spent), "
                                    "candidates=N (LLM proposals: the steps are cut to fit), "
                                    "seconds=S."),
    candidate: Optional[List[str]] = typer.Option(
        None, "--candidate",
        help="A configuration to plan: POLICY[@F], or log (the runs as they ran). Repeat for "
             "several. Default: log and what gfsim recommend adopts on the first log."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1,
                                        help="Each search's planned steps (default: its own, "
                                             "as logged)."),
    cost: CostOption = "serverless-a100",
    prices: str = typer.Option("run", "--prices",
                               help="Token prices of the generator: run (as each run recorded "
                                    "them, else the catalog's for the model it names, else "
                                    "the cost model's) or preset (the cost model's)."),
    forecaster: ForecasterOption = None,
    children: ChildrenOption = "auto",
    simulate: SimulateFlag = False,
    replays: int = typer.Option(8, "--replays", min=1,
                                help="Replays of each log per configuration (the centre)."),
    new_searches: int = typer.Option(32, "--new-searches", min=2,
                                     help="Searches per log and configuration simulated "
                                          "wholly on the world model (a new search's spread)."),
    seed: SeedOption = 0,
    level: float = typer.Option(0.9, "--level", min=0.5, max=0.99, help="The intervals' level."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0,
                             help="Processes the replays and the default recommendation run "
                                  "in (0: one per core; 1: this process); the same answer."),
    cluster: ClusterOption = None,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
) -> None:
    """What one new search like your past runs will cost and find under a budget, before it
    runs: dollars (LLM tokens, forecasts, evaluations), GPU-hours, wall-clock and the best
    speedup, each with its interval and what it rests on, and the chance the budget stops it
    early."""
    from gfsim.api.plan import plan as run_plan
    from gfsim.cli.replay_cmd import step_progress

    with step_progress("plan", off=as_json):
        out = run_plan(log or None, budget, candidate or None, cost=cost, steps=steps,
                       forecaster=forecaster, children=children, replays=replays,
                       new_searches=new_searches, seed=seed, level=level, prices=prices,
                       simulate=simulate, jobs=jobs, cluster=cluster)
    if as_json:
        print_json(out)
        return
    con = console()
    con.print(f"[bold]gfsim plan[/bold]  logs={esc(', '.join(out['logs']), 400)}  "
              f"cost={esc(cost)}  budget={esc(budget)}"
              + (f"  steps={steps}" if steps else "  steps: each search's own"))
    if out["synthetic_logs"]:
        con.print("[yellow]SYNTHETIC log: a demonstration, not a plan for a real "
                  "search[/yellow]")
    print_ran_on(con, out)
    print_plan(con, out)
    for note in out.get("notes", []):
        con.print(f"[dim]note: {esc(note, 1000)}[/dim]")


def _usd(v: float) -> str:
    return f"${v:.2f}" if v >= 0.1 or v == 0 else f"${v:.3g}"


def print_plan(con, out: dict) -> None:
    """One block per configuration (each figure's centre and interval, the chance the budget
    stops it, where the dollars go and what they rest on), then the prices' sources and what
    the intervals are over."""
    from gfsim.cli.units import duration, duration_unit

    level = f"{out['level']:.0%}"
    shown = {"usd": ("USD", _usd), "gpu_hours": ("GPU-hours", lambda v: f"{v:.3g}"),
             "wall_s": ("wall-clock", duration),
             "best_speedup": ("best speedup", lambda v: f"{v:.3f}x")}
    for r in out["configs"]:
        said = (" (what you do now: every child measured, each run's own shape)"
                if r["incumbent"] else " (what gfsim recommend adopts)"
                if r.get("recommended") else "")
        con.print(f"[bold]{esc(r['config'])}[/bold]{said}")
        con.print(f"  {'':<14}{'mean':>12}   {level} interval")
        for key, (name, fmt) in shown.items():
            f = r[key]
            if key == "wall_s":  # (the interval in the mean's unit, to read side by side)
                unit = duration_unit(f["mean"])
                fmt = lambda v, unit=unit: duration(v, unit)  # noqa: E731
            con.print(f"  {name:<14}{fmt(f['mean']):>12}   {fmt(f['lo'])} to {fmt(f['hi'])}")
        p, rest = r["usd"]["parts"], r["rests_on"]
        con.print(f"  the budget stops it before its planned steps: "
                  f"{r['p_budget_exhausted']:.0%} of new searches")
        con.print(f"  dollars: LLM tokens {_usd(p['llm']['mean'])}, forecasts "
                  f"{_usd(p['forecasts']['mean'])}, evaluations {_usd(p['evaluations']['mean'])};"
                  f" {rest['usd_imputed_share']:.0%} priced from priors (assumed usage); "
                  f"{rest['invented_share']:.0%} of the replays' children invented")
        imp = r["best_speedup"].get("improvement") or {}
        if imp.get("prior_weight", 0) > 0:
            con.print(f"  best speedup: {imp['prior_weight']:.0%} of its law rests on a prior "
                      f"(assumed): a new search improves with chance {imp['p_improve']:.0%} "
                      f"from the logs' children, the world model's {imp['model_improved']:.0%}; "
                      "what improving searches found is the benchmark's dev worlds' "
                      "(SYNTHETIC)")
    for e in out["evidence"]:
        if e["few"]:
            con.print(f"[yellow]{esc(e['log'], 200)}: {e['improving_children']} of its "
                      f"{e['measured_children']} measured children beat their parent. The "
                      "world model invents children from the log's own steps, so what a new "
                      "search may find beyond them rests on a prior (the best speedup's "
                      "interval says how much); plan from more runs (--log) or a longer one "
                      "to settle it.[/yellow]")
    for p in out["prices"]:
        con.print(f"[dim]token prices ({esc(p['log'], 200)}): {esc(p['source'], 1000)}[/dim]")
    con.print(f"[dim]intervals: {esc(out['over'], 2000)}[/dim]")
