"""gfsim tune's journal file failing in one line: a full disk (at the start and during a study), a
torn or foreign line, a folder, a device, a file or folder it may not read or write, and a worker
process killed mid-study; a torn last line is set aside and the study goes on."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app

runner = CliRunner()

TUNE = ["tune", "--log", "synthetic-mini", "--param", "tau=0.3:0.99", "--seeds", "1",
        "--validate-seeds", "0", "--study", "s", "--json"]
CREATE = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[2]}\n'
# The old code read a journal on /dev/full or /dev/zero as one endless line until the OOM
# killer ended it: a subprocess that may run one is held to this much memory.
MEMORY = 4 << 30


def tune(journal, trials: int = 2, *more):
    return runner.invoke(app, [*TUNE, "--trials", str(trials), "--storage", str(journal), *more])


def gfsim(args, cwd, limits=(), env=None, user=(), timeout=300):
    """``gfsim ARGS`` in a process of its own in ``cwd``, under the resource ``limits``
    ((RLIMIT_*, value) pairs), as ``user`` (a command prefix such as setpriv's)."""
    code = f"from gfsim.cli.main import app; app({list(args)!r})"

    def limit():
        for what, value in limits:
            resource.setrlimit(what, (value, value))

    return subprocess.run([*user, sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit, env=env)


def refused(stderr: str, *words: str) -> str:
    """The one line of an error, holding every one of ``words``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def records(journal: Path) -> list[dict]:
    data = journal.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize("device, what", [
    ("/dev/full", "cannot be written (ENOSPC: No space left on device)"),
    ("/dev/zero", "is a character device, not a regular file"),
    ("/dev/null", "is a character device, not a regular file"),
])
def test_a_journal_on_a_full_disk_or_a_device_fails_at_once(tmp_path, device, what):
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    (tmp_path / "s.journal").symlink_to(device)
    proc = gfsim([*TUNE, "--trials", "2", "--storage", "s.journal"], tmp_path,
                 limits=[(resource.RLIMIT_AS, MEMORY)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    refused(proc.stderr, f"--storage s.journal (a link to {device}): {what}")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_disk_that_fills_during_a_study_tears_nothing_and_the_study_resumes(tmp_path,
                                                                            workers):
    args = [*TUNE, "--storage", "s.journal", "--workers", str(workers)]
    assert gfsim([*args, "--trials", "2"], tmp_path).returncode == 0
    journal = tmp_path / "s.journal"
    before = journal.read_bytes()
    # A file size limit fails a write past it as a full disk does: the part that fits is
    # written, then the write fails (EFBIG here, ENOSPC there). The replay cache is off: it
    # writes files too.
    quiet = {**os.environ, "GFSIM_LOG_CACHE": "off"}
    full = gfsim([*args, "--trials", "8"], tmp_path, env=quiet,
                 limits=[(resource.RLIMIT_FSIZE, len(before) + 3000)])
    assert full.returncode == 2, full.stderr[-3000:]
    refused(full.stderr, "--storage s.journal: cannot append to the journal (EFBIG: File too "
                         "large); the journal is kept as it was before this write",
            "run the same command again to resume the study")
    assert "Traceback" not in full.stderr
    after = journal.read_bytes()
    assert after.startswith(before) and len(after) > len(before)  # it got some way
    records(journal)  # every line whole
    assert not list(tmp_path.glob("s.journal.torn-*"))
    again = gfsim([*args, "--trials", "8"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["trials"] == 8


def test_a_torn_last_line_is_set_aside_and_every_later_run_goes_on(tmp_path):
    journal = tmp_path / "s.journal"
    assert tune(journal, 2).exit_code == 0
    whole = journal.read_bytes()
    last = whole.splitlines(keepends=True)[-1]
    torn = last[: len(last) // 2]
    journal.write_bytes(whole + torn)  # its writer was killed (or the disk filled) mid-append
    res = tune(journal, 3)
    assert res.exit_code == 0, res.output
    note = [line for line in res.stderr.splitlines() if line.strip()]
    [aside] = tmp_path.glob("s.journal.torn-*")
    assert note == [f"gfsim: warning: --storage {journal}: its last line ({len(torn)} bytes) "
                    "was cut off by a writer that stopped mid-append (killed, or the disk "
                    f"filled): moved to {aside}; every complete line is kept"]
    assert aside.read_bytes() == torn
    assert journal.read_bytes().startswith(whole)
    records(journal)
    assert json.loads(res.stdout)["trials"] == 3
    for trials in (4, 5):
        res = tune(journal, trials)
        assert res.exit_code == 0 and res.stderr == "", res.output
        assert json.loads(res.stdout)["trials"] == trials


def test_an_append_sets_aside_a_line_torn_since_the_journal_was_opened(tmp_path):
    import optuna

    from gfsim.tuning.journal import TornJournalWarning
    from gfsim.tuning.study import make_storage

    journal = tmp_path / "u.journal"
    study = optuna.create_study(study_name="u", storage=make_storage(str(journal)))
    whole = journal.read_bytes()
    with journal.open("ab") as f:  # another process, killed mid-append
        f.write(b'{"op_code":8,"worker_id":"x","tri')
    with pytest.warns(TornJournalWarning, match="its last line \\(33 bytes\\) was cut off"):
        study.set_user_attr("k", 1)
    assert journal.read_bytes().startswith(whole) and len(records(journal)) == 2
    again = optuna.load_study(study_name="u", storage=make_storage(str(journal)))
    assert again.user_attrs == {"k": 1}


def test_a_torn_line_before_the_last_is_named_by_line(tmp_path):
    journal = tmp_path / "s.journal"
    assert tune(journal, 2).exit_code == 0
    lines = journal.read_bytes().splitlines(keepends=True)
    # An older gfsim appended its next record to a cut-off line: line 4 is two halves.
    broken = b"".join(lines[:3]) + lines[3][:25] + b"".join(lines[3:])
    journal.write_bytes(broken)
    res = tune(journal, 3)
    assert res.exit_code == 2, res.output
    refused(res.stderr, f"--storage {journal}: not a journal file Optuna can read: line 4 is "
                        "not JSON (", "the file is left as it is")
    assert journal.read_bytes() == broken


@pytest.mark.parametrize("line, what", [
    (b'{"hello": 1}', "is an object without op_code, not an operation"),
    (b"[1,2]", "is a list, not an operation (an object with op_code)"),
    (b'"text"', "is a string, not an operation"),
    (b'{"op_code": 99, "worker_id": "w"}', "has op_code 99, not one of Optuna's (0 to 10)"),
    (b'{"op_code": "4", "worker_id": "w"}', 'has op_code "4", not one of Optuna\'s'),
    (b'{"op_code": 4, "worker_id": "w"}',
     "is a CREATE_TRIAL operation without study_id, datetime_start"),
    (b'{"op_code": 2, "study_id": 0, "user_attr": {"a": 1}}',
     "is a SET_STUDY_USER_ATTR operation without worker_id"),
    (b"", "is not JSON (Expecting value at column 1;"),
    (b'{"a": "\xff"}', "is not UTF-8 text"),
])
def test_a_line_that_is_not_an_optuna_operation_is_named(tmp_path, line, what):
    journal = tmp_path / "s.journal"
    data = CREATE + line + b"\n" + CREATE
    journal.write_bytes(data)
    res = tune(journal)
    assert res.exit_code == 2, res.output
    refused(res.stderr, f"--storage {journal}: not a journal file Optuna can read: line 2 "
                        f"{what}", "; the file is left as it is")
    assert journal.read_bytes() == data


def test_a_line_longer_than_the_limit_is_refused_unread(tmp_path):
    from gfsim.tuning.journal import MAX_LINE_BYTES

    journal = tmp_path / "s.journal"
    # An operation Optuna would apply (a user attribute of a trial not in the file).
    long = (b'{"op_code":8,"worker_id":"w","trial_id":7,"user_attr":{"x":"'
            + b"a" * MAX_LINE_BYTES + b'"}}\n')
    journal.write_bytes(CREATE + long)
    res = tune(journal)
    assert res.exit_code == 2, res.output
    refused(res.stderr, f"--storage {journal}: not a journal file Optuna can read: line 2 is "
                        "longer than 16 MiB (not read)")
    # Cut off (no newline) and that long, it cannot be set aside either.
    journal.write_bytes(CREATE + long[:-1])
    res = tune(journal)
    assert res.exit_code == 2, res.output
    refused(res.stderr, "line 2 is longer than 16 MiB (not read)")


def test_a_folder_is_one_line(tmp_path):
    (tmp_path / "s.journal").mkdir()
    res = tune(tmp_path / "s.journal")
    assert res.exit_code == 2, res.output
    refused(res.stderr, f"--storage {tmp_path / 's.journal'}: cannot be opened: it is a folder, "
                        "not a journal file")


@pytest.fixture
def place():
    """A folder every user may enter (pytest's own is its owner's only), and how to run
    without root's right to read and write anything: as root, ``setpriv`` empties the
    capability bounding set, so the process stays root (it can still read the checkout and
    the virtual environment, which may sit in folders only root may enter) but file modes
    bind it as they bind any owner."""
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("as root, and no setpriv to drop root's rights with")
        user = (setpriv, "--bounding-set=-all", "--inh-caps=-all")
    else:
        user = ()
    folder = Path(tempfile.mkdtemp(prefix="gfsim-tune-storage-"))
    folder.chmod(0o777)
    (folder / "cache").mkdir(mode=0o777)
    (folder / "cache").chmod(0o777)
    try:
        yield folder, user
    finally:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(folder)


@pytest.mark.parametrize("kind, what", [
    ("unreadable", "--storage s.journal: cannot be read (EACCES: Permission denied)"),
    ("read-only file", "--storage s.journal: cannot be opened for appending (EACCES: "
                       "Permission denied)"),
    ("read-only folder", "--storage ro/s.journal: cannot take the journal's lock "
                         "ro/s.journal.lock beside it (EACCES: Permission denied)"),
    ("read-only folder, no journal", "--storage ro/s.journal: cannot be opened for appending "
                                     "(EACCES: Permission denied)"),
])
def test_a_journal_that_may_not_be_read_or_written_is_one_line(place, kind, what):
    folder, user = place
    journal = folder / "s.journal"
    if kind.startswith("read-only folder"):
        (folder / "ro").mkdir()
        journal = folder / "ro" / "s.journal"
    if kind != "read-only folder, no journal":
        journal.write_bytes(CREATE)
        journal.chmod({"unreadable": 0o000, "read-only file": 0o444}.get(kind, 0o644))
    if kind.startswith("read-only folder"):
        journal.parent.chmod(0o555)
    env = {**os.environ, "GFSIM_LOG_CACHE": "off", "GFSIM_CACHE_DIR": str(folder / "cache"),
           "MPLCONFIGDIR": str(folder / "cache"), "HOME": str(folder / "cache")}
    proc = gfsim([*TUNE, "--trials", "1", "--storage", str(journal.relative_to(folder))],
                 folder, env=env, user=user, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    refused(proc.stderr, what)
    if kind != "read-only folder, no journal":
        journal.chmod(0o644)
        assert journal.read_bytes() == CREATE


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the workers in /proc")
def test_a_killed_worker_is_named_in_one_line_and_the_same_command_resumes(tmp_path):
    # A policy that reads the seed, so that a trial replays every seed and takes a while;
    # heartbeats of 1 s, so that the resumed run soon fails and retries the killed trial.
    args = ["tune", "--log", "synthetic-puct-v1", "--policy", "random", "--param",
            "p=0.1:0.9", "--seeds", "40", "--validate-seeds", "0", "--trials", "6",
            "--workers", "2", "--heartbeat", "1", "--study", "k", "--json"]
    quiet = {**os.environ, "GFSIM_LOG_CACHE": "off"}
    code = f"from gfsim.cli.main import app; app({args!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=quiet,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = tmp_path / "k.journal"
    try:
        deadline = time.time() + 120
        workers = []
        while time.time() < deadline:
            time.sleep(0.2)
            workers = _children(proc.pid)
            started = journal.exists() and b'"op_code":4,' in journal.read_bytes()
            if len(workers) == 2 and started:
                break
        assert len(workers) == 2 and started, "the workers never started a trial"
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("gfsim: error: ")]
    assert len(errors) == 1, err[-3000:]
    assert f"(pid {victim}) was killed by SIGKILL; the other workers stopped after their " \
           "running trial and every finished trial is kept in the study: run the same " \
           "command again to resume it" in errors[0]
    assert errors[0].startswith("gfsim: error: tune worker ") and " of 2 (pid " in errors[0]
    again = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=quiet,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["trials"] == 6
