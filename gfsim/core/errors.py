"""Errors a user can cause. The CLI turns every ``GfsimError`` into a one-line message and
exit 2."""

from __future__ import annotations

__all__ = ["GfsimError", "LogError", "SpecError"]


class GfsimError(Exception):
    """Base class for errors caused by input (files, specs, options), not by bugs."""


class LogError(GfsimError):
    """A replay log that cannot be read or does not follow the schema.

    Carries the file, the 1-based line and the offending field so that the message points at
    the exact place to fix.
    """

    def __init__(self, path: str, line: int | None, message: str, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        where = self.path if line is None else f"{self.path}:{line}"
        what = message if field is None else f"field '{field}': {message}"
        super().__init__(f"{where}: {what}")


class SpecError(GfsimError):
    """A malformed ``NAME:key=value`` spec (policy, budget, capacity) or an unknown name/key."""
