"""The measurer's verdict on a timing claim (``judge_timing``) and the Triton cache it hands
every candidate (``harvest_triton_cache``): pure functions, so tested here with numbers and
folders; the GPU runs of both are in docs/concepts/live-measurement.md."""

import sysconfig

import pytest

from gfsim.live.measure.measurer import MeasurerConfig, harvest_triton_cache, judge_timing

CFG = MeasurerConfig(timing_tolerance=0.3, timing_slack_ms=0.02, forged_below=0.5)


def verdict(claimed, trusted, noise=0.005, gpu=True, cfg=CFG):
    return judge_timing(claimed_ms=claimed, value_ms=claimed, trusted_ms=trusted,
                        noise_ms=noise, config=cfg, gpu=gpu)


def test_an_honest_claim_is_recorded_as_claimed():
    v = verdict(0.100, 0.112)
    assert (v["value_ms"], v["capped"], v["forged"]) == (0.100, False, None)
    assert v["floor_ms"] == pytest.approx(0.112 - 0.005 - 0.02)


def test_a_claim_below_the_floor_by_more_than_the_tolerance_is_capped_at_the_floor():
    v = verdict(0.060, 0.110)  # floor 0.085, and 0.060 is above 0.7 x 0.085 = 0.0595
    assert not v["capped"]
    v = verdict(0.055, 0.110)
    assert v["capped"] and v["value_ms"] == pytest.approx(0.085) and not v["forged"]


def test_a_claim_far_below_the_floor_is_refused_as_forged():
    v = verdict(0.010, 0.110)
    assert v["forged"] and "0.01 ms" in v["forged"]


def test_on_the_cpu_a_claim_far_below_the_floor_is_capped_never_refused():
    """An honest aten._softmax call (about 0.1 ms) in a process whose timing loop costs more
    than the null's (the floor then comes out above the call): on the CPU clock that is not
    evidence of forgery, so it is capped at the floor and said, never refused."""
    v = verdict(0.100, 0.500, noise=0.005, gpu=False)
    assert v["forged"] is None
    assert v["capped"] and v["value_ms"] == pytest.approx(0.495)
    assert "0.1 ms" in v["suspect"]
    assert verdict(0.100, 0.500, noise=0.005, gpu=True)["forged"]  # the GPU's wall clock: refused
    assert verdict(0.100, 0.112, gpu=False)["suspect"] is None  # control: an honest claim


def test_batches_faster_than_the_calls_they_claim_are_forged_on_a_gpu_only():
    # the loop's own work skipped: the batches beat the claim itself
    v = verdict(0.100, 0.040)
    assert v["forged"] and "skipped part of the loop" in v["forged"]
    assert verdict(0.100, 0.040, gpu=False)["forged"] is None
    assert verdict(0.100, -0.3)["forged"]  # a batch shorter than the loop's own cost
    assert verdict(0.100, 0.066, noise=0.005)["forged"] is None  # within the tolerance


def test_the_slack_applies_on_a_gpu_only():
    assert verdict(0.1, 0.2, gpu=False)["floor_ms"] == pytest.approx(0.195)
    assert verdict(0.1, 0.2, gpu=True)["floor_ms"] == pytest.approx(0.175)


def test_harvest_keeps_built_modules_and_never_kernels(tmp_path):
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    cache, into = tmp_path / "cache", tmp_path / "trusted"
    (cache / "KEYUTILS").mkdir(parents=True)
    (cache / "KEYUTILS" / f"cuda_utils{suffix}").write_bytes(b"\x7fELF utils")
    (cache / "KEYLAUNCH").mkdir()
    (cache / "KEYLAUNCH" / f"__triton_launcher{suffix}").write_bytes(b"\x7fELF launcher")
    (cache / "KEYLAUNCH" / "lock").write_text("")
    kernel = cache / "KEYKERNEL"
    kernel.mkdir()
    (kernel / "kernel.cubin").write_bytes(b"cubin")
    (kernel / "__grp__kernel.json").write_text("{}")
    (kernel / f"odd{suffix}").write_bytes(b"not a module of ours")
    (cache / "tmp.pid_1_x").mkdir()
    (cache / "tmp.pid_1_x" / f"half{suffix}").write_bytes(b"torn")
    assert harvest_triton_cache(cache, into) == 2
    assert sorted(p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file()) == [
        f"KEYLAUNCH/__triton_launcher{suffix}", f"KEYUTILS/cuda_utils{suffix}"]
    assert harvest_triton_cache(tmp_path / "missing", into) == 0


@pytest.mark.parametrize("clone", [True, False])
def test_the_reference_protocols_clones_can_be_left_out_of_a_null_batch(clone):
    """Under ``reference`` a call's clones are inside its events; the measurer's null batch
    leaves them out (``clone=False``), or the clones would cancel out of the difference it
    judges and an honest kernel would look as if it skipped part of the loop."""
    np = pytest.importorskip("numpy")
    from gfsim.live.measure import timing

    class Arr(np.ndarray):  # an array with torch's clone()
        def clone(self):
            return self.copy()

    originals = [np.arange(4.0).view(Arr) for _ in range(3)]
    seen = []
    timing.time_reps(lambda x: seen.append(x) or x, lambda r: (originals[r],), 3,
                     device="cpu", protocol="reference", clone=clone)
    assert [s is o for s, o in zip(seen, originals)] == [not clone] * 3
    assert all((s == o).all() for s, o in zip(seen, originals))


def test_a_low_median_is_capped_even_when_one_huge_time_lifts_the_mean():
    """Times reported as [0.05] x 99 + [20]: the mean (0.25 ms) clears the floor, the median
    (0.05 ms), which is what would be recorded, does not."""
    v = judge_timing(claimed_ms=0.25, value_ms=0.05, trusted_ms=0.25, noise_ms=0.005,
                     config=CFG, gpu=True)
    assert v["capped"] and v["value_ms"] == pytest.approx(0.25 - 0.005 - 0.02)
