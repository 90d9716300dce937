"""gfsim.integrations.kernel_evaluator: the evaluator an OpenEvolve or ShinkaEvolve run calls
per program. On a GPU, OpenEvolve measures the initial program in its own process and then
forks its workers, where CUDA cannot start again (found in a real OpenEvolve run on an H100:
every forked worker's evaluation failed with "CUDA error: initialization error"); a call from
such a process is measured in a spawned process of its own. No GPU here: the bad fork is
forced, and the spawned path runs under the Triton interpreter."""

import os

import pytest

from gfsim.integrations import kernel_evaluator
from gfsim.live.tasks import get_task


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "program.py"
    path.write_text(get_task("softmax").candidates()[0].code)
    return path


def test_a_call_from_a_bad_fork_is_measured_in_a_spawned_process_kept_for_the_next(
        program, monkeypatch):
    monkeypatch.setattr(kernel_evaluator, "_in_bad_fork", lambda: True)
    monkeypatch.setattr(kernel_evaluator, "_SPAWNED", {})
    monkeypatch.setattr(kernel_evaluator, "_MEASURERS", {})
    first = kernel_evaluator.evaluate_kernel(program, "softmax", interpret=True)
    second = kernel_evaluator.evaluate_kernel(program, "softmax", interpret=True)
    assert first["device"] == "cpu (Triton interpreter)" and first["speedup"] > 0, first
    assert second["speedup"] > 0, second
    assert kernel_evaluator._MEASURERS == {}  # no measurer in this process: the spawned one
    (key, pool), = kernel_evaluator._SPAWNED.items()
    assert key == (os.getpid(), "softmax", True)
    pids = {p.pid for p in pool._processes.values()}
    assert len(pids) == 1 and os.getpid() not in pids  # one process, kept for both calls
    pool.shutdown()


def test_outside_a_bad_fork_the_program_is_measured_here(program, monkeypatch):
    monkeypatch.setattr(kernel_evaluator, "_SPAWNED", {})
    monkeypatch.setattr(kernel_evaluator, "_MEASURERS", {})
    out = kernel_evaluator.evaluate_kernel(program, "softmax", interpret=True)
    assert out["speedup"] > 0 and kernel_evaluator._SPAWNED == {}
    assert list(kernel_evaluator._MEASURERS) == [(os.getpid(), "softmax", True)]
    kernel_evaluator._MEASURERS.popitem()[1].close()
    assert not kernel_evaluator._in_bad_fork()  # (no CUDA here at all)
