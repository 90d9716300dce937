"""gfsim.core.durable: renames whose directory is fsynced, and temporary folders a killed run
leaves behind removed by the next one."""

import os
import subprocess
import sys

from gfsim.core import durable


def test_replace_renames_and_fsyncs_the_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(
        f"/proc/self/fd/{fd}")) or real(fd))
    src, dst = tmp_path / "a.partial", tmp_path / "a"
    src.write_text("x")
    durable.replace(src, dst)
    assert dst.read_text() == "x" and not src.exists()
    assert str(tmp_path) in synced


def test_a_new_log_file_fsyncs_its_directory(tmp_path, monkeypatch):
    from gfsim.replay_logs import LogWriter

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(
        f"/proc/self/fd/{fd}")) or real(fd))
    with LogWriter(tmp_path / "sub" / "log.jsonl") as w:
        w.append({"kind": "header"})
        w.append({"kind": "run"})
    assert synced.count(str(tmp_path / "sub")) == 1  # once, at the create
    assert synced.count(str(tmp_path / "sub" / "log.jsonl")) == 2  # every append


def test_folders_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"gfsim-measure-{dead_pid}-abc").mkdir()
    (tmp_path / f"gfsim-measure-{dead_pid}-abc" / "cache").mkdir()
    (tmp_path / f"gfsim-measure-{os.getppid()}-live").mkdir()  # a live process: kept
    (tmp_path / "gfsim-measure-old-style").mkdir()  # no pid in the name: not ours to judge
    (tmp_path / f"other-{dead_pid}-x").mkdir()  # another prefix
    mine = durable.owned_tempdir("gfsim-measure-", dir=tmp_path)
    assert mine.name.startswith(f"gfsim-measure-{os.getpid()}-") and mine.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        mine.name, f"gfsim-measure-{os.getppid()}-live", "gfsim-measure-old-style",
        f"other-{dead_pid}-x"])
    assert durable.remove_orphans("gfsim-measure-", tmp_path) == []  # nothing more to remove


def test_temporary_is_removed_at_exit_and_on_an_error(tmp_path):
    import pytest

    with durable.temporary("gfsim-t-", dir=tmp_path) as d:
        (d / "f").write_text("x")
        assert d.is_dir() and d.name.startswith(f"gfsim-t-{os.getpid()}-")
    assert not d.exists()
    with pytest.raises(RuntimeError), durable.temporary("gfsim-t-", dir=tmp_path) as d2:
        raise RuntimeError
    assert not d2.exists() and list(tmp_path.iterdir()) == []
