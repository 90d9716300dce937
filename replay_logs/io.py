"""Reading and writing replay logs as JSON Lines (``.jsonl`` or ``.jsonl.gz``).

Writing is append-only and crash-safe: every record is flushed and fsynced before ``append``
returns. Reading tolerates exactly one kind of damage, the one a crash leaves: a truncated
*last* line is dropped with a warning. A corrupt line anywhere else is an error naming the file
and line.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import warnings
import zlib
from pathlib import Path
from typing import Iterator

from gfsim.core.durable import fsync_dir
from gfsim.core.errors import LogError
from gfsim.core.inputs import InputError, max_input_bytes, open_file, read_file, size_text

__all__ = ["TruncatedTailWarning", "iter_lines", "iter_records", "read_raw", "decompress",
           "loads_record", "LogWriter", "INT_MIN", "INT_MAX", "MAX_LINE_BYTES",
           "max_input_bytes", "MAX_GZIP_RATIO", "read_input", "iter_input_lines",
           "SIDE_LINE_BYTES", "LogText", "LineChunks", "LINE_CHUNK_BYTES"]

# What a log (and any file an importer reads) may be, beyond gfsim.core.inputs' limits. The
# largest line of the shipped logs is 12 KB (a candidate with its forecast and evaluations)
# and the largest log 4 MB of text (7-9x its gzipped size); the
# limits are far above that and far below what exhausts a laptop. A log's stored bytes are held
# once (GFSIM_MAX_INPUT_BYTES bounds them, and raises the limit for a bigger machine) and its
# text is streamed, a chunk of whole lines at a time (``LogText``, ``LineChunks``); so is a side
# file (``iter_input_lines``); each line is bounded before it is decoded, and a gzip stream
# that inflates more than MAX_GZIP_RATIO times its file's size past the first 64 MiB is
# refused as a gzip bomb (JSON logs compress 5-10x; no real log comes near).
MAX_LINE_BYTES = 64 << 20
MAX_GZIP_RATIO = 100
_RATIO_FLOOR = 64 << 20
_DRAW_BYTES = 8 << 20
_size = size_text


class TruncatedTailWarning(UserWarning):
    """The log's last line was cut short (a crash mid-write); it was dropped."""


def read_raw(path: Path) -> bytes:
    """The file's bytes as stored; one line naming the file if it cannot be read, is not a
    regular file (a FIFO would block for ever, a device never end) or is larger than a log
    may be (``gfsim.core.inputs.read_file``)."""
    try:
        return read_file(path, "log file")
    except InputError as exc:
        raise LogError(exc.path, None, exc.reason) from None


def decompress(path: Path, raw: bytes) -> tuple[bytes, bool]:
    """A log's text bytes (gunzipped if it is gzip) and whether a gzip stream ended early."""
    if not raw.startswith(b"\x1f\x8b"):
        return raw, False
    try:
        return _gunzip_members(raw, _Inflated(path, len(raw)))
    except zlib.error as exc:
        raise LogError(str(path), None, f"corrupt gzip data: {exc}") from None
    except MemoryError:
        raise LogError(str(path), None, "not enough memory to decompress it") from None


class _Inflated:
    """What a log's gzip stream has inflated to so far, refused past the log limit or the
    bomb ratio (module constants)."""

    def __init__(self, path: Path, stored: int):
        self.path, self.total = path, 0
        self.limit = max_input_bytes()
        self.ratio_limit = max(_RATIO_FLOOR, MAX_GZIP_RATIO * stored)

    def room(self) -> int:
        """How many more bytes may come out in one draw (at least 1, so that a limit is seen;
        at most 8 MiB, so that zlib never assembles a large piece of its own to copy)."""
        return max(1, min(self.limit, self.ratio_limit, self.total + _DRAW_BYTES)
                   - self.total + 1)

    def add(self, n: int) -> None:
        self.total += n
        if self.total > self.limit:
            raise LogError(str(self.path), None, f"inflates to more than the {_size(self.limit)} "
                           "gfsim reads (GFSIM_MAX_INPUT_BYTES raises it)")
        if self.total > self.ratio_limit:
            raise LogError(str(self.path), None, f"inflates more than {MAX_GZIP_RATIO}x its "
                           f"size (past {_size(self.total)}): refused as a gzip bomb; "
                           "real logs compress 5-10x")


