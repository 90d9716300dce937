"""What a replay derives from a cached log (its traces, its replays), kept beside its tables.

A log loaded through the columnar cache (``replay_logs.cache``) carries the SHA-256 of its
bytes and the folder of its tables. A later process that replays the same bytes the same way
rebuilds the same traces and simulates the same searches; this module keeps such derived
things in that folder, one file each:

    <table cache folder>/derived/<code digest>-<format>/<kind>-<blake2b of the key>.bin

A file holds its full key, a CRC-32 of its payload and a seal of both under this user's key
(``replay_logs.seal``). ``load`` returns the object only if the key it asks with equals the
stored one and the payload's digest and seal match: a stale file (another key), a damaged or
forged one (any byte) or one this code cannot decode is treated as absent
and overwritten by the caller's ``store``. Every key carries the log's SHA-256, the format of
this module, the gfsim version and a digest of gfsim's source (``code_digest``): a change to
the simulator, a policy or a cost model between two runs invalidates what earlier code
derived, even if the version number stayed the same. ``GFSIM_LOG_CACHE=off`` turns this off
with the table cache. Files are written under a temporary name and renamed into place.

Payloads are MessagePack; long lists of one plain number type and numpy arrays travel as raw
bytes (so a 100,000-row column decodes in a millisecond), tuples and numpy scalars keep their
type, and the dataclasses a caller names are rebuilt from their fields: an object decodes to
one equal to what was stored, value for value and type for type.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import struct
import zlib
from pathlib import Path

import msgspec
import numpy as np

from gfsim.replay_logs import seal

__all__ = ["FORMAT", "code_digest", "source_of", "attach_source", "load", "store",
           "pack", "unpack"]

FORMAT = 2  # bump when the payload encoding changes (2: sealed, replay_logs.seal)
_MAGIC = b"GFSIMDV1"
_SUBDIR = "derived"
# The packages whose code decides what a replay derives (hashed into every key).
_PACKAGES = ("gfsim", "gfsim.core", "gfsim.replay_logs", "gfsim.cost_models", "gfsim.forecasts",
             "gfsim.policies", "gfsim.simulator")


def _enabled() -> bool:
    return os.environ.get("GFSIM_LOG_CACHE", "on").lower() not in ("off", "0", "no", "false")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """BLAKE2b of the source of the packages replays run through (read once per process)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        folders = list(spec.submodule_search_locations or []) if spec else []
        for folder in folders:
            for path in sorted(Path(folder).glob("*.py")):
                digest.update(f"{name}/{path.name}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def _version() -> str:
    from gfsim import __version__

    return __version__


# -- a log's source -----------------------------------------------------------------------------
_TABLES = ("candidates", "forecasts", "decisions", "evaluations", "forecast_errors")


def attach_source(log, digest: str, folder: Path) -> None:
    """Mark ``log`` as the tables of the bytes with SHA-256 ``digest``, cached in ``folder``.
    The mark holds only while the log's tables are the objects loaded (``source_of``): a copy
    (``dataclasses.replace``) does not carry it, and a table swapped for another drops it."""
    log.__dict__["_derived_source"] = (digest, Path(folder),
                                       tuple(id(getattr(log, t)) for t in _TABLES),
                                       tuple(getattr(log, t) for t in _TABLES))


def source_of(log) -> tuple[str, Path] | None:
    """(SHA-256 of the log's bytes, its table cache folder) if ``log`` is a log as loaded from
    that cache and derived things may be cached for it; else None."""
    if not _enabled():
        return None
    mark = log.__dict__.get("_derived_source")
    if mark is None:
        return None
    digest, folder, ids, _tables = mark
    if tuple(id(getattr(log, t)) for t in _TABLES) != ids:
        return None
    return digest, folder


def _file(folder: Path, kind: str, key: dict) -> tuple[Path, bytes]:
    """The file of ``key``: in a folder per code digest and format, so that what older code
    derived is removed as a whole when newer code stores (``_prune``)."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
    name = hashlib.blake2b(text, digest_size=12).hexdigest()
    return folder / _SUBDIR / f"{key['code']}-{key['format']}" / f"{kind}-{name}.bin", text


def _prune(code_folder: Path) -> None:
    """Remove the folders other code (or another format) left beside ``code_folder``: their
    keys can never match again, and each holds traces and replays as large as the log."""
    from gfsim.core.folders import remove_tree

    try:
        others = [p for p in code_folder.parent.iterdir() if p.is_dir() and p != code_folder]
    except OSError:
        return
    for other in others:
        if not other.is_symlink():
            remove_tree(other)


def full_key(log_digest: str, key: dict) -> dict:
    return {**key, "log_sha256": log_digest, "format": FORMAT, "gfsim": _version(),
            "code": code_digest()}


def _where(log, kind: str, key: dict):
    """(file, full key text) of ``key`` beside ``log``'s tables, or None: no source."""
    source = source_of(log)
    if source is None:
        return None
    digest, folder = source
    return _file(folder, kind, full_key(digest, key))


def load(log, kind: str, key: dict, classes=(), external: dict | None = None):
    """The object stored for ``key`` beside ``log``'s tables, or None (no source, no file, a
    stale or damaged file). ``external`` may be a function that gives it, called only where
    a stored object is there to read."""
    where = _where(log, kind, key)
    if where is None:
        return None
    path, text = where
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        if blob[:8] != _MAGIC:
            return None
        (n,) = struct.unpack_from("<I", blob, 8)
        head = json.loads(blob[12:12 + n])
        payload = memoryview(blob)[12 + n:]
        if head.get("key") != text.decode():
            return None
        if zlib.crc32(payload) != head.get("crc32") or not seal.verify(
                head.get("seal"), text, payload):
            return None  # damaged, or not written by this user's gfsim
        return unpack(payload, classes, external() if callable(external) else external)
    except Exception:  # noqa: BLE001 - a damaged file is never trusted, only replaced
        return None


def store(log, kind: str, key: dict, obj, classes=(), external: dict | None = None,
          lazy: dict | None = None) -> Path | None:
    """Keep ``obj`` for ``key`` beside ``log``'s tables; the file's path, or None when it
    cannot be kept (no source, an unwritable folder, a value the encoding does not cover):
    caching is a speed-up, never a reason to fail. ``external`` may be a function that gives
    it, called only where the object is to be kept."""
    where = _where(log, kind, key)
    if where is None:
        return None
    path, text = where
    if callable(external):
        external = external()
    try:
        payload = pack(obj, classes, external, lazy)
    except (TypeError, ValueError, OverflowError, KeyError, msgspec.EncodeError):
        return None
    mac = seal.seal(text, payload)
    if mac is None:
        return None
    head = json.dumps({"key": text.decode(), "crc32": zlib.crc32(payload),
                       "seal": mac}).encode()
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        if not path.parent.exists():
            _prune(path.parent)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack("<I", len(head)) + head + payload)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return None
    return path


