"""TritonMeasurer on a real GPU (runs on the H200; skips without CUDA)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer  # noqa: E402
from gfsim.live.tasks import TASKS, get_task  # noqa: E402


@pytest.mark.parametrize("name", list(TASKS))
@pytest.mark.parametrize("protocol", ["gfsim", "reference"])
def test_a_hand_written_candidate_is_measured(name, protocol):
    task = get_task(name)
    with TritonMeasurer(name, MeasurerConfig(protocol=protocol, energy_window_s=1.0)) as m:
        r = m.measure(task.candidates()[0])
    assert r["outcome"] == "success", r
    assert r["speedup"] > 0 and r["runtime_ns"] > 0 and r["ref_runtime_ns"] > 0
    assert r["speedup"] == pytest.approx(r["ref_runtime_ns"] / r["runtime_ns"])
    assert min(r["timing_reps"]) >= 3 and r["compile_s"] > 0 and r["timing_s"] > 0
    assert r["timing_statistic"] == ("median" if protocol == "gfsim" else "mean")
    if protocol == "reference":  # clones are timed inside the call: never the GPU clock
        assert r["timing_clock"] == "wall"
    elif r["timing_clock"] == "gpu":
        assert all(n > 0 for n in r["timing_null_ms"]) and r["clock_prep_s"] > 0
    if "energy_j" in r:
        assert r["energy_j"] > 0 and r["joules_per_call"] > 0


def test_a_candidate_that_writes_out_of_bounds_is_caught_and_the_worker_replaced():
    code = ("import torch, triton, triton.language as tl\n"
            "@triton.jit\n"
            "def k(p):\n"
            "    tl.store(p + tl.arange(0, 1024) * 1_000_000_000, 1.0)\n"
            "def run(x):\n"
            "    k[(1,)](x)\n"
            "    return x\n")

    class C:
        candidate_id = "oob"

    C.code = code
    with TritonMeasurer("softmax", MeasurerConfig()) as m:
        r = m.measure(C())
        assert r["outcome"] in ("runtime_error", "incorrect"), r
        ok = m.measure(get_task("softmax").candidates()[0])
    assert ok["outcome"] == "success"
