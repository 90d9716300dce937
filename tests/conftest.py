"""Shared fixtures. ``proxy``: a ``FaultProxy`` (below) in front of the vLLM server.
``vllm_server``: the real vLLM OpenAI-compatible server the live forecaster tests talk to
(``scripts/test-all`` and ``.ci/run`` start it with ``scripts/start_vllm_cpu.sh``). Where it is
not running the tests skip, unless ``GFSIM_REQUIRE_VLLM=1``, under which they fail. The real
Kernel Tuner caches the tests use ship as package data (``gfsim/worlds/data/kernel_tuner``), found
through the installed package as any user's install finds them."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import pytest

try:  # Hypothesis's default deadline (200 ms an example) is a timing, not a hang guard: a busy
    # machine fails it. Off for every test; a test's own @settings keeps what it sets.
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("gfsim", deadline=None)
    _hypothesis_settings.load_profile("gfsim")
except ImportError:  # hypothesis is in the test extra; a test that needs it imports it
    pass


@pytest.fixture(autouse=True, scope="session")
def _log_cache_in_a_temporary_folder(tmp_path_factory):
    """Logs opened by name (shipped ones) cache their tables in the user cache folder: for
    the tests, a temporary one, so that no run leaves or reuses a cache of another."""
    old = os.environ.get("GFSIM_CACHE_DIR")
    os.environ["GFSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("gfsim-cache"))
    yield
    if old is None:
        os.environ.pop("GFSIM_CACHE_DIR", None)
    else:
        os.environ["GFSIM_CACHE_DIR"] = old


@dataclass(frozen=True)
class VllmServer:
    url: str  # .../v1
    model: str
    host: str
    port: int


@pytest.fixture(scope="session")
def vllm_server() -> VllmServer:
    from urllib.parse import urlparse

    url = os.environ.get("GFSIM_VLLM_URL", "http://127.0.0.1:8011/v1").rstrip("/")
    model = os.environ.get("GFSIM_VLLM_MODEL", "tiny")
    root = url[:-3] if url.endswith("/v1") else url
    try:
        import httpx

        ok = httpx.get(f"{root}/health", timeout=5).status_code == 200
        why = "" if ok else "health check failed"
    except Exception as exc:  # noqa: BLE001 - any failure means: no server here
        ok, why = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        msg = f"no vLLM server at {url} ({why}); start one with scripts/start_vllm_cpu.sh DIR PORT"
        if os.environ.get("GFSIM_REQUIRE_VLLM") == "1":
            pytest.fail(msg + " (GFSIM_REQUIRE_VLLM=1)")
        pytest.skip(msg)
    parsed = urlparse(url)
    return VllmServer(url, model, parsed.hostname, parsed.port)


@pytest.fixture(scope="session")
def vllm_long_server(tmp_path_factory) -> VllmServer:
    """A vLLM CPU server with an 8,192-token context, for a real OpenEvolve run's prompts (the
    session's ``vllm_server`` serves the tiny model at 512, which its forecaster tests read):
    ``GFSIM_VLLM_LONG_URL`` where one runs, else started here from ``GFSIM_VLLM_PYTHON`` and
    ``GFSIM_VLLM_MODEL_DIR`` (scripts/test-all sets both), stopped at the session's end."""
    import signal
    import subprocess
    from urllib.parse import urlparse

    import httpx

    def up(url: str) -> bool:
        try:
            return httpx.get(url[:-3] + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    given = os.environ.get("GFSIM_VLLM_LONG_URL", "").rstrip("/")
    if given and up(given):
        parsed = urlparse(given)
        yield VllmServer(given, "tiny", parsed.hostname, parsed.port)
        return
    python, model_dir = os.environ.get("GFSIM_VLLM_PYTHON"), os.environ.get(
        "GFSIM_VLLM_MODEL_DIR")
    if not (python and model_dir):
        msg = ("no long-context vLLM server: set GFSIM_VLLM_LONG_URL, or GFSIM_VLLM_PYTHON and "
               "GFSIM_VLLM_MODEL_DIR (vLLM's python, the tiny model) to start one")
        if os.environ.get("GFSIM_REQUIRE_VLLM") == "1":
            pytest.fail(msg + " (GFSIM_REQUIRE_VLLM=1)")
        pytest.skip(msg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm-long") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
             "--dtype", "float32", "--enforce-eager", "--max-model-len", "8192",
             "--max-num-seqs", "4"], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600  # a hang guard: it starts in about a minute
        while not up(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the long-context vLLM server did not start:\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(1)
        yield VllmServer(url, "tiny", "127.0.0.1", port)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


class FaultProxy:
    """A loopback TCP proxy that injects faults between an HTTP client and a real server.

    Each accepted connection whose first request's path contains ``only`` (default: chat
    completions; other requests pass untouched) takes the next fault from ``schedule`` (then
    ``default``):
    ``pass`` forwards both ways; ``drop`` closes the connection at once; ``delay:S`` waits S seconds
    before forwarding; ``garbage`` reads the request and answers bytes that are not HTTP;
    ``http500`` answers an HTTP 500; ``notjson`` answers HTTP 200 with a body that is not JSON.
    The faults hit the connection, never the shared server behind it.
    """

    def __init__(self, target_host: str, target_port: int, schedule=(), default: str = "pass",
                 only: str = "/chat/completions"):
        self.target = (target_host, target_port)
        self.only = only
        self.schedule = list(schedule)
        self.default = default
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _next(self) -> str:
        with self._lock:
            fault = self.schedule.pop(0) if self.schedule else self.default
            self.seen.append(fault)
            return fault

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_head(conn) -> bytes:
        conn.settimeout(5)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        conn.settimeout(None)
        return data

    def _handle(self, conn) -> None:
        head = self._read_head(conn)
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        fault = self._next() if self.only in line else "pass"
        try:
            if fault == "drop":
                conn.close()
                return
            if fault in ("garbage", "http500", "notjson"):
                reply = {
                    "garbage": b"\x00\xffthis is not HTTP at all\r\n\r\n\x13\x37",
                    "http500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n"
                               b"Connection: close\r\n\r\noops",
                    "notjson": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 9\r\nConnection: close\r\n\r\n<html>oh!",
                }[fault]
                conn.sendall(reply)
                conn.close()
                return
            if fault.startswith("delay:"):
                time.sleep(float(fault.split(":", 1)[1]))
            upstream = socket.create_connection(self.target)
            upstream.sendall(head)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
        except OSError:
            conn.close()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def proxy(vllm_server):
    """``proxy(schedule, default)`` -> a FaultProxy in front of the vLLM server."""
    made = []

    def start(schedule=(), default="pass"):
        p = FaultProxy(vllm_server.host, vllm_server.port, schedule, default)
        made.append(p)
        return p

    yield start
    for p in made:
        p.close()


# Strings that have broken readers and printers: rich markup, lone surrogates (which JSON
# escapes as \ud800 and UTF-8 cannot carry), a right-to-left override, NUL, a very long name.
HOSTILE_TEXT = ("[/b]", "[bold red]x[/]", "[link=file:///etc]y", "\ud800", "x\udfffy",
                "\u202e", "\x00", "n" * 100_000, "", " ")


@pytest.fixture(scope="session")
def json_values():
    """A hypothesis strategy for any JSON value, for tests that throw bad input at readers:
    draw from it with ``data.draw(json_values)``. Integers up to 10^400 (and the 64-bit
    edges), NaN and infinities (``json.dumps`` writes them as ``NaN``/``Infinity``, which a
    strict reader must refuse), markup, lone surrogates, very long strings, nesting."""
    from hypothesis import strategies as st

    leaves = (st.none() | st.booleans()
              | st.integers(min_value=-10**400, max_value=10**400)
              | st.sampled_from([2**63, -2**63 - 1, 2**64, 2**53 + 1])
              | st.floats() | st.sampled_from([1e308, -1e308, 5e-324, -0.0])
              | st.text(max_size=12) | st.sampled_from(HOSTILE_TEXT))
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
            st.text(max_size=6) | st.sampled_from(HOSTILE_TEXT[:6]), inner, max_size=3),
        max_leaves=8)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL database for distributed-tuning tests (``.ci/run`` starts a server on
    loopback and sets ``GFSIM_POSTGRES_URL``); skipped where there is none, unless
    ``GFSIM_REQUIRE_POSTGRES=1``."""
    url = os.environ.get("GFSIM_POSTGRES_URL")
    why = "GFSIM_POSTGRES_URL is not set"
    if url:
        try:
            import sqlalchemy

            with sqlalchemy.create_engine(url).connect():
                return url
        except Exception as exc:  # noqa: BLE001 - any failure means: no database here
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
    if os.environ.get("GFSIM_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"no PostgreSQL for the tuning tests ({why})")
    pytest.skip(f"no PostgreSQL ({why})")
