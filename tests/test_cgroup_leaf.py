"""A cgroup v2 group that holds processes hands its controllers down through a leaf (issue 52,
item 2): ``gfsim.live.measure.cgroup.delegate`` moves every process of the group into a leaf
``gfsim-measurer-<pid>`` (the kernel refuses a domain controller in ``cgroup.subtree_control``
while the group holds any process, whoever started it), enables the controllers, and
``undelegate`` turns them off, moves the processes back and removes the leaf, once no other
group is left beneath.

The first tests run on a real cgroup2 hierarchy, in a throw-away group made beneath its root
(the machine's own cgroup2 mount, or one mounted here), with whichever domain controller that
root offers (on the 2-core machine, where cgroup v1 holds memory and pids, only ``hugetlb``):
the no-internal-processes rule is the same for every domain controller, memory included. The
lent GPU machine's own group (``/process_api/<id>``, memory delegated, pids not) is tried there
by the lead; a memory-only group's settings are tested here on a temporary folder laid out as
that group is (a fixture of the file layout, not the kernel)."""

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gfsim.live.measure import cgroup
from gfsim.live.measure.sandbox import kernel_limits, limits_word

# Domain controllers (the no-internal-processes rule binds them; pids, cpu and the like are
# threaded and exempt), most telling first.
_DOMAIN = ("memory", "io", "hugetlb", "rdma", "misc")


def _read(path) -> list[str]:
    return Path(path).read_text().split()


@pytest.fixture(scope="module")
def v2_root():
    """(the root of a cgroup2 hierarchy, a domain controller it hands to its children)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make cgroups and move processes between them")
    mount, _v1 = cgroup._mounts()
    mounted = None
    if mount is None:
        mounted = tempfile.mkdtemp(prefix="gfsim-test-cgroup2-")
        if subprocess.run(["mount", "-t", "cgroup2", "none", mounted],
                          capture_output=True).returncode != 0:
            os.rmdir(mounted)
            pytest.skip("no cgroup2 hierarchy here, and none could be mounted")
        mount = mounted
    offered = [c for c in _DOMAIN if c in _read(Path(mount, "cgroup.controllers"))]
    enabled_here = None
    if offered and offered[0] not in _read(Path(mount, "cgroup.subtree_control")):
        enabled_here = offered[0]
        Path(mount, "cgroup.subtree_control").write_text("+" + enabled_here)
    try:
        if not offered:
            pytest.skip(f"the cgroup2 hierarchy at {mount} offers no domain controller "
                        "(cgroup v1 holds them all)")
        yield mount, offered[0]
    finally:
        if enabled_here:
            try:
                Path(mount, "cgroup.subtree_control").write_text("-" + enabled_here)
            except OSError:
                pass
        if mounted:
            subprocess.run(["umount", mounted], capture_output=True)
            os.rmdir(mounted)


@pytest.fixture
def group(v2_root):
    """A throw-away group beneath the hierarchy's root, standing for a measurer's own group;
    every process the test starts in it is killed, and the group removed, after."""
    mount, controller = v2_root
    base = Path(mount, f"gfsim-test-own-{os.getpid()}-{time.monotonic_ns()}")
    base.mkdir()
    sleepers: list[subprocess.Popen] = []

    def start_in(folder: Path) -> int:
        proc = subprocess.Popen(["sleep", "60"])
        sleepers.append(proc)
        Path(folder, "cgroup.procs").write_text(str(proc.pid))
        return proc.pid

    yield base, controller, start_in
    for proc in sleepers:
        proc.kill()
        proc.wait()
    for folder in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
        if folder.is_dir():
            folder.rmdir()
    for name in _read(base / "cgroup.subtree_control"):
        (base / "cgroup.subtree_control").write_text("-" + name)
    base.rmdir()


def test_the_kernel_refuses_a_domain_controller_to_a_group_that_holds_a_process(group):
    """Why the leaf: with any process in the group (not only the measurer's), ``+controller``
    fails with EBUSY, so every process of the group has to move."""
    base, controller, start_in = group
    start_in(base)
    with pytest.raises(OSError) as err:
        (base / "cgroup.subtree_control").write_text("+" + controller)
    assert err.value.errno == 16  # EBUSY


def test_every_process_of_the_group_moves_into_a_leaf_and_back(group):
    base, controller, start_in = group
    ours, another = start_in(base), start_in(base)
    done = cgroup.delegate(str(base), (controller,), "gfsim-measurer-test")
    leaf = base / "gfsim-measurer-test"
    assert done.leaf == str(leaf) and done.enabled == (controller,)
    assert _read(base / "cgroup.procs") == []
    assert sorted(_read(leaf / "cgroup.procs")) == sorted([str(ours), str(another)])
    assert controller in _read(base / "cgroup.subtree_control")
    sandbox = base / "gfsim-sandbox-test"  # a sandbox's group gets the controller
    sandbox.mkdir()
    assert controller in _read(sandbox / "cgroup.controllers")
    sandbox.rmdir()
    assert cgroup.undelegate(done)
    assert not leaf.exists() and _read(base / "cgroup.subtree_control") == []
    assert sorted(_read(base / "cgroup.procs")) == sorted([str(ours), str(another)])


def test_nothing_is_undone_while_another_group_lives_beneath(group):
    """Another measurer's sandbox group needs the controller for its limits: the leaf and the
    controller stay until it is gone."""
    base, controller, start_in = group
    start_in(base)
    done = cgroup.delegate(str(base), (controller,), "gfsim-measurer-test")
    other = base / "gfsim-sandbox-other"
    other.mkdir()
    assert not cgroup.undelegate(done)
    assert Path(done.leaf).is_dir() and controller in _read(base / "cgroup.subtree_control")
    other.rmdir()
    assert cgroup.undelegate(done) and not Path(done.leaf).exists()


def test_a_group_that_holds_no_process_gets_no_leaf(group):
    base, controller, _start_in = group
    done = cgroup.delegate(str(base), (controller,), "gfsim-measurer-test")
    assert done.leaf is None and done.enabled == (controller,)
    assert [p.name for p in base.iterdir() if p.is_dir()] == []
    assert cgroup.undelegate(done) and _read(base / "cgroup.subtree_control") == []


def test_what_is_already_handed_down_is_left_alone(group):
    base, controller, start_in = group
    (base / "cgroup.subtree_control").write_text("+" + controller)
    (base / "gfsim-measurer-earlier").mkdir()  # an earlier measurer's leaf, still in use
    start_in(base / "gfsim-measurer-earlier")
    done = cgroup.delegate(str(base), (controller,), "gfsim-measurer-test")
    assert done == cgroup.Delegation(str(base))
    assert cgroup.undelegate(done)
    assert controller in _read(base / "cgroup.subtree_control")  # not ours: left on


# -- a memory-only v2 group: a fixture of the file layout --------------------------------------
@pytest.fixture
def memory_only(tmp_path, monkeypatch):
    """A folder laid out as the GPU machine's own group once its leaf is made: cgroup v2, the
    memory controller handed down, no pids controller. The kernel's side (that the files are
    honoured) is the real group's, tried on that machine."""
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    (tmp_path / "cgroup.procs").write_text("")
    monkeypatch.setattr(cgroup, "_v2_base", lambda: str(tmp_path))
    monkeypatch.setattr(cgroup, "_mounts", lambda: (str(tmp_path), {}))
    return tmp_path