def _gunzip_members(raw: bytes, budget: _Inflated) -> tuple[bytes, bool]:
    """Decompress member by member, so that a stream cut by a crash still yields what was
    synced, into one growing buffer whose value is handed over without a copy (a list of
    pieces joined at the end held the text twice: 2.15 GB for a 1 GB stream)."""
    out = io.BytesIO()
    cut = False
    for chunk in _inflate(raw, budget):
        if chunk is None:
            cut = True
            break
        out.write(chunk)
    return out.getvalue(), cut


def _inflate(raw: bytes, budget: _Inflated) -> Iterator[bytes | None]:
    """The decompressed pieces of ``raw``'s gzip members, then None if the stream ends early.
    Linear in the file whatever the number of members (a live log appends one per batch):
    each member is fed in slices that grow from 4 KiB, so what zlib copies of the input after
    a member ends is at most one slice. Output is drawn at most ``budget.room()`` bytes at a
    time, so a bomb is refused before it is held."""
    view, n, pos = memoryview(raw), len(raw), 0
    while pos < n:
        d = zlib.decompressobj(wbits=31)
        size = 4096
        while True:
            piece = view[pos:pos + size]
            chunk = d.decompress(piece, budget.room())
            budget.add(len(chunk))
            yield chunk
            while d.unconsumed_tail:
                chunk = d.decompress(d.unconsumed_tail, budget.room())
                budget.add(len(chunk))
                yield chunk
            if d.eof:
                pos += len(piece) - len(d.unused_data)
                break
            pos += len(piece)
            if pos >= n:
                yield None
                return
            size = min(2 * size, 1 << 20)
        while pos < n and raw[pos] == 0:  # padding after a member
            pos += 1


def read_input(path: Path, root: Path | None = None) -> bytes:
    """An input file's text bytes (gunzipped if it is gzip), within the limits a log has: a
    regular file (no FIFO, device, socket or /proc file), bounded stored and inflated size, a
    complete gzip stream. Given ``root`` (a run folder being imported), the file must lie
    inside it, symlinks resolved: a link out of the run is refused, not followed. Errors are
    one line naming the file."""
    path = Path(path)
    _check_inside(path, root)
    data, cut = decompress(path, read_raw(path))
    if cut:
        raise LogError(str(path), None, "gzip stream ends early (a truncated file?)")
    return data


def _check_inside(path: Path, root: Path | None) -> None:
    if root is None:
        return
    try:
        inside = path.resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise LogError(str(path), None, f"leads outside {root} (a symlink?); only the "
                       "run's own files are read")


SIDE_LINE_BYTES = 1 << 20  # what a side file's line may hold before the rest is cut (1 MiB)
_CHUNK_BYTES = 1 << 20
_NOT_NEWLINE = re.compile(rb"[^\n]")


def iter_input_lines(path, root: Path | None = None, *, max_line_bytes: int = SIDE_LINE_BYTES,
                     cut_long: bool = False) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-empty line of an input file (gunzipped if it is
    gzip), streamed: what is held is one chunk and one line, whatever the file's size, so a
    sparse 1 GiB log costs a megabyte, not five gigabytes. A line longer than
    ``max_line_bytes`` is cut there (``cut_long``: a side file's chatter, read for the short
    lines it needs) or refused, one line naming the file and line. The file's limits are
    ``read_input``'s, counted on what is read."""
    path = Path(path)
    _check_inside(path, root)
    line_no, held = 1, bytearray()
    for chunk in _input_chunks(path):
        pos, n = 0, len(chunk)
        while pos < n:
            nl = chunk.find(b"\n", pos)
            end = n if nl < 0 else nl
            room = max_line_bytes - len(held)
            if end - pos > room:
                if not cut_long:
                    raise LogError(str(path), line_no, f"line is longer than the "
                                   f"{_size(max_line_bytes)} a line may hold")
            held += chunk[pos:pos + min(end - pos, room)]
            if nl < 0:
                break
            if held:
                yield line_no, bytes(held)
            held.clear()
            found = _NOT_NEWLINE.search(chunk, nl)  # past a run of newlines at once
            pos = found.start() if found else n
            line_no += pos - nl
    if held:
        yield line_no, bytes(held)


