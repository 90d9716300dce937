"""Reading a user's file within limits: a regular file (a FIFO would block for ever, a device
never end), at most ``max_input_bytes`` (4 GiB unless ``GFSIM_MAX_INPUT_BYTES`` says
otherwise). Logs (``replay_logs.io``), importers and cost-model files read through here; an
``InputError`` is one line naming the file. ``check_output`` keeps a command from writing over,
or into, what it reads."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from gfsim.core.errors import GfsimError

__all__ = ["InputError", "OutputError", "check_output", "read_file", "open_file",
           "max_input_bytes", "size_text", "MAX_INPUT_BYTES"]

MAX_INPUT_BYTES = 4 << 30


class InputError(GfsimError):
    """A file that cannot be read within the limits; ``reason`` says why, without the path."""

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


class OutputError(GfsimError):
    """An output path that is, or lies inside, a path the same command reads."""


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():  # symlinks followed, even where ``a`` does not exist yet
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_output(out, reads, option: str = "`out`") -> None:
    """Refuse, in one line naming both paths, an output ``out`` (what ``option`` writes) that
    is the same file as one of ``reads`` (the files and folders the command reads; ``None``
    entries are skipped), or lies inside one of them that is a folder: an import would
    otherwise replace the database it imports, or leave its log in the user's run folder.
    Checked before any work."""
    out = Path(out)
    reads = [Path(r) for r in reads if r is not None]
    for src in reads:  # the file itself first: the plainer of the two messages
        if _same(out, src):
            what = "" if str(src) == str(out) else f" {src},"
            raise OutputError(f"{out}: {option} would write over{what} a file this command "
                              "reads; write somewhere else (nothing was written)")
    for src in reads:
        if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
            raise OutputError(f"{out}: {option} lies inside {src}, a folder this command "
                              "reads; write somewhere else (nothing was written)")


def max_input_bytes() -> int:
    """The most a file gfsim reads may hold, stored or inflated: ``GFSIM_MAX_INPUT_BYTES`` if
    set (bytes), else 4 GiB."""
    value = os.environ.get("GFSIM_MAX_INPUT_BYTES", "")
    try:
        return int(value) if value.strip() else MAX_INPUT_BYTES
    except ValueError:
        raise GfsimError(f"GFSIM_MAX_INPUT_BYTES: expected a number of bytes, got {value!r}"
                         ) from None


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n:,} bytes"


def open_file(path, what: str = "file", limit: int | None = None):
    """The regular file at ``path`` opened for binary reading, and its ``os.stat_result``;
    ``InputError`` for a folder, a FIFO, socket or device, a kernel pseudo-file (``/proc``,
    ``/sys``: its size is not what it holds), or one larger than ``limit`` (default
    ``max_input_bytes``) by its size. Opened without blocking, so a FIFO is refused rather
    than waited on."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, f"is a directory, not a {what}") from None
    except PermissionError:
        raise InputError(path, "permission denied") from None
    except OSError as exc:
        raise InputError(path, f"cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        _check_kind(path, info, what, limit)  # (before open(), which a folder makes raise)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb", closefd=True), info


def _check_kind(path: Path, info: os.stat_result, what: str, limit: int | None) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, f"is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, f"is not a regular file (a FIFO, socket or device); a {what} "
                         "must be a file")
    if info.st_dev in _pseudo_devices():
        raise InputError(path, f"is a kernel pseudo-file (/proc, /sys), not a {what}: what "
                         "it holds is not its size")
    if info.st_size > (limit if limit is not None else max_input_bytes()):
        raise InputError(path, f"is {size_text(info.st_size)}, {_above(limit)}")


def _pseudo_devices() -> set[int]:
    """The devices of the kernel's pseudo file systems (/proc, /sys), whose regular-looking
    files say they hold 0 or 4096 bytes and hold what they please."""
    found = set()
    for root in ("/proc", "/sys"):
        try:
            found.add(os.stat(root).st_dev)
        except OSError:
            pass
    return found


def read_file(path, what: str = "file", limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (``what`` it should be, for messages: "log
    file"), at most ``limit`` (default ``max_input_bytes``); ``InputError`` otherwise
    (``open_file``). What counts is what was read, not what the file's status says: a file
    that grows while read is read into one buffer, never past the limit, and refused past
    it."""
    path = Path(path)
    fh, info = open_file(path, what, limit)
    bound = limit if limit is not None else max_input_bytes()
    with fh:
        try:
            raw = fh.read(min(info.st_size, bound) + 1)  # one buffer of the stated size
            if len(raw) > info.st_size:  # it grows while read (a log being written)
                raw = _read_rest(fh, raw, bound)
        except MemoryError:
            raise InputError(path, f"not enough memory to read its "
                             f"{size_text(info.st_size)}") from None
        except OSError as exc:
            raise InputError(path, f"cannot be read ({exc.strerror})") from None
    if len(raw) > bound:  # it grew while read
        raise InputError(path, f"is {_above(limit)}")
    return raw


def _above(limit: int | None) -> str:
    if limit is not None:
        return f"above the {size_text(limit)} such a file may hold"
    return (f"above the {size_text(max_input_bytes())} gfsim reads (GFSIM_MAX_INPUT_BYTES "
            "raises it)")


def _read_rest(fh, head: bytes, limit: int) -> bytes:
    """``head`` and what follows it in ``fh``, up to ``limit + 1`` bytes in all, gathered in
    one growing buffer (a ``BytesIO``, whose value is handed over without a copy): never a list
    of pieces joined at the end, which held the text twice."""
    buf = io.BytesIO()
    buf.write(head)
    del head
    while buf.tell() <= limit:
        piece = fh.read(min(1 << 24, limit + 1 - buf.tell()))
        if not piece:
            break
        buf.write(piece)
    return buf.getvalue()
