"""``gfsim tune``: tune a policy's parameters (and the overgeneration factor) with Optuna."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from gfsim.cli.common import (
    CHILDREN_HELP,
    SIMULATE_HELP,
    console,
    esc,
    handles_errors,
    learning_spec,
    print_json,
    puct_children,
    resolve_children,
    search_config,
    CONFIG_HELP,
    current_settings,
    load_config,
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
    log: Optional[str] = typer.Option(None, "--log", "-l", help="Log path or shipped name."),
    forecaster: Optional[str] = typer.Option(None, "--forecaster",
                                             help="A logged forecaster's name, or a what-if "
                                                  "one (paper:gemini3-flash, synthetic:...)."),
    cost: str = typer.Option("serverless-a100", "--cost", "-c", help="Cost preset or TOML."),
    budget: Optional[str] = typer.Option(None, "--budget", "-b",
                                         help="Per-search limits that stop each replayed "
                                              "search, KEY=VALUE pairs joined by commas "
                                              "(usd=2,steps=10); keys: usd, seconds, "
                                              "gpu_evals, steps."),
    driver: str = typer.Option("trace", "--driver", help="trace or puct."),
    search: Optional[str] = typer.Option(None, "--search",
                                         help="puct: paper-standard (default) or "
                                              "paper-filtered, the shape tuned around."),
    children: str = typer.Option("auto", "--children", help=CHILDREN_HELP),
    simulate: bool = typer.Option(False, "--simulate", help=SIMULATE_HELP, metavar=""),
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
    workers: int = typer.Option(1, "--workers", help="Processes running trials on this host."),
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
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object.", metavar=""),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP, is_eager=True,
                                          callback=load_config),
) -> None:
    """Tune a policy (and the puct search's overgeneration) over replayed searches."""
    from gfsim.core.errors import GfsimError
    from gfsim.cost_models import load_cost_model
    from gfsim.replay_logs import open_log
    from gfsim.simulator import parse_budget
    from gfsim.tuning.identity import (
        RUNS_ATTR,
        claim_study,
        configuration,
        default_study_name,
    )
    from gfsim.tuning.study import (
        Objective,
        leave_one_task_out,
        make_sampler,
        make_storage,
        open_study,
        out_of_sample,
        run_study,
        storage_url,
        trial_rows,
    )
    from gfsim.tuning.trials import (
        TrialSetup,
        parse_constraint,
        parse_objectives,
        parse_param,
        seed_dependence_of_space,
        trial_draws,
    )

    if seeds < 1 or trials < 1 or workers < 1 or jobs < 1:
        raise GfsimError("--seeds, --trials, --workers and --jobs must be >= 1")
    params = [parse_param(p, policy, driver) for p in param]
    if len({p.name for p in params}) != len(params):
        raise GfsimError("--param: a parameter is named twice")
    objectives = parse_objectives(objective)
    limit = parse_constraint(constraint)
    from gfsim.forecasts.whatif import resolve

    learning = learning_spec(forecaster)
    the_log, forecaster = resolve(open_log(log), forecaster)
    model = load_cost_model(cost)
    config = search_config(driver, search, the_log)
    children = resolve_children(driver, children)
    puct_only = puct_children(driver, children, simulate)
    the_budget = parse_budget(budget)
    from gfsim.tuning.recommend import parse_config

    base = parse_config(incumbent or ("all@1" if driver == "puct" else "all"), driver, config)
    setup = TrialSetup(the_log, model, policy, driver, the_budget,
                       list(range(seed, seed + seeds)), config, target, forecaster,
                       learning=learning, **puct_only)
    seeded = seed_dependence_of_space(setup, params)
    if seeded is None:  # every seed replays the same trial: one replay is all there is
        setup.seeds = setup.seeds[:1]
    settings = configuration(log=the_log, policy=policy, params=params, driver=driver,
                             search=config, children=children, forecaster=forecaster,
                             learning=learning, cost=cost, model=model, budget=the_budget,
                             objectives=objectives, constraint=limit, target=target,
                             seeds=setup.seeds if seeded else None)
    study = study or default_study_name(settings)
    the_sampler = make_sampler(sampler, seed, limit is not None)
    url = storage_url(storage, study, workers)
    the_study = open_study(make_storage(url, heartbeat or None, retries), study,
                           [d for _, d in objectives], the_sampler)
    adopted = claim_study(the_study, settings, url)
    # every invocation's effective settings (options, where each came from, gfsim's version,
    # the log's SHA-256), beside the configuration claim_study compares
    runs = the_study.user_attrs.get(RUNS_ATTR) or []
    the_study.set_user_attr(RUNS_ATTR, [*runs, current_settings()][-50:])
    obj = Objective(setup, params, objectives, limit, jobs, heartbeat or None, retries)
    if as_json:
        ran = run_study(the_study, obj, trials=trials, workers=workers, storage=url,
                        sampler_name=sampler, seed=seed)
    else:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("tune"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                      transient=True) as bar:
            job = bar.add_task("tune", total=trials)
            ran = run_study(the_study, obj, trials=trials, workers=workers,
                            storage=url, sampler_name=sampler, seed=seed,
                            progress=lambda done, total: bar.update(job, completed=done))
    rows = trial_rows(the_study, objectives)
    if not rows:
        raise GfsimError(f"study {study!r} has no finished trial")
    n_fresh = seeds if validate_seeds is None else validate_seeds
    if seeded is None:  # fresh seeds would replay the same trials again
        n_fresh = 0
    fresh = list(range(seed + seeds, seed + seeds + n_fresh))
    oos = out_of_sample(setup, rows[:top], objectives, fresh) if n_fresh else []
    loto = leave_one_task_out(the_study, objectives)
    rec, rec_note = None, None
    if not recommend:
        pass
    elif [n for n, _ in objectives] != ["best_speedup"]:
        rec_note = ("no recommendation: it compares best speedups; tune with --objective "
                    "best_speedup, or run gfsim recommend")
    else:
        rec = _recommendation(setup, rows[:top], base, fresh, seeded is not None)
    lead = rows[0]
    draws = {}
    if driver == "puct":
        from gfsim.simulator.shape import shape_from_dict

        draws = trial_draws(setup, lead["spec"], shape_from_dict(lead["search"]))
    out = {
        "study": study, "storage": url,
        "log": the_log.name, "synthetic_log": the_log.is_synthetic, "cost_model": cost,
        "policy": policy, "driver": driver, **({"children": children, "draws_of_first": draws}
                                               if driver == "puct" else {}),
        "objectives": [list(o) for o in objectives],
        "constraint": constraint, "params": [p.spec() for p in params],
        "seeds": len(setup.seeds), "seeds_requested": seeds,
        "deterministic": None if seeded else (
            "deterministic configuration: each trial replayed once; seeds cannot change it "
            f"({_why_seed_free(driver, policy, params)})"),
        "seed_dependence": seeded, "configuration": settings,
        "trials": len(rows), "ran_now": ran, "best": rows[0] if len(objectives) == 1 else None,
        "pareto_front": [r for r in rows if r["pareto"]] if len(objectives) > 1 else None,
        "top": rows[:max(top, 5)], "out_of_sample": oos, "fresh_seeds": fresh,
        "leave_one_task_out": loto, "recommendation": rec,
        "notes": ([rec_note] if rec_note else []) + ([adopted] if adopted else []) + ([
            "every trial replays the same seeds (common random numbers); seeds resample one "
            "log, so a tuned value is as good as the log is representative",
            "out_of_sample re-scores the top trials on seeds no trial saw; leave_one_task_out "
            "chooses the best trial on the other tasks and scores it on the held-out one",
        ] if seeded else [
            "a tuned value is as good as the log is representative; leave_one_task_out "
            "chooses the best trial on the other tasks and scores it on the held-out one",
        ]) + ([f"overgen is tuned with --children {children}: most children at F >= 2 were "
              "never logged, and how far such replays are off is measured by gfsim "
              "counterfactual (docs/experiments/counterfactual-benchmark.md)"]
             if any(p.name == "overgen" for p in params) else [])
          + (["the log is SYNTHETIC: a tau tuned on it is a demonstration, not a "
              "recommendation"] if the_log.is_synthetic else []),
    }
    from gfsim.forecasts.provenance import provenance, provenance_notes
    from gfsim.policies import POLICIES

    # Where the forecasts the tuned policy reads came from, the log's known caveats, a price
    # for another GPU: a tuned value rests on all three. (The tuned policy is a name; its
    # class says whether it reads forecasts; an unknown one has failed before this.)
    tuned = POLICIES.get(policy.partition(":")[0])
    prov = provenance(the_log, forecaster, model,
                      read=tuned is None or tuned.needs_forecast)
    out.update(prov)
    out["notes"] = [*out["notes"], *provenance_notes(prov, the_log.name)]
    if plot is not None:
        title = ("SYNTHETIC log (nothing measured): " if the_log.is_synthetic else "") + \
            (f"gfsim tune: study {study}, log {the_log.name}, policy {policy}, cost "
             f"{out['cost_model']}")
        out["plots"] = _plots(the_study, objectives, plot, title)
    if as_json:
        print_json(out)
    else:
        _report(out)


def _recommendation(setup, rows: list[dict], base, fresh: list[int], seeded: bool) -> dict | None:
    """The top trials that meet the constraint against the incumbent, replayed on the
    out-of-sample seeds (the tuning seeds where there are none) and, under puct, simulated as
    as many new searches on seeds after those."""
    from gfsim.simulator.shape import shape_from_dict
    from gfsim.tuning.recommend import Config, config_label, recommendation

    candidates = [Config(r["spec"], s, config_label(r["spec"], s))
                  for r in rows if r["feasible"]
                  for s in [shape_from_dict(r["search"])]]
    if not candidates:
        return None
    seeds = fresh or list(setup.seeds)
    start = max([*seeds, *setup.seeds]) + 1
    new = range(start, start + len(seeds)) if setup.driver == "puct" and seeded else ()
    return recommendation(setup, candidates, base, seeds, fresh_seeds=new)


def _why_seed_free(driver: str, policy: str, params) -> str:
    tuned = [p.name for p in params if p.target == "policy"]
    return (f"{driver} driver replays the logged order; policy {policy} reads no seed"
            + (f" at any {', '.join(tuned)}" if tuned else "") + "; no measurement noise")


def _plots(study, objectives, folder: Path, title: str) -> list[str]:
    """gfsim's own plots of a study: each objective's history and, with two, the front; the
    title names the study, the log and the cost model, and SYNTHETIC where the log is."""
    from gfsim.analysis.plots import plot_tuning_front, plot_tuning_history

    folder.mkdir(parents=True, exist_ok=True)
    done = [t for t in study.get_trials(deepcopy=False) if t.values is not None
            and t.state.name == "COMPLETE"]
    paths = []
    for i, (name, direction) in enumerate(objectives):
        paths.append(str(plot_tuning_history([(t.number, t.values[i]) for t in done], name,
                                             direction, folder / f"history-{name}.png",
                                             title=title)))
    if len(objectives) == 2:
        front = {t.number for t in study.best_trials}
        paths.append(str(plot_tuning_front([(t.number, t.values[0], t.values[1]) for t in done],
                                           front, (objectives[0][0], objectives[1][0]),
                                           folder / "pareto-front.png", title=title)))
    return paths


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
            lo.add_row(r["task"], f"#{r['chosen_on_others']}", _metric(names[0], r["held_out"]),
                       f"#{r['chosen_on_all']}", _metric(names[0], r["in_sample"]))
        con.print(lo)
    if out["recommendation"]:
        from gfsim.cli.recommend_cmd import print_recommendation

        print_recommendation(con, out["recommendation"])
    for note in out["notes"]:
        con.print(f"[dim]note: {esc(note, 2000)}[/dim]")
    for p in out.get("plots", []):
        con.print(f"plot: {p}")
