"""``gfsim counterfactual``: does a replay rank (policy, F) configurations as the world does?"""

from __future__ import annotations

import math
from typing import Optional

import typer

from gfsim.cli.common import (
    ClusterOption,
    ConfigOption,
    console,
    CostOption,
    esc,
    handles_errors,
    print_json,
    print_ran_on,
)

__all__ = ["counterfactual"]


def _log2(e: dict) -> str:
    if not math.isfinite(e["lo"]):
        return f"{e['mean']:+.2f}"
    return f"{e['mean']:+.2f} ({e['lo']:+.2f}, {e['hi']:+.2f})"


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and not math.isfinite(x))


def _num(x, fmt="{:.2f}") -> str:
    return fmt.format(x) if _finite(x) else "n/a"


@handles_errors
def counterfactual(
    world: list[str] = typer.Option(["family"], "--world", "-w",
                                    help="The world(s), repeated or separated by commas: "
                                         "'family' (every built-in world), a built-in name "
                                         "(--list-worlds), kernel-tuner:CACHE[,CACHE...], "
                                         "h200:TASK[,TASK...], PATH.py:NAME or module:NAME."),
    policies: str = typer.Option(",".join(["all", "topk:4", "threshold:0.7",
                                           "threshold:coverage=0.5", "ev:10"]),
                                 "--policies", "-p",
                                 help="Policy specs, separated by ';' or ',' between specs "
                                      "(gfsim policies)."),
    overgen: str = typer.Option("1,2,4,8", "--overgen", "-F",
                                help="Overgeneration factors to compare."),
    seeds: int = typer.Option(6, "--seeds", "-n", min=1, help="World seeds per world (each: one "
                                                       "logged search, its replays and the "
                                                       "direct runs)."),
    split: str = typer.Option("heldout", "--split",
                              help="Which frozen world seeds: heldout (final figures) or dev "
                                   "(free for tuning)."),
    replay_seeds: int = typer.Option(4, "--replay-seeds",
                                     help="Replays per log (they change borrowed draws)."),
    direct_reps: int = typer.Option(2, "--direct-reps",
                                    help="Direct runs per world seed (fresh draws; >= 2 for "
                                         "the noise ceiling)."),
    fresh_seeds: int = typer.Option(
        6, "--fresh-seeds",
        help="New searches per (policy, F) simulated wholly on the world model (--children "
             "fresh), whose spread widens the predictive intervals to a new search's (0: the "
             "replay seeds' spread alone, which is too narrow for one)."),
    steps: int = typer.Option(40, "--steps", help="Steps per search (paper-standard: 40)."),
    cost: CostOption = "serverless-a100",
    children: str = typer.Option("model", "--children",
                                 help="Where the replay's unlogged children come from, one or "
                                      "several separated by commas (each replayed against the "
                                      "same direct runs): model (the default, as gfsim's "
                                      "replays, tuning and recommendations use under the puct "
                                      "driver: a world model fitted to the log; model:crb or "
                                      "model:gbm name its family), fallback (logged children "
                                      "of other parents, by bin) or own (none invented)."),
    forecaster: Optional[str] = typer.Option(
        None, "--forecaster", "-f",
        help="What forecast-reading policies read: the world's what-if forecasts (default), or "
             "learned[:k=v,...] (alias costmodel), the learned forecaster, trained in each "
             "search (direct and replayed) on what that search measured."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Processes (0: one per core, at most 8)."),
    cluster: ClusterOption = None,
    as_json: bool = typer.Option(False, "--json", help="Print every figure as JSON.", metavar=""),
    list_worlds: bool = typer.Option(False, "--list-worlds", help="List built-in worlds.",
                                     metavar=""),
    config: ConfigOption = None,
) -> None:
    """Log a standard search on a world, replay each (policy, F) from the log and run it
    directly on the world under the same USD budget; print how far the replay is off and
    whether it ranks the configurations as the world does.

    Measures (per world): per cell the replay and direct best speedup (mean, 95% interval over
    world seeds), the bias (replay - direct, log2) and the draw shares; the noise ceiling (the
    Kendall tau of two halves of the direct runs), the Kendall tau against the direct runs of
    the recommendation's ranking and of the replays, the share of pairs more than 0.1 log2
    apart each orders right, the regret of the replay's recommendation
    scored on held-out world seeds beside always-F=1-all, and how often the predictive
    intervals (50/80/90/95%) cover single direct runs.
    """
    if list_worlds:
        from gfsim.api.counterfactual import worlds

        fam = worlds()
        tables = fam.pop("measured_tables")
        if as_json:
            print_json(fam)
            return
        con = console()
        frozen = str(fam["frozen"]).partition(":")[0]  # its date; the rest is for maintainers
        con.print(f"{fam['family']} (a fixed family of worlds, frozen {frozen}; the benchmark's "
                  "final figures use its held-out seeds)", markup=False, highlight=False,
                  soft_wrap=True)
        for w in fam["worlds"]:
            con.print(f"  {w['name']:<26} {w['kind']:<13} {w['axes']}", markup=False,
                      highlight=False)
        con.print("measured tables (--world h200:TASK[,TASK...]; not in the family): "
                  + ", ".join(f"h200:{t}" for t in tables), markup=False,
                  highlight=False, soft_wrap=True)
        return
    from gfsim.api.counterfactual import counterfactual as run_benchmark

    kwargs = dict(policies=policies, overgen=overgen, seeds=seeds, split=split,
                  replay_seeds=replay_seeds, direct_reps=direct_reps, fresh_seeds=fresh_seeds,
                  steps=steps, cost=cost, children=children, forecaster=forecaster, jobs=jobs,
                  cluster=cluster)
    if as_json:
        out = run_benchmark(world, **kwargs)
    else:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("counterfactual"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=Console(stderr=True),
                      transient=True) as bar:
            job = bar.add_task("worlds", total=None)
            out = run_benchmark(world, **kwargs, progress=lambda d, t: bar.update(
                job, completed=d, total=t))
    if as_json:
        print_json(out)
        return
    _print(out)


def _gap(t: dict) -> str:
    return f"{t['value']:.0%}" if t["value"] is not None else "n/a"


def _short(t: dict, fmt: str) -> str:
    """", short by ..." of a missed target (``fmt`` formats the miss), nothing of a met one."""
    return "" if t["met"] else f", short by {fmt.format(t['miss'])}"


def _finding(name: str, t: dict) -> str:
    """One benchmark target as a finding a user can act on: what this world showed, the target
    it was held to, and what to do with it (met or short by how much)."""
    if t["met"] is None:
        return f"{name}: not measurable here (target {t['target']})"
    ok = t["met"]
    replays = t.get("replays")
    if name == "tau":
        alone = f"; the replays alone {replays:.2f}" if _finite(replays) else ""
        return (f"ranking: the recommendation orders the configurations "
                f"{'as' if ok else 'unlike'} the direct runs (Kendall tau {t['value']:.2f}, "
                f"target {t['target']}{_short(t, '{:.2f}')}{alone})"
                + (": its order can guide a choice" if ok else
                   ": do not choose by its order alone"))
    if name == "pairs_ordered":
        alone = f"; the replays alone {replays:.0%}" if _finite(replays) else ""
        return (f"clear pairs (> 0.1 log2 apart on the direct runs): {t['value']:.0%} ordered "
                f"right by the recommendation (target {t['target']}){_short(t, '{:.0%}')}"
                f"{alone}")
    if name == "bias_interval":
        n = int(t["value"])
        return ("bias: every configuration's replayed best is within 0.15 log2 of the direct "
                "runs" if ok else
                f"bias: {n} configuration(s) replay more than 0.15 log2 off the direct runs "
                f"(the worst by {t['miss']:.2f} log2 beyond): read their replayed speedups as "
                "relative, not absolute")
    if name == "regret":
        return (f"recommendation: it gives up {t['value']:.1%} of the best configuration's "
                f"speedup (target {t['target']}){_short(t, '{:.1%}')}"
                + (": act on it" if ok else ": measure what it recommends before adopting"))
    if name == "coverage":
        return (f"a new search's best: the 90% intervals hold {t['value']:.0%} of direct runs "
                f"(target {t['target']})" + (": trust them" if ok else
                                             ": expect more outcomes outside them"
                                             if t["value"] < 0.85 else ": they are too wide"))
    if name == "calibration":
        return (f"a new search's best at 50/80/95%: off nominal by up to {_gap(t)} (target 5 "
                f"points){_short(t, '{:.0%}')}")
    label = {"expected_gain": "the expected gain's intervals (what adopting gives)",
             "new_search_gain": "one new search's gain intervals"}.get(name, name)
    return (f"{label}: 50/80/90/95% off nominal by up to {_gap(t)} (target 5 points)"
            + (": trust them" if ok else _short(t, "{:.0%}")))


def _curve(curve: dict | None) -> str:
    """A calibration curve as "50%: 48%, 80%: 79%, ..." (n/a where not measured)."""
    if not curve:
        return "n/a"
    return ", ".join(f"{float(k):.0%}: {_num(v, '{:.0%}')}" for k, v in curve.items())


def _print(out: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    spec = out["spec"]
    con.print(f"{out['note']} {len(out['world_seeds'])} world seeds ({out['split']}: "
              f"{out['world_seeds'][0]}..{out['world_seeds'][-1]}), {spec['steps']} steps, "
              f"{spec['replay_seeds']} replays and {spec['direct_reps']} direct runs per seed, "
              f"children: {', '.join(spec['children'])}, cost: {spec['cost']}", markup=False,
              highlight=False)
    print_ran_on(con, out)
    for name, why in out["skipped"].items():
        con.print(f"skipped {name}: {why}", markup=False, highlight=False)
    for w in out["worlds"]:
        m = w["measures"]
        tasks = esc(", ".join(w["tasks"]), 400)
        con.print(f"\n[bold]{esc(w['world'])}[/bold], children {esc(w['children'])} "
                  f"({w['kind'].upper()}; tasks {tasks}; budget ${w['usd_budget_mean']:.2f} "
                  "per search)", highlight=False)
        tab = Table(box=None, padding=(0, 1, 0, 0))
        for col in ("policy", "F", "new", "replay", "direct", "bias log2 (95%)", "SE log2"):
            tab.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
        for c in w["cells"]:
            se = max(c["se"].values())
            tab.add_row(c["policy"], str(c["overgen"]), f"{c['invented_share']:.0%}",
                        f"{2 ** c['replay_log2']['mean']:.2f}x",
                        f"{2 ** c['direct_log2']['mean']:.2f}x",
                        _log2(c["bias_log2"]), _num(se, "{:.3f}"))
        con.print(tab)
        con.print(
            "  [dim]replay, direct: geometric mean best over world seeds (--json: their 95% "
            "intervals); new: children the log never held; SE: the largest standard error of "
            "the cell's replay, direct and bias means[/dim]", highlight=False)
        con.print(
            f"  noise ceiling tau {_num(m['noise_ceiling_tau'])}; tau against the direct runs "
            f"of the recommendation's ranking {_num(m.get('ranking_tau'))} and of the replays "
            f"{_num(m['tau'])}; pairs > 0.1 log2 apart ordered right "
            f"{_num(m.get('ranking_pairs_ordered'), '{:.0%}')} and "
            f"{_num(m['pairs_ordered'], '{:.0%}')} of {m['pairs_over_margin']}\n"
            f"  regret of the recommendation {_num(m['regret_of_replay_pick'], '{:.1%}')} "
            f"(the replay's argmax: {_num(m['regret_of_argmax'], '{:.1%}')}; always F=1 all: "
            f"{_num(m['regret_of_all_f1'], '{:.1%}')}); direct best "
            f"{m['direct_best']['policy']} F={m['direct_best']['overgen']}\n"
            f"  a new search's best: intervals hold direct runs at "
            + _curve(m["coverage_curve"])
            + f" (90% per seed {m['coverage_90_per_seed']['min']:.0%}.."
            f"{m['coverage_90_per_seed']['max']:.0%}, median width "
            f"{m['interval_width_median']:.3f} log2, interval score "
            f"{m['interval_score_mean']:.3f}); the 90% one holds the direct mean in "
            f"{m['coverage_90_of_direct_mean']:.0%}\n"
            f"  gains over F=1 all: the expected gain's intervals hold the other world seeds' "
            f"mean gain at " + _curve(m.get("expected_gain_curve")) + "; one new search's "
            "hold a direct run's gain at " + _curve(m.get("new_search_gain_curve")),
            markup=False, highlight=False)
        con.print("  what this world shows:", highlight=False)
        for k, t in m["targets"].items():
            con.print(f"    - {_finding(k, t)}", markup=False, highlight=False)
        for line in w["warnings"]:
            con.print(f"  [yellow]note:[/yellow] {line}", highlight=False)
    if len(out["spec"]["children"]) > 1:
        _print_comparison(con, out)


def _print_comparison(con, out: dict) -> None:
    """One row per world and child source: the benchmark's headline measures side by side."""
    from gfsim.cli.common import Table

    con.print("\n[bold]child sources against the same direct runs[/bold]")
    tab = Table(box=None, padding=(0, 1, 0, 0))
    for col in ("world", "children", "ceil", "tau", "pairs", "regret", "F1 all", "bias",
                "cov", "score"):
        tab.add_column(col, justify="left" if col in ("world", "children") else "right",
                       no_wrap=True)
    for w in out["worlds"]:
        m = w["measures"]
        worst = max(abs(c["bias_log2"]["mean"]) for c in w["cells"])
        tab.add_row(w["world"], w["children"], _num(m["noise_ceiling_tau"]), _num(m["tau"]),
                    _num(m["pairs_ordered"], "{:.0%}"), _num(m["regret_of_replay_pick"],
                                                             "{:.1%}"),
                    _num(m["regret_of_all_f1"], "{:.1%}"), _num(worst),
                    f"{m['coverage_90']:.0%}", _num(m["interval_score_mean"]))
    con.print(tab)
    con.print("[dim]ceil: the noise ceiling tau; tau, pairs: the replays' (clear pairs ordered "
              "right); F1 all: the "
              "regret of always F=1 all; bias: the worst cell's, log2; cov: 90% intervals "
              "holding a new search's best; score: their interval score (lower is better; "
              "--json: their median width)[/dim]", highlight=False)
