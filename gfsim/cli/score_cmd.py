"""``gfsim score``: forecast quality of a log's forecasters (docs/concepts/paper.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import (
    console,
    esc,
    handles_errors,
    LogOption,
    print_json,
)

__all__ = ["score"]

_TABLE = [("n", "{:,}"), ("n_parsed", "{:,}"), ("accuracy", "{:.3f}"), ("off_by_one", "{:.3f}"),
          ("ece", "{:.3f}"), ("brier", "{:.3f}"), ("crps", "{:.3f}"), ("nll", "{:.3f}"),
          ("forecast_error", "{:.3f}"), ("recovered_mean", "{:.1%}"), ("aurc", "{:.3f}")]


@handles_errors
def score(
    log: LogOption = None,
    forecaster: Optional[str] = typer.Option(None, "--forecaster",
                                             help="Score only this forecaster."),
    task: Optional[str] = typer.Option(None, "--task", help="Score only this task."),
    by_task: bool = typer.Option(False, "--by-task", help="Also report each task.", metavar=""),
    selective: str = typer.Option("maxprob", "--score",
                                  help="Confidence score for the risk-coverage curve: maxprob, "
                                       "negentropy or margin."),
    calibrate: str = typer.Option("none", "--calibrate",
                                  help="none, temperature or isotonic, fitted out of fold (by "
                                       "task); shows ECE before and after."),
    plot: Optional[Path] = typer.Option(None, "--plot",
                                        help="Write a reliability diagram and a risk-coverage "
                                             "curve (PNG)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: one object per forecaster "
                                                       "(a list when several).", metavar=""),
) -> None:
    """Score the forecasts in a log: accuracy, ECE, Brier, CRPS, NLL, recovery, AURC
    (``gfsim.score`` in Python)."""
    from gfsim.api.options import open_log_arg
    from gfsim.api.score import score as run_score

    if plot is not None:
        from gfsim.core.inputs import check_output

        check_output(plot, [log], "--plot")
    the_log = open_log_arg(log)
    clean = run_score(the_log, forecaster=forecaster, task=task, by_task=by_task,
                      selective=selective, calibrate=calibrate, plot=plot)
    if as_json:
        print_json(clean[0] if len(clean) == 1 else clean)
        return
    _print(the_log, clean, plot)


def _print(log, results: list[dict], plot) -> None:
    from gfsim.cli.common import Table

    con = console()
    prov = log.header["provenance"].get("kind")
    con.print(f"[bold]gfsim score[/bold]  log={esc(log.name, 400)} ({prov})  labels in the "
              f"{log.header['label_bin_convention']} bin convention, forecasts relative to the "
              f"{log.header.get('forecast_relative_to')}")
    for r in results:
        con.print(f"forecasts scored, {esc(r['forecaster'], 80)}: "
                  f"{esc(r['forecast_source']['text'], 2000)}")
    table = Table(show_edge=False)  # metrics as rows: fits a narrow terminal
    table.add_column("metric")
    for r in results:
        table.add_column(esc(r["forecaster"], 60)
                         + (" (SYNTHETIC)" if r["forecast_source"]["synthetic"] else ""),
                         justify="right")
    for key, fmt in _TABLE:
        table.add_row(key, *[fmt.format(r[key]) if r[key] == r[key] else "-" for r in results])
    con.print(table)
    for r in results:
        rec = ", ".join(f"{b}%: {v:.1%}" for b, v in r["recovered"].items())
        con.print(f"{esc(r['forecaster'], 80)}: speedup recovered at {rec} (ranked by expected "
                  "speedup)")
        if "calibration" in r:
            c = r["calibration"]
            con.print(f"  {c['method']} recalibration (out of fold): ECE {c['ece_before']:.3f} "
                      f"-> {c['ece_after']:.3f}, NLL {c['nll_before']:.3f} -> {c['nll_after']:.3f}")
        if "selection" in r:
            con.print(f"  selected log ({r['selection']['rule']}): coverage "
                      f"{r['selection']['coverage']:.0%}; inverse-propensity-weighted accuracy "
                      f"{r['ipw']['accuracy']:.3f}, ECE {r['ipw']['ece']:.3f}")
        for t, v in r.get("by_task", {}).items():
            con.print(f"  {esc(t, 80)}: n {v['n']}, accuracy {v['accuracy']:.3f}, "
                      f"ECE {v['ece']:.3f}, "
                      f"recovered {v['recovered_mean']:.1%}")
    con.print("[dim]recovered: per task, the best true speedup among the top b% by expected "
              "speedup over the best among all (gfsim's definition; the paper's code has none)."
              " Parse failures: uniform in Brier/CRPS/NLL, excluded from accuracy and ECE.[/dim]")
    for c in results[0]["log_caveats"] if results else []:
        con.print(f"[dim]note: known caveat of {esc(log.name, 400)}: {esc(c, 2000)}[/dim]")
    if plot is not None:
        con.print(f"wrote {esc(plot, 400)}")
