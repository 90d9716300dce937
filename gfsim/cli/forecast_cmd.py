"""``gfsim forecast``: add a live forecaster's forecasts to a log whose candidates carry code."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import JsonFlag, console, esc, handles_errors, print_json

__all__ = ["forecast"]


@handles_errors
def forecast(
    log: str = typer.Option(..., "--log", "-l", help="Log path or shipped log name whose "
                                                      "candidates carry code (e.g. "
                                                      "h200-suite-v0)."),
    forecaster: str = typer.Option(..., "--forecaster", "-f",
                                   help="A real server, vllm:URL,model=NAME,mode=logprobs "
                                        "(or mode=tool), then optional KEY=VALUE pairs joined "
                                        "by commas; keys: labels (digits or words), "
                                        "concurrency, timeout, retries, backoff, "
                                        "max_prompt_tokens, tool_transport (tools, json or "
                                        "regex), api_key_env. Or a what-if forecaster: "
                                        "paper:gemini3-flash (or gpt-oss-120b, gpt-oss-20b, "
                                        "deepseek-v4, gpt-oss-20b-brier), or synthetic: with "
                                        "keys sigma, beta, temp, parse_fail (both take "
                                        "failed=parent|low, how a failed kernel is seen). Or "
                                        "the learned forecaster, learned (alias costmodel; "
                                        "keys min_train, prior_sigma, ...), trained "
                                        "prequentially on the log's measurements. Or a "
                                        "plug-in's name (gfsim.forecasters)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output log; an existing one is resumed."),
    repeat: int = typer.Option(0, "--repeat", help="Repeat index written into each forecast."),
    drop_existing: bool = typer.Option(False, "--drop-existing",
                                       help="Leave the input's own forecasts out of the output.",
                                       metavar=""),
    limit: Optional[int] = typer.Option(None, "--limit", help="Forecast at most N candidates "
                                                               "this run."),
    as_json: JsonFlag = False,
) -> None:
    """Add a forecaster's forecasts to a log (resumable): a live one for candidates with code,
    or a what-if one for candidates with a measured speedup (``gfsim.forecast`` in Python)."""
    from gfsim.api.forecast import forecast as run_forecast
    from gfsim.api.forecast import make_forecaster
    forecaster = make_forecaster(forecaster)  # refused before any output
    learned = forecaster.kind == "learned"
    kwargs = dict(repeat=repeat, drop_existing=drop_existing, limit=limit)
    if as_json or learned:
        summary = run_forecast(log, forecaster, out, **kwargs)
        if as_json:
            print_json(summary)
            return
    if learned:
        cm = summary["costmodel"]
        console().print(f"[bold]gfsim forecast[/bold]  {esc(summary['log'], 400)} -> "
                        f"{esc(summary['out'], 400)}  forecaster "
                        f"{esc(summary['forecaster']['name'])} (learned): "
                        f"{summary['forecast_now']} forecasts now, "
                        f"{summary['already_forecast']} already there; {cm['with_features']} "
                        f"of {cm['candidates']} candidates carry features; {cm['prior']} "
                        f"forecast by the prior, {cm['learned']} by trees trained on earlier "
                        f"steps ({summary['seconds']:.1f} s)")
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("forecast"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task("forecast", total=None)

        def progress(total, step):
            if step is None:
                bar.update(job, total=total)
            else:
                bar.advance(job, step)

        summary = run_forecast(log, forecaster, out, **kwargs, progress=progress)
    con = console()
    fc = summary["forecaster"]
    con.print(f"[bold]gfsim forecast[/bold]  {esc(summary['log'], 400)} -> "
              f"{esc(summary['out'], 400)}  forecaster {esc(fc['name'])} ({fc['mode']})"
              + ("  \\[resumed]" if summary["resumed"] else ""))
    if fc["mode"] == "whatif":
        con.print(f"what-if forecasts for candidates with a measured speedup: "
                  f"{summary['forecast_now']} now ({summary['parse_failed']} parse failures), "
                  f"{summary['already_forecast']} already there")
    else:
        con.print(f"candidates with code {summary['candidates_with_code']}, without "
                  f"{summary['without_code']}; already forecast {summary['already_forecast']}; "
                  f"now {summary['forecast_now']}: answered {summary['answered']}, parse "
                  f"failed {summary['parse_failed']}, no answer {summary['error']}")
        lat = summary["mean_latency_s"]
        con.print(f"tokens {summary['input_tokens']:,} in / {summary['output_tokens']:,} out; "
                  f"mean latency {lat:.3f} s" if lat is not None else "no answers this run")
    if summary["error"]:
        con.print(f"[yellow]note: {esc(summary['note'], 2000)}[/yellow]")
