"""Reading a user's file within limits: a regular file (a FIFO would block for ever, a device
never end), at most ``max_input_bytes`` (4 GiB unless ``GFSIM_MAX_INPUT_BYTES`` says
otherwise). Logs (``replay_logs.io``), importers and cost-model files read through here; an
``InputError`` is one line naming the file. ``check_output`` keeps a command from writing over,
or into, what it reads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gfsim.core.errors import GfsimError

__all__ = ["InputError", "OutputError", "check_output", "read_file", "max_input_bytes",
           "size_text", "MAX_INPUT_BYTES"]

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


def check_output(out, reads, option: str = "--out") -> None:
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


def read_file(path, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path`` (``what`` it should be, for messages: "log
    file"), at most ``max_input_bytes``; ``InputError`` otherwise."""
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
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):  # (open() of a folder's descriptor raises)
        os.close(fd)
        raise InputError(path, f"is a directory, not a {what}")
    with open(fd, "rb", closefd=True) as fh:
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, f"is not a regular file (a FIFO, socket or device); a {what} "
                             "must be a file")
        limit = max_input_bytes()
        if info.st_size > limit:
            raise InputError(path, f"is {size_text(info.st_size)}, above the "
                             f"{size_text(limit)} gfsim reads (GFSIM_MAX_INPUT_BYTES raises it)")
        try:
            raw = fh.read(info.st_size + 1)  # (a larger request would be allocated whole)
            if len(raw) > info.st_size:  # it grows while read (a log being written)
                more = [raw]
                while sum(map(len, more)) <= limit and (piece := fh.read(1 << 24)):
                    more.append(piece)
                raw = b"".join(more)
        except MemoryError:
            raise InputError(path, f"not enough memory to read its "
                             f"{size_text(info.st_size)}") from None
        except OSError as exc:
            raise InputError(path, f"cannot be read ({exc.strerror})") from None
    if len(raw) > limit:  # it grew while read
        raise InputError(path, f"is above the {size_text(limit)} gfsim reads "
                         "(GFSIM_MAX_INPUT_BYTES raises it)")
    return raw
