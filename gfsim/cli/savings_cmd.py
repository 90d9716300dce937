"""``gfsim savings``: the paired, censoring-aware saving of a policy against a baseline."""

from __future__ import annotations

from typing import Optional

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

__all__ = ["savings"]


@handles_errors
def savings(
    policy: str = typer.Option("threshold:0.7", "--policy", "-p", help="Policy spec."),
    baseline: str = typer.Option("all", "--baseline", help="Baseline policy spec."),
    log: LogOption = None,
    cost: CostOption = "serverless-a100",
    budget: BudgetOption = None,
    driver: str = typer.Option("trace", "--driver", help="trace or puct."),
    search: Optional[str] = typer.Option(None, "--search",
                                         help="puct: paper-standard or paper-filtered (the "
                                              "baseline runs it without overgeneration)."),
    overgen: Optional[int] = typer.Option(None, "--overgen",
                                          help="puct: the policy's overgeneration factor F "
                                               "(the baseline runs F 1)."),
    forecaster: ForecasterOption = None,
    children: ChildrenOption = "auto",
    simulate: SimulateFlag = False,
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1,
                                        help="Paired seeds (default 32 where a seed can "
                                             "change the replay, else 1: a deterministic "
                                             "configuration is replayed once)."),
    seed: SeedOption = 0,
    jobs: int = typer.Option(1, "--jobs", help="Processes for the seeds."),
    cluster: ClusterOption = None,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
) -> None:
    """Dollars, seconds and joules a policy saves per search against a baseline, with
    intervals; cost to reach targets; the speedup at equal cost; break-even prices
    (``gfsim.savings`` in Python)."""
    from gfsim.api.savings import savings as compute_savings
    from gfsim.cli.replay_cmd import step_progress

    with step_progress("savings", off=as_json):
        out = compute_savings(log, policy, baseline, cost=cost, budget=budget, driver=driver,
                              search=search, overgen=overgen, forecaster=forecaster,
                              children=children, simulate=simulate, seeds=seeds, seed=seed,
                              jobs=jobs, cluster=cluster)
    if as_json:
        print_json(out)
        return
    _report(out)


def _targets(per_task: dict) -> str:
    v = list(per_task.values())
    return f"{min(v):.2f}x" if min(v) == max(v) else f"{min(v):.2f}x-{max(v):.2f}x"


def _distinct_targets(targets: dict) -> list[list[str]]:
    """Target names grouped where their targets are the same on every task (one replay, or a
    baseline whose final best never varies): one row each, not the same row repeated."""
    groups: list[list[str]] = []
    for name, per_task in targets.items():
        if groups and targets[groups[-1][0]] == per_task:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def _report(out: dict) -> None:
    from gfsim.cli.common import Table

    from gfsim.api.report import usd_text
    from gfsim.api.report import POINT_WORDS, no_spread

    con = console()
    i = out["inputs"]
    con.print(f"[bold]gfsim savings[/bold]  {esc(i['policy'])} vs {esc(i['baseline'])}  "
              f"log={esc(i['log'], 400)}  cost={esc(i['cost_model'])}  driver={i['driver']}  "
              + (f"{out['seeds']} paired seeds" if out["seed_dependence"] else "1 replay"))
    print_ran_on(con, out)
    if "seeds_note" in out:
        con.print(out["seeds_note"], markup=False, highlight=False)
    con.print(f"[bold]{esc(out['verdict'], 2000)}[/bold]")
    if i.get("policy_draws"):
        con.print(f"children: {i['children']}; the policy's children the log never held: "
                  f"{i['policy_draws']['invented_share']:.0%} (baseline "
                  f"{i['baseline_draws'].get('invented_share', 0):.0%})", markup=False,
                  highlight=False)
    t = Table(title="per search: baseline minus policy (positive = saved)", show_edge=False)
    for col in ("", "policy", "baseline", "saved [95%]"):
        t.add_column(col, justify="right" if col else "left")
    from gfsim.cli import units

    for key, label in (("usd", "USD"), ("seconds", "wall-clock"), ("joules", "energy")):
        per, sv = out[f"{key}_per_search"], out[f"{key}_saved_per_search"]
        # one unit a row, from the baseline's figure
        unit = units.duration_unit(per["baseline"]) if key == "seconds" else \
            units.energy_unit(per["baseline"]) if key == "joules" else None

        def fmt(x, key=key, unit=unit):
            return usd_text(x) if key == "usd" else units.duration(x, unit) \
                if key == "seconds" else units.energy(x, unit)

        t.add_row(label, fmt(per["policy"]), fmt(per["baseline"]),
                  f"{fmt(sv['mean'])} (point)" if no_spread(sv) else
                  esc(f"{fmt(sv['mean'])} [{fmt(sv['lo'])}, {fmt(sv['hi'])}]")
                  + (" (includes 0)" if sv["includes_zero"] else ""))
    con.print(t)
    r = Table(title="reaching a target (quantile of the baseline's final best, per task)",
              show_edge=False)
    for col in ("target", "P(reach) policy", "P(reach) baseline",
                "restricted mean USD policy", "baseline", "saved [95%]"):
        r.add_column(col, justify="right")
    for names in _distinct_targets(out["targets"]):
        name = names[0]
        c, p = out["cost_to_target"][name], out["reach_probability"][name]
        s = c["saved_usd"]
        r.add_row(esc(f"{' = '.join(names)} ({_targets(out['targets'][name])})"),
                  f"{p['policy']:.0%}",
                  f"{p['baseline']:.0%}", usd_text(c["policy_usd"]),
                  usd_text(c["baseline_usd"]),
                  f"{usd_text(s['mean'])} (point)" if no_spread(s) else
                  esc(f"{usd_text(s['mean'])} [{usd_text(s['lo'])}, {usd_text(s['hi'])}]"))
    con.print(r)
    cells = [out[f"{k}_saved_per_search"] for k in ("usd", "seconds", "joules")] + [
        c["saved_usd"] for c in out["cost_to_target"].values()]
    if any(no_spread(c) for c in cells):
        con.print(f"[dim](point): {POINT_WORDS}[/dim]")
    be = out["break_even"]
    con.print(f"break-even: the policy {be['summary']}; "
              f"{be['extra_mutations_per_search']:+.1f} mutations per search")
    con.print("[dim]note: restricted mean: a search that never reaches the target counts what it "
              "spent; " + out["note"] + "[/dim]")
    if i["synthetic_log"]:
        con.print("[dim]note: the log is SYNTHETIC: these dollars describe it, not a real "
                  "search[/dim]")
    for note in out.get("notes", []):
        con.print(f"[dim]note: {esc(note, 2000)}[/dim]")
