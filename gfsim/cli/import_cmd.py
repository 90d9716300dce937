"""``gfsim import``: other tools' logs and data sets as replay logs (``gfsim import --help``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import console, handles_errors, print_json

__all__ = ["app"]

app = typer.Typer(help="Import logs and data sets of other tools as gfsim replay logs.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


def _done(summary: dict, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    con = console()
    con.print(f"wrote {summary['out']} from {summary['source']}")
    for k, v in summary.items():
        if k not in ("out", "source"):
            con.print(f"  {k}: {v}", highlight=False)


@app.command("kernel-tuner")
@handles_errors
def kernel_tuner(
    cache: Path = typer.Argument(..., help="A Kernel Tuner cache (.json or .json.gz) or a T4 "
                                           "results file."),
    out: Path = typer.Option(..., "--out", "-o", help="The config_space log to write."),
    reference: Optional[str] = typer.Option(None, "--reference",
                                            help="key=value,... of the configuration speedups "
                                                 "are against (default: the file's first "
                                                 "configuration that ran)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """A Kernel Tuner cache or T4 file as a config_space log (every configuration a
    candidate with its compile, verification and benchmark times)."""
    from gfsim.importers.kernel_tuner import import_kernel_tuner

    _done(import_kernel_tuner(cache, out, reference=reference), as_json)