def _input_chunks(path: Path) -> Iterator[bytes]:
    """An input file's text in pieces of about a megabyte, within the input limit counted
    on what was read; a gzip file's stored bytes are held (they are bounded by the same
    limit) and its text inflated piece by piece."""
    try:
        fh, _ = open_file(path, "file")
    except InputError as exc:
        raise LogError(exc.path, None, exc.reason) from None
    limit = max_input_bytes()
    with fh:
        head = fh.read(_CHUNK_BYTES)
        if head.startswith(b"\x1f\x8b"):
            fh.close()
            yield from _inflated_chunks(path, read_raw(path))
            return
        total = len(head)
        piece = head
        while piece:
            yield piece
            piece = fh.read(_CHUNK_BYTES)
            total += len(piece)
            if total > limit:
                raise LogError(str(path), None, f"is above the {_size(limit)} gfsim reads "
                               "(GFSIM_MAX_INPUT_BYTES raises it)")


def _inflated_chunks(path: Path, raw: bytes) -> Iterator[bytes]:
    try:
        for chunk in _inflate(raw, _Inflated(path, len(raw))):
            if chunk is None:
                raise LogError(str(path), None, "gzip stream ends early (a truncated file?)")
            yield chunk
    except zlib.error as exc:
        raise LogError(str(path), None, f"corrupt gzip data: {exc}") from None


