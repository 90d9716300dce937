"""The client side of an OpenAI-compatible server, shared by the live LLM clients (the forecaster
in ``gfsim.live.llm.forecaster``, the mutator in ``gfsim.live.llm.mutator``): one thread-safe
``httpx.Client`` with retries and exponential backoff, the tally of what the answers cost, and the
``URL,model=NAME,...`` spec both parse. It imports nothing else of ``gfsim.live``; httpx is
imported only when the first request is made.

An answer is read a chunk at a time and never past ``MAX_ANSWER_BYTES``, on the wire or after
inflating, within the request's ``timeout_s``: the requests ask for no compression, a gzip or
deflate answer sent anyway is inflated with that cap, and an answer that is larger, in another
encoding, or slower is no answer (a compression bomb or an endless body costs a client a few
MB, never its memory).
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass

from gfsim.core.errors import GfsimError, SpecError
from gfsim.core.specs import parse_kv

__all__ = ["HttpTransport", "NoAnswer", "Rejected", "new_tally", "server_spec", "token_count",
           "MAX_ANSWER_BYTES"]


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


# The most an answer may hold, on the wire and again after inflating. The largest honest answer
# is /tokenize's for the longest prompt, its token ids at about 7 bytes each: under 1 MB for a
# 128k-token context, 7 MB only for a million tokens; a chat answer is at most max_tokens tokens
# (2048 by default: tens of KB; a few hundred KB for a reasoning model given 32k). 8 MiB is well
# above both, and bounds what a hostile server costs (a gzip bomb, a 1.5 GB body) to a few times
# that, where reading without a cap passed 6 GB.
MAX_ANSWER_BYTES = 8 * 2**20
# Content-Encodings inflated (with the cap); any other is no answer (the requests ask for none).
_INFLATED = {"gzip", "x-gzip", "deflate"}
@dataclass(frozen=True)
class _Refusal:
    """What ``_rejected`` reads of an HTTP 4xx answer: its status and (capped) text."""

    status_code: int
    text: str


def _too_large(what: str, size: int | None = None) -> NoAnswer:
    said = f" ({size} bytes)" if size is not None else ""
    return NoAnswer(f"an answer {what} larger than the {MAX_ANSWER_BYTES}-byte cap{said}")


def _inflater(encoding: str):
    """A ``zlib`` decompressor for an answer's ``Content-Encoding`` header, None for an answer
    that is not encoded; an encoding not in ``_INFLATED`` (brotli, zstd, one stacked on
    another) is no answer."""
    codings = [c.strip().lower() for c in encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _INFLATED:
        raise NoAnswer(f"an answer encoded as {encoding!r}, which the forecaster does not read")
    return zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or zlib header, whichever it has


def _inflate(inflater, data: bytes, out: bytearray) -> None:
    """Adds ``data`` inflated to ``out``, never growing it more than a byte past
    ``MAX_ANSWER_BYTES``: ``max_length`` stops each step there, the rest left unconsumed."""
    try:
        while data:
            out += inflater.decompress(data, MAX_ANSWER_BYTES + 1 - len(out))
            if len(out) > MAX_ANSWER_BYTES:
                raise _too_large("inflated")
            data = inflater.unconsumed_tail
    except zlib.error as exc:
        raise NoAnswer(f"an encoded answer that does not inflate: {exc}") from None


def _read_capped(resp) -> bytes:
    """The body of the streamed answer ``resp``, read a chunk at a time (inflated when it is
    gzip or deflate) and given up as soon as it is seen to pass ``MAX_ANSWER_BYTES`` on the
    wire or inflated; a Content-Length above the cap is refused before any of the body is
    read. Reading is the request's: its deadline bounds it (``_post_once``)."""
    announced = resp.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > MAX_ANSWER_BYTES:
        raise _too_large("announced", int(announced))
    inflater = _inflater(resp.headers.get("content-encoding", ""))
    out, wire = bytearray(), 0
    for chunk in resp.iter_raw():
        wire += len(chunk)
        if wire > MAX_ANSWER_BYTES:
            raise _too_large("sent")
        if inflater is None:
            out += chunk
        else:
            _inflate(inflater, chunk, out)
    return bytes(out)



class HttpTransport:
    """The HTTP side of the live clients (``VllmForecaster``,
    ``gfsim.live.llm.mutator.LlmMutator``): one thread-safe ``httpx.Client`` and POST with retries
    and exponential backoff. A subclass sets ``base_url``, ``api_key``, ``concurrency``,
    ``keepalive``, ``timeout_s``, ``retries`` and ``backoff_s``; ``_rejected`` makes the exception
    raised for an HTTP 4xx answer other than 429 (a request the server refuses, not one it failed to
    answer). ``timeout_s`` bounds each attempt as a whole, from connecting to the answer's last
    byte."""

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
        """One POST, its answer streamed and read by ``_read_capped`` (at most
        ``MAX_ANSWER_BYTES``, never compressed unless the server ignores that it was asked
        not to), connecting, sending and reading all within ``timeout_s``: the deadline caps
        every socket operation, so a server dripping a byte a second ends there too. An answer
        too large, in an unread encoding, or late is ``NoAnswer``."""
        import httpx

        started = time.perf_counter()
        client = self._http()
        _DEADLINE.at = time.monotonic() + self.timeout_s
        try:
            with client.stream("POST", url, json=payload,
                               headers={"Accept-Encoding": "identity"}) as resp:
                status, data = resp.status_code, _read_capped(resp)
        except httpx.HTTPError as exc:  # connect, read timeout, broken or garbage HTTP
            raise NoAnswer(f"{type(exc).__name__}: {exc}".strip()) from None
        finally:
            _DEADLINE.at = None
        took = time.perf_counter() - started
        if status == 429 or status >= 500:
            raise NoAnswer(f"HTTP {status}")
        if status >= 400:
            raise self._rejected(url, _Refusal(status, data.decode("utf-8", "replace")))
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            raise NoAnswer(f"HTTP {status} with a body that is not JSON: "
                           f"{data[:80].decode('utf-8', 'replace')!r}") from None
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
