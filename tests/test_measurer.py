"""TritonMeasurer on CPU: the sandbox, limits and checks with candidates that misbehave (the
hostile-candidate suite is tests/test_hostile.py; the GPU stages run on the H200 in the
gpu-marked tests and experiments/hostile_suite.py)."""

import hashlib
import os
import socket
import threading
from dataclasses import dataclass, replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gfsim.live.measure.measurer import CORRECT_UNTIMED, MeasurerConfig, TritonMeasurer  # noqa: E402


@dataclass(frozen=True)
class Code:
    """A stand-in candidate: just code (the measurer needs .code and .candidate_id)."""

    code: str

    @property
    def candidate_id(self) -> str:
        return "test-" + hashlib.sha256(self.code.encode()).hexdigest()[:8]


CORRECT = """
import torch
def run(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)
"""


@pytest.fixture(scope="module")
def measurer(tmp_path_factory):
    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=8, memory_limit_mb=1500)
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("measure"))
    yield m
    m.close()


def test_a_correct_candidate_passes_the_checks(measurer):
    r = measurer.measure(Code(CORRECT))
    assert r["outcome"] == CORRECT_UNTIMED, r
    assert r["compile_s"] > 0 and r["check_s"] > 0 and r["wall_s"] >= r["check_s"]


def test_a_wrong_candidate_is_incorrect(measurer):
    r = measurer.measure(Code(CORRECT.replace("e / e.sum", "0.5 * e / e.sum")))
    assert r["outcome"] == "incorrect" and "differs from the reference" in r["reason"]


def test_a_syntax_error_is_a_compile_failure(measurer):
    r = measurer.measure(Code("def run(x) return x\n"))
    assert r["outcome"] == "compile_failed"


def test_calling_the_reference_is_refused(measurer):
    r = measurer.measure(Code("import torch\ndef run(x):\n    return torch.softmax(x, -1)\n"))
    assert r["outcome"] == "runtime_error" and "reference entry point" in r["reason"]
    r = measurer.measure(Code("def run(x):\n    return x.softmax(-1)\n"))
    assert r["outcome"] == "runtime_error" and "reference entry point" in r["reason"]
    # ...and the guard is lifted afterwards: the next candidate is unaffected.
    assert measurer.measure(Code(CORRECT))["outcome"] == CORRECT_UNTIMED


def test_every_candidate_gets_a_fresh_process(measurer):
    code = "import os\ndef run(x):\n    raise RuntimeError('pid %d' % os.getpid())\n"
    before = measurer.sandboxes
    first = measurer.measure(Code(code))
    second = measurer.measure(Code(code + "\n"))
    assert measurer.sandboxes == before + 2
    # PID 1 of a namespace of its own, each time (where the kernel allows namespaces).
    if measurer.facilities.pid_ns:
        assert "pid 1" in first["reason"] and "pid 1" in second["reason"]
    assert first["sandbox"] != "none"


@pytest.mark.slow
def test_a_hanging_candidate_times_out(measurer, tmp_path):
    # Its own measurer, with a compile limit of 10 s instead of the fixture's 60 (which waits
    # for slow Triton compiles): this candidate hangs in its first call; the honest one after it
    # compiles in about 0.1 s.
    m = TritonMeasurer("softmax", replace(measurer.config, compile_timeout_s=10),
                       workdir=tmp_path)
    try:
        r = m.measure(Code("def run(x):\n    while True:\n        pass\n"))
        assert r["outcome"] == "timeout" and "no answer within 10 s" in r["reason"]
        assert m.measure(Code(CORRECT))["outcome"] == CORRECT_UNTIMED
    finally:
        m.close()


def test_a_crashing_candidate_is_a_runtime_error(measurer):
    r = measurer.measure(Code("import os\ndef run(x):\n    os._exit(3)\n"))
    assert r["outcome"] == "runtime_error" and "exit 3" in r["reason"]
    assert measurer.measure(Code(CORRECT))["outcome"] == CORRECT_UNTIMED


def test_unbounded_allocation_is_killed_by_the_memory_watchdog(measurer):
    r = measurer.measure(Code(
        "def run(x):\n    hog = []\n    while True:\n        hog.append(bytearray(50_000_000))\n"))
    assert r["outcome"] == "runtime_error" and "memory limit" in r["reason"]
    assert measurer.measure(Code(CORRECT))["outcome"] == CORRECT_UNTIMED


