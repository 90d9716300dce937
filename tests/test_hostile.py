"""The hostile-candidate suite (experiments/hostile.py) on CPU: each row is a kernel that tries to
forge its timing, cheat the checks, or escape the sandbox, and each must be contained. The GPU
rows and the H200 figures: experiments/hostile_suite.py, docs/concepts/live-measurement.md."""

import os
import statistics
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gfsim.live.candidates import CodeCandidate  # noqa: E402
# The rows are test-only code, kept with the experiment that runs them on a GPU.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from hostile import ROWS, Context, format_table, honest_code, run_row  # noqa: E402
from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer  # noqa: E402
from gfsim.live.tasks import get_task  # noqa: E402

CPU_ROWS = [r for r in ROWS if not r.gpu_only]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    cfg = MeasurerConfig(cpu_timing=True, rse_target=0.05, max_reps=40,
                         cpu_shapes=({"M": 64, "N": 4096},), timing_timeout_s=10,
                         check_timeout_s=30, compile_timeout_s=60, memory_limit_mb=3000,
                         energy_window_s=0, timing_tolerance=0.1,
                         checked_reps=6)  # a partial cheat is caught, not just likely caught
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("hostile"))
    ctx = Context(honest_code(get_task("softmax"), "cpu"))
    honest = m.measure(CodeCandidate("softmax", ctx.honest + "\ndef run(*inputs):\n"
                                     "    return _honest(*inputs)\n"))
    assert honest["outcome"] == "success", honest
    ctx.honest_ns = honest["runtime_ns"]
    yield m, ctx
    m.close()
    ctx.close()


@pytest.mark.slow
@pytest.mark.parametrize("row", CPU_ROWS, ids=[r.name for r in CPU_ROWS])
def test_a_hostile_candidate_is_contained(suite, row):
    m, ctx = suite
    result = run_row(row, m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"


@pytest.mark.slow
def test_after_the_hostile_rows_an_honest_kernel_measures_as_before(suite, tmp_path):
    """Runs after the rows (pytest keeps file order): nothing they did outlived them."""
    m, ctx = suite
    code = ctx.honest + "\ndef run(*inputs):\n    return _honest(*inputs)\n# again\n"
    again = m.measure(CodeCandidate("softmax", code))
    # Not refused as forged; on two busy cores an honest kernel may be capped (at the floor the
    # clock vouches for: the call's wall-clock, time descheduled included, which a busy
    # machine can make tens of times the kernel's), and interpreter times vary by up to 2x.
    assert again["outcome"] == "success", again
    assert m._zygote.proc.poll() is None and m.sandboxes == len(CPU_ROWS) + 2
    if again["runtime_ns"] < 3 * ctx.honest_ns:
        return
    # Slower than before: the rows' doing, or the machine's? A measurer that never saw a
    # hostile row times the same kernel under the same load: this one must keep up. The two
    # take turns, five times each. What the rows could leave behind (a busy thread, a lowered
    # priority, a smaller CPU set) slows every later measurement, so it shows in both the
    # fastest and the median of each; a burst of load on two busy cores (CI runs the slow
    # files two at a time) falls on some turns only. It fails where both say slower: one CI
    # run timed the fastest of 4 after the rows at 64 ms and one of 3 fresh at 12 ms, the
    # fresh measurer's next turn 64 ms (medians 90 against 64 ms); alone here all are 3.6 ms.
    fresh = TritonMeasurer("softmax", m.config, workdir=tmp_path)
    after, control = [again], []
    try:
        for turn in range(5):
            control.append(fresh.measure(CodeCandidate("softmax", code + f"# control {turn}\n")))
            after.append(m.measure(CodeCandidate("softmax", code + f"# again {turn}\n")))
    finally:
        fresh.close()
    assert all(r["outcome"] == "success" for r in after + control), (after, control)
    a = [r["runtime_ns"] for r in after]
    c = [r["runtime_ns"] for r in control]
    slower = min(a) >= 3 * min(c) and statistics.median(a) >= 3 * statistics.median(c)
    assert not slower, (a, c, ctx.honest_ns, _process_state(m._zygote.proc.pid),
                        _process_state(os.getpid()))


def _process_state(pid: int) -> dict:
    """What a row could have changed of a process that outlives it (a failure's evidence)."""
    state: dict = {"pid": pid}
    try:
        state["nice"] = os.getpriority(os.PRIO_PROCESS, pid)
        state["cpus"] = sorted(os.sched_getaffinity(pid))
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        state.update(line.split(":", 1) for line in status
                     if line.split(":")[0] in ("Threads", "VmRSS", "Cpus_allowed_list"))
        state["cgroup"] = Path(f"/proc/{pid}/cgroup").read_text().strip()
    except OSError as exc:
        state["error"] = str(exc)
    state["loadavg"] = os.getloadavg()
    return state