# -- the encoding -------------------------------------------------------------------------------
(_FLOATS, _INTS, _BOOLS, _ARRAY, _OBJECTS, _TUPLE, _SCALAR, _DATACLASS, _CODES, _DEF, _REF,
 _EXTERNAL, _LAZY_DATACLASS) = range(1, 14)
_PLAIN = {str, type(None), float, int, bool}
_TEXT = {str, type(None)}
_I64 = (-(2 ** 63), 2 ** 63 - 1)


class Lazy:
    """A dataclass whose fields may arrive undecoded (``pack``'s ``lazy``): a field is decoded
    on first access (``__getattr__`` runs only for attributes not set), so a replay that
    reads its cached results' figures never pays for their per-candidate tables. Pickling
    and copying decode every field first."""

    def __getattr__(self, name: str):
        pending = self.__dict__.get("_lazy")
        if pending and name in pending:
            data, decode = pending.pop(name)
            value = decode(data)
            self.__dict__[name] = value
            return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        for name in list(self.__dict__.get("_lazy") or ()):
            getattr(self, name)
        return {k: v for k, v in self.__dict__.items() if k != "_lazy"}


class _Wire:
    """One encoding's state: the dataclasses it may rebuild, the lists it has written (a list
    met twice is written once: the decoded object shares it where the stored one did) and the
    lists of other objects it refers to by name instead (``external``)."""

    def __init__(self, classes, external=None, lazy=None):
        self.names = {c.__name__: c for c in classes}
        self.lazy = lazy or {}
        self.external = external or {}
        self.seen: dict[int, int] = {}
        self.keep: list = []  # the lists seen, alive while their ids are keys


def pack(obj, classes=(), external: dict | None = None, lazy: dict | None = None) -> bytes:
    """MessagePack of ``obj`` (see the module's docstring); raises TypeError on a value it
    does not cover. ``external``: ``{id(a list): its name}`` for lists the decoder is given
    (``unpack``'s ``external``) rather than read. ``lazy``: ``{class name: field names}``
    decoded only when read (the class must derive from ``Lazy``)."""
    return msgspec.msgpack.encode(_to_wire(obj, _Wire(classes, external, lazy)))


def unpack(payload, classes=(), external: dict | None = None):
    return _decoder(classes, external)(payload)


