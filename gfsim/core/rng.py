"""Keyed random streams (DESIGN.md "Randomness").

Every draw comes from a generator keyed by what it is about, e.g. ``stream(seed, cid, "noise")``,
never from a sequential or global RNG. Two runs with the same seed therefore see the same world
and differ only where their decisions differ (common random numbers).
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["key_words", "keyed_uniforms", "stream", "uniform"]


def _word(part) -> int:
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part >= 0:
        return int(part)
    digest = hashlib.blake2b(repr(part).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def key_words(*key) -> tuple[int, ...]:
    """Stable 64-bit words for a key made of ints and strings (no Python ``hash``: it is salted)."""
    return tuple(_word(k) for k in key)


def stream(seed: int, *key) -> np.random.Generator:
    """A generator for one keyed stream; the same (seed, key) always gives the same draws."""
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=key_words(*key))
    return np.random.Generator(np.random.PCG64(ss))


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
