"""Errors a user can cause. The CLI turns every ``GfsimError`` into a one-line message and
exit 2.

A message speaks in the library's parameters, not in the command line's flags: a parameter is
named in backticks, as the keyword of ``gfsim.api`` that takes it (`` `forecaster` ``,
`` `parents_per_step` ``). The CLI renders each as the flag that sets it (``as_flags``:
``--forecaster``, ``--parents-per-step``), so one message serves both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["GfsimError", "LogError", "SpecError", "as_flags"]

_PARAMETER = re.compile(r"(?<!`)`([a-z][a-z0-9_]*)`(?!`)")  # (not ``code``)


def as_flags(message: str, flags: Mapping[str, str] | None = None) -> str:
    """``message`` with each backticked parameter as the flag that sets it: ``flags[name]``
    where given (a flag named otherwise, such as ``--search`` for ``preset``), else
    ``--name`` with hyphens for underscores.

    Examples:
        >>> as_flags("`parents_per_step` must be >= 1; see `search`", {"search": "--search"})
        '--parents-per-step must be >= 1; see --search'
    """
    flags = flags or {}
    return _PARAMETER.sub(lambda m: flags.get(m.group(1), "--" + m.group(1).replace("_", "-")),
                          message)


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
