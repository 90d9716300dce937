"""The live forecaster against servers whose answers would exhaust its memory or its time: a
gzip or deflate bomb, a body larger than any honest answer (streamed, or announced by its
Content-Length), an encoding the forecaster does not read, and a server dripping its answer a
byte a second. Each is recorded as a failed forecast (``error``), read no further than
``MAX_ANSWER_BYTES`` on the wire and after inflating, within the request's deadline. The server
is a real HTTP server on loopback, in a thread; the bombs are made a chunk at a time, so that
neither side holds more than a few MB of them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gfsim.live.llm.forecaster import MAX_ANSWER_BYTES, ForecastRequest, VllmForecaster

LABEL_ID = {str(b): 100 + b for b in range(1, 9)}  # the "digits" labels' token ids here
MiB = 2**20
PAD = b" " * MiB  # whitespace after a JSON answer: still JSON, so only a cap refuses it


def good_answer() -> bytes:
    entries = [{"token": f"token_id:{LABEL_ID[str(b)]}", "logprob": -float(b)}
               for b in range(1, 9)]
    return json.dumps({"choices": [{"logprobs": {"content": [{"top_logprobs": entries}]}}],
                       "usage": {"prompt_tokens": 30, "completion_tokens": 1}}).encode()


def padded(mib: int):
    """A good answer followed by ``mib`` MiB of spaces, a MiB at a time."""
    yield good_answer()
    for _ in range(mib):
        yield PAD


@lru_cache(maxsize=None)
def compressed(encoding: str, mib: int) -> tuple[bytes, ...]:
    """``padded(mib)`` compressed as ``encoding`` (gzip or deflate): about a KB per MiB."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip"
                         else zlib.MAX_WBITS)
    chunks = [z.compress(part) for part in padded(mib)]
    return tuple(c for c in [*chunks, z.flush()] if c)


class Server:
    """A loopback server: /tokenize answers the label ids; each chat completion is answered by
    ``script(n)`` (n counts from 0) -> (headers, chunks of the body, seconds between chunks).
    The response is HTTP/1.0: without a Content-Length, the body ends when the server closes."""

    def __init__(self, script):
        self.script, self.n, self.sent = script, 0, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):
                    body = json.dumps({"tokens": [LABEL_ID.get(req.get("prompt"), 7)],
                                       "count": 50}).encode()
                    headers, chunks, gap = {"Content-Length": str(len(body))}, [body], 0.0
                else:
                    headers, chunks, gap = outer.script(outer.n)
                    outer.n += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        outer.sent += len(chunk)
                        if gap:
                            time.sleep(gap)
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
def serve():
    made = []

    def start(script):
        s = Server(script)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def forecaster(server, **kw) -> VllmForecaster:
    kw = {"retries": 0, "backoff_s": 0.0, "timeout_s": 30.0, **kw}
    return VllmForecaster(server.url, "scripted", mode="logprobs", **kw)


def request(i=0) -> ForecastRequest:
    return ForecastRequest(f"c{i}", "def run(x):\n    return x * 2\n",
                           "def run(x):\n    return x + x\n", "toy", {})


def assert_failed(a, *words):
    """``a`` is recorded as a forecast with no answer, its error saying ``words``."""
    assert a.error is not None and not a.parse_failed, a
    assert a.probs == [0.0] * 8 and a.predicted_bin is None
    assert all(w in a.error for w in words), a.error
    rec = a.record()
    assert rec["error"] == a.error and "predicted_bin" not in rec


# the cap is a few MiB: far above an honest answer, far below what exhausts memory
def test_the_cap_is_a_few_mib():
    assert 1 * MiB <= MAX_ANSWER_BYTES <= 64 * MiB


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compression_bomb_is_no_answer_and_is_not_inflated_past_the_cap(serve, encoding):
    mib = 32 * MAX_ANSWER_BYTES // MiB  # inflates to 32 times the cap
    chunks = compressed(encoding, mib)
    assert sum(map(len, chunks)) < MAX_ANSWER_BYTES  # small on the wire
    s = serve(lambda n: ({"Content-Encoding": encoding}, chunks, 0.0))
    a = forecaster(s).forecast(request())
    assert_failed(a, "larger than", "inflated")
    assert a.attempts == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity"])
