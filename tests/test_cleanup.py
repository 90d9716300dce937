"""Cleanup that cannot crash (issue 52): ``gfsim.core.folders.remove_tree`` removes whatever a
candidate can make in its folder, a failed removal is one warning line and never fatal (for
this run or a later measurer's start), and a candidate's folder has a quota."""

import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from gfsim.core.durable import owned_tempdir, temporary
from gfsim.core.folders import CleanupWarning, remove_tree, tree_usage


@pytest.fixture
def scratch(tmp_path):
    """A folder on tmpfs where there is one (a 3,000-deep tree goes in milliseconds there, in
    seconds on a disk), else pytest's."""
    if os.access("/dev/shm", os.W_OK):
        folder = tempfile.mkdtemp(prefix="gfsim-test-cleanup-", dir="/dev/shm")
        yield folder
        remove_tree(folder, warn=False)
    else:
        yield str(tmp_path)


def _nested(top: str, depth: int, name: str = "d" * 200) -> None:
    """``depth`` nested folders under ``top`` (relative steps: the whole path is longer than
    PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as fh:
        fh.write("at the bottom")
    os.close(fd)


def _dead_pid() -> int:
    """The pid of a process that has exited (a killed run's)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _immutable(path: str) -> bool:
    """Make ``path`` immutable (chattr +i) where this file system and user allow it."""
    try:
        return subprocess.run(["chattr", "+i", path], capture_output=True).returncode == 0
    except OSError:
        return False


def test_a_tree_deeper_than_recursion_and_path_max_is_removed(scratch):
    top = os.path.join(scratch, "candidate")
    os.mkdir(top)
    _nested(top, 3000)  # rmtree: RecursionError
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = remove_tree(top)
    assert out.complete and out.removed == 3002 and not os.path.lexists(top)


def test_links_are_removed_and_never_followed(scratch, tmp_path):
    outside = tmp_path / "outside"
    (outside / "kept").mkdir(parents=True)
    (outside / "kept" / "file").write_text("not the candidate's")
    top = os.path.join(scratch, "candidate")
    os.makedirs(os.path.join(top, "x"))
    for name, to in (("self", "."), ("up", ".."), ("a", "b"), ("b", "a"),
                     ("outside", str(outside)), ("x/loop", "../x"), ("file", str(outside /
                     "kept" / "file"))):
        os.symlink(to, os.path.join(top, name))
    os.mkfifo(os.path.join(top, "fifo"))
    out = remove_tree(top)
    assert out.complete and not os.path.lexists(top)
    assert (outside / "kept" / "file").read_text() == "not the candidate's"
    assert os.path.isdir(scratch)


def test_what_cannot_be_removed_is_left_with_one_warning_line(scratch):
    top = os.path.join(scratch, "candidate")
    odd = os.path.join(top, "odd\x1b[31m\u202ename")
    os.makedirs(odd)
    for i in range(20):
        open(os.path.join(top, str(i)), "w").close()
    stuck = os.path.join(odd, "immutable")
    open(stuck, "w").close()
    if not _immutable(stuck):
        pytest.skip("chattr +i is not allowed here (needs root and a file system with flags)")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = remove_tree(top)
    finally:
        subprocess.run(["chattr", "-i", stuck], check=True)
    assert not out.complete and out.removed == 20 and out.left == 3  # the file, 2 folders
    (warning,) = caught
    text = str(warning.message)
    assert warning.category is CleanupWarning and "\n" not in text
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b" in text  # escaped
    assert remove_tree(top).complete and not os.path.lexists(top)  # the next call finishes


def test_a_capped_removal_stops_warns_and_the_next_carries_on(scratch):
    top = os.path.join(scratch, "candidate")
    os.mkdir(top)
    for i in range(50):
        open(os.path.join(top, str(i)), "w").close()
    with pytest.warns(CleanupWarning, match="cap of 10 entries"):
        first = remove_tree(top, max_entries=10)
    assert first.stopped and first.removed <= 10 and os.path.isdir(top)
    assert remove_tree(top).complete and not os.path.lexists(top)


_AS_NOBODY = """
import os, sys
from gfsim.core.folders import remove_tree  # (before: nobody may not read the interpreter's)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
top = sys.argv[1]
for d in ("locked/inner", "readonly/sub"):
    os.makedirs(os.path.join(top, d))
    for i in range(5):
        open(os.path.join(top, d, str(i)), "w").close()
os.chmod(os.path.join(top, "locked/inner"), 0)
os.chmod(os.path.join(top, "locked"), 0)
os.chmod(os.path.join(top, "readonly/sub"), 0o500)
os.chmod(os.path.join(top, "readonly"), 0o500)
out = remove_tree(top)
print(out.complete, os.path.lexists(top))
"""


def test_unreadable_folders_of_their_owner_are_removed(scratch):
    """As a user that is not root (root needs no permission to remove): chmod 000 and
    read-only folders are given their owner's permissions back and removed."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the removal as another user (nobody)")
    top = os.path.join(scratch, "nobody")
    os.chmod(scratch, 0o777)
    out = subprocess.run([sys.executable, "-c", _AS_NOBODY, top], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_a_later_start_survives_a_dead_runs_deep_and_stuck_folders(scratch):
    """The measurer's start sweeps dead runs' folders (``owned_tempdir``): a 3,000-deep tree
    is removed, an immutable entry is left with a warning, and the start goes on. Today's
    sweep raised RecursionError at every start."""
    pid = _dead_pid()
    deep = os.path.join(scratch, f"gfsim-measure-{pid}-deep")
    os.makedirs(os.path.join(deep, "gfsim-worker-a"))
    _nested(os.path.join(deep, "gfsim-worker-a"), 3000)
    stuck = os.path.join(scratch, f"gfsim-measure-{pid}-stuck", "immutable")
    os.makedirs(os.path.dirname(stuck))
    open(stuck, "w").close()
    held = _immutable(stuck)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mine = owned_tempdir("gfsim-measure-", dir=scratch)
            again = owned_tempdir("gfsim-measure-", dir=scratch)  # the next start too
    finally:
        if held:
            subprocess.run(["chattr", "-i", stuck], check=True)
    assert mine.is_dir() and again.is_dir() and not os.path.lexists(deep)
    assert os.path.lexists(stuck) == held
    assert len([w for w in caught if w.category is CleanupWarning]) == (2 if held else 0)


def test_a_temporary_folder_filled_deep_is_removed(scratch):
    with temporary("gfsim-test-", dir=scratch) as folder:
        _nested(str(folder), 3000)
    assert not folder.exists()


def test_tree_usage_stops_at_the_first_limit_passed(scratch):
    top = os.path.join(scratch, "candidate")
    os.mkdir(top)
    _nested(top, 3000, "d")
    deep = tree_usage(top, max_depth=32, max_entries=10**6, max_bytes=1 << 40)
    assert deep.over == "folders more than 32 deep" and deep.depth == 33
    remove_tree(top)
    os.mkdir(top)
    for i in range(300):
        open(os.path.join(top, str(i)), "w").close()
    many = tree_usage(top, max_depth=32, max_entries=100, max_bytes=1 << 40)
    assert many.over == "more than 100 entries" and many.entries == 101
    with open(os.path.join(top, "big"), "wb") as fh:
        fh.write(b"x" * (3 << 20))
    big = tree_usage(top, max_depth=32, max_entries=10**6, max_bytes=2 << 20)
    assert big.over == "more than 2 MiB"
    with open(os.path.join(top, "sparse"), "wb") as fh:  # holds no blocks: not counted
        fh.truncate(1 << 40)
    os.remove(os.path.join(top, "big"))
    assert tree_usage(top, max_depth=32, max_entries=10**6, max_bytes=2 << 20).over is None


# -- through the real measurer (CPU: Triton's interpreter) -----------------------------------
_HONEST = """
import torch
def run(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)
"""


class _Code:
    """A stand-in candidate: just code (the measurer needs .code and .candidate_id)."""

    def __init__(self, code: str):
        self.code, self.candidate_id = code, f"cleanup-{abs(hash(code)) % 10**8}"


def _in_folder(body: str) -> str:
    """Code that runs ``body`` in a folder of its own inside its folder, then is honest."""
    return ("import os, time\n_home = os.getcwd()\nos.mkdir('hostile')\nos.chdir('hostile')\n"
            + body + "\nos.chdir(_home)\n" + _HONEST)


@pytest.fixture(scope="module")
def measurer(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    cfg = MeasurerConfig(compile_timeout_s=60, check_timeout_s=30, memory_limit_mb=1500,
                         folder_max_depth=16, folder_max_entries=2000, folder_max_mb=64)
    m = TritonMeasurer("softmax", cfg, workdir=tmp_path_factory.mktemp("cleanup"))
    yield m
    m.close()


def _workers(m) -> list:
    """The candidates' folders left in the measurer's (the baseline's excepted)."""
    base = getattr(m._ref_worker, "dir", None)
    return [p for p in m._root.glob("gfsim-worker-*") if p != base]


def _over_quota(m, rec, over: str) -> bool:
    """Whether ``rec`` failed for passing the folder quota: killed by the measurer's check
    (``over``), or, for bytes and entries where the folder is a tmpfs of the quota's size
    (``Facilities.folder_quota``), refused by the kernel (ENOSPC)."""
    reason = str(rec.get("reason"))
    if rec["outcome"] != "runtime_error":
        return False
    return f"quota ({over})" in reason or ("deep" not in over and m.facilities.folder_quota
                                           .startswith("tmpfs") and "No space left" in reason)


@pytest.mark.parametrize("body, over", [
    ("for _ in range(40):\n    os.mkdir('d')\n    os.chdir('d')\ntime.sleep(5)",
     "folders more than 16 deep"),
    ("for i in range(5000):\n    open(str(i), 'w').close()\ntime.sleep(5)",
     "more than 2000 entries"),
    ("for i in range(50):\n    with open(str(i), 'wb') as f:\n        f.write(b'x' * (2 << 20))"
     "\ntime.sleep(5)", "more than 64 MiB"),
], ids=["depth", "entries", "bytes"])
def test_a_candidate_past_its_folder_quota_is_killed_and_its_folder_removed(measurer, body,
                                                                           over):
    rec = measurer.measure(_Code(_in_folder(body)))
    assert _over_quota(measurer, rec, over), rec
    assert _workers(measurer) == []


def test_no_file_of_a_candidate_passes_its_folder_quota(measurer):
    """The kernel refuses the write (RLIMIT_FSIZE; or, where the folder is a tmpfs of the
    quota's size, the tmpfs is full first): the file stops at the quota."""
    rec = measurer.measure(_Code(_in_folder(
        "with open('big', 'wb') as f:\n    for _ in range(100):\n"
        "        f.write(b'x' * (1 << 20))")))
    assert rec["outcome"] == "runtime_error" and ("File too large" in rec["reason"] or (
        measurer.facilities.folder_quota.startswith("tmpfs") and
        "No space left" in rec["reason"])), rec
    assert _workers(measurer) == []


def test_a_candidate_leaving_3000_nested_folders_is_measured_and_cleaned(measurer):
    """The issue's reproducer (names of 200 characters: past PATH_MAX), whether or not the
    quota's check kills it before its tree is whole: the measurer raised RecursionError here,
    and in close()."""
    rec = measurer.measure(_Code(_in_folder(
        "for _ in range(3000):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)")))
    assert rec["outcome"] in ("runtime_error", "correct_untimed"), rec
    assert _workers(measurer) == []


def test_an_honest_candidate_passes_under_the_quota(measurer):
    assert measurer.measure(_Code(_HONEST))["outcome"] == "correct_untimed"


@pytest.mark.slow
def test_a_later_measurer_start_measures_after_a_hostile_folder_was_left(tmp_path):
    """A killed run left a measurer folder holding a 3,000-deep tree (a candidate's, removed
    by no one): the next measurer on that folder starts, measures, and removes it."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gfsim.live.measure.measurer import MeasurerConfig, TritonMeasurer

    left = tmp_path / f"gfsim-measure-{_dead_pid()}-killed" / "gfsim-worker-x"
    left.mkdir(parents=True)
    _nested(str(left), 3000, "d")
    with TritonMeasurer("softmax", MeasurerConfig(compile_timeout_s=60, check_timeout_s=30),
                        workdir=tmp_path) as m:
        assert m.measure(_Code(_HONEST))["outcome"] == "correct_untimed"
    assert list(tmp_path.iterdir()) == []


_HIDE_AS_NOBODY = """
import os, sys
from gfsim.core.folders import tree_usage
os.setgroups([]); os.setgid(65534); os.setuid(65534)
top = sys.argv[1]
for d in ("hidden", "unsearchable"):
    os.makedirs(os.path.join(top, d))
    for i in range(50):
        open(os.path.join(top, d, str(i)), "w").close()
os.chmod(os.path.join(top, "hidden"), 0)
os.chmod(os.path.join(top, "unsearchable"), 0o600)
print(tree_usage(top, max_depth=8, max_entries=10**6, max_bytes=1 << 40).entries)
"""


def test_a_folder_made_unreadable_still_counts_against_the_quota(scratch):
    """As a user that is not root: a chmod 000 folder (and one that cannot be searched) is
    opened again, so what it holds is counted."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to measure as another user (nobody)")
    top = os.path.join(scratch, "nobody")
    os.chmod(scratch, 0o777)
    out = subprocess.run([sys.executable, "-c", _HIDE_AS_NOBODY, top], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["102"]


def test_files_unlinked_but_held_open_count_against_the_quota(measurer):
    """A file it unlinks and keeps writing to is in no folder, and still on the disk."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a candidate's descriptors are not listable otherwise")
    rec = measurer.measure(_Code(_in_folder(
        "_held = []\nfor i in range(5):\n    f = open(str(i), 'wb')\n    os.unlink(str(i))\n"
        "    f.write(b'x' * (20 << 20))\n    f.flush()\n    _held.append(f)\ntime.sleep(5)")))
    assert _over_quota(measurer, rec, "with files unlinked but open"), rec
