"""Sandbox limits with no side doors (issue 52): memory held where no process maps it (a memfd
written through its descriptor, detached SysV segments) and threads count against the limits.

With a cgroup (``gfsim.live.cgroup``: root, and a v2 or v1 memory and pids hierarchy) the
kernel holds both; without one (``cgroups=False``, as on such a machine) seccomp refuses
memfd and SysV shm. Each hoard aims half a GiB past a 1.5 GB limit."""

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gfsim.live import cgroup  # noqa: E402
from gfsim.live.candidates import CodeCandidate  # noqa: E402
from gfsim.live.hostile import ROWS, Context, format_table, honest_code, run_row  # noqa: E402
from gfsim.live.measurer import MeasurerConfig, TritonMeasurer  # noqa: E402
from gfsim.live.sandbox import probe_subprocess  # noqa: E402
from gfsim.live.tasks import get_task  # noqa: E402

ROW = {r.name: r for r in ROWS}
CGROUP_VERSION, NO_CGROUP = cgroup.support()
needs_cgroup = pytest.mark.skipif(not CGROUP_VERSION,
                                  reason=f"this machine allows no sandbox cgroup: {NO_CGROUP}")


def _measurer(tmp_path_factory, cgroups: bool):
    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=30, memory_limit_mb=1500,
                         energy_window_s=0, cgroups=cgroups)
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("limits"))
    ctx = Context(honest_code(get_task("softmax"), "cpu"))
    honest = m.measure(CodeCandidate("softmax", ctx.honest + "\ndef run(*inputs):\n"
                                     "    return _honest(*inputs)\n"))
    return m, ctx, honest


@pytest.fixture(scope="module")
def with_cgroup(tmp_path_factory):
    if not CGROUP_VERSION:
        pytest.skip(f"this machine allows no sandbox cgroup: {NO_CGROUP}")
    m, ctx, honest = _measurer(tmp_path_factory, True)
    yield m, ctx, honest
    m.close()
    ctx.close()


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    m, ctx, honest = _measurer(tmp_path_factory, False)
    if not m.facilities.seccomp:
        m.close()
        ctx.close()
        pytest.skip("this kernel has no seccomp: the fallback cannot refuse unmapped memory")
    yield m, ctx, honest
    m.close()
    ctx.close()


def _own_groups() -> list[str]:
    """This process's sandbox groups still on the machine."""
    v2, v1 = cgroup._mounts()
    roots = [v2] if v2 else []
    roots += [mount for mount, _root in v1.values()]
    tag = f"gfsim-sandbox-{os.getpid()}-"
    return [str(p) for root in roots for p in Path(root).rglob(tag + "*")]


def _populated(group: str) -> bool:
    """Whether a group still holds a task (its sandbox is alive)."""
    try:
        return bool(Path(group, "cgroup.procs").read_text().split())
    except OSError:
        return False


@needs_cgroup
def test_the_kernel_holds_the_limits_and_says_so(with_cgroup):
    m, _ctx, honest = with_cgroup
    assert honest["outcome"] in ("success", "correct_untimed"), honest
    assert f"cgroup{CGROUP_VERSION}" in honest["sandbox"].split("+")
    fac = m.facilities
    assert fac.cgroup == CGROUP_VERSION and fac.memory_limit.startswith("cgroup v")
    assert "threads" in fac.task_limit


@needs_cgroup
@pytest.mark.parametrize("name", ["memfd-hoard", "sysv-shm-hoard", "3000-threads"])
def test_with_a_cgroup_a_hoard_or_thread_storm_is_contained(with_cgroup, name):
    m, ctx, _honest = with_cgroup
    result = run_row(ROW[name], m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"
    if name != "3000-threads":  # the kernel stopped it at the limit: killed, or refused
        reason = str(result["record"].get("reason"))
        assert "memory limit" in reason or "Cannot allocate memory" in reason, result["record"]


@needs_cgroup
def test_an_honest_kernel_measures_after_the_hoards_and_no_group_is_left(with_cgroup):
    m, ctx, _honest = with_cgroup
    again = m.measure(CodeCandidate("softmax", ctx.honest + "\ndef run(*inputs):\n"
                                    "    return _honest(*inputs)\n# again\n"))
    assert again["outcome"] in ("success", "correct_untimed"), again
    # The measurer keeps its baseline's worker, whose sandbox (and group) lives on; every
    # group of a sandbox that ended, the hoards' included, is gone.
    assert [g for g in _own_groups() if not _populated(g)] == []
    assert len(_own_groups()) <= 2 * 2  # at most the baseline's and one more, per hierarchy


@pytest.mark.parametrize("name", ["memfd-hoard", "sysv-shm-hoard"])
def test_without_a_cgroup_seccomp_refuses_unmapped_memory(fallback, name):
    m, ctx, honest = fallback
    assert honest["outcome"] in ("success", "correct_untimed"), honest
    assert "rlimits" in honest["sandbox"].split("+")
    result = run_row(ROW[name], m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"
    # refused, the candidate is its honest kernel
    assert result["outcome"] == honest["outcome"], result["record"]


@pytest.mark.skipif(os.geteuid() == 0, reason="RLIMIT_NPROC does not bind root's uid (the "
                    "kernel exempts it); as root the cgroup holds the thread count")
def test_without_a_cgroup_rlimit_nproc_caps_threads(fallback):
    m, ctx, _honest = fallback
    result = run_row(ROW["3000-threads"], m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"


def test_the_probe_states_which_memory_limit_holds():
    fac = probe_subprocess(timeout=120)
    assert fac.memory_limit and fac.task_limit
    if CGROUP_VERSION:
        assert fac.cgroup == CGROUP_VERSION and "memfd" in fac.memory_limit
    else:
        assert fac.cgroup == 0 and "refused" in fac.memory_limit
