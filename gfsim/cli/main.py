"""Entry point: ``gfsim COMMAND`` (also ``python -m gfsim``). Commands import their heavy
dependencies only when run."""

from __future__ import annotations

from typing import Optional

import typer

from gfsim.cli import cap_proxy_cmd, costs_cmd, counterfactual_cmd, forecast_cmd, import_cmd
from gfsim.cli import inspect_cmds, live_cmd, replay_cmd
from gfsim.cli import plan_cmd, recommend_cmd, savings_cmd, score_cmd, synth_cmd, tune_cmd
from gfsim.cli.common import CONTEXT, GfsimCommand
from gfsim.core.docs import DOCS_URL

app = typer.Typer(
    name="gfsim",
    help="Cost-aware budget simulator and policy optimizer for LLM-driven GPU-kernel searches. "
         f"Run `gfsim COMMAND -h` for a command's options; the guide is {DOCS_URL}",
    no_args_is_help=True,
    # click's own help layout: it rewraps prose to the terminal and never cuts an option's
    # text, where rich's panels cut long values with an ellipsis at 80 columns
    rich_markup_mode=None,
    context_settings=CONTEXT,
    pretty_exceptions_enable=False,
)

# (name, function, the one line `gfsim -h` shows: click would cut a longer first sentence)
COMMANDS = [
    ("replay", replay_cmd.replay, "Replay a log under a policy; compare with a baseline."),
    ("validate", inspect_cmds.validate, "Check a log against the schema."),
    ("logs", inspect_cmds.logs, "List the logs shipped with gfsim."),
    ("policies", inspect_cmds.policies, "List the policies and their parameters."),
    ("synth", synth_cmd.synth, "Write a SYNTHETIC log (nothing measured)."),
    ("costs", costs_cmd.costs, "List cost presets, LLM endpoints and their sources."),
    ("score", score_cmd.score, "Score the forecasts in a log."),
    ("forecast", forecast_cmd.forecast, "Add a forecaster's forecasts to a log."),
    ("tune", tune_cmd.tune, "Tune a policy and the overgeneration factor with Optuna."),
    ("savings", savings_cmd.savings, "Dollars, seconds and joules a policy saves."),
    ("recommend", recommend_cmd.recommend, "Which configuration to run next time."),
    ("plan", plan_cmd.plan, "What the next search will cost and find, before it runs."),
    ("cap-proxy", cap_proxy_cmd.cap_proxy, "Hold an LLM server's calls to a run's dollar cap."),
    ("live", live_cmd.live, "Run a live search with real parts (vLLM, Triton)."),
    ("merge", live_cmd.merge, "Merge logs of the same hardware and protocol."),
    ("fidelity", live_cmd.fidelity, "Replay a live log against the live run."),
    ("counterfactual", counterfactual_cmd.counterfactual,
     "Benchmark replays against direct runs on worlds."),
]
for name, fn, short in COMMANDS:
    app.command(name, short_help=short, cls=GfsimCommand)(fn)
app.add_typer(import_cmd.app, name="import", short_help="Import other tools' runs as logs.")


def _version(value: bool) -> None:
    if value:
        from gfsim import __version__

        typer.echo(f"gfsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Optional[bool] = typer.Option(
        None, "--version", "-V", callback=_version, is_eager=True,
        help="Print gfsim's version and exit.")) -> None:
    """Cost-aware budget simulator and policy optimizer for LLM-driven GPU-kernel searches.
    Run `gfsim COMMAND -h` for a command's options; the guide is the documentation site
    (``gfsim.core.docs.DOCS_URL``)."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
