"""``gfsim costs``: the cost presets and LLM endpoints, or every figure of one cost model with
its source."""

from __future__ import annotations

from typing import Optional

import typer

from gfsim.api.costs import SPEC_HELP
from gfsim.cli.common import JsonFlag, console, handles_errors, print_json

__all__ = ["costs"]


def _print_catalog(out: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    table = Table(title="cost presets (--cost)", show_edge=False)
    for col in ("name", "billing", "GPU", "$/h", "RunPod", "board W", "compile"):
        numeric = col in ("$/h", "RunPod", "board W")
        table.add_column(col, justify="right" if numeric else "left",
                         no_wrap=numeric or col == "name")
    for p in out["presets"]:
        runpod = p["runpod_usd_per_hour"]
        name = p["name"] + (" (plug-in)" if p.get("plugin") else "")
        table.add_row(name, p["billing"], p["gpu"], f"{p['usd_per_hour']:.2f}",
                      "-" if runpod is None else f"{runpod:.2f}", f"{p['board_w']:g}",
                      "GPU host" if p["compile_on"] == "gpu_host" else "CPU")
    con.print(table)
    con.print("[dim]serverless $/h: Modal list price (modal.com/pricing, 2026), per-second "
              "billing; RunPod $/h with provider=runpod (docs.runpod.io/serverless/pricing). "
              "reserved $/h: assumption, Modal's list price as a reservation. Power: vendor "
              "board specs; idle and active draw: see `gfsim costs PRESET`.[/dim]")
    llms = Table(title="LLM endpoints (forecaster=..., generator=...)", show_edge=False)
    for col in ("name", "$/1M in", "$/1M out", "J/token out", "source"):
        llms.add_column(col, justify="left" if col in ("name", "source") else "right",
                        no_wrap=col == "name")
    derived = []
    for r in out["llms"]:
        source = r["source"]
        if r["kind"] != "api":
            derived.append(f"{r['name']}: {source}")
            source = "derived (below)"
        llms.add_row(r["name"] + (" (default)" if r["name"] == out["default_llm"] else ""),
                     f"{r['usd_per_m_input']:.4g}", f"{r['usd_per_m_output']:.4g}",
                     f"{r['j_per_output_token']:g}", source)
    con.print(llms)
    for line in derived:
        con.print(f"[dim]{line}[/dim]")
    con.print(f"[dim]energy per token: {out['llms'][0]['energy_source']}[/dim]")
    cpu = out["cpu"]
    con.print(f"CPU compile workers: {cpu['source']}; {cpu['w_per_core']:g} W per core "
              "(assumption)")
    con.print(f"[dim]--cost takes {out['spec']}; `gfsim costs SPEC` shows every figure of one "
              "model with its source[/dim]")


def _print_model(out: dict) -> None:
    from gfsim.cli.common import Table

    con = console()
    con.print(f"[bold]{out['name']}[/bold]  billing={out['billing']}  "
              f"compile_on={out['compile_on']}")
    notes: dict[str, int] = {}
    table = Table(show_edge=False)
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("source", justify="right")
    for row in out["figures"]:
        v = row["value"]
        ref = notes.setdefault(row["source"] or "(none)", len(notes) + 1)
        table.add_row(row["key"], f"{v:g}" if isinstance(v, float) else str(v), f"[{ref}]")
    con.print(table)
    con.print("sources:")
    for text, ref in notes.items():
        con.print(f"  [{ref}] {text}", highlight=False, markup=False)


@handles_errors
def costs(
    spec: Optional[str] = typer.Argument(None, metavar="[PRESET_SPEC]", help=SPEC_HELP + "."),
    as_json: JsonFlag = False,
) -> None:
    """List cost presets and LLM endpoints, or every figure of one cost model with its source."""
    from gfsim.api.costs import costs as catalog

    out = catalog(spec)
    if as_json:
        print_json(out)
    elif spec is None:
        _print_catalog(out)
    else:
        _print_model(out)
