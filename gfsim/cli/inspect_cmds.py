"""``gfsim validate``, ``gfsim logs`` and ``gfsim policies``: look before you replay."""

from __future__ import annotations

import typer

from gfsim.cli.common import JsonFlag, console, esc, handles_errors, print_json

__all__ = ["validate", "logs", "policies"]


def _log_summary(log) -> dict:
    from gfsim.replay_logs import log_caveats

    return {
        "log": log.name,
        "path": log.path,
        "shape": log.shape,
        "provenance": log.header["provenance"].get("kind"),
        "tasks": [t["task_id"] for t in log.header["tasks"]],
        "searches": int(log.candidates["search_id"].nunique()) if len(log.candidates) else 0,
        "records": log.counts,
        "candidates": len(log.candidates),
        "statuses": log.status_counts(),
        "forecasters": log.forecasters(),
        "label_bin_convention": log.header["label_bin_convention"],
        "truncated": log.truncated,
        "forecast_relative_to": log.header.get("forecast_relative_to"),
        "caveats": log_caveats(log),
    }


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
    from gfsim.core.errors import GfsimError
    from gfsim.replay_logs import open_log

    log = open_log(path)
    if log.truncated and not allow_truncated:
        raise GfsimError(f"{log.truncated}; the records before the cut are valid (pass "
                         "--allow-truncated to accept them)")
    summary = _log_summary(log)
    if as_json:
        print_json({"valid": True, **summary})
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

    from gfsim.replay_logs import DEFAULT_LOG, SHIPPED_LOGS, open_log

    rows = []
    for name, (_, description) in SHIPPED_LOGS.items():
        log = open_log(name)
        rows.append({"name": name, "default": name == DEFAULT_LOG, "description": description,
                     **_log_summary(log)})
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
    from gfsim.policies import POLICIES

    rows = []
    for name, cls in POLICIES.items():
        params = [{"name": p.name, "default": p.default, "help": p.help,
                   "type": list(p.kind) if isinstance(p.kind, tuple) else p.kind.__name__}
                  for p in cls.params]
        rows.append({"name": name, "summary": cls.summary, "needs_forecast": cls.needs_forecast,
                     "params": params, "plugin": not POLICIES.builtin(name)})
    if as_json:
        print_json(rows)
        return
    con = console()
    for r in rows:
        plugin = f"  [dim](plug-in: {esc(POLICIES[r['name']].__module__, 200)})[/dim]" \
            if r["plugin"] else ""
        con.print(f"[bold]{esc(r['name'])}[/bold]  {esc(r['summary'], 400)}{plugin}")
        for p in r["params"]:
            kind = "|".join(p["type"]) if isinstance(p["type"], list) else p["type"]
            con.print(f"    {p['name']}={p['default']}  ({kind}) {p['help']}")
    con.print("[dim]a bare value binds the first parameter: threshold:0.7 = "
              "threshold:tau=0.7[/dim]")
