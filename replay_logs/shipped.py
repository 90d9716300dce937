"""Logs shipped as package data, addressable by name (``--log synthetic-mini``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gfsim.core.docs import cite_docs
from gfsim.core.errors import GfsimError

__all__ = ["SHIPPED_LOGS", "SHIPPED_CAVEATS", "DEFAULT_LOG", "resolve_log", "shipped_path",
           "log_caveats", "untrusted_timings"]

# name -> (file under gfsim/replay_logs/data/, one-line description)
SHIPPED_LOGS: dict[str, tuple[str, str]] = {
    "synthetic-mini": (
        "synthetic-mini.jsonl.gz",
        "SYNTHETIC: 3 tasks, one measure-all search each, made by "
        "experiments/make_synthetic_mini.py (seed 0); not measured on any GPU",
    ),
    "synthetic-v1": (
        "synthetic-v1.jsonl.gz",
        "SYNTHETIC: 6 tasks, 3,000 candidates, one measure-all greedy search per task, made by "
        "`gfsim synth --out replay_logs/data/synthetic-v1.jsonl.gz --seed 1 --candidates 3000 "
        "--tasks 6`; not measured on any GPU",
    ),
    "synthetic-puct-v1": (
        "synthetic-puct-v1.jsonl.gz",
        "SYNTHETIC: 6 tasks, 1,896 candidates, the reference's standard PUCT search (40 steps x "
        "2 parents x 4, all measured) per task, made by `gfsim synth --out "
        "replay_logs/data/synthetic-puct-v1.jsonl.gz --seed 1 --tasks 6 --driver puct --steps "
        "40`; not measured on any GPU",
    ),
    "h200-suite-v0": (
        "h200-suite-v0.jsonl.gz",
        "MEASURED on an NVIDIA H200: 24 hand-written Triton candidates (softmax, layernorm, "
        "matmul) with their code, each against its task's PyTorch baseline; a pairs log for "
        "`gfsim forecast` and `gfsim score`; made by experiments/make_h200_suite.py",
    ),
    "h200-live-v1": (
        "h200-live-v1.jsonl.gz",
        "MEASURED on an NVIDIA H200 by `gfsim live`: PUCT searches (paper-standard, policy all) "
        "over the 5-task suite, seed 0 complete (40 steps, two sessions, the second resumed) "
        "and seed 1 for 4 steps, merged; candidates from the tasks' mutation operator; "
        "forecasts are SYNTHETIC what-if ones (paper:gemini3-flash), drawn after measurement; "
        "made by experiments/live_h200.sh",
    ),
    "h200-costmodel-all": (
        "h200-costmodel-all.jsonl.gz",
        "MEASURED on an NVIDIA H200 by `gfsim live`: PUCT searches (6 steps x 2 parents x 4, "
        "policy all) over softmax, layernorm and fp8_quant, seeds 0 and 1, candidates from the "
        "wide mutation operator, every candidate forecast by the learned cost model before its "
        "decision (forecasts real, not what-if); the measure-all half of "
        "experiments/live_threshold_h200.sh",
    ),
    "h200-costmodel-threshold": (
        "h200-costmodel-threshold.jsonl.gz",
        "MEASURED on an NVIDIA H200 by `gfsim live`: the same searches as h200-costmodel-all "
        "(tasks, seeds, shape) under policy threshold:0.7 reading the learned cost model's "
        "forecasts, so skipped candidates were never measured; the selective half of "
        "experiments/live_threshold_h200.sh",
    ),
}
DEFAULT_LOG = "synthetic-puct-v1"

# name -> what the docs admit about a shipped log that its numbers do not show: printed by
# `gfsim logs` and beside every replay of it, so that a reader meets the caveat where the numbers
# are, not only on the page that states it. Each quotes the page it comes from.
SHIPPED_CAVEATS: dict[str, tuple[str, ...]] = {
    "h200-suite-v0": (
        "its candidates were written by hand, not by an LLM, and it holds no forecasts until "
        "`gfsim forecast` adds them (docs/concepts/logs.md)",
    ),
    "h200-live-v1": (
        "the baseline timings of this log drift between sessions: the fp8 seed-0 speedups of its "
        "first 5 steps (up to 102x) rest on an inflated baseline (fp8_quant's PyTorch baseline "
        "recorded at 4.64 ms; in fresh processes it times 0.58 ms); measured against 0.58 ms, "
        "the same kernels are 2.2-12.9x faster than PyTorch; matmul's baseline was recorded at "
        "193, 297, 198 and 244 us, softmax's at 204 and 322 us; each evaluation's own runtime_ns "
        "is unaffected (docs/how-to/live-gpu.md)",
        "no LLM wrote these kernels (the tasks' mutation operator did): replays price generation "
        "with the LLM-token prior (docs/experiments/fidelity.md)",
        "1,308 of its 1,716 candidates repeated a kernel their search had already measured; "
        "their measurement was reused at zero seconds (docs/how-to/live-gpu.md)",
    ),
    "h200-costmodel-all": (
        "each search replays its own GPU time exactly and its wall-clock within 5% (`gfsim "
        "fidelity`), except four of the five searches that ran over two sessions: the second "
        "session's start-up sits in its first step, and they replay 8-10% short "
        "(docs/experiments/live-threshold.md)",
    ),
    "h200-costmodel-threshold": (
        "the live run under threshold:0.7 never measured what it skipped: those candidates "
        "have no speedup in the log (docs/experiments/live-threshold.md)",
        "each search replays its own GPU time exactly and its wall-clock within 5% (`gfsim "
        "fidelity`), except four of the five searches that ran over two sessions: the second "
        "session's start-up sits in its first step, and they replay 8-10% short "
        "(docs/experiments/live-threshold.md)",
    ),
}
# the pages they quote, as the documentation site's URLs (a pip install has no docs/)
SHIPPED_CAVEATS = {name: tuple(cite_docs(c) for c in caveats)
                   for name, caveats in SHIPPED_CAVEATS.items()}


def shipped_path(name: str) -> Path:
    filename = SHIPPED_LOGS[name][0]
    return Path(str(resources.files("gfsim.replay_logs").joinpath("data", filename)))


def resolve_log(name_or_path: str | None) -> Path:
    """A shipped log's name or a path -> a path. A missing path is an error naming it."""
    if name_or_path is None:
        name_or_path = DEFAULT_LOG
    if name_or_path in SHIPPED_LOGS:
        return shipped_path(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        shipped = ", ".join(SHIPPED_LOGS)
        raise GfsimError(f"{name_or_path}: no such file, and not a shipped log ({shipped})")
    return path


def log_caveats(log) -> list[str]:
    """The known caveats of ``log``: a shipped log's, by the name it was opened by, or by the
    log it was derived from (``gfsim forecast`` keeps ``derived_from.log_id`` in its copy's
    header, and a copy inherits its source's timings and so their caveats)."""
    out: list[str] = []
    names = [log.label, (log.header.get("derived_from") or {}).get("log_id")]
    for name in names:
        if name in SHIPPED_CAVEATS:
            out = list(SHIPPED_CAVEATS[name])
            break
    untrusted = untrusted_timings(log)
    if untrusted:
        out.append(untrusted)
    return out


UNTRUSTED = "UNTRUSTED timings"


def untrusted_timings(log) -> str | None:
    """The one caveat a log timed on the CPU clock carries (``UNTRUSTED timings: ...``), or
    None: what its header says (``gfsim live --trust-cpu-clock`` writes
    ``provenance.timing_trust``), else what its evaluations say of themselves
    (``timing_trusted`` false, or ``timing_clock`` ``wall``) where the header is silent (a
    copy, or a log edited to hide it): their speedups are a candidate's own word."""
    trust = (log.header.get("provenance") or {}).get("timing_trust")
    if isinstance(trust, str) and trust.strip():
        trust = trust.strip()
        return trust if trust.startswith(UNTRUSTED) else f"{UNTRUSTED}: {trust}"
    n = _cpu_clock_evaluations(log)
    if not n:
        return None
    return (f"{UNTRUSTED}: {n:,} evaluation{'s' * (n != 1)} of this log say{'s' * (n == 1)} "
            "they were timed on the CPU clock (timing_trusted false or timing_clock 'wall'), "
            "where a candidate's own process reports its times and can forge them. Speedups "
            "here are not evidence.")


def _cpu_clock_evaluations(log) -> int:
    """How many of the log's evaluations mark themselves timed on the CPU clock."""
    ev = getattr(log, "evaluations", None)
    if ev is None or "extra" not in getattr(ev, "columns", ()):
        return 0
    n = 0
    for extra in ev["extra"].dropna():
        if isinstance(extra, dict) and (extra.get("timing_trusted") is False
                                        or extra.get("timing_clock") == "wall"):
            n += 1
    return n