def _read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes (decompressed) and whether a gzip stream ended early."""
    return decompress(path, read_raw(path))


_PIECE_BYTES = 8 << 20
LINE_CHUNK_BYTES = 16 << 20  # what a reader decodes at a time (about 20,000 candidates)


class LogText:
    """A log's text, given again on each pass in pieces of at most 8 MiB, never held whole: a
    plain file is read from disk a piece at a time on each pass; a gzip file's stored bytes
    are held once (``raw``) and inflated piece by piece. ``cut``: the text as already read
    (``decompress``'s pair), the stream cut short if True. ``hash_reads``: a pass over a
    plain file also takes the SHA-256 of what it read (``read_digest``), so that a cache
    names the very bytes its tables were read from."""

    def __init__(self, path, raw: bytes | None, cut: bool | None = None):
        self.path, self.raw = Path(path), raw
        self.is_gzip = cut is None and raw is not None and raw.startswith(b"\x1f\x8b")
        self.cut = bool(cut)
        self.hash_reads, self.read_digest = False, None

    @classmethod
    def open(cls, path) -> "LogText":
        """The text of the log file at ``path``, refused in one line as ``read_raw`` refuses
        a file; a gzip file's stored bytes are read now, a plain file's on each pass."""
        path = Path(path)
        try:
            fh, _ = open_file(path, "log file")
            with fh:
                magic = fh.read(2)
        except InputError as exc:
            raise LogError(exc.path, None, exc.reason) from None
        except OSError as exc:
            raise LogError(str(path), None, f"cannot be read ({exc.strerror})") from None
        return cls(path, read_raw(path) if magic == b"\x1f\x8b" else None)

    @classmethod
    def of(cls, path, loaded: "tuple[bytes, bool] | LogText | None") -> "LogText":
        """The text of ``path`` as given (``iter_lines``' ``loaded``), else as read."""
        if isinstance(loaded, LogText):
            return loaded
        if loaded is not None:
            return cls(path, loaded[0], loaded[1])
        return cls.open(path)

    def digest(self) -> str:
        """The SHA-256 of the file's stored bytes (a plain file's read through once)."""
        if self.raw is not None:
            return hashlib.sha256(self.raw).hexdigest()
        hashing, self.hash_reads = self.hash_reads, True
        try:
            for _ in self.pieces():
                pass
        finally:
            self.hash_reads = hashing
        return self.read_digest

    def pieces(self) -> Iterator[bytes | memoryview | None]:
        """The text's pieces, then None if a gzip stream ends early; the inflate limits of
        ``decompress``, and its errors, on the way."""
        if self.raw is None:
            yield from self._file_pieces()
            return
        if not self.is_gzip:
            raw = memoryview(self.raw)  # (pieces of it, not copies)
            for pos in range(0, len(raw), _PIECE_BYTES):
                yield raw[pos:pos + _PIECE_BYTES]
            if self.cut:
                yield None
            return
        try:
            yield from _inflate(self.raw, _Inflated(self.path, len(self.raw)))
        except zlib.error as exc:
            raise LogError(str(self.path), None, f"corrupt gzip data: {exc}") from None
        except MemoryError:
            raise LogError(str(self.path), None, "not enough memory to decompress it") from None

    def _file_pieces(self) -> Iterator[bytes]:
        """A plain file's bytes a piece at a time, within the input limit counted on what
        was read (a file that grows while read is refused past it, as ``read_raw`` does)."""
        path, limit = self.path, max_input_bytes()
        try:
            fh, _ = open_file(path, "log file")
        except InputError as exc:
            raise LogError(exc.path, None, exc.reason) from None
        sha, total = hashlib.sha256() if self.hash_reads else None, 0
        with fh:
            while True:
                try:
                    piece = fh.read(_PIECE_BYTES)
                except OSError as exc:
                    raise LogError(str(path), None, f"cannot be read ({exc.strerror})"
                                   ) from None
                if not piece:
                    break
                total += len(piece)
                if total > limit:
                    raise LogError(str(path), None, f"is above the {_size(limit)} gfsim "
                                   "reads (GFSIM_MAX_INPUT_BYTES raises it)")
                if sha is not None:
                    sha.update(piece)
                yield piece
        if sha is not None:
            self.read_digest = sha.hexdigest()

    def check(self) -> None:
        """Inflate the whole stream once, for what is wrong with the file as a whole (a bomb,
        corrupt gzip data, the input limit): a reader that gave up early says it first."""
        if not self.is_gzip:
            return  # (a plain file's limit is counted as it is read, in order)
        for _ in self.pieces():
            pass


class LineChunks:
    """A log's text in chunks of whole lines, about ``chunk_bytes`` each: iterating gives
    (number of the chunk's first line, its bytes, every line ending in a newline, how many
    lines it holds). Once it
    is exhausted, ``tail`` is the text after the last newline (a line that may be cut),
    ``cut`` whether the gzip stream ended early (its tail is then dropped) and ``newlines``
    how many lines came before the tail. A line longer than ``MAX_LINE_BYTES`` is refused
    by number and size once the lines before it have been given; it is counted, not held."""

    def __init__(self, path, pieces, chunk_bytes: int | None = None):
        self.path, self.pieces_ = Path(path), pieces
        self.chunk_bytes = chunk_bytes or LINE_CHUNK_BYTES
        self.tail, self.cut, self.newlines, self.done = b"", False, 0, False

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        buf, line = bytearray(), 1
        pieces = iter(self.pieces_)
        for piece in pieces:
            if piece is None:
                self.cut = True
                break
            buf += piece
            if len(buf) < self.chunk_bytes:
                continue
            nl = buf.rfind(b"\n")
            if nl < 0:
                if len(buf) > MAX_LINE_BYTES:
                    self._overlong(line, len(buf), pieces)
                    break
                continue
            line = yield from self._give(buf, nl, line)
        nl = buf.rfind(b"\n")
        if nl >= 0:
            line = yield from self._give(buf, nl, line)
        if not self.cut:
            if len(buf) > MAX_LINE_BYTES:
                self._refuse(line, len(buf))
            self.tail = bytes(buf)
        self.newlines, self.done = line - 1, True

    def _give(self, buf: bytearray, nl: int, line: int):
        """Yield ``buf`` up to its newline at ``nl`` and keep the rest; the next line number.
        A line too long is refused once the lines before it are given."""
        long_line = self._first_too_long(buf, nl)
        if long_line is not None:
            start, size = long_line
            if start:
                line = yield from self._give(buf, start - 1, line)
            self._refuse(line, size)
        with memoryview(buf) as view:
            chunk = bytes(view[:nl + 1])
        del buf[:nl + 1]
        n_lines = chunk.count(b"\n")
        yield line, chunk, n_lines
        return line + n_lines

    def _first_too_long(self, buf: bytearray, nl: int) -> tuple[int, int] | None:
        """(start, size) of the first line of ``buf[:nl + 1]`` longer than a line may be.
        Only the first can be, unless the limit was lowered below a chunk: it alone began
        before the last piece, and a piece is far smaller than the limit."""
        if MAX_LINE_BYTES >= self.chunk_bytes + max(_PIECE_BYTES, _DRAW_BYTES + 1):
            first = buf.find(b"\n")
            return (0, first) if first > MAX_LINE_BYTES else None
        pos = 0
        while pos <= nl:
            end = buf.find(b"\n", pos)
            if end - pos > MAX_LINE_BYTES:
                return pos, end - pos
            pos = end + 1
        return None

    def _overlong(self, line: int, held: int, pieces) -> None:
        """Count the rest of a line too long to hold, then refuse it; a line that a cut gzip
        stream ends in is dropped as any cut line is."""
        for piece in pieces:
            if piece is None:
                self.cut = True
                return
            nl = bytes(piece).find(b"\n")
            if nl >= 0:
                self._refuse(line, held + nl)
            held += len(piece)
        self._refuse(line, held)

    def _refuse(self, line: int, size: int):
        raise LogError(str(self.path), line, f"line is {_size(size)}, above the "
                       f"{_size(MAX_LINE_BYTES)} a log's line may hold")


def iter_lines(path: str | os.PathLike, loaded: "tuple[bytes, bool] | LogText | None" = None
               ) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, may_be_cut) of each non-blank line, streamed a chunk at a time
    (``LineChunks``); may_be_cut marks an unterminated last line. ``loaded``: the file's
    (text bytes, cut) if already read, or its ``LogText``."""
    path = Path(path)
    chunks = LineChunks(path, LogText.of(path, loaded).pieces())
    for first, chunk, _ in chunks:
        yield from _chunk_lines(path, chunk, first)
    if chunks.cut:
        # A gzip stream that ends early lost (part of) its last batch even when no partial line
        # was decompressed, so warn here rather than rely on a cut line failing to parse. Text
        # after the last newline of a cut stream is an unfinished write: it was dropped.
        warnings.warn(
            f"{path}: gzip stream ends early (crash during a write?); kept the "
            f"{chunks.newlines} complete lines before the cut",
            TruncatedTailWarning,
            stacklevel=2,
        )
        return
    tail, line_no = chunks.tail, chunks.newlines + 1
    if not tail.strip():
        return
    try:
        text = tail.decode("utf-8")
    except UnicodeDecodeError:
        _warn_tail(path, line_no)
        return
    yield line_no, text, True


def _chunk_lines(path: Path, data: bytes, line_no: int) -> Iterator[tuple[int, str, bool]]:
    """The non-blank lines of a chunk of whole lines, the first numbered ``line_no``. Lines
    are found one at a time (a split would make an object of every blank line: 1 GiB of
    newlines is a billion of them)."""
    counted_to = 0
    for match in _LINE.finditer(data):
        start = match.start()
        line_no += data.count(b"\n", counted_to, start)
        counted_to = start
        raw = match.group()
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LogError(str(path), line_no, f"not valid UTF-8 ({exc.reason} at byte "
                           f"{exc.start})") from None
        yield line_no, text, False


_LINE = re.compile(rb"[^\n]+")


def _warn_tail(path: Path, line: int) -> None:
    warnings.warn(
        f"{path}:{line}: last line is truncated (crash during a write?); dropped it",
        TruncatedTailWarning,
        stacklevel=3,
    )


INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # what a log's integers may be (int64)


class _Unrepresentable(ValueError):
    """A JSON value a log may not hold: NaN, Infinity, a number out of range."""


def _constant(name: str):
    raise _Unrepresentable(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unrepresentable(f"the number {text[:40]} is out of range for a double")
    return value


def _int(text: str) -> int:
    value = int(text) if len(text) <= 20 else None
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise _Unrepresentable(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} "
                               "is outside the 64-bit range")
    return value


def loads_record(text: str) -> dict | list | str | int | float | bool | None:
    """``json.loads`` that refuses NaN, Infinity and numbers a log cannot hold."""
    return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)


def _lone_surrogate(value, where: str = "") -> str | None:
    """The path of the first string in ``value`` that holds a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "(the record)"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
        value, list) else ()
    for k, v in items:
        if isinstance(k, str) and _lone_surrogate(k) is not None:
            return f"{where}.{k!r}" if where else repr(k)
        name = k if not isinstance(k, str) or k.isprintable() else repr(k)  # one line
        found = _lone_surrogate(v, f"{where}[{k}]" if isinstance(k, int)
                                else f"{where}.{name}" if where else name)
        if found is not None:
            return found
    return None


