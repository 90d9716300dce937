"""A per-user secret that seals what gfsim caches, so that a cache gfsim did not write is
never believed.

The table cache and what replays derive from it (``replay_logs.cache``,
``replay_logs.derived``) live beside a log, where anyone who hands over the log can hand over
a cache folder too: a digest of the log's bytes in a manifest proves nothing, since whoever
forged the tables can write the digest as well. Every cache file therefore carries an
HMAC-SHA256 of its contents under a 32-byte key that only this user's gfsim knows
(``<user cache>/gfsim/seal.key``, mode 0600, made on first use). A file whose seal does not
verify (forged, damaged, or written by another user's gfsim) is treated as absent and
rebuilt. Without a usable key nothing is cached.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import stat
from pathlib import Path

__all__ = ["seal", "verify", "available", "user_cache"]

_KEY_BYTES = 32


def user_cache() -> Path:
    """The user's gfsim cache folder: ``$GFSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/gfsim``, else
    ``~/.cache/gfsim``."""
    base = os.environ.get("GFSIM_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gfsim"


def _key_path() -> Path:
    return user_cache() / "seal.key"


@functools.lru_cache(maxsize=4)
def _key_at(path: Path) -> bytes | None:
    """The key kept at ``path``, made there (atomically, 0600) if there is none; None if it
    cannot be made or is not this user's private regular file of 32 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return _make(path)
    except OSError as exc:
        return _unusable(path, exc.strerror or type(exc).__name__)
    try:  # (fstat before open(): open() of a folder's descriptor raises IsADirectoryError)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _unusable(path, "not a regular file (a folder?)")
        if info.st_uid != os.getuid() or info.st_mode & 0o077 or info.st_size != _KEY_BYTES:
            return _unusable(path, f"not this user's private (0600) file of {_KEY_BYTES} bytes")
        key = os.read(fd, _KEY_BYTES + 1)
    except OSError as exc:
        return _unusable(path, exc.strerror or type(exc).__name__)
    finally:
        os.close(fd)
    return key if len(key) == _KEY_BYTES else _unusable(path, "changed while read")


def _unusable(path: Path, why: str) -> None:
    """No key, said once per process in one line (never a traceback): without one nothing is
    cached, and every replay of a log parses it afresh."""
    import warnings

    warnings.warn(f"{path}: the cache's key is {why}; nothing is cached (remove it, and gfsim "
                  "makes a new key)", stacklevel=3)
    return None


def _make(path: Path) -> bytes | None:
    tmp = path.with_name(f".seal-{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as fh:
            fh.write(os.urandom(_KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if another process made one first: theirs is used
        except FileExistsError:
            pass
    except OSError:
        return None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    _key_at.cache_clear()
    return _key_at(path)


def _key() -> bytes | None:
    return _key_at(_key_path())


def available() -> bool:
    """Whether a key can be had (else nothing may be cached)."""
    return _key() is not None


def seal(*parts: bytes) -> str | None:
    """The hex HMAC-SHA256 of ``parts`` (each length-prefixed, so that no two ways of cutting
    the same bytes seal alike), or None without a key."""
    key = _key()
    if key is None:
        return None
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.hexdigest()


def verify(mac, *parts: bytes) -> bool:
    """Whether ``mac`` is the seal of ``parts`` under this user's key."""
    expected = seal(*parts)
    return (expected is not None and isinstance(mac, str)
            and hmac.compare_digest(mac, expected))
