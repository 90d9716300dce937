"""A columnar cache of validated logs: a second load of the same bytes skips parsing.

A log loaded with ``load_log(path, cache=True)`` (``open_log`` and the command line do) leaves
its tables in Arrow IPC files, in a folder named after the log file and a SHA-256 of its bytes:

    <log folder>/.gfsim-cache/<log file>.<sha256 prefix>/   (beside the log)
    <user cache>/gfsim/logs/<sha256>/                     (shipped logs, read-only folders)

where the user cache is ``$GFSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME``, else ``~/.cache``. A load
hashes the log's bytes (about 0.7 s per GB here) and reads the folder only if its manifest's seal
verifies under this user's key (``replay_logs.seal``: a folder that came with the log from someone
else is never believed) and the manifest names that hash, this cache format and this version of
gfsim, so an edited log (one byte is enough) is parsed again and its old folder replaced; each table
must match the SHA-256 the manifest gives it. A folder is written under a temporary name and renamed
into place, so a reader never sees half of one; a folder that cannot be read is ignored (and
replaced). ``GFSIM_LOG_CACHE=off`` turns caching off.

The hash is remembered, sealed, beside the folder (``<log file>.sha256.json``) with the file's
status (size, inode, device, modification and change times in nanoseconds); a load whose file has
that status, taken at least two seconds after both times (``known_digest``), skips reading and
hashing the bytes. Any write changes the change time, so an edited log is hashed again. The folder
also keeps what replays derive from the log (``replay_logs.derived``).

Columns keep their pandas dtype: numbers and booleans as Arrow numbers, strings as Arrow
strings, and object columns (free-form values such as ``imputed_by`` or unknown fields) as
one JSON text per cell, so a cached table equals a freshly built one exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec

from gfsim.core.durable import fsync_dir, owned_tempdir
from gfsim.core.folders import remove_tree
from gfsim.replay_logs import seal
import numpy as np
import pandas as pd

__all__ = ["load", "store", "cache_dir_for", "FORMAT"]

FORMAT = 3  # bump when the tables a load builds change (2: truncated logs are not cached;
#            3: every file sealed, replay_logs.seal)
_TABLES = ("candidates", "forecasts", "decisions", "evaluations", "forecast_errors")
_MANIFEST = "manifest.json"
_SEAL = "manifest.seal"  # the manifest's seal; the manifest holds each table's SHA-256


def _enabled() -> bool:
    """Caching is on unless ``GFSIM_LOG_CACHE`` turns it off, and only with a key to seal
    what is cached (``replay_logs.seal``)."""
    return (os.environ.get("GFSIM_LOG_CACHE", "on").lower() not in ("off", "0", "no", "false")
            and seal.available())


_user_cache = seal.user_cache


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


# -- the digest of unchanged bytes, remembered by the file's status ------------------------------
# Hashing a log costs about 0.2 s per 100,000 candidates, as much as reading its cached tables.
# A file's status (size, inode, modification and change times to the nanosecond) changes with
# any write, so a digest taken when the status was S still names the bytes while the status is
# S. As in git's index, a status is trusted only if both times were at least _RACY_NS older than
# the moment the bytes were read: a write within the file system's timestamp granularity after
# the hash would otherwise leave the times as they were.
_RACY_NS = 2_000_000_000


def _status(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def _memo_parts(path: str, digest: str, status: list, read_ns: int) -> tuple[bytes, ...]:
    return (path.encode("utf-8", "surrogateescape"), digest.encode(),
            json.dumps(status).encode(), str(read_ns).encode())


def _memo_path(path: Path) -> Path:
    if not _shipped(path):
        return path.parent / ".gfsim-cache" / f"{path.name}.sha256.json"
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
    return _user_cache() / "logs" / f"{name}.json"


def known_digest(path: str | os.PathLike, st: os.stat_result) -> str | None:
    """The SHA-256 of the file's bytes as remembered for status ``st``, or None (none kept, a
    different status, a memo too close in time to its read to be trusted, caching off)."""
    if not _enabled():
        return None
    path = Path(path)
    try:
        memo = msgspec.json.decode(_memo_path(path).read_bytes())
        if (memo["path"] == str(path.resolve()) and memo["status"] == _status(st)
                and max(st.st_mtime_ns, st.st_ctime_ns) + _RACY_NS <= memo["read_ns"]):
            digest = memo["sha256"]
            if not (isinstance(digest, str) and len(digest) == 64 and seal.verify(
                    memo.get("seal"), *_memo_parts(memo["path"], digest, memo["status"],
                                                   memo["read_ns"]))):
                return None
            return digest
    except (OSError, ValueError, KeyError, TypeError, msgspec.DecodeError):
        pass
    return None


def remember_digest(path: str | os.PathLike, digest: str, before: os.stat_result,
                    after: os.stat_result, read_ns: int) -> None:
    """Keep ``digest`` for the file's status, if the status did not change while the bytes
    were read (``before``, ``after``; ``read_ns``: wall-clock time before the read)."""
    if not _enabled() or _status(before) != _status(after):
        return
    path = Path(path)
    memo = _memo_path(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".tmp-{os.getpid()}-{memo.name}")
        where, status = str(path.resolve()), _status(before)
        mac = seal.seal(*_memo_parts(where, digest, status, read_ns))
        if mac is None:
            return
        tmp.write_bytes(msgspec.json.encode({"path": where, "sha256": digest, "status": status,
                                             "read_ns": read_ns, "seal": mac}))
        os.replace(tmp, memo)
    except OSError:
        pass


_DATA = Path(__file__).resolve().parent / "data"  # the shipped logs, package data


def _shipped(path: Path) -> bool:
    try:
        return path.resolve().parent == _DATA
    except OSError:
        return False


def cache_dir_for(path: str | os.PathLike, digest: str) -> list[Path]:
    """Where the cache of the log at ``path`` with these bytes may be, in the order tried:
    beside the log (unless it is shipped package data), then the user cache."""
    path = Path(path)
    places = []
    if not _shipped(path):
        places.append(path.parent / ".gfsim-cache" / f"{path.name}.{digest[:16]}")
    places.append(_user_cache() / "logs" / digest)
    return places


def _version() -> str:
    from gfsim import __version__

    return __version__


def load(path: str, raw: bytes | None, digest: str | None = None) -> dict | None:
    """The cached parts of a ``ReplayLog`` of these bytes (its fields, by name, and under
    ``"_folder"`` the folder they were read from), or None (no cache, or a stale or damaged
    one). ``digest``: the SHA-256 of ``raw`` if the caller has it."""
    if not _enabled():
        return None
    digest = digest or _digest(raw)
    for folder in cache_dir_for(path, digest):
        try:
            body = (folder / _MANIFEST).read_bytes()
            if not seal.verify((folder / _SEAL).read_text("ascii").strip(), body):
                continue  # not written by this user's gfsim (forged), or damaged
            manifest = msgspec.json.decode(body)
        except (OSError, ValueError, msgspec.DecodeError):
            continue
        if (manifest.get("sha256") != digest or manifest.get("format") != FORMAT
                or manifest.get("gfsim") != _version()):
            continue
        try:
            return {**_read(folder, manifest), "_folder": folder}
        except Exception:  # noqa: BLE001 - a damaged cache is never trusted, only replaced
            continue
    return None


def store(path: str, raw: bytes | None, log, digest: str | None = None) -> Path | None:
    """Write ``log``'s tables to the first writable cache folder; returns it (None if none
    could be written: caching is a speed-up, never a reason to fail a load)."""
    if not _enabled():
        return None
    digest = digest or _digest(raw)
    for folder in cache_dir_for(path, digest):
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = owned_tempdir(".tmp-", dir=folder.parent)  # a killed writer's is removed
        except OSError:
            continue
        try:
            _write(tmp, digest, log)
            _replace_stale(folder)
            try:
                os.rename(tmp, folder)
                fsync_dir(folder.parent)
            except OSError:  # another process wrote the same bytes' cache first
                remove_tree(tmp)
            return folder
        except OSError:
            remove_tree(tmp)
            continue
    return None


def _replace_stale(folder: Path) -> None:
    """Remove this log's caches of other bytes (a log beside its cache has one at a time)."""
    if folder.parent.name != ".gfsim-cache":
        return
    stem = folder.name.rsplit(".", 1)[0]
    for other in folder.parent.glob(f"{stem}.*"):
        if other.is_dir() and not other.is_symlink() and other != folder and \
                len(other.name) == len(folder.name):
            remove_tree(other)