def test_an_honest_compressed_answer_is_read(serve, encoding):
    chunks = compressed(encoding, 0) if encoding != "identity" else (good_answer(),)
    s = serve(lambda n: ({"Content-Encoding": encoding}, chunks, 0.0))
    a = forecaster(s).forecast(request())
    assert a.error is None and not a.parse_failed and a.predicted_bin == 1, a


def test_an_encoding_the_forecaster_does_not_read_is_no_answer(serve):
    s = serve(lambda n: ({"Content-Encoding": "br"}, (b"\x8b\x02\x80{}\x03",), 0.0))
    assert_failed(forecaster(s).forecast(request()), "encoded", "br")


def test_a_body_larger_than_the_cap_is_no_answer_read_no_further(serve):
    mib = MAX_ANSWER_BYTES // MiB + 4  # streamed with no Content-Length, until the server closes
    s = serve(lambda n: ({}, padded(mib), 0.0))
    a = forecaster(s).forecast(request())
    assert_failed(a, "larger than")
    assert a.attempts == 1


def test_a_body_announced_larger_than_the_cap_is_not_read(serve):
    huge = 1536 * MiB  # the 1.5 GB answer: refused from its Content-Length, before any byte
    s = serve(lambda n: ({"Content-Length": str(huge)}, padded(2), 0.0))
    a = forecaster(s).forecast(request())
    assert_failed(a, "larger than", str(huge))
    assert s.sent < huge


def test_a_slow_drip_ends_at_the_request_deadline(serve):
    # a byte a second (a gzip stream, so the inflating read is the one that waits): each read
    # is answered well within a per-read timeout, so only the whole request's deadline ends it
    drip = b"".join(compressed("gzip", 0))
    s = serve(lambda n: ({"Content-Encoding": "gzip"},
                         (drip[i:i + 1] for i in range(len(drip))), 1.0))
    started = time.monotonic()
    a = forecaster(s, timeout_s=1.5).forecast(request())
    took = time.monotonic() - started
    assert_failed(a, "Timeout")
    assert len(drip) > 60 and took < 30, took  # the drip itself would take over a minute


CHILD = textwrap.dedent("""
    import resource, sys
    from gfsim.live.llm.forecaster import ForecastRequest, VllmForecaster
    f = VllmForecaster(sys.argv[1], "scripted", retries=0, backoff_s=0.0, timeout_s=60.0)
    f.prepare()  # httpx imported and a connection made before the first measurement
    req = ForecastRequest("c", "def run(x):\\n    return x\\n", "def run(x):\\n    return x\\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    errors = [f.forecast(req).error for _ in range(int(sys.argv[2]))]
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(grew // 1024, *errors, sep="\\n")  # MiB (ru_maxrss is in KiB on Linux)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB: Linux")
def test_the_forecasting_process_stays_small_however_big_the_answers(serve):
    # in a process of its own, so that its peak resident memory is the forecasts' alone: a
    # bomb inflating to 256 MiB and a 1.5x-cap body, each read the old way, would pass 256 MiB
    bomb = compressed("gzip", 256)
    big = MAX_ANSWER_BYTES // MiB * 3 // 2
    s = serve(lambda n: ({"Content-Encoding": "gzip"}, bomb, 0.0) if n == 0
              else ({}, padded(big), 0.0))
    out = subprocess.run([sys.executable, "-c", CHILD, s.url, "2"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grew, *errors = out.stdout.split("\n")[:3]
    assert int(grew) < 3 * MAX_ANSWER_BYTES // MiB + 32, f"grew by {grew} MiB"
    assert all(e != "None" and "larger than" in e for e in errors), errors
