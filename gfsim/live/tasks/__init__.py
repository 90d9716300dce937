"""Triton benchmark tasks: a name -> task registry, constructed lazily.

``TASKS[name]`` (or ``get_task(name)``) imports the task's module on first use; importing this
package imports neither torch nor triton. An unknown name raises ``UnknownTaskError`` (a
``GfsimError`` and a ``KeyError``) listing the valid names.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from gfsim.core.errors import GfsimError
from gfsim.live.tasks.base import Candidate, Task

__all__ = ["TASKS", "Candidate", "Task", "UnknownTaskError", "get_task"]

# name -> "module:class"; the class is constructed without arguments.
_ENTRIES = {
    "softmax": "gfsim.live.tasks.softmax:SoftmaxTask",
    "layernorm": "gfsim.live.tasks.layernorm:LayerNormTask",
    "matmul": "gfsim.live.tasks.matmul:MatmulTask",
    "cross_entropy": "gfsim.live.tasks.cross_entropy:CrossEntropyTask",
    "fp8_quant": "gfsim.live.tasks.fp8_quant:Fp8GroupQuantTask",
}


class UnknownTaskError(GfsimError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class _Registry(Mapping):
    """A read-only mapping that imports and constructs each task on first access."""

    def __init__(self, entries: dict[str, str]):
        self._entries = dict(entries)
        self._tasks: dict[str, Task] = {}

    def __getitem__(self, name: str) -> Task:
        if name not in self._entries:
            raise UnknownTaskError(f"unknown task {name!r}; valid: {', '.join(self._entries)}")
        if name not in self._tasks:
            module, cls = self._entries[name].split(":")
            self._tasks[name] = getattr(importlib.import_module(module), cls)()
        return self._tasks[name]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries


TASKS: Mapping[str, Task] = _Registry(_ENTRIES)


def get_task(name: str) -> Task:
    return TASKS[name]
