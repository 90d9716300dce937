"""Files that survive a crash: directory fsyncs after a create or rename, and temporary folders
that name their owner, so that the next run removes those a killed run left behind.

A rename or a new file is durable only once its directory's entry is on disk (POSIX says
nothing of the directory when the file is fsynced), so every atomic write here ends with an
fsync of the directory. A folder made by ``owned_tempdir`` is named ``PREFIX<pid>-<random>``;
``remove_orphans(PREFIX)`` deletes those whose process is gone (a reused pid keeps its folder:
the safe way to be wrong).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from gfsim.core.folders import MAX_REMOVE_S, remove_tree

__all__ = ["fsync_dir", "replace", "owned_tempdir", "remove_orphans", "temporary"]


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush the directory ``path``'s entries to disk (a no-op where directories cannot be
    opened, as on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; nothing more to do
        pass
    finally:
        os.close(fd)


def replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace(src, dst)``, then the directory fsynced, so that the new name survives a
    power cut as well as a crash."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def owned_tempdir(prefix: str, dir: str | os.PathLike | None = None) -> Path:
    """A new temporary folder named after this process (``PREFIX<pid>-...``), after removing
    the folders of this prefix that dead processes left (``remove_orphans``)."""
    remove_orphans(prefix, dir)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dir))


def remove_orphans(prefix: str, dir: str | os.PathLike | None = None) -> list[Path]:
    """Delete the folders ``PREFIX<pid>-*`` in ``dir`` (default: the temporary directory)
    whose process no longer exists; returns those removed. A folder that cannot be removed
    completely (``remove_tree``: immutable entries, or a cap reached) is left with one warning
    line, and the sweep goes on: it never stops a start, nor holds it longer than
    ``MAX_REMOVE_S`` in all (what is left goes at the next sweep)."""
    base = Path(dir) if dir is not None else Path(tempfile.gettempdir())
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    deadline = time.monotonic() + MAX_REMOVE_S
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            break
        try:
            if entry.is_dir() and not entry.is_symlink() and \
                    remove_tree(entry, max_s=left_s).complete:
                removed.append(entry)
        except OSError:
            continue
    return removed


@contextmanager
def temporary(prefix: str, dir: str | os.PathLike | None = None):
    """``tempfile.TemporaryDirectory`` whose folder, if a kill leaves it, the next
    ``owned_tempdir``/``temporary`` of the same prefix removes."""
    path = owned_tempdir(prefix, dir)
    try:
        yield path
    finally:
        remove_tree(path)
