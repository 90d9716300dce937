"""``gfsim recommend``: which configuration to run next time on a log, against the incumbent."""

from __future__ import annotations

from typing import List, Optional

import typer

from gfsim.cli.common import (
    BudgetOption,
    ChildrenOption,
    ClusterOption,
    ConfigOption,
    console,
    CostOption,
    esc,
    ForecasterOption,
    handles_errors,
    JsonFlag,
    LogOption,
    print_json,
    print_ran_on,
    SeedOption,
    SimulateFlag,
)

__all__ = ["recommend", "print_recommendation", "INCUMBENT_HELP"]

INCUMBENT_HELP = ("What you do now, which a recommendation must beat detectably: POLICY[@F] "
                  "(F the overgeneration factor, or own: each search's own), or log (measure "
                  "every child, each search in its own shape). Default: all@1 (measure every "
                  "child at F 1) in a closed loop, all under trace.")


@handles_errors
def recommend(
    candidate: Optional[List[str]] = typer.Option(
        None, "--candidate",
        help="A configuration to consider: POLICY[@F]. Repeat for several. Default: the "
             "counterfactual benchmark's grid (all, topk:4, threshold:0.7, "
             "threshold:coverage=0.5, ev:10, at F 1, 2, 4 and 8 in a closed loop)."),
    incumbent: Optional[str] = typer.Option(None, "--incumbent", help=INCUMBENT_HELP),
    log: LogOption = None,
    cost: CostOption = "serverless-a100",
    budget: BudgetOption = "usd=40",
    driver: str = typer.Option("closed", "--driver", help="closed (closed loop, F matters: "
                                                          "each search's own algorithm, "
                                                          "chosen from the log: evolutionary "
                                                          "for OpenEvolve and ShinkaEvolve "
                                                          "runs, PUCT for PUCT logs), puct "
                                                          "(closed loop, PUCT forced) or "
                                                          "trace (the logged order)."),
    search: Optional[str] = typer.Option(None, "--search",
                                         help="puct: paper-standard or paper-filtered (default: "
                                              "each search in its own shape)."),
    forecaster: ForecasterOption = None,
    children: ChildrenOption = "auto",
    simulate: SimulateFlag = False,
    seeds: int = typer.Option(8, "--seeds", min=1,
                              help="Replays of the log per configuration (paired by seed)."),
    fresh_seeds: int = typer.Option(8, "--fresh-seeds", min=0,
                                    help="puct: new searches per configuration simulated "
                                         "wholly on the world model (a new search's own "
                                         "randomness; 0: none, and the intervals are over "
                                         "replays of this log only)."),
    seed: SeedOption = 0,
    level: float = typer.Option(0.9, "--level", min=0.5, max=0.99,
                                help="The intervals' level and the detection's one-sided "
                                     "level (a gain of 1.149x or more is adopted at 70% "
                                     "where that is lower)."),
    prices: bool = typer.Option(True, "--prices/--no-prices",
                                help="Find the break-even GPU-hour and forecast prices of a "
                                     "recommendation (more replays)."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0,
                             help="Processes the configurations are replayed in (0: one per "
                                  "core, at most one per configuration; 1: this process). "
                                  "The answer is the same whatever their number."),
    cluster: ClusterOption = None,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
) -> None:
    """Which configuration to run next time: its expected gain over the incumbent (what
    adopting it gives; the recommendation decides on it) and one new search's, each with its
    interval, and the prices over which it holds; the incumbent when no expected gain is
    adoptable (detectable, or a large gain detectable at 70%), with what would settle it."""
    from gfsim.api.recommend import recommend as run_recommend
    from gfsim.cli.replay_cmd import step_progress

    with step_progress("recommend", off=as_json):
        out = run_recommend(log, candidate or None, incumbent, cost=cost, budget=budget,
                            driver=driver, search=search, forecaster=forecaster,
                            children=children, simulate=simulate, seeds=seeds,
                            fresh_seeds=fresh_seeds, seed=seed, level=level, prices=prices,
                            jobs=jobs, cluster=cluster)
    rec = out["recommendation"]
    if as_json:
        print_json(out)
        return
    con = console()
    con.print(f"[bold]gfsim recommend[/bold]  log={esc(out['log'], 400)}  driver={driver}"
              + (f" (chose {out['driver_chosen']} from the log)" if "driver_chosen" in out
                 else "") + "  "
              f"cost={esc(cost)}  budget={esc(budget)}"
              + (f"  children={out['children']}" if driver != "trace" else ""))
    if out["synthetic_log"]:
        con.print("[yellow]SYNTHETIC log: a demonstration, not a recommendation for a real "
                  "search[/yellow]")
    for caveat in out.get("log_caveats", []):  # (a CPU-clock best is a candidate's own word)
        style = "bold red" if caveat.startswith("UNTRUSTED") else "yellow"
        con.print(f"[{style}]{esc(caveat, 1000)}[/{style}]")
    print_ran_on(con, out)
    print_recommendation(con, rec)
    for note in out.get("notes", []):
        con.print(f"[dim]note: {esc(note, 1000)}[/dim]")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def print_recommendation(con, rec: dict) -> None:
    """The configurations against the incumbent, then the verdict and its prices."""
    from gfsim.api.report import POINT_WORDS, no_spread
    from gfsim.cli.common import Table

    level = f"{rec['level']:.0%}"
    table = Table(title=f"against the incumbent ({esc(rec['incumbent'])})", box=None,
                  padding=(0, 1, 0, 0))
    for col in ("configuration", f"gain ({level})", "sure", "1 search", "best", "USD", "new"):
        table.add_column(col, justify="left" if col == "configuration" else "right",
                         no_wrap=True)

    def shown(e: dict) -> str:
        if e["lo"] is None:
            return f"{e['mean']:.2f}x (none)"
        return f"{e['mean']:.3f}x (point)" if no_spread(e) else \
            f"{e['mean']:.2f}x {e['lo']:.2f}-{e['hi']:.2f}"

    for r in rec["configs"]:
        b, e, g = r["best_speedup"], r.get("expected_gain"), r.get("new_search_gain")
        mark = " (now)" if r["incumbent"] else " <-" if r["recommended"] else ""
        table.add_row(esc(r["config"]) + mark, "-" if e is None else shown(e),
                      "-" if e is None else "yes" if e["detectable"]
                      else "large" if e.get("adoptable") else "no",
                      "-" if g is None else "(point)" if no_spread(g)
                      else f"{g['lo']:.2f}-{g['hi']:.2f}",
                      f"{b['mean']:.2f}x", f"${r['usd_per_search']:.2f}",
                      f"{r['invented_share']:.0%}")
    con.print(table)
    con.print(f"[dim]gain: the expected gain of adopting it, {level} interval, over "
              f"{esc(rec['expected_over'], 1000)}; sure: yes, it is detectable (one-sided "
              f"{level} lower bound above 1x); large, a gain of "
              f"{rec['adoption']['large_gain']:.3f}x or more whose one-sided "
              f"{rec['adoption']['large_level']:.0%} lower bound is above 1x (adoptable too). "
              f"1 search: where one new search's gain lands, {level} "
              f"interval; it and best are over {esc(rec['over'], 1000)}; best: the mean best "
              "speedup (--json: its interval, evals and what each best rests on); new: the "
              "share of children the log never held (invented by the world model)[/dim]")
    if any(r.get("expected_gain") and r["expected_gain"]["lo"] is not None
           and no_spread(r["expected_gain"]) for r in rec["configs"]):
        con.print(f"[dim](point): {POINT_WORDS}[/dim]")
    if any(r.get("simulated_searches") for r in rec["configs"]):
        con.print("[yellow]SIMULATED: PUCT does not reproduce the log's search; these are PUCT "
                  "searches simulated on its evidence[/yellow]")
    con.print(f"[bold]recommendation:[/bold] {esc(rec['verdict'], 1000)}")
    prices = rec.get("prices")
    if not prices:
        return
    for what, name in (("gpu", "GPU-hour price"), ("forecaster", "forecast price")):
        p = prices.get(what)
        if p is None:
            continue
        if "note" in p:
            con.print(f"  {name}: {esc(p['note'])}")
            continue
        now = p["now"]
        lo = f"under {now / 8:.4g}" if p["from"] is None else f"{p['from']:.4g}"
        hi = f"over {now * 8:.4g}" if p["to"] is None else f"{p['to']:.4g}"
        con.print(f"  the gain holds for a {name} from {lo} to {hi} {p['unit']} (today "
                  f"{now:.4g}; prices x1/8 to x8 tried)")
    if "note" in prices:
        con.print(f"  prices: {esc(prices['note'])}")
