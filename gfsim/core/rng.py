"""Keyed random streams (docs/concepts/design.md "Randomness").

Every draw comes from a generator keyed by what it is about, e.g. ``stream(seed, cid, "noise")``,
never from a sequential or global RNG. Two runs with the same seed therefore see the same world
and differ only where their decisions differ (common random numbers).
"""

from __future__ import annotations

import functools
import hashlib
import threading

import numpy as np

__all__ = ["key_words", "keyed_uniforms", "stream", "transient_stream", "uniform"]


def _word(part) -> int:
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part >= 0:
        return int(part)
    if isinstance(part, str):
        return _str_word(part)
    digest = hashlib.blake2b(repr(part).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@functools.lru_cache(maxsize=1 << 16)
def _str_word(part: str) -> int:
    digest = hashlib.blake2b(repr(part).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def key_words(*key) -> tuple[int, ...]:
    """Stable 64-bit words for a key made of ints and strings (no Python ``hash``: it is salted)."""
    return tuple(_word(k) for k in key)


def stream(seed: int, *key) -> np.random.Generator:
    """A generator for one keyed stream; the same (seed, key) always gives the same draws."""
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=key_words(*key))
    return np.random.Generator(np.random.PCG64(ss))


_STATES: dict = {}  # (seed, key words) -> PCG64 (state, inc) right after seeding
_STATES_MAX = 1 << 18
_LOCAL = threading.local()


def transient_stream(seed: int, *key) -> np.random.Generator:
    """``stream(seed, *key)``'s draws, from one generator per thread that is reset to the
    keyed state: valid only until this thread's next call. Seeding (a ``SeedSequence`` and a
    ``PCG64``) costs some 40 microseconds; a state seen before is restored in a few, so a
    tuning run that replays the same seeds thousands of times seeds each key once."""
    words = key_words(*key)
    k = (int(seed), words)
    got = _STATES.get(k)
    if got is None:
        bg = np.random.PCG64(np.random.SeedSequence(entropy=int(seed), spawn_key=words))
        st = bg.state["state"]
        got = (st["state"], st["inc"])
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()
        _STATES[k] = got
    gen = getattr(_LOCAL, "gen", None)
    if gen is None:
        gen = _LOCAL.gen = np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = {"bit_generator": "PCG64",
                               "state": {"state": got[0], "inc": got[1]},
                               "has_uint32": 0, "uinteger": 0}
    return gen


def uniform(seed: int, *key) -> float:
    """One U(0,1) draw keyed by (seed, key)."""
    return float(stream(seed, *key).random())


def keyed_uniforms(seed: int, ids, purpose: str) -> np.ndarray:
    """One U[0,1) per id, keyed by (seed, id, purpose): a hash, so cheap for many ids.

    The same (seed, id, purpose) always gives the same value, whatever else is drawn, which
    is what common random numbers across policies need.
    """
    prefix = f"{int(seed)}\x1f{purpose}\x1f".encode()
    out = np.empty(len(ids))
    for i, ident in enumerate(ids):
        digest = hashlib.blake2b(prefix + str(ident).encode(), digest_size=8).digest()
        out[i] = (int.from_bytes(digest, "little") >> 11) * 2.0**-53
    return out