def iter_records(path: str | os.PathLike, loaded: tuple[bytes, bool] | None = None
                 ) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each JSON object in the log. ``loaded``: the file's (text
    bytes, cut) if already read."""
    path = Path(path)
    for line, text, maybe_cut in iter_lines(path, loaded):
        try:
            rec = loads_record(text)
        except json.JSONDecodeError as exc:
            if maybe_cut:
                _warn_tail(path, line)
                return
            raise LogError(str(path), line,
                           f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        except _Unrepresentable as exc:
            raise LogError(str(path), line, f"not valid JSON for a log: {exc}") from None
        except RecursionError:
            raise LogError(str(path), line, "JSON nested too deeply") from None
        if not isinstance(rec, dict):
            raise LogError(str(path), line, f"expected a JSON object, got {type(rec).__name__}")
        if "\\u" in text:  # only an escape can make a lone surrogate
            where = _lone_surrogate(rec)
            if where is not None:
                raise LogError(str(path), line, "holds a lone surrogate escape (\\ud800-\\udfff "
                               "without its pair), which is not text", where)
        yield line, rec


def _text_safe(value):
    """``value`` (a record, or anything in one) with every lone surrogate in its text written
    out as its escape's characters (``\\ud800``): a candidate's error text or a server's
    answer may hold one (JSON's ``\\ud800`` escape yields it), and no UTF-8 log can (a reader
    refuses the escape). Valid text is returned as it is."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "backslashreplace").decode(
            "utf-8")
    if isinstance(value, dict):
        return {_text_safe(k): _text_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text_safe(v) for v in value]
    return value


def _dumps(record: dict) -> str:
    if "kind" not in record:
        raise ValueError("a record needs a 'kind'")
    ordered = {"kind": record["kind"], **{k: v for k, v in record.items() if k != "kind"}}
    return json.dumps(ordered, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


class LogWriter:
    """Append records to a log, fsyncing each one (or each ``append_many`` batch).

    For ``.gz`` paths every batch is its own gzip member, so a crash loses at most the batch
    being written and the reader keeps everything before it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fh: io.BufferedWriter | None = None

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> io.BufferedWriter:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists()
            self._fh = open(self.path, "ab")
            if new:  # the file's directory entry must reach the disk too
                fsync_dir(self.path.parent)
        return self._fh

    def append(self, record: dict) -> None:
        self.append_many([record])

    def append_many(self, records) -> None:
        text = "".join(_dumps(r) + "\n" for r in records)
        try:
            payload = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a candidate's error text, say)
            payload = "".join(_dumps(_text_safe(r)) + "\n" for r in records).encode("utf-8")
        if not payload:
            return
        if self.path.suffix == ".gz":
            payload = gzip.compress(payload, mtime=0)
        fh = self._open()
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
