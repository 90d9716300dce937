"""Where a live search's candidate kernels come from.

A ``CandidateSource`` turns a parent kernel (its code and what its measurement said) into child
kernels. Three sources ship:

- ``mutate`` (``MutationSource``): the task suite's own mutation operator (``Task.mutate``): one
  parameter moved to a neighbouring value, or another algorithmic variant. No LLM; generation
  takes microseconds and costs no tokens. ``mutate-wide``: the wide operator
  (``Task.mutate_wide``: one or two parameters to any value, or another variant with up to two
  changed), the one the measured H200 worlds search.
- ``log:PATH`` (``LogCodeSource``): kernels whose code a replay log stores (e.g. the shipped
  ``h200-suite-v0``), drawn per task without replacement in a keyed order: re-measuring, or
  re-forecasting, what another search generated.
- ``llm:URL,model=NAME`` (``gfsim.live.llm.mutator.LlmMutator``): an LLM behind an OpenAI-compatible
  server is shown the parent's code and its measured feedback and answers with one Python block.

Every source is keyed: the same (seed, task, node, expansion) asks for the same children (an
LLM at temperature > 0 may still answer differently; its answers are recorded, and a resumed run
reuses them rather than asking again).
"""

from __future__ import annotations

import time

from gfsim.core.errors import GfsimError, SpecError
from gfsim.live.candidates import (
    CandidateSource,
    CodeCandidate,
    Generated,
    ParentInfo,
    code_sha256,
    task_seed,
)

__all__ = ["Generated", "ParentInfo", "CandidateSource", "MutationSource", "LogCodeSource",
           "CodeCandidate", "parse_source", "code_sha256"]


class MutationSource(CandidateSource):
    """``Task.mutate``: deterministic given the key. A child whose code the search has already
    generated is drawn again (up to ``retries`` times) so that the search does not spend a
    slot on a duplicate; one that stays a duplicate is kept (and its measurement reused)."""

    name = "mutate"

    def __init__(self, retries: int = 8, wide: bool = False):
        self.retries = retries
        self.wide = wide  # Task.mutate_wide: the neighbourhood the measured worlds search
        if wide:
            self.name = "mutate-wide"
        self._codes: dict[tuple, set] = {}  # (seed, task) -> codes this search generated

    def seed(self, task) -> ParentInfo:
        return task_seed(task)

    def generate(self, task, parent, key, slot):
        from gfsim.core.rng import stream
        from gfsim.live.tasks import Candidate

        t0 = time.perf_counter()
        meta = parent.meta
        if "variant" not in meta:
            raise GfsimError(f"mutate: parent {parent.node_id} has no variant/params (was it "
                             "made by another source?)")
        base = Candidate(task.name, meta["variant"],
                         task.complete(meta["variant"], dict(meta["params"])))
        rng = stream(*key, "mutate", slot)
        draw = task.mutate_wide if self.wide else task.mutate
        child = draw(base, rng)
        tries = 0
        seen = self._seen(key)
        while child.code in seen and tries < self.retries:
            child = draw(base, rng)
            tries += 1
        seen.add(child.code)
        return Generated(child.code, {"variant": child.variant, "params": child.params},
                         service_s=time.perf_counter() - t0)

    def _seen(self, key) -> set:
        # Codes generated per (seed, task): a duplicate costs a measurement slot for nothing.
        return self._codes.setdefault((key[0], key[1]), set())

    def remember(self, seed: int, task_name: str, code: str) -> None:
        """A resumed run tells the source what the search already generated."""
        self._seen((seed, task_name)).add(code)


class LogCodeSource(CandidateSource):
    """Kernels stored in a replay log, per task, in a keyed order without replacement."""

    name = "log"

    def __init__(self, path: str):
        from gfsim.replay_logs.io import iter_records
        from gfsim.replay_logs.shipped import resolve_log

        path = str(resolve_log(path))  # a shipped log's name, or a path
        self.path = path
        by_sha: dict[str, str] = {}
        order: dict[str, list[str]] = {}
        for _, rec in iter_records(path):
            if rec.get("kind") != "candidate" or not rec.get("code"):
                continue
            sha = code_sha256(rec["code"])
            if sha not in by_sha:
                by_sha[sha] = rec["code"]
                order.setdefault(rec["task_id"], []).append(sha)
        if not by_sha:
            raise GfsimError(f"{path}: no candidate in this log stores its code (a log source "
                             "needs the code field)")
        self._code = by_sha
        self._order = order
        self._taken: dict = {}

    def seed(self, task) -> ParentInfo:
        return task_seed(task)

    def generate(self, task, parent, key, slot):
        from gfsim.core.rng import stream

        shas = self._order.get(task.name)
        if not shas:
            return Generated(None, failed_reason=f"{self.path} stores no code for task "
                             f"{task.name!r} (it has: {', '.join(self._order)})")
        taken = self._taken.setdefault((key[0], task.name), set())
        free = [s for s in shas if s not in taken]
        if not free:
            return Generated(None, failed_reason=f"every stored kernel of {task.name} was used")
        pick = free[int(stream(*key, "log", slot).integers(len(free)))]
        taken.add(pick)
        return Generated(self._code[pick], {"log_code_sha256": pick})

    def remember(self, seed: int, task_name: str, code: str) -> None:
        self._taken.setdefault((seed, task_name), set()).add(code_sha256(code))

    def describe(self) -> dict:
        return {"name": self.name, "path": str(self.path)}


def parse_source(spec: str) -> CandidateSource:
    """``mutate`` | ``mutate-wide`` | ``log:PATH`` | ``llm:URL,model=NAME[,...]`` (see the
    module doc)."""
    kind, sep, rest = (spec or "").partition(":")
    if kind == "mutate" and not rest:
        return MutationSource()
    if kind == "mutate-wide" and not rest:
        return MutationSource(wide=True)
    if kind == "log" and rest:
        return LogCodeSource(rest)
    if kind == "llm" and rest:
        from gfsim.live.llm.mutator import parse_mutator

        return parse_mutator(spec)
    raise SpecError(f"`source`: expected mutate, mutate-wide, log:PATH or llm:URL,model=NAME; "
                    f"got {spec!r}")
