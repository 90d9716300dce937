"""The JournalStorage file of a tuning study, opened so that whatever is wrong with it is one line.

``open_journal`` is the one place a journal file is opened. Before Optuna reads the file it is
checked: a folder, a file that cannot be read or appended to, a device (``/dev/full`` says
ENOSPC to the empty write that probes it; ``/dev/zero`` would be one endless line) are refused;
then one streaming pass reads every complete line, at most ``MAX_LINE_BYTES`` of it, and
refuses a line that is not one of Optuna's operations (JSON, an object, a known ``op_code``
with the fields Optuna reads for it), naming the file and the line. Optuna itself would read a
mile-long line into memory, fail on the first operation it does not know with
``AssertionError``, and on a line that is not JSON with ``JSONDecodeError``.

A last line without its newline was cut off by a writer that stopped mid-append (killed, or
the disk filled); Optuna skips it while it is last, but the next append would glue its record
onto it, and that corrupt line would end every later read. So each append (under Optuna's lock
of the file, where no other writer is mid-append) first moves such a line to
``FILE.torn-TIMESTAMP`` and cuts the file back to its last complete line, saying so in one
line (``TornJournalWarning``): no complete record is lost. An append that fails (ENOSPC, a
file size limit, a folder made read-only) cuts the file back to where it began, so that it
tears nothing, and fails in one line; the backend then refuses every later append with the same
line (``journal_failure`` finds it: Optuna replaces an error raised while it records a
trial's end with an ``AssertionError`` of its own).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from datetime import datetime

import msgspec
import optuna
from optuna.storages.journal import JournalFileBackend

from gfsim.core.errors import GfsimError
from gfsim.tuning.rdb_rows import MAX_JSON_DEPTH, json_depth

__all__ = ["MAX_LINE_BYTES", "TORN_SUFFIX", "OPERATIONS", "TornJournalWarning", "open_journal",
           "journal_failure"]

MAX_LINE_BYTES = 16 << 20  # a longer line is refused by name, not read into memory
TORN_SUFFIX = ".torn-"  # FILE.torn-TIMESTAMP holds a cut-off last line set aside
_READ_BUFFER = 1 << 20

# Optuna's journal operations (optuna.storages.journal._storage.JournalOperation) and the
# fields its replay reads for each, besides op_code and worker_id.
OPERATIONS = {
    0: ("CREATE_STUDY", ("study_name", "directions")),
    1: ("DELETE_STUDY", ("study_id",)),
    2: ("SET_STUDY_USER_ATTR", ("study_id", "user_attr")),
    3: ("SET_STUDY_SYSTEM_ATTR", ("study_id", "system_attr")),
    4: ("CREATE_TRIAL", ("study_id", "datetime_start")),
    5: ("SET_TRIAL_PARAM", ("trial_id", "param_name", "param_value_internal", "distribution")),
    6: ("SET_TRIAL_STATE_VALUES", ("trial_id", "state", "values")),
    7: ("SET_TRIAL_INTERMEDIATE_VALUE", ("trial_id", "step", "intermediate_value")),
    8: ("SET_TRIAL_USER_ATTR", ("trial_id", "user_attr")),
    9: ("SET_TRIAL_SYSTEM_ATTR", ("trial_id", "system_attr")),
    10: ("DISCARD_TRIALS", ()),
}

_JSON_TYPES = {list: "a list", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


_DECODE = msgspec.json.Decoder().decode  # some 20 times the standard library's speed


class TornJournalWarning(UserWarning):
    """The journal's last line was cut off mid-append; it was set aside in FILE.torn-*."""


