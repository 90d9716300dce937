"""TritonMeasurer on CPU against a worker process that lies in what it answers and in the files
it leaves: every answer and file is the candidate's to forge (its code runs in the worker), so
each must end as a recorded failure of that candidate, promptly and in bounded memory, never
as an exception out of ``measure()`` or a blocked measurer. The candidates below forge them
from inside the real worker (patching its module, NumPy's ``save`` or its stderr)."""

import hashlib
import json
import os
import stat
import threading
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import gfsim.live.measure.confined as confined_module  # noqa: E402
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

# The worker's answer to ``compile`` (the first request after ``load``, which runs the
# candidate's module: ``serve`` had looked up ``json.dumps`` for the load's answer before)
# replaced by the text ANSWER evaluates to; later answers are the worker's own.
LYING_ANSWER = """
import json as _json
import gfsim.live.measure.worker as _w


class _Lying:
    loads = staticmethod(_json.loads)

    @staticmethod
    def dumps(obj, **kw):
        _w.json = _json
        return ANSWER


_w.json = _Lying
""" + CORRECT

# NumPy's save replaced in the worker (its output and rows files are written with it).
SAVE = """
import os
import numpy
import numpy.lib.format as _format

_real_save = numpy.save

def _save(path, arr, **kw):
    path = str(path)
BODY

numpy.save = _save
""" + CORRECT

MiB = 1 << 20


def lying(answer_expr: str) -> str:
    return LYING_ANSWER.replace("ANSWER", answer_expr)


def saving(body: str) -> str:
    return SAVE.replace("BODY", "\n".join("    " + line for line in body.strip().splitlines()))


@pytest.fixture(scope="module")
def measurer(tmp_path_factory):
    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=8, memory_limit_mb=1500)
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("limits"))
    yield m
    m.close()


def _unblock(m: TritonMeasurer) -> None:
    """Open every FIFO under the measurer's folder for writing and close it again: a reader
    blocked in opening one then sees its end (only on code that blocks)."""
    for p in Path(m._root).rglob("*"):
        try:
            if stat.S_ISFIFO(os.lstat(p).st_mode):
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def measure_within(m: TritonMeasurer, code: str, seconds: float = 90.0) -> dict:
    """``m.measure`` of ``code``, failing the test if it blocks for ``seconds`` or raises."""
    box: dict = {}

    def go():
        try:
            box["record"] = m.measure(Code(code))
        except BaseException as exc:  # noqa: BLE001 - reported below
            box["raised"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        _unblock(m)
        t.join(30)
        pytest.fail(f"measure() blocked for over {seconds:.0f} s")
    if "raised" in box:
        exc = box["raised"]
        pytest.fail(f"measure() raised {type(exc).__name__}: {str(exc)[:300]}")
    return box["record"]


def measure_peak(m: TritonMeasurer, code: str) -> tuple[dict, int]:
    """(record, peak bytes this process allocated while measuring)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        record = measure_within(m, code)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return record, peak


# -- 1. answers that are not the expected shape ---------------------------------------------
@pytest.mark.parametrize("answer", [
    "'{}'",
    "'{\"ok\": \"yes\", \"seconds\": 0.1}'",
    "'{\"ok\": 1, \"seconds\": 0.1}'",
    "'{\"ok\": true, \"seconds\": NaN}'",
    "'{\"ok\": true, \"seconds\": Infinity}'",
    "'{\"ok\": true, \"seconds\": 1e999}'",
    "'{\"ok\": true, \"seconds\": \"fast\"}'",
    "'{\"ok\": true}'",
    "'{\"ok\": false}'",
    "'{\"ok\": false, \"kind\": \"compile\", \"error\": [\"not\", \"text\"]}'",
    "'{\"ok\": false, \"kind\": {\"a\": 1}, \"error\": \"x\"}'",
], ids=["empty", "ok-text", "ok-int", "nan", "infinity", "overflow", "seconds-text",
        "no-seconds", "no-error", "error-list", "kind-object"])
def test_an_answer_of_the_wrong_shape_is_a_recorded_failure(measurer, answer):
    r = measure_within(measurer, lying(answer))
    assert r["outcome"] == "runtime_error", r
    assert r["failed_stage"] == "compile"
    assert r["reason"].startswith("the worker's answer to 'compile' "), r["reason"]
    if "seconds\": N" in answer or "seconds\": I" in answer or "1e999" in answer:
        assert "'seconds' null or a non-finite number" in r["reason"], r["reason"]


# -- 2. answers too deep or too large for the parser ------------------------------------------
def test_a_deeply_nested_answer_is_a_recorded_failure(measurer):
    r = measure_within(measurer, lying("'[' * 100_000"))
    assert r["outcome"] == "runtime_error", r
    assert "not JSON" in r["reason"], r["reason"]


def test_an_answer_over_the_size_limit_is_a_recorded_failure(measurer, monkeypatch):
    # (The real limit is above what a Unix socket's default buffer lets a worker send; a
    # lower one here shows the check with an answer that such a buffer carries.)
    monkeypatch.setattr(confined_module, "MAX_ANSWER_BYTES", 64 << 10)
    r = measure_within(measurer, lying("_json.dumps({'ok': True, 'seconds': 0.1, "
                                       "'pad': 'x' * 100_000})"))
    assert r["outcome"] == "runtime_error", r
    assert "64 KiB" in r["reason"], r["reason"]


# -- 3. output files that are not regular files -----------------------------------------------
def test_an_output_left_as_a_fifo_does_not_block_the_measurer(measurer):
    r = measure_within(measurer, saving("os.mkfifo(path)"))
    assert r["outcome"] == "incorrect", r
    assert "not a regular file" in r["reason"], r["reason"]


def test_an_output_left_as_a_symlink_is_refused(measurer):
    r = measure_within(measurer, saving("""
_real_save(path + ".real.npy", arr, **kw)
os.symlink(path + ".real.npy", path)
"""))
    assert r["outcome"] == "incorrect", r
    assert "symbolic link" in r["reason"], r["reason"]


def test_a_folder_left_where_outputs_go_is_a_recorded_failure(measurer):
    r = measure_within(measurer, """
import os
def run(x):
    os.makedirs("out.7.npy/inside", exist_ok=True)
    return x
""")
    assert r["outcome"] == "incorrect", r
    assert "out.7.npy cannot be removed" in r["reason"], r["reason"]


def test_a_stderr_left_as_a_fifo_does_not_block_the_measurer(measurer):
    r = measure_within(measurer, """
import os
def run(x):
    try:  # (absent where the folder is a tmpfs: the measurer's stderr.log lies beneath it)
        os.unlink("stderr.log")
    except FileNotFoundError:
        pass
    os.mkfifo("stderr.log")
    os._exit(3)
""")
    assert r["outcome"] == "runtime_error" and "exit 3" in r["reason"], r


# -- 4. output files larger than the reference's output ---------------------------------------
def test_a_huge_sparse_output_is_refused_before_it_is_loaded(measurer):
    r, peak = measure_peak(measurer, saving("""
with open(path, "wb") as fh:
    _format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                        "shape": (1 << 29,)})
    fh.truncate(fh.tell() + (2 << 30))