# -- tables <-> Arrow --------------------------------------------------------------------------
def _kind(series: pd.Series) -> str:
    d = series.dtype
    if isinstance(d, pd.StringDtype):
        return "str"
    if d == np.dtype(object):
        return "json"
    return "num"


def _write(folder: Path, digest: str, log) -> None:
    import pyarrow as pa
    import pyarrow.feather as feather

    tables = {}
    for name in _TABLES:
        df = getattr(log, name)
        cols, kinds = {}, {}
        for c in df.columns:
            s = df[c]
            kind = kinds[c] = _kind(s)
            if kind == "str":
                cols[c] = pa.array(s.array)
            elif kind == "json":
                values = s.tolist()
                if all(v is None for v in values):
                    kinds[c] = "none"
                    cols[c] = pa.nulls(len(values), pa.null())
                else:
                    cols[c] = pa.array([msgspec.json.encode(v) for v in values], pa.binary())
            else:
                cols[c] = pa.array(s.to_numpy())
        table = pa.table(cols) if cols else pa.table({})
        sink = pa.BufferOutputStream()
        feather.write_feather(table, sink, compression="uncompressed")
        blob = sink.getvalue()
        (folder / f"{name}.arrow").write_bytes(blob)
        tables[name] = {"columns": list(df.columns), "kinds": kinds, "rows": len(df),
                        "dtypes": {c: str(df[c].dtype) for c in df.columns},
                        "sha256": hashlib.sha256(blob).hexdigest()}
    manifest = {"sha256": digest, "format": FORMAT, "gfsim": _version(), "header": log.header,
                "runs": log.runs, "steps": log.steps, "counts": log.counts, "tables": tables}
    # The manifest and its seal come last: a folder without them is never read.
    body = msgspec.json.encode(manifest)
    mac = seal.seal(body)
    if mac is None:
        raise OSError("no key to seal the cache with")
    (folder / _MANIFEST).write_bytes(body)
    (folder / _SEAL).write_text(mac, "ascii")