def test_the_environment_is_allow_listed_and_the_directory_private(measurer, monkeypatch,
                                                                    tmp_path):
    monkeypatch.setenv("GFSIM_TEST_SECRET", "hunter2")
    monkeypatch.chdir(tmp_path)
    code = ("import os\n"
            "def run(x):\n"
            "    open('left-behind.txt', 'w').write('x')\n"
            "    raise RuntimeError('secret=%s home=%s cwd=%s' % (os.environ.get("
            "'GFSIM_TEST_SECRET'), os.environ.get('HOME'), os.getcwd()))\n")
    m = TritonMeasurer("softmax", measurer.config, workdir=tmp_path / "w")
    (tmp_path / "w").mkdir()
    try:
        r = m.measure(Code(code))
    finally:
        m.close()
    assert "secret=None" in r["reason"]
    assert "gfsim-worker-" in r["reason"]
    assert not (tmp_path / "left-behind.txt").exists()
    assert not list((tmp_path / "w").iterdir())  # the private directory is removed on close


def test_no_network_where_the_kernel_allows_a_namespace(measurer):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    port = server.getsockname()[1]
    seen = []

    def accept():
        try:
            conn, _ = server.accept()
            seen.append(True)
            conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    code = ("import socket\n"
            "def run(x):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    raise RuntimeError('connected')\n")
    r = measurer.measure(Code(code))
    t.join(timeout=8)
    server.close()
    assert not seen and r["outcome"] == "runtime_error" and "connected" not in r["reason"]


def test_a_machine_without_the_sandbox_refuses_untrusted_code(tmp_path):
    """Where the kernel lacks a facility, the measurer refuses to start, naming what is
    missing; --trust-candidates (trust_candidates) runs with what there is."""
    from gfsim.live.measure.measurer import UntrustedRefused
    from gfsim.live.measure.sandbox import Facilities

    class Limited(TritonMeasurer):
        def _start_zygote(self):
            zygote = super()._start_zygote() if self._zygote is not None else None
            if zygote is None:
                import gfsim.live.measure.measurer as mod

                real = mod.Zygote

                class NoNamespaces(real):
                    def __init__(self, *a, **k):
                        super().__init__(*a, **k)
                        self.facilities = Facilities(landlock_abi=self.facilities.landlock_abi,
                                                     seccomp=self.facilities.seccomp)

                mod.Zygote = NoNamespaces
                try:
                    zygote = super()._start_zygote()
                finally:
                    mod.Zygote = real
            return zygote

    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=20)
    with pytest.raises(UntrustedRefused, match="user namespace.*`trust_candidates`"):
        Limited("softmax", cfg, workdir=tmp_path).measure(Code(CORRECT))
    trusted = Limited("softmax", MeasurerConfig(compile_timeout_s=60, check_timeout_s=20,
                                                trust_candidates=True), workdir=tmp_path)
    try:
        r = trusted.measure(Code(CORRECT))
    finally:
        trusted.close()
    assert r["outcome"] == CORRECT_UNTIMED and r["network_isolated"] is False


def test_the_watchdog_counts_a_sandbox_tmpfs_only_once_it_is_mounted(tmp_path):
    """Until a starting sandbox has mounted its /dev/shm and folder tmpfs, the paths the
    watchdog reads them at are the host's (its /dev/shm, the disk under the folder): their used
    bytes are not the sandbox's memory. CI once killed two starting sandboxes "for memory" this
    way on a loaded machine (the disk's gigabytes counted); reproduced by delaying the mounts."""
    from gfsim.live.measure.confined import _own_tmpfs_kb

    assert _own_tmpfs_kb(tmp_path, tmp_path) == 0.0  # not mounted over: the host's disk
    assert _own_tmpfs_kb(tmp_path / "gone", tmp_path) == 0.0
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no /dev/shm of its own here")
    held = os.path.join(shm, f"gfsim-test-{os.getpid()}")
    with open(held, "wb") as f:
        f.write(b"\1" * (4 << 20))
    try:
        assert _own_tmpfs_kb(shm, tmp_path) >= 4 << 10  # a filesystem of its own: counted
    finally:
        os.unlink(held)
