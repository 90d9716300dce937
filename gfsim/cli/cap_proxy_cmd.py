"""``gfsim cap-proxy``: an OpenAI-compatible server's calls held to a run's dollar cap
(``gfsim.integrations.cap_proxy``), served until interrupted."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Optional

import typer

from gfsim.cli.common import handles_errors
from gfsim.core.errors import GfsimError

__all__ = ["cap_proxy"]


@handles_errors
def cap_proxy(
    usd: float = typer.Option(..., "--usd", help="The run's dollar cap."),
    ledger: Path = typer.Option(..., "--ledger", help="The cap's ledger file (JSON lines), "
                                                      "shared by every part of the run held "
                                                      "to the cap: give the gate's DollarCap "
                                                      "the same ledger, usd and prices."),
    upstream: str = typer.Option(..., "--upstream", metavar="URL",
                                 help="The OpenAI-compatible server's base URL, e.g. "
                                      "http://127.0.0.1:8000/v1."),
    cost: str = typer.Option("serverless-a100", "--cost", help="Cost preset whose generator "
                                                               "prices the tokens (gfsim "
                                                               "costs lists them)."),
    generator_prices: Optional[str] = typer.Option(
        None, "--generator-prices", metavar="IN,OUT",
        help="USD per million input and output tokens, instead of the preset's."),
    refusal: str = typer.Option("error", "--refusal", metavar="[error|reply]",
                                help="How a call the cap refuses is answered: error, HTTP 402 "
                                     "that says why; reply, a completion that says why "
                                     "(ShinkaEvolve retries every HTTP error: give it reply)."),
    port: int = typer.Option(0, "--port", help="Port on 127.0.0.1 (0: a free one)."),
    log: Optional[Path] = typer.Option(None, "--log", help="Write each call (forwarded or "
                                                           "refused, its ticket and usage) "
                                                           "here as JSON lines."),
    model: str = typer.Option("MODEL", "--model", help="The upstream's model name, for the "
                                                       "line that tells ShinkaEvolve's name."),
) -> None:
    """Serve an OpenAI-compatible proxy on 127.0.0.1 that holds an LLM server's calls to a run's
    dollar cap: each call reserves its prompt and max_tokens at the generator's prices before
    it is forwarded and settles the usage reported; once the cap is reached nothing is
    forwarded. Runs until interrupted (Ctrl-C), then says what was spent."""
    from gfsim.api.cap import CapProxy, DollarCap

    cap = DollarCap.from_cost_model(usd, ledger, cost)
    if generator_prices is not None:
        try:
            prices = tuple(float(v) for v in generator_prices.split(","))
            if len(prices) != 2:
                raise ValueError
        except ValueError:
            raise GfsimError(f"--generator-prices: expected IN,OUT (USD per million tokens), "
                             f"got {generator_prices!r}") from None
        cap = DollarCap(usd, ledger, prices, cap.forecaster_usd_per_m, cap.gpu_usd_per_hour)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with CapProxy(cap, upstream, refusal=refusal, log=log, port=port) as proxy:
        typer.echo(f"gfsim cap-proxy at {proxy.url} -> {proxy.upstream}: cap ${usd:g}, ledger "
                   f"{cap.ledger}; refusals as {refusal}")
        typer.echo(f"ShinkaEvolve's name for it: local/{model}@{proxy.url}")
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    st = cap.status()
    reached = st["reached"]
    typer.echo(f"stopped: {proxy.forwarded} forwarded, {proxy.refused} refused; the ledger "
               f"says ${st['spent_usd']:.4f} spent of ${usd:g}, "
               + (f"cap reached: {reached['why']}" if reached else "cap not reached"))
