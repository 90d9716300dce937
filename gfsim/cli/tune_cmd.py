"""``gfsim tune``: tune a policy's parameters (and the overgeneration factor) with Optuna."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from gfsim.cli.common import (
    BudgetOption,
    ChildrenOption,
    ClusterOption,
    ConfigOption,
    console,
    CostOption,
    current_settings,
    esc,
    ForecasterOption,
    handles_errors,
    JsonFlag,
    LogOption,
    print_json,
    print_ran_on,
    SimulateFlag,
)
from gfsim.cli.recommend_cmd import INCUMBENT_HELP

__all__ = ["tune"]


@handles_errors
def tune(
    policy: str = typer.Option("threshold", "--policy", "-p", help="Policy name to tune."),
    param: List[str] = typer.Option(..., "--param",
                                    help="NAME=LOW:HIGH[:int][:log] or NAME=A|B|C; a policy "
                                         "parameter or, with --driver puct, overgen, "
                                         "samples_per_parent, k_per_parent, parents_per_step, "
                                         "steps. Repeat for several."),
    objective: str = typer.Option("best_speedup", "--objective",
                                  help="best_speedup, score, cost_to_target, usd, wall_s, "
                                       "joules, gpu_evals; NAME:max|min,... for several "
                                       "(a Pareto front)."),
    constraint: Optional[str] = typer.Option(None, "--constraint",
                                             help="e.g. usd<=40: the mean per search must "
                                                  "stay within it (the sampler's "
                                                  "constraints)."),
    target: float = typer.Option(1.5, "--target",
                                 help="cost_to_target: reach this multiple of the task's seed "
                                      "speedup."),
    log: LogOption = None,
    forecaster: ForecasterOption = None,
    cost: CostOption = "serverless-a100",
    budget: BudgetOption = None,
    driver: str = typer.Option("trace", "--driver",
                               help="trace, puct or closed (each search's own algorithm, "
                                    "chosen from the log)."),
    search: Optional[str] = typer.Option(None, "--search",
                                         help="puct: paper-standard (default) or "
                                              "paper-filtered, the shape tuned around."),
    children: ChildrenOption = "auto",
    simulate: SimulateFlag = False,
    seeds: int = typer.Option(8, "--seeds", min=1, help="Seeds per trial (the same for every "
                                                 "trial: common random numbers); one where "
                                                 "no seed can change a trial (trace driver, "
                                                 "a policy that reads none)."),
    seed: int = typer.Option(0, "--seed", help="First seed; the sampler's seed too."),
    trials: int = typer.Option(50, "--trials", help="Finished trials the study should hold "
                                                    "(a rerun resumes up to it)."),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe, nsga2, gp (needs torch), random."),
    storage: Optional[str] = typer.Option(None, "--storage",
                                          help="Optuna storage URL (default: a JournalStorage "
                                               "file STUDY.journal; STUDY.db if an earlier "
                                               "gfsim left one)."),
    study: Optional[str] = typer.Option(None, "--study",
                                        help="Study name (default: gfsim-tune-POLICY-HASH, "
                                             "HASH of the settings trials depend on, so the "
                                             "same command resumes its study). An existing "
                                             "study resumes if made with the same settings; "
                                             "else it is refused."),
    workers: int = typer.Option(1, "--workers", help="Processes running trials on this host "
                                "(with --cluster: the cluster's tasks; 1: one per CPU there)."),
    cluster: ClusterOption = None,
    heartbeat: int = typer.Option(30, "--heartbeat",
                                  help="Seconds between a running trial's heartbeats; a trial "
                                       "silent for three is a killed worker's: failed and "
                                       "retried (0: off)."),
    retries: int = typer.Option(1, "--retries", help="Retries of a killed worker's trial."),
    jobs: int = typer.Option(1, "--jobs", help="Processes per trial for its seeds."),
    top: int = typer.Option(3, "--top", help="Trials re-scored out of sample."),
    validate_seeds: Optional[int] = typer.Option(None, "--validate-seeds",
                                                 help="Fresh seeds for the out-of-sample "
                                                      "check (default: as many as --seeds; 0 "
                                                      "skips it, as does a configuration no "
                                                      "seed can change)."),
    incumbent: Optional[str] = typer.Option(None, "--incumbent", help=INCUMBENT_HELP),
    recommend: bool = typer.Option(True, "--recommend/--no-recommend",
                                   help="End with a recommendation: the top trials against "
                                        "the incumbent, on seeds no trial saw (best_speedup "
                                        "objective only)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Folder for history and Pareto "
                                                             "front PNGs."),
    as_json: JsonFlag = False,
    config: ConfigOption = None,
) -> None:
    """Tune a policy (and the puct search's overgeneration) over replayed searches
    (``gfsim.tune`` in Python)."""
    from gfsim.api.tune import tune as run_tuning
    from gfsim.core.inputs import check_output

    if plot is not None:
        check_output(plot, [log, cost, config], "--plot")
    kwargs = dict(objective=objective, constraint=constraint, target=target,
                  forecaster=forecaster, cost=cost, budget=budget, driver=driver,
                  search=search, children=children, simulate=simulate, seeds=seeds, seed=seed,
                  trials=trials, sampler=sampler, storage=storage, study=study, workers=workers,
                  cluster=cluster, heartbeat=heartbeat, retries=retries, jobs=jobs, top=top,
                  validate_seeds=validate_seeds, incumbent=incumbent, recommend=recommend,
                  plot=plot, run_record=current_settings())
    if as_json:
        print_json(run_tuning(log, policy, param, **kwargs).to_dict())
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("tune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task("tune", total=trials)
        result = run_tuning(log, policy, param, **kwargs,
                            progress=lambda done, total: bar.update(job, completed=done))
    _report(result.to_dict())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _metric(name: str, v: float) -> str:
    """An objective's value in its unit (x, $, time, energy), else four digits."""
    from gfsim.cli import units

    if name in ("best_speedup", "confirmed_speedup"):
        return f"{v:.3f}x"
    if name == "usd":
        return units.usd(v)
    if name == "wall_s":
        return units.duration(v)
    if name == "joules":
        return units.energy(v)
    if name == "gpu_evals":
        return f"{v:,.1f}"
    return f"{v:.4g}"


def _report(out: dict) -> None:
    from gfsim.cli import units
    from gfsim.cli.common import Table

    con = console()
    names = [n for n, _ in out["objectives"]]
    con.print(f"[bold]gfsim tune[/bold]  study={esc(out['study'])} ({esc(out['storage'], 400)})"
              f"  log={esc(out['log'], 400)}  policy={esc(out['policy'])}  "
              f"driver={out['driver']}  cost={esc(out['cost_model'])}")
    print_ran_on(con, out)
    con.print(f"{_count(out['trials'], 'finished trial')} ({out['ran_now']} now), "
              f"{_count(out['seeds'], 'seed')} each; objectives "
              f"{', '.join(f'{n} ({d})' for n, d in out['objectives'])}"
              + (f"; constraint {out['constraint']}" if out["constraint"] else ""))
    if out["deterministic"]:
        con.print(out["deterministic"], markup=False, highlight=False)
    first = out.get("draws_of_first") or {}
    if first:
        evidence = first["best_evidence"]
        con.print(f"children: {out['children']}; the first trial's children the log never "
                  f"held: {first['invented_share']:.0%}; its best rests on: "
                  f"{evidence['label']}"
                  + ("; SIMULATED: PUCT does not reproduce the log's search, so trials are PUCT "
                     "simulated on its evidence" if evidence["simulated_searches"] else ""),
                  markup=False, highlight=False)
    title = "Pareto front" if out["pareto_front"] else "best trials"
    table = Table(title=title, show_edge=False)
    for col in ("#", "policy (search)", "best", "score", "USD", "evals", "clipped", "ok"):
        table.add_column(col, justify="left" if col.startswith("policy") else "right")
    rows = out["pareto_front"] or out["top"]
    for r in rows:
        m = r["metrics"]
        s = {k: v for k, v in (r["search"] or {}).items() if k != "own"}
        short = {"overgen": "F", "samples_per_parent": "spp", "k_per_parent": "k",
                 "parents_per_step": "parents", "steps": "steps"}
        shape = " (" + ", ".join(f"{short[k]} {s[k]}" for k in short if k in s) + ")" \
            if s else ""
        table.add_row(str(r["number"]), esc(r["spec"] + shape), f"{m['best_speedup']:.3f}x",
                      f"{m['score']:.3f}", units.usd(m["usd"]), f"{m['gpu_evals']:.0f}",
                      str(r["clipped"]), "yes" if r["feasible"] else "no")
    con.print(table)
    best = "best speedup found" if first and first["best_evidence"]["basis"] != "measured" \
        else "best measured speedup"
    con.print(f"[dim]best: {best} (geo-mean over tasks, mean over seeds); score: "
              "standardised (0 = random order, 1 = the log's best; clipped: denominators "
              "clipped); USD and evals: per search; ok: meets the constraint[/dim]")
    if out["out_of_sample"]:
        oos = Table(title=f"out of sample: {_count(len(out['fresh_seeds']), 'fresh seed')}",
                    show_edge=False)
        oos.add_column("#", justify="right")
        oos.add_column("spec")
        for n in names:
            oos.add_column(f"{n} in-sample", justify="right")
            oos.add_column(f"{n} fresh", justify="right")
        for r in out["out_of_sample"]:
            cells = []
            for n in names:
                cells += [_metric(n, r["in_sample"][n]), _metric(n, r["fresh_seeds"][n])]
            oos.add_row(str(r["number"]), esc(r["spec"]), *cells)
        con.print(oos)
    if out["leave_one_task_out"]:
        lo = Table(title=f"leave one task out ({names[0]})", show_edge=False)
        for col in ("held-out task", "chosen on others", "its value there",
                    "chosen on all", "its value there"):
            lo.add_column(col, justify="right")
        for r in out["leave_one_task_out"]:
            lo.add_row(esc(r["task"]), f"#{r['chosen_on_others']}",
                       _metric(names[0], r["held_out"]), f"#{r['chosen_on_all']}",
                       _metric(names[0], r["in_sample"]))
        con.print(lo)
    if out["recommendation"]:
        from gfsim.cli.recommend_cmd import print_recommendation

        print_recommendation(con, out["recommendation"])
    for note in out["notes"]:
        con.print(f"[dim]note: {esc(note, 2000)}[/dim]")
    for p in out.get("plots", []):
        con.print(f"plot: {p}")
