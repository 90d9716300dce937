"""A loopback OpenAI-compatible proxy that holds an LLM server's calls to a run's dollar cap
(``gfsim.integrations.cap.DollarCap``), for search tools that take a server's URL but no client
of ours: ShinkaEvolve names one ``local/MODEL@URL`` (tested inside a real ShinkaEvolve 0.0.7
run: tests/data/shinka-cap).

Each ``POST /v1/chat/completions`` (or ``/v1/completions``) reserves its prompt (a token per
UTF-8 byte, plus a chat template's tokens: ``cap.chat_bytes``) and its ``max_tokens``
(``max_completion_tokens``; else the cap's ``max_output_tokens``) at the generator's prices
before it is forwarded to the upstream server, and settles at the usage the upstream reported
(the reservation where it reported none: a call that failed may still have been billed; nothing
where the upstream could not be reached at all). Reservations go to the cap's ledger under its
file lock, so calls in flight count, whichever thread, process or proxy makes them. Once the cap
refuses, no call is forwarded: the proxy answers itself, saying that the cap is reached and the
ledger's why. ``GET /v1/models`` is forwarded as it is (it costs nothing); a streamed request is
refused (no usage to settle by), as is any other route (embeddings are not held to the cap, so
they are not carried).

How a refusal is answered (``refusal``):

- ``"error"`` (the default): HTTP 402 with an OpenAI error body (``type`` and ``code``
  ``dollar_cap_reached``, the why as its ``message``) and ``x-should-retry: false`` (the OpenAI
  Python client retries 408, 409, 429 and 5xx, not a 402, and reads that header too). For
  clients that give up on a 4xx.
- ``"reply"``: HTTP 200 with a completion whose text is the refusal (model
  ``gfsim-dollar-cap``, zero usage, no code in it): for ShinkaEvolve. ShinkaEvolve 0.0.7 retries
  every HTTP error, 4xx included, and ignores ``x-should-retry``: its local-server query
  (``shinka.llm.providers.local_openai``) is wrapped in ``backoff.on_exception`` over
  ``openai.APIStatusError`` and ``APIConnectionError`` with up to 20 tries and waits up to 20 s
  (``BACKOFF_MAX_TRIES``, ``BACKOFF_MAX_VALUE``), and ``AsyncLLMClient.query`` tries that 3
  times; a proposal makes up to ``max_novelty_attempts x max_patch_resamples x
  max_patch_attempts`` queries (3 x 3 x 1 by default). A refusal as an error would cost
  minutes of retries per query, for each generation left. A reply is not retried: ShinkaEvolve
  finds no program in it, records the proposal as failed (``attempt_log`` and
  ``gen_N/failure.json``, whose ``llm_result`` holds the refusal's text) and submits nothing
  for evaluation. Failed proposals are not programs, so the generations left fail at once, one
  after another, and when ``num_generations`` generations have been handed out ShinkaEvolve
  stops itself ("Generation budget exhausted before reaching target completed generations",
  ``generation_event_log`` status ``stopped_generation_budget_exhausted``), waits for the
  evaluations in flight and finalizes as usual: every program is in ``programs.sqlite``. Its
  own stop, ``max_api_costs``, cannot be used: it prices a ``local/`` model's tokens from
  ``pricing.csv``, where a local model has no row (so its cost is 0). To resume, run
  ShinkaEvolve again on the same results folder with more ``num_generations`` and a larger cap
  on the same ledger (a failed generation's folder is skipped, as ShinkaEvolve skips any
  existing one).

Each call is also written to ``log`` (JSON lines, if given): what it asked, whether it was
forwarded (with its ledger ticket and when it was sent), the upstream's status and usage, and
what it settled, or the refusal. Bound to 127.0.0.1 only; stdlib ``http.server``, as
``gfsim.integrations.mutation_server``, with httpx (gfsim's ``live`` extra) to the upstream.
Usage::

    cap = DollarCap.from_cost_model(5.0, "/abs/run.ledger", "serverless-a100")
    with CapProxy(cap, "http://127.0.0.1:8000/v1", refusal="reply") as proxy:
        model = f"local/MODEL@{proxy.url}"  # ShinkaEvolve's llm_models
"""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from gfsim.core.errors import GfsimError
from gfsim.integrations.jsonhttp import JsonHandler

