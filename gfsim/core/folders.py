"""Folders someone else filled: removing one whatever it holds, and measuring one against a quota.

A candidate's folder (and a dead run's folder with it) may hold anything its code could make:
3,000 nested folders (deeper than ``shutil.rmtree``'s recursion, longer than PATH_MAX), symbolic
links to anywhere, folders it made unreadable, FIFOs and sockets, millions of entries. Both
walks here are iterative and work through directory descriptors (``dir_fd``), never through
paths, and never follow a link, so no depth and no name length breaks them.

``remove_tree`` is total: it never raises for anything it finds. It gives itself back the
permissions it needs on what this user owns, skips what it still cannot remove (an immutable
file, another file system mounted inside), stops at a cap on entries and on seconds so that no
tree stalls its caller, and reports what it left in one warning line (``CleanupWarning``). The
next call on the same folder carries on where it stopped.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import warnings
from dataclasses import dataclass, field

__all__ = ["CleanupWarning", "Removal", "remove_tree", "TreeUsage", "tree_usage",
           "MAX_REMOVE_ENTRIES", "MAX_REMOVE_S"]

# What one removal may cost before it stops and says what it left: far above any honest
# candidate's folder (a Triton cache of some hundred files), low enough that a measurer's start
# never waits long on a hostile one. The rest goes at the next removal of the same folder.
MAX_REMOVE_ENTRIES = 500_000
MAX_REMOVE_S = 30.0

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU


class CleanupWarning(UserWarning):
    """A folder could not be removed completely; what is left stays in place."""


@dataclass
class Removal:
    """What ``remove_tree`` did: entries removed, entries left (and a few of their paths)."""

    path: str
    removed: int = 0
    left: int = 0
    examples: list = field(default_factory=list)
    stopped: str | None = None  # why it stopped early (a cap), if it did

    @property
    def complete(self) -> bool:
        return self.left == 0 and self.stopped is None

    def summary(self) -> str:
        why = [self.stopped] if self.stopped else []
        if self.left:
            shown = ", ".join(_shown(e) for e in self.examples)
            why.append(f"{self.left} entries could not be removed (e.g. {shown})")
        return f"{_shown(self.path)}: left in place after removing {self.removed} entries: " \
            + "; ".join(why)


def _shown(text: str, limit: int = 120) -> str:
    """``text`` with control, bidi and other unprintable characters escaped, cut to ``limit``."""
    out = repr(text)[1:-1]
    return out if len(out) <= limit else out[:limit - 3] + "..."


@dataclass
class _Frame:
    name: str  # in its parent
    dev: int
    ino: int
    subdirs: list  # names of sub-folders not yet removed


class _Remover:
    def __init__(self, path: str, max_entries: int, max_s: float):
        self.out = Removal(path)
        self.max_entries = max_entries
        self.deadline = time.monotonic() + max_s
        self.names: list[str] = []  # the path from the top to the folder being cleared

    # -- bookkeeping ----------------------------------------------------------------------------
    def over(self) -> bool:
        if self.out.stopped is None:
            if self.out.removed + self.out.left >= self.max_entries:
                self.out.stopped = f"stopped at the cap of {self.max_entries} entries"
            elif time.monotonic() > self.deadline:
                self.out.stopped = "stopped at the cap on seconds"
        return self.out.stopped is not None

    def leave(self, name: str, exc: OSError | None = None) -> None:
        self.out.left += 1
        if len(self.out.examples) < 3:
            names = self.names if len(self.names) <= 8 else \
                [f"<{len(self.names) - 4} folders>", *self.names[-4:]]
            where = os.path.join(*names, name)
            self.out.examples.append(where + (f" ({exc.strerror})" if exc else ""))

    # -- single entries -------------------------------------------------------------------------
    def unlink(self, fd: int, name: str, is_dir: bool = False) -> bool:
        """Remove the entry ``name`` of the folder ``fd`` (an empty folder if ``is_dir``),
        giving the folder its owner's write permission once if that was what was missing."""
        remove = os.rmdir if is_dir else os.unlink
        for attempt in (0, 1):
            try:
                remove(name, dir_fd=fd)
                self.out.removed += 1
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if attempt == 0 and exc.errno in (errno.EACCES, errno.EPERM):
                    try:
                        os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | _OWNER_RWX)
                        continue
                    except OSError:
                        pass
                self.leave(name, exc)
                return False
        return False

    def open_dir(self, fd: int, name: str, dev: int) -> int | None:
        """The folder ``name`` of ``fd`` opened (its owner's permissions given back if it
        refused), or None when it is left: another file system, or unopenable."""
        for attempt in (0, 1):
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # no folder now: an entry
                    self.unlink(fd, name)
                    return None
                if attempt == 0 and exc.errno == errno.EACCES:
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            os.chmod(name, st.st_mode & 0o7777 | _OWNER_RWX, dir_fd=fd)
                            continue
                    except OSError:
                        pass
                self.leave(name, exc)
                return None
            if os.fstat(child).st_dev != dev:  # a mount point: never cross into it
                os.close(child)
                self.leave(name, OSError(errno.EXDEV, "another file system"))
                return None
            return child
        return None

    def clear(self, fd: int) -> list:
        """Remove every entry of ``fd`` that is not a folder; return the folders' names."""
        try:
            fh = os.scandir(fd)
        except OSError:
            try:
                os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | _OWNER_RWX)
                fh = os.scandir(fd)
            except OSError as exc:
                self.leave(".", exc)
                return []
        entries = []
        with fh:
            for entry in fh:  # read first, removed after: no removal while the folder is read
                entries.append(entry)
                if self.out.removed + self.out.left + len(entries) >= self.max_entries:
                    break
        subdirs = []
        for entry in entries:
            if self.over():
                break
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.name)
            else:
                self.unlink(fd, entry.name)
        return subdirs

    # -- the walk -------------------------------------------------------------------------------
    def tree(self, top_parent: int, name: str) -> None:
        """Remove ``name`` of the folder ``top_parent``: depth first, one folder descriptor
        open at a time (a parent is reached again through ``..``, checked to be the same)."""
        try:
            st = os.stat(name, dir_fd=top_parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            self.unlink(top_parent, name)
            return
        fd = self.open_dir(top_parent, name, st.st_dev)
        if fd is None:
            return
        self.names = [name]
        stack = [_Frame(name, st.st_dev, st.st_ino, self.clear(fd))]
        try:
            while stack and not self.over():
                frame = stack[-1]
                if frame.subdirs:
                    child = frame.subdirs.pop()
                    cfd = self.open_dir(fd, child, st.st_dev)
                    if cfd is not None:
                        os.close(fd)
                        fd, cst = cfd, os.fstat(cfd)
                        self.names.append(child)
                        stack.append(_Frame(child, cst.st_dev, cst.st_ino, self.clear(fd)))
                    continue
                stack.pop()
                self.names.pop()
                up = os.open("..", _DIR, dir_fd=fd) if stack else None
                os.close(fd)
                fd = up
                if stack:
                    ust = os.fstat(up)
                    if (ust.st_dev, ust.st_ino) != (stack[-1].dev, stack[-1].ino):
                        self.out.stopped = "stopped: a folder was moved while it was removed"
                        return
                self.unlink(fd if stack else top_parent, frame.name, is_dir=True)
        except OSError as exc:
            self.out.stopped = f"stopped: {exc.strerror}"
        finally:
            if fd is not None:
                os.close(fd)


def remove_tree(path: str | os.PathLike, *, max_entries: int = MAX_REMOVE_ENTRIES,
                max_s: float = MAX_REMOVE_S, warn: bool = True) -> Removal:
    """Remove ``path`` and everything beneath it, never following a link (a link is removed,
    not what it points to) and never raising for what it finds. What it cannot remove, or
    leaves at the cap of ``max_entries`` entries or ``max_s`` seconds, stays in place and is
    reported in one ``CleanupWarning`` line (unless ``warn`` is false) and in the result."""
    path = os.fspath(path)
    parent, name = os.path.split(os.path.abspath(path))
    remover = _Remover(path, max_entries, max_s)
    try:
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            remover.leave(path, exc)
    else:
        try:
            remover.tree(top, name)
        except OSError as exc:  # the top itself could not be looked at
            remover.leave(name, exc)
        finally:
            os.close(top)
    out = remover.out
    if warn and not out.complete:
        warnings.warn(CleanupWarning(out.summary()), stacklevel=2)
    return out


# -- a quota ------------------------------------------------------------------------------------
@dataclass
class TreeUsage:
    """What a folder holds, counted until a limit was passed (then ``over`` says which)."""

    depth: int = 0
    entries: int = 0
    bytes: int = 0  # on disk (allocated blocks: a sparse file counts what it holds)
    over: str | None = None


def tree_usage(path: str | os.PathLike, *, max_depth: int, max_entries: int,
               max_bytes: int) -> TreeUsage:
    """Count the folders, files and bytes beneath ``path`` (links not followed), stopping as
    soon as one passes its limit: at most ``max_depth`` + 1 folders are open at a time and at
    most ``max_entries`` + 1 entries are looked at. A folder that refuses this user (a
    candidate's chmod 000, to hide what it holds) is given back its owner's permissions first;
    one that still cannot be read counts as empty."""
    use = TreeUsage()
    parent, name = os.path.split(os.path.abspath(path))
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return use
    try:
        top = _open_readable(pfd, name)
    finally:
        os.close(pfd)
    if top is None:
        return use
    stack = [(top, 0, _children(top, max_entries))]
    try:
        while stack and use.over is None:
            fd, depth, pending = stack[-1]
            if not pending:
                os.close(stack.pop()[0])
                continue
            name, is_dir, blocks = pending.pop()
            use.entries += 1
            use.bytes += blocks * 512
            use.depth = max(use.depth, depth + 1)
            if use.entries > max_entries:
                use.over = f"more than {max_entries} entries"
            elif use.bytes > max_bytes:
                use.over = f"more than {max_bytes >> 20} MiB"
            elif use.depth > max_depth:
                use.over = f"folders more than {max_depth} deep"
            elif is_dir:
                child = _open_readable(fd, name)
                if child is None:
                    continue
                stack.append((child, depth + 1, _children(child, max_entries)))
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return use


def _open_readable(fd: int, name: str) -> int | None:
    """The folder ``name`` of ``fd`` opened (never through a link), with its owner's read,
    write and search permissions given back where it lacked them; None if it cannot be."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            return None
        if st.st_mode & _OWNER_RWX != _OWNER_RWX and st.st_uid == os.geteuid():
            os.chmod(name, st.st_mode & 0o7777 | _OWNER_RWX, dir_fd=fd)
        return os.open(name, _DIR, dir_fd=fd)
    except OSError:
        return None


def _children(fd: int, limit: int = 1 << 30) -> list:
    """(name, is a folder, 512-byte blocks) of up to ``limit`` + 1 entries of the folder
    ``fd``; [] when it cannot be read."""
    out = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append((entry.name, stat.S_ISDIR(st.st_mode), st.st_blocks))
                if len(out) > limit:
                    break
    except OSError:
        pass
    return out
