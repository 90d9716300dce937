"""``gfsim import``: other tools' logs and data sets as replay logs (``gfsim import --help``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import (
    CONTEXT,
    GfsimCommand,
    JsonFlag,
    console,
    esc,
    handles_errors,
    print_json,
)
from gfsim.core.docs import docs_url

__all__ = ["app"]

app = typer.Typer(help="Import logs and data sets of other tools as gfsim replay logs.",
                  no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings=CONTEXT)


def _done(summary: dict, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    con = console()
    con.print(f"wrote {esc(summary['out'], 400)} from {esc(summary['source'], 400)}")
    for k, v in summary.items():
        if k not in ("out", "source"):
            unit = summary.get("metric") or summary.get("runtime_metric")
            unit = f" ({unit}, the value speedups are against)" if k == "reference" and unit \
                else ""
            con.print(f"  {k.replace('_', ' ')}: {esc(_shown(v), 400)}{esc(unit)}",
                      highlight=False)


def _shown(v) -> str:
    """A summary value for a person: numbers to four significant digits (whole ones from
    1,000 on, with thousands separators), mappings as ``key value`` pairs, lists joined by
    commas."""
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "none"}[v]
    if isinstance(v, float):
        return f"{v:,.0f}" if 1e3 <= abs(v) < 1e15 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_shown(x)}" for k, x in v.items()) or "none"
    if isinstance(v, (list, tuple)):
        return ", ".join(_shown(x) for x in v) or "none"
    return str(v)


@app.command("kernel-tuner")
@handles_errors
def kernel_tuner(
    cache: Path = typer.Argument(..., help="A Kernel Tuner cache (.json or .json.gz) or a T4 "
                                           "results file: a path, or the file name of a cache "
                                           "gfsim ships (convolution_milo_A100.json.gz, ...)."),
    out: Path = typer.Option(..., "--out", "-o", help="The config_space log to write."),
    reference: Optional[str] = typer.Option(None, "--reference",
                                            help="key=value,... of the configuration speedups "
                                                 "are against (default: the file's first "
                                                 "configuration that ran)."),
    as_json: JsonFlag = False,
) -> None:
    """A Kernel Tuner cache or T4 file as a config_space log (every configuration a
    candidate with its compile, verification and benchmark times)."""
    from gfsim.api.imports import import_kernel_tuner

    if not cache.exists() and cache.parent == Path("."):
        from gfsim.api.imports import find_cache

        cache = find_cache(str(cache))  # by name: $GFSIM_KERNEL_TUNER_DIR, ..., the shipped ones
    _done(import_kernel_tuner(cache, out, reference=reference), as_json)


@app.command("search")
@handles_errors
def search(
    source: Path = typer.Argument(..., help="A bring-your-own-search file: one JSON object per "
                                            "candidate (id, parent, outcome, speedup or "
                                            "runtime_ns, ...; the guide below gives every "
                                            "field)."),
    out: Path = typer.Option(..., "--out", "-o", help="The trajectory log to write."),
    reference_runtime_ns: Optional[float] = typer.Option(
        None, "--reference-runtime-ns",
        help="The reference runtime speedups are against (default: each task's first root "
             "with a runtime_ns)."),
    device: str = typer.Option("unknown", "--device", help="The GPU it was measured on."),
    provenance: str = typer.Option("measured", "--provenance",
                                   help="measured, synthetic or mixed: where the numbers came "
                                        "from, said in the log's header."),
    as_json: JsonFlag = False,
) -> None:
    """Your own search tool's output as a trajectory log (the smallest record set: one JSON
    object per candidate)."""
    from gfsim.api.imports import import_search

    _done(import_search(source, out, reference_runtime_ns=reference_runtime_ns, device=device,
                        provenance=provenance), as_json)


@app.command("openevolve")
@handles_errors
def openevolve(
    run_dir: Path = typer.Argument(..., help="An OpenEvolve output folder (checkpoints/, "
                                             "logs/), written by OpenEvolve 0.4.x."),
    out: Path = typer.Option(..., "--out", "-o", help="The trajectory log to write."),
    runtime_metric: Optional[str] = typer.Option(
        None, "--runtime-metric", help="The metric that is a program's runtime (lower is "
                                       "better), or its score with --higher-is-better."),
    higher_is_better: bool = typer.Option(False, "--higher-is-better",
                                          help="The metric is a score: speedup = score / the "
                                               "reference's score.", metavar=""),
    reference_runtime: Optional[float] = typer.Option(
        None, "--reference-runtime", help="The metric's value speedups are against, in its "
                                          "unit (default: the seed program's)."),
    openevolve_version: Optional[str] = typer.Option(
        None, "--openevolve-version", help="The OpenEvolve version that made the run (the run "
                                           "does not record it); refused outside 0.4.x."),
    task: str = typer.Option("task", "--task", help="The task id the search is for."),
    device: str = typer.Option("unknown", "--device", help="The GPU it was measured on."),
    provenance: str = typer.Option("measured", "--provenance",
                                   help="measured, synthetic or mixed: where the numbers came "
                                        "from, said in the log's header."),
    surrogate_log: Optional[Path] = typer.Option(
        None, "--surrogate-log", help="The log gfsim's surrogate (gfsim.integrations."
                                      "openevolve) wrote during the run: its forecasts join "
                                      "the programs by code."),
    trace: Optional[Path] = typer.Option(
        None, "--trace", help="The run's evolution trace (default: evolution_trace.jsonl in "
                              "the run folder, when there is one): children the checkpoints "
                              "dropped, and failed iterations."),
    as_json: JsonFlag = False,
) -> None:
    """An OpenEvolve run as a trajectory log: every checkpoint's programs, parents, the
    log's iteration order and seconds, failures with their error text."""
    from gfsim.api.imports import import_openevolve

    _done(import_openevolve(run_dir, out, runtime_metric=runtime_metric,
                            higher_is_better=higher_is_better,
                            reference_runtime=reference_runtime,
                            openevolve_version=openevolve_version, task=task, device=device,
                            provenance=provenance, surrogate_log=surrogate_log,
                            trace=trace), as_json)



