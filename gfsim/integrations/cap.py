"""A hard dollar cap over a whole search run: the LLM's proposals, the forecasts and the
evaluations, with the work in flight counted, shared by every process of the run.

Each piece of work reserves its price before it starts and settles what it cost when it ends, in
a ledger file (JSON lines, appended under a file lock, as the surrogate's log is): a proposal
reserves its prompt and ``max_output_tokens`` at the generator's prices, a forecast the same at
the forecaster's, an evaluation the longest evaluation so far (``eval_reserve_s`` before the
first) at the GPU's. A prompt is reserved at a token per byte of its UTF-8 text plus
``TEMPLATE_TOKENS`` a call and ``MESSAGE_TOKENS`` a message (a chat template's own tokens): no
tokenizer that falls back to bytes makes more (a token per 3 characters, reserved before, was
passed by a real server's tokenizer: 4,804 prompt tokens where 1,847 were reserved). A
reservation that would take what is settled plus what is in flight past ``usd`` is refused, the
refusal is written with why, and from then on every reservation is refused: once the cap is
reached, no proposal, forecast or evaluation starts. Work already in flight finishes; the cap
can be passed only by an evaluation that runs longer than it reserved (at most one evaluation's
price with one in flight at a time). The ledger keeps the run's account across restarts: a run
resumed on the same ledger with a larger ``usd`` goes on from what was spent (a cap stays
reached for the ``usd`` it was reached at and any smaller one).

``gfsim.integrations.openevolve`` puts it in front of OpenEvolve's LLM (``openevolve_client``)
and its evaluator (``Surrogate(cap=...)``); ``gfsim.integrations.cap_proxy`` in front of any
OpenAI-compatible server (ShinkaEvolve's LLMs). Each LLM call goes through ``llm_call``.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gfsim.core.errors import GfsimError

__all__ = ["DollarCap", "CapReached", "LLMBill", "TEMPLATE_TOKENS", "MESSAGE_TOKENS",
           "chat_bytes", "text_bytes"]

# A prompt's tokens are reserved as its UTF-8 bytes (a byte-level BPE, a SentencePiece with
# byte fallback or a character-level tokenizer makes at most a token a byte), plus the chat
# template's special tokens: at most TEMPLATE_TOKENS a call and MESSAGE_TOKENS a message.
TEMPLATE_TOKENS = 64
MESSAGE_TOKENS = 16


class CapReached(GfsimError):
    """The run's dollar cap refuses this piece of work."""


WORK = {"generator": "proposal", "forecaster": "forecast"}  # an LLM role's kind of work


def text_bytes(text) -> int:
    """The UTF-8 bytes of ``text`` (anything not a string: its ``str``)."""
    return len((text if isinstance(text, str) else str(text or "")).encode("utf-8", "replace"))


def chat_bytes(messages) -> int:
    """What a chat's messages reserve as prompt tokens: the UTF-8 bytes of their text parts
    (anything else as its ``str``), plus ``MESSAGE_TOKENS`` a message."""
    n = 0
    for m in messages or ():
        content = m.get("content", "") if isinstance(m, dict) else m
        if isinstance(content, list):
            n += sum(text_bytes(p["text"]) if isinstance(p, dict) and
                     isinstance(p.get("text"), str) else text_bytes(p) for p in content)
        else:
            n += text_bytes(content)
        n += MESSAGE_TOKENS
    return n


@dataclass
class LLMBill:
    """One LLM call under the cap (``DollarCap.llm_call``): its ticket, what it reserved, and
    ``usd``, what it cost where known (set it from the usage the API reported,
    ``DollarCap.usage_usd``; 0 for a call that never reached the server). Left None, the call
    is settled at its reservation: a call that failed may still have been billed."""

    ticket: str
    reserved_usd: float
    usd: float | None = None