def _why(exc: OSError) -> str:
    """An OS error as ``ENOSPC: No space left on device``."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def _name(path: str) -> str:
    """The journal as named in a message: the path given, and where a link leads."""
    if os.path.islink(path):
        return f"{path} (a link to {os.path.realpath(path)})"
    return path


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return what
    return "special file"


def _check_file(path: str) -> None:
    """Refuse, in one line, a journal path that is a folder, cannot be read, cannot be opened
    for appending or written (an empty write: free on a file, ENOSPC on a full device), or is
    not a regular file. A missing file is created, as Optuna would."""
    name = _name(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a loop of links, a folder on the way that cannot be searched
        raise GfsimError(f"`storage` {name}: cannot be opened ({_why(exc)})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise GfsimError(f"`storage` {name}: cannot be opened: it is a folder, not a journal "
                         "file")
    if mode is not None and stat.S_ISREG(mode):
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            raise GfsimError(f"`storage` {name}: cannot be read ({_why(exc)})") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o666)
    except OSError as exc:
        raise GfsimError(f"`storage` {name}: cannot be opened for appending "
                         f"({_why(exc)})") from None
    try:
        os.write(fd, b"")
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        raise GfsimError(f"`storage` {name}: cannot be written ({_why(exc)})") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        raise GfsimError(f"`storage` {name}: is a {_kind(mode)}, not a regular file; a journal "
                         "must be a file")


def _load(line: bytes):
    """``line`` decoded as Optuna reads it: what msgspec refuses (NaN, a lone surrogate, a
    line that is not JSON) goes to the standard library, whose error says what is wrong."""
    try:
        return _DECODE(line)
    except msgspec.DecodeError:
        return json.loads(line)


def _problem(line: bytes) -> str | None:
    """What keeps ``line`` from being one of Optuna's journal operations; None if nothing."""
    if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH:  # (Optuna copies values
        depth = json_depth(line.decode("utf-8", "replace"))  # recursively: no deeper)
        if depth > MAX_JSON_DEPTH:
            return f"nests {depth} deep (at most {MAX_JSON_DEPTH}), not an operation"
    try:
        op = _load(line)
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    except json.JSONDecodeError as exc:
        return (f"is not JSON ({exc.msg} at column {exc.colno}; cut off by a writer that "
                "stopped mid-append, or not a journal line)")
    if not isinstance(op, dict):
        return f"is {_JSON_TYPES.get(type(op), 'a JSON value')}, not an operation (an object " \
               "with op_code)"
    if "op_code" not in op:
        return "is an object without op_code, not an operation"
    code = op["op_code"]
    if type(code) is not int or code not in OPERATIONS:
        return f"has op_code {json.dumps(code)[:40]}, not one of Optuna's (0 to " \
               f"{max(OPERATIONS)})"
    what, fields = OPERATIONS[code]
    missing = [f for f in ("worker_id", *fields) if f not in op]
    if missing:
        return f"is a {what} operation without {', '.join(missing)}"
    return None


def _refuse(path: str, number: int, what: str) -> GfsimError:
    return GfsimError(f"`storage` {_name(path)}: not a journal file Optuna can read: line "
                      f"{number} {what}; the file is left as it is")


def _scan(path: str) -> None:
    """One streaming pass over the journal's complete lines (as far as it reached when the
    pass began), each read at most ``MAX_LINE_BYTES`` at a time; the first that is not an
    operation is refused by file and line. A last line without its newline is passed over:
    it is being written now, or was cut off, which the next append mends."""
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        end, done, number = os.fstat(f.fileno()).st_size, 0, 0
        while done < end:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:  # cut short meanwhile
                return
            number += 1
            done += len(line)
            if len(line) > MAX_LINE_BYTES:
                raise _refuse(path, number, f"is longer than {MAX_LINE_BYTES >> 20} MiB (not "
                                            "read)")
            if not line.endswith(b"\n"):
                return
            what = _problem(line)
            if what is not None:
                raise _refuse(path, number, what)


def _last_line_start(fd: int, size: int) -> int | None:
    """Where the last line of the first ``size`` bytes begins (just past the newline before
    it), looking back at most ``MAX_LINE_BYTES``; None if it began earlier."""
    pos = size
    while pos > 0 and size - pos < MAX_LINE_BYTES:
        step = min(1 << 16, pos)
        chunk = os.pread(fd, step, pos - step)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return pos - step + cut + 1
        pos -= step
    return 0 if pos == 0 else None