@app.command("shinka")
@handles_errors
def shinka(
    run_dir: Path = typer.Argument(..., help="A ShinkaEvolve results folder (programs.sqlite, "
                                             "gen_N/), written by ShinkaEvolve 0.0.x."),
    out: Path = typer.Option(..., "--out", "-o", help="The trajectory log to write."),
    metric: str = typer.Option("combined_score", "--metric",
                               help="The value speedups come from: combined_score, or "
                                    "public.NAME / private.NAME of the programs' metrics."),
    lower_is_better: bool = typer.Option(False, "--lower-is-better",
                                         help="The metric is a runtime: speedup = the "
                                              "reference's value / the program's.", metavar=""),
    reference: Optional[float] = typer.Option(
        None, "--reference", help="The metric's value speedups are against, in its unit "
                                  "(default: the seed program's)."),
    db: Optional[str] = typer.Option(None, "--db", help="The database file, where it is not "
                                                        "programs.sqlite, evolution_db.sqlite "
                                                        "or None."),
    shinka_version: Optional[str] = typer.Option(
        None, "--shinka-version", help="The ShinkaEvolve version that made the run (the run "
                                       "does not record it); refused outside 0.0.x."),
    task: str = typer.Option("task", "--task", help="The task id the search is for."),
    device: str = typer.Option("unknown", "--device", help="The GPU it was measured on."),
    provenance: str = typer.Option("measured", "--provenance",
                                   help="measured, synthetic or mixed: where the numbers came "
                                        "from, said in the log's header."),
    surrogate_log: Optional[Path] = typer.Option(
        None, "--surrogate-log", help="The log gfsim's gate (gfsim.integrations.shinka) wrote "
                                      "during the run: its forecasts join the programs by "
                                      "code."),
    as_json: JsonFlag = False,
) -> None:
    """A ShinkaEvolve run as a trajectory log: its programs with parents and islands, the
    proposals that failed before evaluation, seconds, tokens and API dollars."""
    from gfsim.api.imports import import_shinka

    _done(import_shinka(run_dir, out, metric=metric, lower_is_better=lower_is_better,
                        reference=reference, db=db, shinka_version=shinka_version, task=task,
                        device=device, provenance=provenance,
                        surrogate_log=surrogate_log), as_json)


@app.command("kernelbench")
@handles_errors
def kernelbench(
    run_dir: Path = typer.Argument(..., help="A KernelBench run folder (runs/RUN_NAME) or its "
                                             "eval_results.json, in any shape KernelBench "
                                             "has written."),
    baseline: Path = typer.Option(..., "--baseline",
                                  help="KernelBench's baseline timing file for the GPU the "
                                       "results were measured on (its results/timing/ "
                                       "folder: baseline_time_torch.json)."),
    out: Path = typer.Option(..., "--out", "-o", help="The trajectory log to write."),
    level: Optional[int] = typer.Option(None, "--level",
                                        help="The KernelBench level (default: the run's "
                                             "generation_config.yaml, or the file's nesting)."),
    device: str = typer.Option("unknown", "--device", help="The GPU it was measured on "
                                                            "(default: the one the results "
                                                            "record)."),
    provenance: str = typer.Option("measured", "--provenance",
                                   help="measured, synthetic or mixed: where the numbers came "
                                        "from, said in the log's header."),
    force: bool = typer.Option(False, "--force",
                               help="Import even where --level contradicts the run's "
                                    "generation_config.yaml, or the baseline was timed on "
                                    "another GPU than the results (said in the log's "
                                    "header).", metavar=""),
    as_json: JsonFlag = False,
) -> None:
    """KernelBench results as a trajectory log: every sample of every problem, a child of
    the reference, with KernelBench's speedup and its failures by kind."""
    from gfsim.api.imports import import_kernelbench

    _done(import_kernelbench(run_dir, out, baseline=baseline, level=level, device=device,
                             provenance=provenance, force=force), as_json)

def _capacities(text: str | None) -> dict | None:
    """The run's concurrency in the event importer's terms (``eval``: the GPU slots)."""
    from gfsim.cli.common import parse_capacities

    if not text:
        return None
    given = parse_capacities(text, "--capacity", keys=("gen", "forecast", "gpus"))
    return {{"gpus": "eval"}.get(k, k): n for k, n in given.items()}