def _read(folder: Path, manifest: dict) -> dict:
    import pyarrow as pa
    import pyarrow.feather as feather

    frames = {}
    for name in _TABLES:
        spec = manifest["tables"][name]
        blob = (folder / f"{name}.arrow").read_bytes()
        if hashlib.sha256(blob).hexdigest() != spec["sha256"]:  # the sealed manifest's
            raise ValueError(f"{name}.arrow is not the table its manifest sealed")
        table = feather.read_table(pa.BufferReader(blob), memory_map=False)
        data = {}
        for c in spec["columns"]:
            kind = spec["kinds"][c]
            col = table.column(c)
            if kind == "str":
                data[c] = pd.array(col.combine_chunks(), dtype=pd.StringDtype(na_value=np.nan))
            elif kind == "none":
                data[c] = np.full(spec["rows"], None, dtype=object)
            elif kind == "json":
                values = np.empty(spec["rows"], dtype=object)
                cells = col.to_pylist()
                if None in cells:
                    values[:] = [None if v is None else msgspec.json.decode(v) for v in cells]
                else:  # every cell is one JSON text: decoded as one array, in one call
                    values[:] = msgspec.json.decode(b"[" + b",".join(cells) + b"]")
                data[c] = values
            else:  # a writable copy: callers may change what a frame gives them
                data[c] = np.array(col.to_numpy())
        df = pd.DataFrame(data, columns=spec["columns"]) if spec["columns"] else pd.DataFrame(
            index=range(spec["rows"]))
        for c in spec["columns"]:
            if spec["kinds"][c] in ("json", "none"):
                df[c] = pd.Series(df[c].to_numpy(), dtype=object)
        if len(df) != spec["rows"]:
            raise ValueError("a cached table has the wrong number of rows")
        frames[name] = df
    return {"header": manifest["header"], "runs": manifest["runs"], "steps": manifest["steps"],
            "counts": manifest["counts"], **frames}