@dataclass(frozen=True)
class DollarCap:
    """The cap (``usd``), its ledger file and the prices it charges (USD per million input and
    output tokens of the generator and the forecaster, USD per GPU-hour). Picklable: every
    process of a run builds nothing but this and reads the same ledger."""

    usd: float
    ledger: str
    generator_usd_per_m: tuple[float, float] = (0.5, 3.0)
    forecaster_usd_per_m: tuple[float, float] = (0.5, 3.0)
    gpu_usd_per_hour: float = 2.5
    max_output_tokens: int = 4096
    eval_reserve_s: float = 60.0

    def __post_init__(self):
        if not (isinstance(self.usd, (int, float)) and self.usd > 0 and math.isfinite(self.usd)):
            raise GfsimError(f"cap: usd must be a positive number, got {self.usd!r}")
        rates = (*self.generator_usd_per_m, *self.forecaster_usd_per_m, self.gpu_usd_per_hour,
                 self.eval_reserve_s)
        if any(not (isinstance(v, (int, float)) and v >= 0) for v in rates):
            raise GfsimError("cap: prices and eval_reserve_s must be numbers >= 0")
        object.__setattr__(self, "ledger", str(Path(self.ledger).resolve()))

    @classmethod
    def from_cost_model(cls, usd: float, ledger, cost: str = "serverless-a100", **kw):
        """A cap priced by a cost preset's generator, forecaster and GPU."""
        from gfsim.cost_models import load_cost_model

        m = load_cost_model(cost)
        return cls(usd, str(ledger),
                   (m.generator.usd_per_m_input, m.generator.usd_per_m_output),
                   (m.forecaster.usd_per_m_input, m.forecaster.usd_per_m_output),
                   m.gpu.usd_per_hour, **kw)

    # -- prices ---------------------------------------------------------------------------
    def llm_usd(self, role: str, input_tokens: float, output_tokens: float) -> float:
        inp, out = self.generator_usd_per_m if role == "generator" else \
            self.forecaster_usd_per_m
        return (input_tokens * inp + output_tokens * out) / 1e6

    def llm_reserve(self, role: str, prompt_bytes: int, max_tokens: int | None) -> float:
        """What a call with this prompt (``prompt_bytes``: ``chat_bytes`` of its messages, or
        ``text_bytes`` of its text) may cost at most, its output at most ``max_tokens``."""
        return self.llm_usd(role, prompt_bytes + TEMPLATE_TOKENS,
                            max_tokens or self.max_output_tokens)

    def usage_usd(self, role: str, usage) -> float | None:
        """What an OpenAI-style ``usage`` (``prompt_tokens``, ``completion_tokens``) comes to
        at the role's prices; None where the API reported none."""
        if not isinstance(usage, dict) or not usage:
            return None
        return self.llm_usd(role, usage.get("prompt_tokens") or 0,
                            usage.get("completion_tokens") or 0)

    @contextmanager
    def llm_call(self, role: str, prompt_bytes: int, max_tokens: int | None,
                 about: str = "") -> Iterator[LLMBill]:
        """Hold one LLM call (``role``: ``generator``, a proposal; ``forecaster``, a forecast)
        to the cap: reserves ``llm_reserve`` before the call (``CapReached``: make no call),
        and settles when the block ends, however it ends, at the bill's ``usd`` (else the
        reservation)."""
        usd = self.llm_reserve(role, prompt_bytes, max_tokens)
        bill = LLMBill(self.reserve(WORK[role], usd, about), usd)
        try:
            yield bill
        finally:
            self.settle(bill.ticket, bill.reserved_usd if bill.usd is None else bill.usd)

    def eval_usd(self, seconds: float) -> float:
        return max(0.0, seconds) * self.gpu_usd_per_hour / 3600.0

    # -- the ledger -----------------------------------------------------------------------
    @contextmanager
    def _locked(self):
        path = Path(self.ledger)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _append(self, rec: dict) -> None:
        with open(self.ledger, "a", encoding="utf-8") as f:
            f.write(json.dumps({**rec, "t": time.time()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def status(self) -> dict:
        """The ledger as it stands: dollars settled (in all and per kind of work), in flight,
        the longest evaluation so far, and the refusal that reached the cap (None before)."""
        with self._locked():
            return self._status()

    def _status(self) -> dict:
        st = _ledger_state(Path(self.ledger))
        reached = next((r for r in st.reached
                        if float(r.get("cap_usd", math.inf)) >= self.usd), None)
        # (a larger cap, on resuming, is not reached by a refusal under a smaller one)
        return {"cap_usd": self.usd, "spent_usd": sum(st.settled.values()),
                "settled": dict(st.settled),
                "in_flight_usd": sum(float(r["usd"]) for r in st.opened.values()),
                "in_flight": len(st.opened), "longest_evaluation_s": st.longest,
                "reached": reached}

    def reserve(self, what: str, usd: float | None, about: str = "") -> str:
        """Reserve ``usd`` for a piece of work (``proposal``, ``forecast`` or ``evaluation``;
        None for an evaluation: ``eval_reservation``'s, read under the same lock); returns its
        ticket, or raises ``CapReached`` (and the cap stays reached) where the settled dollars,
        those in flight and this reservation would pass the cap."""
        if what not in ("proposal", "forecast", "evaluation"):
            raise ValueError(f"unknown kind of work {what!r}")
        if usd is None and what != "evaluation":
            raise ValueError(f"a {what} reserves a price of its own")
        with self._locked():
            st = self._status()
            if usd is None:
                usd = self._eval_reservation(st)
            reached = st["reached"]
            spent, flying = st["spent_usd"], st["in_flight_usd"]
            if reached is None and spent + flying + usd > self.usd:
                left = max(0.0, self.usd - spent - flying)
                reached = {"kind": "reached", "what": what, "about": about, "asked_usd": usd,
                           "spent_usd": spent, "in_flight_usd": flying, "cap_usd": self.usd,
                           "why": f"the dollar cap ${self.usd:g} is reached: ${spent:.4f} spent "
                                  f"and ${flying:.4f} in flight leave ${left:.4f}, and a {what} "
                                  f"reserves ${usd:.4f}; no proposal, forecast or evaluation "
                                  "starts from now on"}
                self._append(reached)
            if reached is not None:
                raise CapReached(reached["why"])
            ticket = uuid.uuid4().hex
            self._append({"kind": "open", "id": ticket, "what": what, "usd": usd,
                          "about": about})
            return ticket

    def settle(self, ticket: str, usd: float, seconds: float | None = None) -> None:
        """What the work of ``ticket`` cost (its reservation is released)."""
        with self._locked():
            self._append({"kind": "close", "id": ticket, "usd": float(usd),
                          **({"seconds": float(seconds)} if seconds is not None else {})})

    def eval_reservation(self) -> float:
        """What the next evaluation reserves: the longest so far, or ``eval_reserve_s``."""
        with self._locked():
            return self._eval_reservation(self._status())

    def _eval_reservation(self, st: dict) -> float:
        longest = st["longest_evaluation_s"]
        return self.eval_usd(self.eval_reserve_s if longest is None else longest)


class _LedgerState:
    """A ledger's account as read so far, up to byte ``offset``: reservations open, dollars
    settled per kind of work, the longest evaluation, every refusal. Each read under the lock
    folds in only the lines appended since (the ledger is append-only), so a reservation costs
    the lines written since the last, not the whole run's."""

    def __init__(self, identity: tuple):
        self.identity = identity  # (device, inode): a ledger replaced is read afresh
        self.offset = 0
        self.lines = 0
        self.opened: dict[str, dict] = {}
        self.settled = {"proposal": 0.0, "forecast": 0.0, "evaluation": 0.0}
        self.longest: float | None = None
        self.reached: list[dict] = []

    def fold(self, path: Path, data: bytes) -> None:
        for line in data.splitlines():
            self.lines += 1
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise GfsimError(f"{path}:{self.lines}: not a JSON line of a gfsim dollar-cap "
                                 "ledger (give each run a ledger of its own)") from None
            kind = rec.get("kind")
            if kind == "open":
                self.opened[rec["id"]] = rec
            elif kind == "close":
                was = self.opened.pop(rec["id"], None)
                if was is not None:
                    self.settled[was["what"]] += float(rec["usd"])
                    if was["what"] == "evaluation" and rec.get("seconds") is not None:
                        self.longest = max(self.longest or 0.0, float(rec["seconds"]))
            elif kind == "reached":
                self.reached.append(rec)
        self.offset += len(data)


_LEDGERS: dict[str, _LedgerState] = {}  # this process's reading of each ledger, by path


def _ledger_state(path: Path) -> _LedgerState:
    """The account of the ledger at ``path`` (call under its lock), brought up to date."""
    try:
        info = path.stat()
    except FileNotFoundError:
        _LEDGERS.pop(str(path), None)
        return _LedgerState((None, None))
    identity = (info.st_dev, info.st_ino)
    st = _LEDGERS.get(str(path))
    if st is None or st.identity != identity or info.st_size < st.offset:
        st = _LEDGERS[str(path)] = _LedgerState(identity)
    if info.st_size > st.offset:
        with open(path, "rb") as f:
            f.seek(st.offset)
            data = f.read(info.st_size - st.offset)
        try:
            st.fold(path, data)
        except GfsimError:
            _LEDGERS.pop(str(path), None)  # (read afresh next time, and fail the same way)
            raise
    return st
