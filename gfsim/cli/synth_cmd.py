"""``gfsim synth``: write a SYNTHETIC replay log from the seeded kernel landscape."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import (
    console,
    handles_errors,
    JsonFlag,
    print_json,
    SeedOption,
)

__all__ = ["synth"]

_PROGRESS_FROM = 20_000  # candidates; smaller logs take well under a second or two


@handles_errors
def synth(
    out: Path = typer.Option(..., "--out", "-o",
                             help="Output log (.jsonl or .jsonl.gz); replaced if it exists."),
    seed: SeedOption = 0,
    candidates: Optional[int] = typer.Option(None, "--candidates", "-n",
                                             help="Candidates in the log (pairs: comparisons); "
                                                  "not with --driver puct."),
    tasks: int = typer.Option(6, "--tasks", "-k",
                              help="Synthetic tasks; candidates are split evenly over them."),
    shape: str = typer.Option("trajectory", "--shape",
                              help="trajectory (one measure-all search per task) or pairs "
                                   "(reference/candidate comparisons for `gfsim score`)."),
    driver: str = typer.Option("greedy", "--driver",
                               help="greedy (parents by measured speedup) or puct (the "
                                    "reference search, paper-standard shape)."),
    steps: int = typer.Option(40, "--steps", help="Steps per search (puct driver)."),
    world: Optional[str] = typer.Option(None, "--world",
                                        help="Search this world instead of the landscape "
                                             "(puct driver): a built-in name, "
                                             "kernel-tuner:CACHE, PATH.py:NAME or module:NAME."),
    as_json: JsonFlag = False,
) -> None:
    """Write a SYNTHETIC log (nothing measured): same arguments, same bytes.

    Every distribution parameter is a stated assumption, recorded in the log's header.
    """
    from gfsim.core.errors import GfsimError
    from gfsim.api.synth import SHAPES, summary_lines, synthesize

    if shape not in SHAPES:
        raise GfsimError(f"--shape: unknown shape {shape!r}; valid: {', '.join(SHAPES)}")
    if not out.parent.exists():  # as --plot: a typo in a folder name is not a new folder
        raise GfsimError(f"{out}: folder {out.parent} does not exist")
    if world:  # the file a world is read from (kernel-tuner:CACHE, PATH.py:NAME)
        from gfsim.core.inputs import check_output

        name = world.removeprefix("kernel-tuner:")
        check_output(out, [name if name != world else world.rpartition(":")[0] or None])
    if candidates is not None and candidates >= _PROGRESS_FROM and not as_json:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("synth"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=Console(stderr=True),
                      transient=True) as bar:
            job = bar.add_task("synth", total=candidates)
            summary = synthesize(out, seed=seed, candidates=candidates, tasks=tasks, shape=shape,
                                 progress=lambda n: bar.advance(job, n), driver=driver,
                                 steps=steps, world=world)
    else:
        summary = synthesize(out, seed=seed, candidates=candidates, tasks=tasks, shape=shape,
                             driver=driver, steps=steps, world=world)
    if as_json:
        print_json(summary)
        return
    con = console()
    for line in summary_lines(summary):
        con.print(line, highlight=False, markup=False, soft_wrap=True)
    if summary.get("kind") == "measured":
        con.print("[dim]MEASURED runtimes from the world's data; the search over them, its "
                  "forecasts and generation times are synthetic (the header's provenance.note "
                  "says which is which)[/dim]", soft_wrap=True)
        return
    con.print("[dim]SYNTHETIC: nothing was measured; every number comes from the assumptions "
              "in the header (provenance.params)[/dim]", soft_wrap=True)