def test_a_memory_only_group_sets_memory_and_no_task_limit(memory_only):
    group = cgroup.TaskGroup.create("7-x", 1500 << 20, 512)
    folder = Path(group.folders["memory"])
    assert group.version == 2 and group.controllers == ("memory",)
    assert (folder / "memory.max").read_text() == str(1500 << 20)
    assert not (folder / "pids.max").exists() and group.tasks_refused() == 0
    (folder / "memory.events").write_text("oom 1\noom_kill 2\n")
    assert group.oom_kills() == 2
    for name in ("memory.max", "memory.events"):
        (folder / name).unlink()
    assert group.remove() and not folder.exists()


def test_the_probe_says_memory_by_the_cgroup_and_tasks_by_the_fallback(memory_only):
    held = kernel_limits()
    assert held["cgroup"] == 2 and held["cgroup_controllers"] == ["memory"]
    assert held["memory_limit"].startswith("cgroup v2: the kernel caps")
    assert "RLIMIT_NPROC" in held["task_limit"] and "no pids cgroup" in held["task_limit"]


def test_the_sandbox_word_says_which_limit_held():
    assert limits_word({"cgroup": 2, "cgroup_controllers": ["memory", "pids"]}) == "cgroup2"
    assert limits_word({"cgroup": 2, "cgroup_controllers": ["memory"],
                        "tasks_by": "watchdog"}) == "cgroup2-memory+tasks-watchdog"
    assert limits_word({"cgroup": 1, "cgroup_controllers": ["memory"],
                        "tasks_by": "nproc"}) == "cgroup1-memory+tasks-nproc"
    assert limits_word({"cgroup": 2, "cgroup_controllers": ["pids"]}) == \
        "cgroup2-pids+memory-seccomp"
    assert limits_word({"cgroup": 0}) == "rlimits"


_HOLDER = """
import os, sys
from pathlib import Path
from gfsim.live.measure import cgroup
base, controller = sys.argv[1], sys.argv[2]
Path(base, "cgroup.procs").write_text(str(os.getpid()))
def own():
    return Path("/proc/self/cgroup").read_text().split("0::", 1)[1].split()[0]
print(cgroup.hold((controller,)), cgroup.hold((controller,)))  # the second only counts
procs = Path(base, "cgroup.procs").read_text().split()
print(os.path.basename(own()), cgroup._v2_base() == base, procs)
cgroup.release()
print(sorted(p.name for p in Path(base).iterdir() if p.is_dir()))
cgroup.release()
print(os.path.basename(own()), sorted(p.name for p in Path(base).iterdir() if p.is_dir()))
cgroup.hold((controller,))  # left held: undone at exit
"""


def test_a_holder_moves_into_its_leaf_and_back_and_undoes_at_exit(group):
    """``hold`` and ``release`` in a process of the group, with another process beside it: it
    and the other move into ``gfsim-measurer-<pid>``, new groups still go beneath the group,
    and the last release (or the process's exit) brings both back and removes the leaf."""
    import sys

    base, controller, start_in = group
    other = start_in(base)
    out = subprocess.run([sys.executable, "-c", _HOLDER, str(base), controller],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "None None"
    name, climbs, left = lines[1].split(" ", 2)
    assert name.startswith(cgroup.LEAF_PREFIX) and climbs == "True" and left == "[]", lines
    assert lines[2] == f"['{name}']"  # one release of two: still held
    assert lines[3] == f"{base.name} []"
    assert _read(base / "cgroup.procs") == [str(other)]  # back, and the exit's undo ran
    assert [p.name for p in base.iterdir() if p.is_dir()] == []
    assert controller not in _read(base / "cgroup.subtree_control")
