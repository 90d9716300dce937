"""The live forecaster against misbehaving OpenAI-compatible servers: a real HTTP server on
loopback that answers with whatever a test scripts (odd shapes, refusals, a trickle), so that
every answer is either read or recorded as a failed forecast, and only a misconfigured server
stops a run. (The well-behaved server is the real vLLM one, in test_forecaster.py.)"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gfsim.live.llm.forecaster import (
    REFUSALS_TO_STOP,
    ForecasterError,
    ForecastRequest,
    VllmForecaster,
)
from gfsim.live.llm.prompt import PROB_FIELDS, TOOL_NAME

LABEL_ID = {str(b): 100 + b for b in range(1, 9)}  # the "digits" labels' token ids here


class Scripted:
    """A loopback server: /tokenize answers the label ids; each chat completion is answered by
    ``script(n)`` (n counts from 0) -> (status, body bytes, seconds between body bytes)."""

    def __init__(self, script):
        self.script, self.n = script, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):
                    status, body, gap = 200, json.dumps(
                        {"tokens": [LABEL_ID.get(req.get("prompt"), 7)], "count": 50}
                    ).encode(), 0.0
                else:
                    status, body, gap = outer.script(outer.n)
                    outer.n += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if gap:
                        for i in range(len(body)):
                            self.wfile.write(body[i:i + 1])
                            self.wfile.flush()
                            time.sleep(gap)
                    else:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    made = []

    def start(script):
        s = Scripted(script)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def forecaster(server, mode="logprobs", **kw) -> VllmForecaster:
    kw = {"retries": 0, "backoff_s": 0.0, "timeout_s": 5.0, **kw}
    return VllmForecaster(server.url, "scripted", mode=mode, **kw)


def request(i=0) -> ForecastRequest:
    return ForecastRequest(f"c{i}", "def run(x):\n    return x * 2\n",
                           "def run(x):\n    return x + x\n", "toy", {})


def logprobs_body(entries, usage=None) -> dict:
    return {"choices": [{"logprobs": {"content": [{"top_logprobs": entries}]}}],
            "usage": usage if usage is not None else {"prompt_tokens": 30,
                                                      "completion_tokens": 1}}


def good_entries():
    return [{"token": f"token_id:{LABEL_ID[str(b)]}", "logprob": -float(b)} for b in range(1, 9)]


def tool_body(calls) -> dict:
    return {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": calls}}]}


ARGS = json.dumps({"predicted_bin": 5, **dict(zip(PROB_FIELDS, [0.125] * 8)),
                   "reasoning": "r"})

# answers whose shape is wrong: each must be a parse failure of that forecast, nothing more
BAD = {
    ("logprobs", "top_logprobs is a string"): logprobs_body("1 2 3"),
    ("logprobs", "entries are numbers"): logprobs_body([1, 2, 3]),
    ("logprobs", "a huge logprob"): logprobs_body([{"token": "token_id:101",
                                                     "logprob": 1e308}]),
    ("logprobs", "a logprob that is a string"): logprobs_body([{"token": "token_id:101",
                                                                 "logprob": "-0.1"}]),
    ("logprobs", "choices is a string"): {"choices": "none"},
    ("logprobs", "content is a dict"): {"choices": [{"logprobs": {"content": {"a": 1}}}]},
    ("tool", "tool_calls is a string"): tool_body("call it"),
    ("tool", "a tool call is a list"): tool_body([["function", TOOL_NAME]]),
    ("tool", "function is a string"): tool_body([{"function": TOOL_NAME}]),
    ("tool", "arguments is an object"): tool_body([{"function": {
        "name": TOOL_NAME, "arguments": {"predicted_bin": 5}}}]),
    ("tool", "message is a string"): {"choices": [{"message": "hello"}]},
    ("tool", "arguments hold NaN"): tool_body([{"function": {
        "name": TOOL_NAME, "arguments": ARGS.replace("0.125", "NaN", 1)}}]),
    ("tool", "arguments hold a 5000-digit integer"): tool_body([{"function": {
        "name": TOOL_NAME, "arguments": ARGS.replace('"predicted_bin": 5',
                                                     '"predicted_bin": ' + "9" * 5000)}}]),
}


@pytest.mark.parametrize("mode, what", sorted(BAD), ids=[w for _, w in sorted(BAD)])
def test_an_answer_of_any_shape_is_a_parse_failure_not_a_crash(scripted, mode, what):
    body = json.dumps(BAD[mode, what]).encode()
    s = scripted(lambda n: (200, body, 0.0))
    a = forecaster(s, mode, tool_transport="tools").forecast(request())
    assert a.parse_failed and a.error is None, (what, a)
    assert a.probs == [0.0] * 8 and a.parse_error
    rec = a.record()
    assert rec["parse_failed"] is True and "predicted_bin" not in rec


@pytest.mark.parametrize("usage", ["lots", {"prompt_tokens": "30"}, {"prompt_tokens": 1e300},
                                   {"prompt_tokens": -5, "completion_tokens": [1]}, 7])
def test_a_usage_of_any_shape_counts_no_tokens_and_the_answer_is_read(scripted, usage):
    body = json.dumps(logprobs_body(good_entries(), usage)).encode()
    s = scripted(lambda n: (200, body, 0.0))
    a = forecaster(s).forecast(request())
    assert not a.parse_failed and a.error is None and a.predicted_bin == 1
    assert (a.input_tokens, a.output_tokens) == (0, 0)


def test_a_refusal_fails_that_forecast_and_the_next_is_answered(scripted):
    good = json.dumps(logprobs_body(good_entries())).encode()
    too_long = json.dumps({"error": {"message": "This model's maximum context length is "
                                                "512 tokens"}}).encode()
    s = scripted(lambda n: (400, too_long, 0.0) if n == 1 else (200, good, 0.0))
    f = forecaster(s)
    got = [f.forecast(request(i)) for i in range(3)]
    assert [g.error is None for g in got] == [True, False, True]
    assert "HTTP 400" in got[1].error and "maximum context length" in got[1].error
    assert got[1].attempts == 1  # a refusal is not retried


def test_a_server_that_refuses_everything_from_the_start_stops_the_run(scripted):
    s = scripted(lambda n: (400, b'{"error": "bad request"}', 0.0))
    f = forecaster(s)
    for i in range(REFUSALS_TO_STOP - 1):
        assert "HTTP 400" in f.forecast(request(i)).error
    with pytest.raises(ForecasterError, match="all refused"):
        f.forecast(request(99))


def test_an_unknown_model_stops_the_run_at_once(scripted):
    s = scripted(lambda n: (404, b'{"error": "The model scripted does not exist."}', 0.0))
    with pytest.raises(ForecasterError, match="HTTP 404"):
        forecaster(s).forecast(request())


def test_a_server_that_trickles_its_answer_meets_the_whole_request_deadline(scripted):
    body = json.dumps(logprobs_body(good_entries())).encode()
    s = scripted(lambda n: (200, body, 0.05))  # ~1,000 bytes: about 50 s at this pace
    f = forecaster(s, timeout_s=1.0)
    started = time.monotonic()
    a = f.forecast(request())
    took = time.monotonic() - started
    assert a.error is not None and "Timeout" in a.error, a
    # one attempt, bounded by timeout_s (1 s) as a whole: a hang guard ten times that and more,
    # and half the trickle's own 50 s
    assert took < 25.0, took
