"""The client side of an OpenAI-compatible server, shared by the live LLM clients (the forecaster
in ``gfsim.live.forecaster``, the mutator in ``gfsim.live.mutator``): one thread-safe
``httpx.Client`` with retries and exponential backoff, the tally of what the answers cost, and the
``URL,model=NAME,...`` spec both parse. It imports nothing else of ``gfsim.live``; httpx is
imported only when the first request is made.
"""

from __future__ import annotations

import os
import threading
import time

from gfsim.core.errors import GfsimError, SpecError
from gfsim.core.specs import parse_kv

__all__ = ["HttpTransport", "NoAnswer", "Rejected", "new_tally", "server_spec", "token_count"]


def new_tally() -> dict:
    """What one answer cost, summed over its attempts (``HttpTransport._post`` adds to it)."""
    return {"attempts": 0, "latency_s": 0.0, "input_tokens": 0, "output_tokens": 0}


class NoAnswer(Exception):
    """A request that got no usable HTTP answer (retryable)."""


class Rejected(Exception):
    """An HTTP 4xx answer other than 429: the server refused this request (not retried). A
    client decides whether that ends one answer or the run (``HttpTransport._rejected``)."""


def token_count(value) -> int:
    """A usage figure from an answer as a count of tokens: an integer (or a whole float) from
    0 to 2^53, anything else (a string, NaN, a huge or negative number) 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not (value == value and value.is_integer()):
        return 0
    return int(value) if 0 <= value <= 2**53 else 0


# The overall deadline of the request this thread is making (time.monotonic()), which every
# socket operation of the connection pool is capped by (``_deadline_backend``): httpx's own
# timeouts bound each read, so a server trickling a byte at a time would never time out.
_DEADLINE = threading.local()


def _capped(timeout):
    at = getattr(_DEADLINE, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        import httpcore

        raise httpcore.ReadTimeout("no complete answer within the request's deadline")
    return left if timeout is None else min(timeout, left)


def _deadline_backend(inner):
    """httpcore's network backend ``inner`` with every connect, read and write capped by the
    calling thread's deadline (``_DEADLINE``)."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, stream):
            self._s = stream

        def read(self, max_bytes, timeout=None):
            return self._s.read(max_bytes, _capped(timeout))

        def write(self, buffer, timeout=None):
            self._s.write(buffer, _capped(timeout))

        def close(self):
            self._s.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._s.start_tls(ssl_context, server_hostname, _capped(timeout)))

        def get_extra_info(self, info):
            return self._s.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def connect_tcp(self, host, port, timeout=None, local_address=None,
                        socket_options=None):
            return Stream(inner.connect_tcp(host, port, _capped(timeout), local_address,
                                            socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(inner.connect_unix_socket(path, _capped(timeout), socket_options))

        def sleep(self, seconds):
            inner.sleep(seconds)

    return Backend()


class HttpTransport:
    """The HTTP side of the live clients (``VllmForecaster``, ``gfsim.live.mutator.LlmMutator``):
    one thread-safe ``httpx.Client`` and POST with retries and exponential backoff. A subclass
    sets ``base_url``, ``api_key``, ``concurrency``, ``keepalive``, ``timeout_s``, ``retries`` and
    ``backoff_s``; ``_rejected`` makes the exception raised for an HTTP 4xx answer other than 429
    (a request the server refuses, not one it failed to answer). ``timeout_s`` bounds each
    attempt as a whole, from connecting to the answer's last byte."""

    _client = None
    _client_lock = threading.Lock()

    def _rejected(self, url: str, resp) -> Exception:
        return GfsimError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")

    @property
    def root_url(self) -> str:
        """The server root (``/tokenize`` lives there, not under ``/v1``)."""
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    def _http(self):
        if self._client is None:
            import httpx

            with self._client_lock:  # one client, however many threads ask first
                if self._client is None:
                    headers = ({"Authorization": f"Bearer {self.api_key}"} if self.api_key
                               else {})
                    limits = httpx.Limits(max_connections=self.concurrency,
                                          max_keepalive_connections=None if self.keepalive
                                          else 0)
                    transport = httpx.HTTPTransport(limits=limits)
                    pool = getattr(transport, "_pool", None)  # httpcore.ConnectionPool
                    if pool is None or not hasattr(pool, "_network_backend"):
                        raise GfsimError(f"httpx {httpx.__version__}: its connection pool is "
                                         "not the one gfsim caps by a deadline (httpx 0.27 "
                                         "and 0.28 are)")
                    pool._network_backend = _deadline_backend(pool._network_backend)
                    self._client = httpx.Client(timeout=self.timeout_s, headers=headers,
                                                transport=transport)
        return self._client

    def _post_once(self, url: str, payload: dict) -> tuple[dict, float]:
        import httpx

        started = time.perf_counter()
        client = self._http()
        _DEADLINE.at = time.monotonic() + self.timeout_s
        try:
            resp = client.post(url, json=payload)
        except httpx.HTTPError as exc:  # connect, read timeout, broken or garbage HTTP
            raise NoAnswer(f"{type(exc).__name__}: {exc}".strip()) from None
        finally:
            _DEADLINE.at = None
        took = time.perf_counter() - started
        if resp.status_code == 429 or resp.status_code >= 500:
            raise NoAnswer(f"HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise self._rejected(url, resp)
        try:
            body = resp.json()
        except (ValueError, RecursionError):
            raise NoAnswer(f"HTTP {resp.status_code} with a body that is not JSON: "
                            f"{resp.text[:80]!r}") from None
        if not isinstance(body, dict):
            raise NoAnswer("a JSON answer that is not an object")
        return body, took

    def _post(self, url: str, payload: dict, tally: dict) -> dict:
        """POST with retries and exponential backoff; raises NoAnswer when they run out."""
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            tally["attempts"] += 1
            try:
                body, took = self._post_once(url, payload)
            except NoAnswer as exc:
                last = exc
                continue
            tally["latency_s"] += took
            usage = body.get("usage")
            if isinstance(usage, dict):  # (a server may send anything here)
                tally["input_tokens"] += token_count(usage.get("prompt_tokens"))
                tally["output_tokens"] += token_count(usage.get("completion_tokens"))
            return body
        raise NoAnswer(f"no answer after {self.retries + 1} attempts: {last}")


def server_spec(rest: str, what: str, kind: str, keys: dict) -> tuple[str, dict]:
    """``URL,model=NAME,key=value,...`` (the part after ``kind:``) -> (URL, keyword arguments):
    values converted by ``keys`` (key -> type), ``timeout``/``backoff`` renamed ``timeout_s``/
    ``backoff_s``, ``api_key_env`` replaced by ``api_key`` read from that environment variable."""
    items = parse_kv(rest, what)
    if not items or items[0][0] is not None:
        raise SpecError(f"{what}: the first item after {kind}: is the server URL, e.g. "
                        f"{kind}:http://127.0.0.1:8000/v1,model=NAME")
    url = items[0][1]
    if not url.startswith(("http://", "https://")):
        raise SpecError(f"{what}: {url!r} is not an http(s) URL")
    kw: dict = {}
    for key, raw in items[1:]:
        if key not in keys:
            raise SpecError(f"{what}: unknown key {key!r}; valid: {', '.join(keys)}")
        try:
            kw[key] = keys[key](raw)
        except ValueError:
            raise SpecError(f"{what}: {key}={raw!r} is not a {keys[key].__name__}") from None
    if "model" not in kw:
        raise SpecError(f"{what}: model=NAME is required")
    if "api_key_env" in kw:
        var = kw.pop("api_key_env")
        kw["api_key"] = os.environ.get(var)
        if not kw["api_key"]:
            raise SpecError(f"{what}: environment variable {var} is not set")
    renames = {"timeout": "timeout_s", "backoff": "backoff_s"}
    return url, {renames.get(k, k): v for k, v in kw.items()}