__all__ = ["CapProxy", "REFUSALS", "REFUSED_MODEL"]

REFUSALS = ("error", "reply")
REFUSED_MODEL = "gfsim-dollar-cap"  # the model a refusal given as a reply names
_CAPPED = ("/chat/completions", "/completions")


def _error(status: int, message: str, kind: str = "gfsim_cap_proxy") -> tuple:
    return status, {"error": {"message": " ".join(message.split()), "type": kind,
                              "param": None, "code": kind}}


class CapProxy:
    """The proxy: ``cap`` (a ``DollarCap``) in front of ``upstream`` (an OpenAI-compatible base
    URL, ``http://HOST:PORT/v1``); see the module doc. ``start()`` (or ``with``) binds
    127.0.0.1 on ``port`` (0: a free one) and serves in a daemon thread; ``url`` is then the
    base URL to give a client. ``forwarded`` and ``refused`` count the capped calls."""

    def __init__(self, cap, upstream: str, *, refusal: str = "error", log=None, port: int = 0,
                 timeout_s: float = 1200.0):
        if refusal not in REFUSALS:
            raise GfsimError(f"cap proxy: refusal must be one of {', '.join(REFUSALS)}, "
                             f"got {refusal!r}")
        if not str(upstream).startswith(("http://", "https://")):
            raise GfsimError(f"cap proxy: upstream must be an http(s):// base URL such as "
                             f"http://127.0.0.1:8000/v1, got {upstream!r}")
        self.cap, self.upstream = cap, str(upstream).rstrip("/")
        self.refusal, self.log, self.port, self.timeout_s = refusal, log, port, timeout_s
        self.url = None
        self.forwarded = self.refused = 0
        self._lock = threading.Lock()
        self._httpd = self._client = None

    # -- serving ----------------------------------------------------------------------------
    def start(self) -> "CapProxy":
        try:
            import httpx
        except ImportError:
            raise GfsimError("cap proxy: forwarding needs httpx: pip install 'gfsim[live]' "
                             "(or httpx)") from None
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=10.0))
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._client.close()
            self._httpd = None

    def __enter__(self) -> "CapProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one request --------------------------------------------------------------------------
    def get(self, route: str, headers: dict) -> tuple:
        """(status, body) for a GET: ``/models`` forwarded, ``/health`` with the cap's state."""
        if route in ("", "/health"):
            return 200, {"status": "ok", "upstream": self.upstream, "cap": self.cap.status()}
        if route != "/models":
            return _error(404, f"gfsim cap proxy: no route {route!r}")
        import httpx

        try:
            r = self._client.get(self.upstream + route, headers=headers)
        except httpx.TransportError as exc:
            return self._unreachable(exc)
        return r.status_code, r.content

    def post(self, route: str, raw: bytes, headers: dict) -> tuple:
        """(status, body, extra headers) for a POST: forwarded under the cap, or refused."""
        if route not in _CAPPED:
            return (*_error(404, f"gfsim cap proxy: no route {route!r} (it carries "
                                 "/v1/chat/completions, /v1/completions and /v1/models)"), {})
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return (*_error(400, "gfsim cap proxy: expected a JSON object"), {})
        if body.get("stream"):
            return (*_error(400, "gfsim cap proxy: streamed completions are not carried (they "
                                 "report no usage to settle by): ask with stream false"), {})
        from gfsim.integrations.cap import CapReached, chat_bytes, text_bytes

        prompt = body.get("prompt", "")
        size = chat_bytes(body.get("messages")) if route == "/chat/completions" else \
            text_bytes(prompt if isinstance(prompt, str) else json.dumps(prompt))
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        limit = limit if isinstance(limit, int) and limit > 0 else None
        record = {"route": route, "model": body.get("model"), "prompt_bytes": size,
                  "max_tokens": limit}
        try:
            with self.cap.llm_call("generator", size, limit,
                                   f"{route} model={body.get('model')}") as bill:
                record.update(ticket=bill.ticket, reserved_usd=bill.reserved_usd,
                              forwarded=True, sent_t=time.time())
                status, out = self._forward(route, raw, headers, bill, record)
        except CapReached as exc:
            with self._lock:
                self.refused += 1
            self._write({**record, "forwarded": False, "refused": str(exc)})
            return self._refuse(route, str(exc))
        with self._lock:
            self.forwarded += record["forwarded"]
        self._write({**record, "settled_usd": bill.reserved_usd if bill.usd is None
                     else bill.usd})
        return status, out, {}

    def _forward(self, route: str, raw: bytes, headers: dict, bill, record: dict) -> tuple:
        import httpx

        try:
            r = self._client.post(self.upstream + route, content=raw, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            bill.usd = 0.0  # it never reached the server: nothing to bill
            record.update(forwarded=False, error=" ".join(str(exc).split()))
            return self._unreachable(exc)
        except httpx.TransportError as exc:  # sent, but no answer: it may have been billed
            record["error"] = " ".join(str(exc).split()) or type(exc).__name__
            return self._unreachable(exc)
        usage = None
        if r.is_success:
            try:
                usage = r.json().get("usage")
            except (ValueError, AttributeError):
                usage = None
        bill.usd = self.cap.usage_usd("generator", usage)
        record.update(status=r.status_code, usage=usage)
        return r.status_code, r.content

    def _unreachable(self, exc) -> tuple:
        why = " ".join(str(exc).split()) or type(exc).__name__
        return _error(502, f"gfsim cap proxy: the upstream {self.upstream} did not answer: "
                           f"{why}", "upstream_unreachable")

    def _refuse(self, route: str, why: str) -> tuple:
        text = f"gfsim cap proxy: not forwarded: {why}"
        if self.refusal == "error":
            return (*_error(402, text, "dollar_cap_reached"), {"x-should-retry": "false"})
        with self._lock:
            n = self.refused
        head = {"id": f"gfsim-cap-{n}", "created": int(time.time()), "model": REFUSED_MODEL,
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
        if route == "/completions":
            return 200, {**head, "object": "text_completion", "choices": [
                {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}, {}
        return 200, {**head, "object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": text}}]}, {}

    def _write(self, record: dict) -> None:
        if self.log is None:
            return
        line = json.dumps({"t": time.time(), **record}) + "\n"
        with self._lock, open(Path(self.log), "a", encoding="utf-8") as f:
            f.write(line)


def _handler(proxy: CapProxy):
    class Handler(JsonHandler):
        def _route(self) -> str:
            path = self.path.split("?", 1)[0].rstrip("/")
            return path[3:] if path.startswith("/v1") else path

        def _headers(self) -> dict:
            keep = {"authorization", "openai-organization", "openai-project"}
            out = {k: v for k, v in self.headers.items() if k.lower() in keep}
            return {**out, "Content-Type": "application/json"}

        def do_GET(self):  # noqa: N802 - http.server's name
            try:
                self.send_json(*proxy.get(self._route(), self._headers()))
            except Exception as exc:  # noqa: BLE001 - a bug answers as one, never hangs
                self.send_json(*_error(500, f"gfsim cap proxy: {type(exc).__name__}: {exc}"))

        def do_POST(self):  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            try:
                self.send_json(*proxy.post(self._route(), raw, self._headers()))
            except Exception as exc:  # noqa: BLE001
                self.send_json(*_error(500, f"gfsim cap proxy: {type(exc).__name__}: {exc}"))

    return Handler
