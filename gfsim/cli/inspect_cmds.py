"""``gfsim validate``, ``gfsim logs`` and ``gfsim policies``: look before you replay."""

from __future__ import annotations

import typer

from gfsim.cli.common import JsonFlag, console, esc, handles_errors, print_json

__all__ = ["validate", "logs", "policies"]


@handles_errors
def validate(
    path: str = typer.Argument(..., help="Log file (.jsonl or .jsonl.gz) or shipped log name."),
    as_json: JsonFlag = False,
    allow_truncated: bool = typer.Option(False, "--allow-truncated",
                                         help="Accept a log whose end a crash cut (its "
                                              "complete records are kept), exit 0.", metavar=""),
) -> None:
    """Check a log against schema v1; exit 2 naming the file, line and field of a problem, or
    saying what a crash cut from its end (unless --allow-truncated)."""
    from gfsim.api.describe import describe_log

    summary = describe_log(path, allow_truncated=allow_truncated)
    if as_json:
        print_json(summary)
        return
    con = console()
    con.print(f"[green]valid[/green] {esc(summary['path'], 400)}: schema v1, "
              f"{summary['shape']}, {summary['provenance']}")
    tasks = ", ".join(esc(t, 80) for t in summary["tasks"][:20]) + (
        f", ... ({len(summary['tasks'])} in all)" if len(summary["tasks"]) > 20 else "")
    con.print(f"  tasks: {tasks}; searches: {summary['searches']}")
    con.print("  records: " + ", ".join(f"{k} {v}" for k, v in summary["records"].items()))
    con.print("  candidates: " + ", ".join(f"{k} {v}" for k, v in summary["statuses"].items()))
    con.print(f"  forecasters: {', '.join(esc(f, 80) for f in summary['forecasters']) or 'none'}")
    for caveat in summary["caveats"]:
        con.print(f"  [yellow]caveat:[/yellow] {esc(caveat, 400)}")


@handles_errors
def logs(as_json: JsonFlag = False) -> None:
    """List the logs shipped with gfsim (usable as --log NAME)."""
    import textwrap

    from gfsim.api.describe import shipped_logs

    rows = shipped_logs()
    if as_json:
        print_json(rows)
        return
    # One block per log, its name whole on a line of its own (the name is what one types), the
    # description as prose under it: readable at any width, as `gfsim policies` is.
    con = console()
    for r in rows:
        con.print(f"[bold]{esc(r['name'])}[/bold]" + ("  (the default)" if r["default"] else ""),
                  highlight=False, overflow="fold")
        con.print(f"  {r['provenance']} {r['shape']} log: {r['candidates']:,} candidates, "
                  f"{len(r['tasks'])} task{'s' if len(r['tasks']) != 1 else ''}",
                  highlight=False)
        con.print(textwrap.fill(esc(r["description"], 4000), width=max(40, con.width - 1),
                                initial_indent="  ", subsequent_indent="  "),
                  highlight=False, soft_wrap=True)
    # What the docs admit about a log and its numbers do not show, under the table where the
    # logs are chosen (a replay of the log repeats them).
    for r in rows:
        for c in r["caveats"]:
            con.print(f"caveat, {esc(r['name'])}: {esc(c, 2000)}")


@handles_errors
def policies(as_json: JsonFlag = False) -> None:
    """List policies, their parameters and defaults (spec: NAME:VALUE or NAME:key=value,...)."""
    from gfsim.api.describe import policies as listed

    rows = listed()
    if as_json:
        print_json(rows)
        return
    con = console()
    for r in rows:
        plugin = f"  [dim](plug-in: {esc(r['module'], 200)})[/dim]" if r["plugin"] else ""
        con.print(f"[bold]{esc(r['name'])}[/bold]  {esc(r['summary'], 400)}{plugin}")
        for p in r["params"]:
            kind = "|".join(p["type"]) if isinstance(p["type"], list) else p["type"]
            con.print(f"    {p['name']}={p['default']}  ({kind}) {p['help']}")
    con.print("[dim]a bare value binds the first parameter: threshold:0.7 = "
              "threshold:tau=0.7[/dim]")
