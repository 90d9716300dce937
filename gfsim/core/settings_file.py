"""Reading a settings file (``--config FILE.toml``) within limits, as a log is read: a regular
file (a FIFO would block for ever, ``/dev/zero`` never end), at most ``MAX_SETTINGS_BYTES``,
and a shape a person writes: tables and arrays nested at most ``MAX_DEPTH`` deep, dotted keys
of at most ``MAX_KEY_PARTS`` parts, at most ``MAX_KEYS`` keys of at most ``MAX_KEY_CHARS``
characters. The shape is checked on the text before TOML parses it: 200 KB of dotted key parts
took the parser past 4 GB, and 5,000 nested arrays past Python's recursion limit. Every
problem is an ``InputError``, one line naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gfsim.core.inputs import InputError, read_file

__all__ = ["read_settings", "MAX_SETTINGS_BYTES", "MAX_DEPTH", "MAX_KEY_PARTS", "MAX_KEYS",
           "MAX_KEY_CHARS"]

# A settings file names a command's options (a few dozen, a table or two deep); the
# limits are far above any such file and far below what costs the parser memory or its stack.
MAX_SETTINGS_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_KEY_PARTS = 32
MAX_KEYS = 10_000
MAX_KEY_CHARS = 256


def read_settings(path) -> dict:
    """The settings file at ``path`` as a dict, within the module's limits; ``InputError``
    (one line naming the file) otherwise."""
    path = Path(path)
    raw = read_file(path, "settings file", limit=MAX_SETTINGS_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    problem = _shape_problem(text)
    if problem:
        raise InputError(path, problem)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML ({exc})") from None
    except RecursionError:  # (the depth checked above keeps the parser well inside its stack)
        raise InputError(path, "nested too deeply") from None
    problem = _key_problem(data)
    if problem:
        raise InputError(path, problem)
    return data


def _shape_problem(text: str) -> str | None:
    """What in ``text`` is beyond a settings file's shape (nesting, dotted key parts, key
    count), found by a scan that skips strings and comments; None if nothing is."""
    return _Scan(text).run()


class _Scan:
    """One pass over a TOML text, outside its strings and comments, counting what the limits
    bound. Text it cannot follow (an unterminated string) is left to the parser to name."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0
        self.stack: list[str] = []  # open brackets: '[' (array or header) or '{'
        self.in_key, self.parts, self.keys = True, 1, 0

    def run(self) -> str | None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in "\"'":
                self._skip_string(c)
                continue
            problem = self._step(c)
            if problem:
                return problem
            self.pos += 1
        return None

    def _step(self, c: str) -> str | None:
        if c == "#":
            end = self.text.find("\n", self.pos)
            self.pos = (len(self.text) if end < 0 else end) - 1
        elif c == "\n" and not self.stack:
            self.in_key, self.parts = True, 1
        elif c in "[{":
            self.stack.append(c)
            if len(self.stack) > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} deep (arrays and tables)"
            if c == "{":
                self.in_key, self.parts = True, 1
        elif c in "]}":
            if self.stack:
                self.stack.pop()
            if c == "}":
                self.in_key = False  # back in the value that held the table
        elif c == "=":
            self.in_key = False
            self.keys += 1
            if self.keys > MAX_KEYS:
                return f"more than {MAX_KEYS:,} keys; a settings file names options"
        elif c == "," and self.stack and self.stack[-1] == "{":
            self.in_key, self.parts = True, 1
        elif c == "." and self.in_key:
            self.parts += 1
            if self.parts > MAX_KEY_PARTS:
                return f"a dotted key of more than {MAX_KEY_PARTS} parts"
        return None

    def _skip_string(self, quote: str) -> None:
        text = self.text
        triple = text.startswith(quote * 3, self.pos)
        end_mark = quote * 3 if triple else quote
        i = self.pos + len(end_mark)
        while i < len(text):
            if quote == '"' and text[i] == "\\":
                i += 2
                continue
            if text.startswith(end_mark, i):
                self.pos = i + len(end_mark)
                return
            if not triple and text[i] == "\n":
                break
            i += 1
        self.pos = i  # unterminated: the parser names it


def _key_problem(data: dict) -> str | None:
    """A key longer than ``MAX_KEY_CHARS``, walked without recursion."""
    todo = [data]
    while todo:
        value = todo.pop()
        items = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict):
            for key in value:
                if len(key) > MAX_KEY_CHARS:
                    return (f"a key of {len(key):,} characters, above the {MAX_KEY_CHARS} a "
                            "settings file's key may hold")
        todo.extend(v for v in items if isinstance(v, (dict, list)))
    return None
