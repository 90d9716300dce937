"""Sandbox limits with no side doors (issue 52): memory held where no process maps it (a memfd
written through its descriptor, detached SysV segments) and threads count against the limits.

With a cgroup (``gfsim.live.measure.cgroup``: root, and a v2 or v1 memory and pids hierarchy) the
kernel holds both; without one (``cgroups=False``, as on such a machine) seccomp refuses
memfd and SysV shm. Each hoard aims half a GiB past a 1.5 GB limit."""

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gfsim.live.measure import cgroup  # noqa: E402
from gfsim.live.candidates import CodeCandidate  # noqa: E402
# The rows are test-only code, kept with the experiment that runs them on a GPU.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from hostile import ROWS, Context, format_table, honest_code, run_row  # noqa: E402
from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer  # noqa: E402
from gfsim.live.measure.sandbox import probe_subprocess  # noqa: E402
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


# -- a group of the memory controller alone (as the lent GPU machines delegate) ----------------
@pytest.fixture(scope="module")
def memory_only(tmp_path_factory):
    """A measurer whose sandbox groups hold the memory controller alone
    (``MeasurerConfig.cgroup_controllers``), as on a machine that delegates no pids
    controller: the kernel holds memory, and threads count by the fallback."""
    if not CGROUP_VERSION:
        pytest.skip(f"this machine allows no sandbox cgroup: {NO_CGROUP}")
    if "memory" not in cgroup.controllers()[1]:
        pytest.skip("this machine's sandbox groups get no memory controller")
    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=30, memory_limit_mb=1500,
                         energy_window_s=0, cgroup_controllers=("memory",))
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("memory-only"))
    ctx = Context(honest_code(get_task("softmax"), "cpu"))
    yield m, ctx
    m.close()
    ctx.close()


def test_a_memory_only_group_says_memory_by_the_kernel_and_tasks_by_the_fallback(memory_only):
    m, ctx = memory_only
    honest = m.measure(CodeCandidate("softmax", ctx.honest + "\ndef run(*inputs):\n"
                                     "    return _honest(*inputs)\n"))
    assert honest["outcome"] in ("success", "correct_untimed"), honest
    # root's uid is exempt from RLIMIT_NPROC: there only the watchdog counts threads
    tasks = "watchdog" if os.geteuid() == 0 else "nproc"
    assert f"+cgroup{CGROUP_VERSION}-memory+tasks-{tasks}" in honest["sandbox"], honest


@pytest.mark.parametrize("name", ["memfd-hoard", "3000-threads"])
def test_a_memory_only_group_holds_a_hoard_and_a_thread_storm(memory_only, name):
    """The memfd is not refused (seccomp lets it through where the memory cgroup charges it):
    the kernel kills at the limit; the threads are counted by the fallback."""
    m, ctx = memory_only
    result = run_row(ROW[name], m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"
    if name == "memfd-hoard":
        assert "memory limit" in str(result["record"].get("reason")), result["record"]


# -- the folder quota by the kernel: a tmpfs in the sandbox's mount namespace ------------------
def _fill_folder(ctx, mib: int) -> str:
    """A candidate that writes ``mib`` MiB of files into its folder, 64 MiB a file (under
    RLIMIT_FSIZE), waits, then is honest."""
    return ctx.honest + (f"\nimport os, time\nfor _i in range({mib // 64}):\n"
                         "    with open(f'fill{_i}', 'wb') as _f:\n"
                         "        _f.write(b'x' * (64 << 20))\ntime.sleep(2)\n"
                         "def run(*inputs):\n    return _honest(*inputs)\n")


def _tmpfs_or_skip(m) -> None:
    if not m.facilities.folder_quota.startswith("tmpfs"):
        pytest.skip(f"no tmpfs folder quota here: {m.facilities.folder_quota}")


@pytest.mark.parametrize("fixture", ["with_cgroup", "fallback"])
def test_folder_bytes_count_against_the_memory_limit(request, fixture):
    """The folder's tmpfs pages are memory: past the 1.5 GB memory limit (under the 4 GiB
    folder quota) the memory cgroup's OOM killer, or without one the watchdog (which adds the
    folder's tmpfs to its sum), ends the candidate. Before, 2 GiB of files went to the disk
    and the candidate passed."""
    m, ctx, _honest = request.getfixturevalue(fixture)
    _tmpfs_or_skip(m)
    rec = m.measure(CodeCandidate("softmax", _fill_folder(ctx, 2048)))
    # (.get: a record from a measure that failed before its sandbox started has no "sandbox";
    # the assertion then shows the whole record, and why it failed)
    assert "folder-tmpfs" in str(rec.get("sandbox", "")).split("+"), rec
    assert rec["outcome"] != "success" and "memory limit" in str(rec.get("reason")), rec


def test_the_kernel_refuses_entries_past_the_folder_quota(with_cgroup):
    """ENOSPC from the tmpfs's inode count (20,000 entries), not a kill by the 0.5 s check."""
    m, ctx, _honest = with_cgroup
    _tmpfs_or_skip(m)
    result = run_row(ROW["many-entries"], m, ctx)
    assert result["contained"], format_table([result]) + f"\n{result['record']}"
    assert "No space left on device" in str(result["record"].get("reason")), result["record"]


_TMPFS_CHILD = """
import os, sys
from gfsim.live.measure.sandbox import (CLONE_NEWNS, MS_PRIVATE, MS_REC, folder_tmpfs, mount,
                                unshare_mapped)
folder = sys.argv[1]
unshare_mapped(CLONE_NEWNS)
mount("none", "/", None, MS_REC | MS_PRIVATE)
folder_tmpfs(folder, 1 << 20, 8)
seen = sorted(os.path.relpath(os.path.join(d, f), folder)
              for d, dirs, files in os.walk(folder) for f in dirs + files)
made = 0
try:
    for i in range(20):
        open(str(i), "w").close()
        made += 1
except OSError as exc:
    refused = exc.errno
print(os.getcwd() == folder, seen, made, refused, open("triton-cache/k/mod.so").read())
"""


def test_the_folder_tmpfs_keeps_the_trusted_cache_and_refuses_past_its_entries(tmp_path):
    """What the measurer seeded (a Triton cache) is copied onto the tmpfs, the outer process's
    stderr.log is not, the working directory moves onto it, and the ninth entry (8 allowed;
    the copied cache's three count) fails with ENOSPC."""
    import subprocess
    import sys

    from gfsim.live.measure.sandbox import plain_env

    if not probe_subprocess(timeout=120).mount_ns:
        pytest.skip("no mount namespace here")
    (tmp_path / "triton-cache" / "k").mkdir(parents=True)
    (tmp_path / "triton-cache" / "k" / "mod.so").write_text("trusted")
    (tmp_path / "stderr.log").write_text("the outer's")
    out = subprocess.run([sys.executable, "-c", _TMPFS_CHILD, str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=plain_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == ("True ['triton-cache', 'triton-cache/k', "
                                         "'triton-cache/k/mod.so'] 5 28 trusted")
    assert (tmp_path / "stderr.log").read_text() == "the outer's"  # beneath, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr.log", "triton-cache"]
