"""What a candidate source is: the ``CandidateSource`` contract and the records it trades in
(``ParentInfo`` in, ``Generated`` out; ``CodeCandidate`` for the measurer). The sources
themselves live in ``gfsim.live.sources`` and ``gfsim.live.llm.mutator``; this module imports
nothing else of ``gfsim.live``, so both can build on it.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

__all__ = ["CandidateSource", "CodeCandidate", "Generated", "ParentInfo", "code_sha256",
           "task_seed"]


def code_sha256(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True)
class CodeCandidate:
    """A kernel as the measurer sees it: the task's name and standalone code."""

    task: str
    code: str

    @property
    def candidate_id(self) -> str:
        return f"{self.task}-{code_sha256(self.code)[:12]}"


@dataclass
class ParentInfo:
    """What a source is told about the kernel it mutates."""

    node_id: str
    code: str
    meta: dict = field(default_factory=dict)  # source-specific, e.g. variant and params
    outcome: str | None = None  # of its measurement (None for a seed not yet measured)
    speedup: float | None = None  # measured, against the task's baseline
    reason: str | None = None  # why it failed, when it did


@dataclass
class Generated:
    """One generated child. ``code`` is None when generation failed (``failed_reason`` says
    why); token counts are None where no LLM was asked (the log then leaves them out)."""

    code: str | None
    meta: dict = field(default_factory=dict)
    failed_reason: str | None = None
    service_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None


class CandidateSource(ABC):
    """Children of a parent kernel. ``name`` and ``describe()`` go into the log's header."""

    name: str
    concurrency: int = 1  # generations that may run at once (an LLM server: several)

    @abstractmethod
    def seed(self, task) -> ParentInfo:
        """The search's root kernel for ``task`` (a ``gfsim.live.tasks.Task``), unmeasured."""

    @abstractmethod
    def generate(self, task, parent: ParentInfo, key: tuple, slot: int) -> Generated:
        """Child number ``slot`` of the expansion ``key`` = (seed, task, node id, expansion)
        of ``parent``. Called from worker threads, up to ``concurrency`` at once."""

    def describe(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:  # noqa: B027 - optional
        pass


def task_seed(task) -> ParentInfo:
    """The task suite's first candidate as a search's root kernel (unmeasured)."""
    first = task.candidates()[0]
    return ParentInfo("seed", first.code, {"variant": first.variant, "params": first.params})