@app.command("gpu-forecasters-events")
@handles_errors
def gpu_forecasters_events(
    events: Path = typer.Argument(..., help="A reference search's events.jsonl (raw lines, or "
                                            "data-set rows wrapping them)."),
    out: Path = typer.Option(..., "--out", "-o", help="The trajectory log to write."),
    capacity: Optional[str] = typer.Option(None, "--capacity",
                                           help="The run's concurrency, KEY=N pairs joined "
                                                "by commas (keys gen, forecast, gpus): service "
                                                "times are then recovered by "
                                                "replaying the log's own FIFO queue (else they "
                                                "stay queue-inclusive)."),
    task: Optional[str] = typer.Option(None, "--task", help="Task id (default: the log's "
                                                             "kernel_task, or the file name)."),
    device: Optional[str] = typer.Option(None, "--device", help="GPU name, where the events "
                                                                 "do not say."),
    as_json: JsonFlag = False,
) -> None:
    """The reference's search events (standard or filtered) as a trajectory log."""
    from gfsim.api.imports import import_events

    _done(import_events(events, out, task=task, device=device,
                        capacities=_capacities(capacity)), as_json)


@app.command("gpu-forecasters-eval-set")
@handles_errors
def gpu_forecasters_eval_set(
    out: Path = typer.Option(..., "--out", "-o", help="The pairs log to write."),
    rows: Optional[Path] = typer.Option(None, "--rows", help="Eval-set rows (.jsonl[.gz] or "
                                                             ".parquet)."),
    predictions: Optional[Path] = typer.Option(None, "--predictions",
                                               help="Predictions (.jsonl[.gz] or .parquet)."),
    hf: bool = typer.Option(False, "--hf", help="Download both from the HuggingFace hub with "
                                                "`datasets` (needs the network).", metavar=""),
    as_json: JsonFlag = False,
) -> None:
    """The paper's evaluation pairs and predictions as a pairs log for `gfsim score`."""
    from gfsim.core.errors import GfsimError
    from gfsim.api.imports import fetch_hf, import_eval_set

    if hf:
        if rows or predictions:
            raise GfsimError("--hf downloads the files: give it without --rows/--predictions")
        rows, predictions = fetch_hf(out.parent / (out.name + ".hf"))
    elif rows is None or predictions is None:
        raise GfsimError("give --rows and --predictions (or --hf)")
    summary = import_eval_set(rows, predictions, out)
    summary["source"] = f"{summary['rows']} + {summary['predictions']}"
    _done(summary, as_json)


@app.command("plugin")
@handles_errors
def plugin(
    name: str = typer.Argument(..., help="The importer plug-in's name (its package's "
                                         "gfsim.importers entry point)."),
    source: Path = typer.Argument(..., help="What it reads: a file or a folder."),
    out: Path = typer.Option(..., "--out", "-o", help="The log to write."),
    option: list[str] = typer.Option([], "--option", help="KEY=VALUE passed to the importer "
                                                          "as a string; repeat for more."),
    as_json: JsonFlag = False,
) -> None:
    """Another package's importer: its records written and checked as a log, all or nothing."""
    from gfsim.core.errors import SpecError
    from gfsim.api.imports import import_with

    options = {}
    for item in option:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"--option {item!r}: expected KEY=VALUE")
        options[key.strip()] = value
    _done(import_with(name, source, out, options), as_json)


# The line `gfsim import -h` shows for each (click would cut a longer first sentence).
_SHORT = {
    "kernel-tuner": "A Kernel Tuner cache or T4 results file.",
    "search": "Your own search tool's output (gfsim's format).",
    "openevolve": "An OpenEvolve run (checkpoints, logs, trace).",
    "shinka": "A ShinkaEvolve run (its SQLite database).",
    "kernelbench": "KernelBench results (eval_results.json).",
    "gpu-forecasters-events": "The reference's search events.",
    "gpu-forecasters-eval-set": "The paper's evaluation pairs and predictions.",
    "plugin": "Another package's importer (an entry point).",
}
# Each command's page on the documentation site (a pip install has no docs/), shown under its
# description on a line of its own ("\b": click leaves it unwrapped, so the URL stays whole).
_GUIDE = {
    "kernel-tuner": "how-to/import-kernel-tuner.md",
    "search": "how-to/import-your-search.md",
    "openevolve": "how-to/replay-openevolve.md",
    "shinka": "how-to/replay-shinka.md",
    "kernelbench": "how-to/replay-kernelbench.md",
    "gpu-forecasters-events": "how-to/import-event-log.md",
    "plugin": "how-to/write-a-plugin.md",
}
for _info in app.registered_commands:  # readable metavars (gfsim.cli.common.GfsimCommand)
    _info.cls = GfsimCommand
    _info.short_help = _SHORT[_info.name]
    if _info.name in _GUIDE:
        _info.help = (inspect.getdoc(_info.callback) or "") + \
            f"\n\n\b\nGuide: {docs_url(_GUIDE[_info.name])}"
