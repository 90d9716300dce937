"""The memory a command may plan to use: ``GFSIM_MEMORY_BUDGET`` (bytes, or a number with a unit:
``8GiB``, ``500MB``) if set, else half the machine's physical memory. Work whose size is
known before it starts (a closed-loop replay's candidates) is refused in one line when its
estimate is above the budget, instead of ending in a ``MemoryError`` or the kernel's OOM
killer minutes later."""

from __future__ import annotations

import contextlib
import gc
import os
import re

from gfsim.core.errors import GfsimError
from gfsim.core.inputs import size_text

__all__ = ["memory_budget_bytes", "budget_text", "MEMORY_BUDGET_ENV", "no_cyclic_gc"]

MEMORY_BUDGET_ENV = "GFSIM_MEMORY_BUDGET"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_AMOUNT = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,6})?)\s*([a-zA-Z]{0,3})\s*")


def memory_budget_bytes() -> int:
    """``GFSIM_MEMORY_BUDGET`` in bytes, else half the physical memory (8 GiB where the
    machine does not say)."""
    value = os.environ.get(MEMORY_BUDGET_ENV, "")
    if not value.strip():
        return _physical_bytes() // 2
    m = _AMOUNT.fullmatch(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise GfsimError(f"{MEMORY_BUDGET_ENV}: expected an amount of memory (bytes, or with a "
                         f"unit: 8GiB, 500MB), got {value[:40]!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def _physical_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def budget_text() -> str:
    """The budget as a message says it, with where it comes from."""
    source = (MEMORY_BUDGET_ENV if os.environ.get(MEMORY_BUDGET_ENV, "").strip()
              else f"half this machine's memory; {MEMORY_BUDGET_ENV} sets it")
    return f"{size_text(memory_budget_bytes())} memory budget ({source})"


@contextlib.contextmanager
def no_cyclic_gc():
    """No cyclic garbage collection while many acyclic objects are made (a log's tables, a
    replay's results, its JSON): each collection walks every object alive, and with 10^5
    searches' results alive collections took half the time of making them. Reference counting
    still frees."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