def _set_aside(path: str, fd: int, size: int) -> int:
    """Move the cut-off last line of the journal (``fd``, ``size`` bytes long) to
    FILE.torn-TIMESTAMP and cut the file back to the line before; returns the new size. Run
    under the journal's lock."""
    name = _name(path)
    start = _last_line_start(fd, size)
    if start is None:
        raise GfsimError(f"`storage` {name}: its last line is cut off (no newline) and longer "
                         f"than {MAX_LINE_BYTES >> 20} MiB: not a journal file Optuna wrote; "
                         "the file is left as it is")
    aside = f"{path}{TORN_SUFFIX}{datetime.now():%Y%m%d-%H%M%S-%f}"
    try:
        tail = os.pread(fd, size - start, start)
        with open(aside, "xb") as f:
            f.write(tail)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise GfsimError(f"`storage` {name}: its last line ({size - start} bytes) was cut off "
                         f"by a writer that stopped mid-append and cannot be set aside in "
                         f"{aside} ({_why(exc)}); the file is left as it is") from None
    try:
        os.ftruncate(fd, start)
        os.fsync(fd)
    except OSError as exc:
        raise GfsimError(f"`storage` {name}: its cut-off last line, copied to {aside}, cannot "
                         f"be cut from the file ({_why(exc)})") from None
    warnings.warn(TornJournalWarning(
        f"`storage` {name}: its last line ({size - start} bytes) was cut off by a writer that "
        f"stopped mid-append (killed, or the disk filled): moved to {aside}; every complete "
        "line is kept"), stacklevel=2)
    return start


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


class _Backend(JournalFileBackend):
    """Optuna's journal file whose appends mend a cut-off last line first, tear nothing when
    they fail, and fail in one line (``GfsimError``), then refuse every later append with it
    (``failure``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.failure: str | None = None

    def _fail(self, message: str) -> GfsimError:
        self.failure = self.failure or message
        return GfsimError(self.failure)

    def append_logs(self, logs: list[dict]) -> None:
        if self.failure is not None:
            raise GfsimError(self.failure)
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs)
                + "\n").encode("utf-8")
        name = _name(self._file_path)
        try:
            self._lock.acquire()
        except OSError as exc:  # a folder made read-only, a full disk
            raise self._fail(f"`storage` {name}: cannot take the journal's lock "
                             f"{self._file_path}.lock beside it ({_why(exc)})") from None
        try:
            self._append(data, name)
        except GfsimError as exc:
            raise self._fail(str(exc)) from None
        finally:
            self._lock.release()

    def _append(self, data: bytes, name: str) -> None:
        try:
            fd = os.open(self._file_path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise GfsimError(f"`storage` {name}: cannot be opened for appending "
                             f"({_why(exc)})") from None
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                size = _set_aside(self._file_path, fd, size)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError as exc:
                raise GfsimError(f"`storage` {name}: cannot append to the journal "
                                 f"({_why(exc)}); {_cut_back(fd, size)}: make room and run "
                                 "the same command again to resume the study") from None
        except OSError as exc:
            raise GfsimError(f"`storage` {name}: cannot be read back ({_why(exc)})") from None
        finally:
            os.close(fd)


def _cut_back(fd: int, size: int) -> str:
    """Cut a failed append off the journal; says what the journal holds now."""
    try:
        os.ftruncate(fd, size)
        return "the journal is kept as it was before this write"
    except OSError:
        return "the journal's last line may be cut off (the next run sets it aside)"


def open_journal(path: str, check: bool = True) -> optuna.storages.JournalStorage:
    """A JournalStorage on the file ``path``, refused in one line (``GfsimError``) where the
    file cannot serve: see the module. ``check=False`` leaves out the pass over its lines (a
    worker of a study whose file its parent has just checked)."""
    _check_file(path)
    if check:
        _scan(path)
    try:
        return optuna.storages.JournalStorage(_Backend(path))
    except Exception as exc:  # changed since the checks, or a field Optuna cannot replay
        raise GfsimError(f"`storage` {_name(path)}: is not a journal file Optuna can read "
                         f"({type(exc).__name__}: {str(exc)[:200]}); the file is left as it "
                         "is") from None


def journal_failure(storage) -> GfsimError | None:
    """The error that ended appends to ``storage``'s journal file, if one did."""
    failure = getattr(getattr(storage, "_backend", None), "failure", None)
    return GfsimError(failure) if failure else None
