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

__all__ = ["HttpTransport", "NoAnswer", "new_tally", "server_spec"]


def new_tally() -> dict:
    """What one answer cost, summed over its attempts (``HttpTransport._post`` adds to it)."""
    return {"attempts": 0, "latency_s": 0.0, "input_tokens": 0, "output_tokens": 0}


class NoAnswer(Exception):
    """A request that got no usable HTTP answer (retryable)."""


class HttpTransport:
    """The HTTP side of the live clients (``VllmForecaster``, ``gfsim.live.mutator.LlmMutator``):
    one thread-safe ``httpx.Client`` and POST with retries and exponential backoff. A subclass
    sets ``base_url``, ``api_key``, ``concurrency``, ``keepalive``, ``timeout_s``, ``retries`` and
    ``backoff_s``; ``_rejected`` makes the exception raised for an HTTP 4xx answer other than 429
    (a request the server refuses, not one it failed to answer)."""

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
                    self._client = httpx.Client(timeout=self.timeout_s, headers=headers,
                                                limits=limits)
        return self._client

    def _post_once(self, url: str, payload: dict) -> tuple[dict, float]:
        import httpx

        started = time.perf_counter()
        try:
            resp = self._http().post(url, json=payload)
        except httpx.HTTPError as exc:  # connect, read timeout, broken or garbage HTTP
            raise NoAnswer(f"{type(exc).__name__}: {exc}".strip()) from None
        took = time.perf_counter() - started
        if resp.status_code == 429 or resp.status_code >= 500:
            raise NoAnswer(f"HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise self._rejected(url, resp)
        try:
            body = resp.json()
        except ValueError:
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
            usage = body.get("usage") or {}
            tally["input_tokens"] += int(usage.get("prompt_tokens") or 0)
            tally["output_tokens"] += int(usage.get("completion_tokens") or 0)
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