"""))
    assert r["outcome"] == "incorrect", r
    assert "header" in r["reason"] and "(536870912,)" in r["reason"], r["reason"]
    assert peak < 200 * MiB, f"measuring allocated {peak / MiB:.0f} MiB"


def test_an_output_with_data_beyond_its_array_is_refused(measurer):
    r, peak = measure_peak(measurer, saving("""
_real_save(path, arr, **kw)
with open(path, "ab") as fh:
    fh.truncate(os.path.getsize(path) + (1 << 30))
"""))
    assert r["outcome"] == "incorrect", r
    assert "bytes" in r["reason"], r["reason"]
    assert peak < 200 * MiB, f"measuring allocated {peak / MiB:.0f} MiB"


def test_an_output_of_another_dtype_is_refused(measurer):
    r = measure_within(measurer, saving("_real_save(path, arr.astype('float64'), **kw)"))
    assert r["outcome"] == "incorrect", r
    assert "float64" in r["reason"], r["reason"]


def test_honest_answers_and_outputs_still_pass(measurer):
    """A control (it passes on the code before these checks too): they refuse forgeries, not
    the worker's own files, nor a non-finite number in a field the measurer does not use (an
    honest batch's ``rse`` of one time is infinite)."""
    assert measure_within(measurer, CORRECT)["outcome"] == CORRECT_UNTIMED
    r = measure_within(measurer, lying("'{\"ok\": true, \"seconds\": 0.1, \"rse\": Infinity}'"))
    assert r["outcome"] == CORRECT_UNTIMED, r


# -- 5. a huge stderr ---------------------------------------------------------------------------
def test_only_the_tail_of_a_huge_sparse_stderr_is_read(measurer):
    r, peak = measure_peak(measurer, """
import os
def run(x):
    os.ftruncate(2, 3 << 30)
    os.write(2, b"THE-LAST-WORDS")
    os._exit(3)
""")
    assert r["outcome"] == "runtime_error" and "exit 3" in r["reason"], r
    assert "THE-LAST-WORDS" in r["reason"], r["reason"]
    assert peak < 200 * MiB, f"measuring allocated {peak / MiB:.0f} MiB"


# -- 6. error text that is not valid Unicode ----------------------------------------------------
def test_a_lone_surrogate_in_the_error_text_reaches_the_log_as_text(measurer, tmp_path):
    from gfsim.live.driver import RecordedLog

    r = measure_within(measurer, "def run(x):\n    raise RuntimeError('bad \\ud800 text')\n")
    assert r["outcome"] == "runtime_error", r
    r["reason"].encode("utf-8")  # no lone surrogate left
    assert "bad \\ud800 text" in r["reason"], r["reason"]
    log = RecordedLog(tmp_path / "live.jsonl")
    log.write({"kind": "evaluation", "candidate_id": "c", **r})
    log.close()
    (line,) = (tmp_path / "live.jsonl").read_bytes().decode("utf-8").splitlines()
    assert "bad \\ud800 text" in json.loads(line)["reason"]


def test_the_live_log_writer_encodes_lone_surrogates_safely(tmp_path):
    from gfsim.live.driver import RecordedLog
    from gfsim.replay_logs.io import iter_records

    log = RecordedLog(tmp_path / "live.jsonl")
    log.write({"kind": "evaluation", "candidate_id": "c\udcff", "outcome": "runtime_error",
               "reason": "bad \ud800 text", "extra": {"k\udc80": ["\udfff", 1.5]}})
    log.close()
    ((_, rec),) = list(iter_records(tmp_path / "live.jsonl"))
    assert rec["candidate_id"] == "c\\udcff" and rec["reason"] == "bad \\ud800 text"
    assert rec["extra"] == {"k\\udc80": ["\\udfff", 1.5]}