def _decoder(classes, external):
    """A decoding function for one MessagePack document (its own table of shared lists)."""
    names = {c.__name__: c for c in classes}
    lists: dict[int, list] = {}

    def hook(code: int, data: memoryview):
        if code == _CODES:
            values, codes = msgspec.msgpack.decode(data)
            table = np.empty(len(values), dtype=object)
            table[:] = values
            return table[np.frombuffer(codes, dtype="<i4")].tolist()
        if code == _DEF:
            no, value = dec(data)
            lists[no] = value
            return value
        if code == _REF:
            return lists[msgspec.msgpack.decode(data)]
        if code == _EXTERNAL:
            return external[tuple(msgspec.msgpack.decode(data))]
        if code == _FLOATS:
            return np.frombuffer(data, dtype="<f8").tolist()
        if code == _INTS:
            return np.frombuffer(data, dtype="<i8").tolist()
        if code == _BOOLS:
            return np.frombuffer(data, dtype=np.bool_).tolist()
        if code == _ARRAY:
            dtype, shape, raw = msgspec.msgpack.decode(data)
            return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        if code == _OBJECTS:
            items = dec(data)
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out
        if code == _TUPLE:
            return tuple(dec(data))
        if code == _SCALAR:
            dtype, raw = msgspec.msgpack.decode(data)
            return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
        if code == _DATACLASS:
            name, fields = dec(data)
            return names[name](**fields)
        if code == _LAZY_DATACLASS:
            name, fields, later = dec(data)
            obj = names[name].__new__(names[name])
            obj.__dict__.update(fields)
            # (views into the file's bytes, kept alive by them: no copy)
            obj.__dict__["_lazy"] = {k: (v, _decoder(classes, external))
                                     for k, v in later.items()}
            return obj
        raise ValueError(f"unknown extension {code}")

    def dec(data):
        return msgspec.msgpack.decode(data, ext_hook=hook)

    return dec


def _ext(code: int, value) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, msgspec.msgpack.encode(value))


def _to_wire(v, w: _Wire):
    t = type(v)
    if t in _PLAIN:
        return v
    if t is list:
        if len(v) < 8:
            return _list(v, w)
        if id(v) in w.external:
            return _ext(_EXTERNAL, list(w.external[id(v)]))
        if id(v) in w.seen:
            return _ext(_REF, w.seen[id(v)])
        no = w.seen[id(v)] = len(w.seen)
        w.keep.append(v)
        return msgspec.msgpack.Ext(_DEF, msgspec.msgpack.encode([no, _list(v, w)]))
    if t is tuple:
        return _ext(_TUPLE, [_to_wire(x, w) for x in v])
    if t is dict:
        if not all(type(k) is str for k in v):
            raise TypeError("only dicts with str keys are cached")
        return {k: _to_wire(x, w) for k, x in v.items()}
    if t is np.ndarray:
        if v.dtype == object:
            if v.ndim != 1:
                raise TypeError("only 1-D object arrays are cached")
            return _ext(_OBJECTS, _to_wire(v.tolist(), w))
        if v.dtype.hasobject or v.dtype.kind not in "biuf":
            raise TypeError(f"arrays of {v.dtype} are not cached")
        arr = np.ascontiguousarray(v)
        return _ext(_ARRAY, [arr.dtype.str, list(arr.shape), arr.tobytes()])
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return _ext(_SCALAR, [v.dtype.str, v.tobytes()])
    if dataclasses.is_dataclass(v) and w.names.get(t.__name__) is t:
        later = w.lazy.get(t.__name__, ())
        fields = {f.name: _to_wire(getattr(v, f.name), w)
                  for f in dataclasses.fields(v) if f.init and f.name not in later}
        if not later:
            return _ext(_DATACLASS, [t.__name__, fields])
        if not issubclass(t, Lazy):
            raise TypeError(f"{t.__name__} does not decode lazily")
        shadowed = [f for f in later if hasattr(t, f)]
        if shadowed:  # a class default would be read instead of the undecoded field
            raise TypeError(f"{t.__name__}.{shadowed[0]} has a default: it cannot be lazy")
        # A lazy field is its own MessagePack document, with its own shared lists (a list it
        # shares with another field is written in both).
        docs = {}
        outer = w.seen, w.keep
        for f in later:
            w.seen, w.keep = {}, []
            docs[f] = msgspec.msgpack.encode(_to_wire(getattr(v, f), w))
        w.seen, w.keep = outer
        return _ext(_LAZY_DATACLASS, [t.__name__, fields, docs])
    raise TypeError(f"{t.__name__} values are not cached")


def _list(v: list, w: _Wire):
    kinds = set(map(type, v))
    if len(v) >= 8 and len(kinds) == 1:
        (k,) = kinds
        if k is float:
            return msgspec.msgpack.Ext(_FLOATS, np.array(v, dtype="<f8").tobytes())
        if k is bool:
            return msgspec.msgpack.Ext(_BOOLS, np.array(v, dtype=np.bool_).tobytes())
        if k is int and _I64[0] <= min(v) and max(v) <= _I64[1]:
            return msgspec.msgpack.Ext(_INTS, np.array(v, dtype="<i8").tobytes())
    if len(v) >= 8 and kinds <= _TEXT:
        values = dict.fromkeys(v)
        if len(values) <= len(v) // 4:  # few distinct texts (states, outcomes, ids of a search)
            index = {x: i for i, x in enumerate(values)}
            codes = np.fromiter(map(index.__getitem__, v), dtype="<i4", count=len(v))
            return _ext(_CODES, [list(values), codes.tobytes()])
    if kinds <= _PLAIN:
        return v
    return [_to_wire(x, w) for x in v]
