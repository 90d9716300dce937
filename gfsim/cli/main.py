"""Entry point: ``gfsim COMMAND``. Commands import their heavy dependencies only when run."""

from __future__ import annotations

import typer

from gfsim.cli import costs_cmd, counterfactual_cmd, forecast_cmd, import_cmd
from gfsim.cli import inspect_cmds, live_cmd, replay_cmd
from gfsim.cli import recommend_cmd, savings_cmd, score_cmd, synth_cmd, tune_cmd

app = typer.Typer(
    name="gfsim",
    help="Cost-aware budget simulator and policy optimizer for LLM-driven GPU-kernel searches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("replay")(replay_cmd.replay)
app.command("validate")(inspect_cmds.validate)
app.command("logs")(inspect_cmds.logs)
app.command("policies")(inspect_cmds.policies)
app.command("synth")(synth_cmd.synth)
app.command("costs")(costs_cmd.costs)
app.command("score")(score_cmd.score)
app.command("forecast")(forecast_cmd.forecast)
app.command("tune")(tune_cmd.tune)
app.command("savings")(savings_cmd.savings)
app.command("recommend")(recommend_cmd.recommend)
app.command("live")(live_cmd.live)
app.command("merge")(live_cmd.merge)
app.command("fidelity")(live_cmd.fidelity)
app.command("counterfactual")(counterfactual_cmd.counterfactual)
app.add_typer(import_cmd.app, name="import")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
