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
from numpy.random.bit_generator import ISeedSequence

__all__ = ["key_words", "keyed_state", "keyed_uniform", "keyed_uniforms", "stream",
           "transient_stream", "uniform"]


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
    """A generator for one keyed stream; the same (seed, key) always gives the same draws.

    Its state is ``PCG64(SeedSequence(entropy=seed, spawn_key=key_words(*key)))``'s, bit for
    bit (``_seed_state``; tests compare the two on thousands of keys), computed without
    numpy's ``SeedSequence``: that one costs some 40 microseconds a key, and the worlds of
    ``gfsim counterfactual`` seed two to four streams per child they draw, tens of thousands
    of children per world seed."""
    seed = int(seed)
    words = key_words(*key)
    if seed < 0 or not words or not _hand_seeding_agrees():  # numpy's own
        ss = np.random.SeedSequence(entropy=seed, spawn_key=words)
        return np.random.Generator(np.random.PCG64(ss))
    return np.random.Generator(np.random.PCG64(_State(_seed_state(seed, words))))


# --- numpy's SeedSequence, for keyed streams (numpy/random/bit_generator.pyx) -------------------
#
# A SeedSequence hashes its entropy words (the seed's 32-bit words, padded with zeros to four
# when there is a spawn key, then the spawn key's) into a pool of four 32-bit words, each word
# absorbed in turn; the state it hands PCG64 is the pool hashed out to four 64-bit words. The
# pool after a key's leading words is the same for every key that shares them (a parent's
# children differ only in their last word), so it is kept (``_absorbed``) and only the last
# word is absorbed per stream.

_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _u32_words(n: int) -> list[int]:
    """An int >= 0 as SeedSequence reads it: 32-bit words, least significant first."""
    if n == 0:
        return [0]
    out = []
    while n:
        out.append(n & _M32)
        n >>= 32
    return out


def _absorb(pool: list[int], h: int, values) -> int:
    """Mix ``values`` into ``pool`` (in place) as SeedSequence's ``mix_entropy`` mixes the words
    past the first four; returns the hash constant after them."""
    for value in values:
        for i in range(_POOL):
            v = (value ^ h) & _M32
            h = (h * _MULT_A) & _M32
            v = (v * h) & _M32
            v ^= v >> 16
            r = (_MIX_L * pool[i] - _MIX_R * v) & _M32
            pool[i] = r ^ (r >> 16)
    return h


@functools.lru_cache(maxsize=1 << 16)
def _absorbed(seed: int, words: tuple) -> tuple[tuple[int, ...], int]:
    """(pool, hash constant) of a SeedSequence with a spawn key once ``seed`` and the spawn
    key's leading ``words`` are absorbed."""
    if words:
        pool, h = _absorbed(seed, words[:-1])
        pool = list(pool)
        h = _absorb(pool, h, _u32_words(words[-1]))
        return tuple(pool), h
    run = _u32_words(seed)
    run += [0] * (_POOL - len(run))  # padded: there is a spawn key
    pool = []
    h = _INIT_A
    for value in run[:_POOL]:
        v = (value ^ h) & _M32
        h = (h * _MULT_A) & _M32
        v = (v * h) & _M32
        pool.append(v ^ (v >> 16))
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                v = (pool[src] ^ h) & _M32
                h = (h * _MULT_A) & _M32
                v = (v * h) & _M32
                v ^= v >> 16
                r = (_MIX_L * pool[dst] - _MIX_R * v) & _M32
                pool[dst] = r ^ (r >> 16)
    h = _absorb(pool, h, run[_POOL:])
    return tuple(pool), h


def _out_constants() -> tuple[int, ...]:
    h, out = _INIT_B, []
    for _ in range(2 * _POOL):
        h2 = (h * _MULT_B) & _M32
        out.append((h, h2))
        h = h2
    return tuple(out)


_OUT = _out_constants()  # (xor constant, multiplier) of each output word: fixed by position


def _seed_state(seed: int, words: tuple) -> np.ndarray:
    """``SeedSequence(entropy=seed, spawn_key=words).generate_state(4, np.uint64)`` for a
    seed >= 0 and a non-empty key: ``_absorb`` of the last word and the output hashing,
    written out lane by lane (this runs once per keyed stream)."""
    (p0, p1, p2, p3), h = _absorbed(seed, words[:-1])
    m, ma, ml, mr = _M32, _MULT_A, _MIX_L, _MIX_R
    last = words[-1]
    for value in ((last,) if 0 <= last <= m else _u32_words(last)):
        v = (value ^ h) & m
        h = (h * ma) & m
        v = (v * h) & m
        r = (ml * p0 - mr * (v ^ (v >> 16))) & m
        p0 = r ^ (r >> 16)
        v = (value ^ h) & m
        h = (h * ma) & m
        v = (v * h) & m
        r = (ml * p1 - mr * (v ^ (v >> 16))) & m
        p1 = r ^ (r >> 16)
        v = (value ^ h) & m
        h = (h * ma) & m
        v = (v * h) & m
        r = (ml * p2 - mr * (v ^ (v >> 16))) & m
        p2 = r ^ (r >> 16)
        v = (value ^ h) & m
        h = (h * ma) & m
        v = (v * h) & m
        r = (ml * p3 - mr * (v ^ (v >> 16))) & m
        p3 = r ^ (r >> 16)
    (x0, m0), (x1, m1), (x2, m2), (x3, m3), (x4, m4), (x5, m5), (x6, m6), (x7, m7) = _OUT
    o0 = ((p0 ^ x0) * m0) & m
    o1 = ((p1 ^ x1) * m1) & m
    o2 = ((p2 ^ x2) * m2) & m
    o3 = ((p3 ^ x3) * m3) & m
    o4 = ((p0 ^ x4) * m4) & m
    o5 = ((p1 ^ x5) * m5) & m
    o6 = ((p2 ^ x6) * m6) & m
    o7 = ((p3 ^ x7) * m7) & m
    return np.array([(o0 ^ (o0 >> 16)) | (o1 ^ (o1 >> 16)) << 32,
                     (o2 ^ (o2 >> 16)) | (o3 ^ (o3 >> 16)) << 32,
                     (o4 ^ (o4 >> 16)) | (o5 ^ (o5 >> 16)) << 32,
                     (o6 ^ (o6 >> 16)) | (o7 ^ (o7 >> 16)) << 32], dtype=np.uint64)


@functools.cache
def _hand_seeding_agrees() -> bool:
    """Whether ``_seed_state`` gives this numpy's SeedSequence state on a few keys (checked
    once per process): numpy promises a stable SeedSequence, and should one ever change,
    streams come from numpy's own again rather than from a copy of the old algorithm."""
    keys = ((0, (1,)), (12345, (7, 2**40 + 3)), (2**70 + 5, (0, 2**63, 9)))
    return all(np.array_equal(_seed_state(seed, words), np.random.SeedSequence(
        entropy=seed, spawn_key=words).generate_state(4, np.uint64)) for seed, words in keys)


class _State(ISeedSequence):
    """A seed sequence that hands PCG64 a state computed beforehand (``_seed_state``)."""

    __slots__ = ("state",)

    def __init__(self, state: np.ndarray):
        self.state = state

    def generate_state(self, n_words, dtype=np.uint32):
        if n_words != 4 or np.dtype(dtype) != np.uint64:  # only PCG64's request is precomputed
            raise ValueError("a precomputed keyed state: PCG64's 4 uint64 words only")
        return self.state


_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341  # PCG64's 128-bit multiplier
_M128 = (1 << 128) - 1


def _pcg64_seeded(words: np.ndarray) -> tuple[int, int]:
    """The (state, inc) ``PCG64`` sets from four 64-bit seed words (numpy's
    ``pcg64_set_seed``: the first two the initial state, the last two the sequence; the state
    stepped once before the initial state is added and once after), without building one."""
    w0, w1, w2, w3 = (int(x) for x in words)
    inc = ((((w2 << 64) | w3) << 1) | 1) & _M128
    state = (inc + ((w0 << 64) | w1)) & _M128  # 0 * MULT + inc, plus the initial state
    return (state * _PCG_MULT + inc) & _M128, inc


@functools.cache
def _hand_pcg_agrees() -> bool:
    """Whether ``_pcg64_seeded`` gives this numpy's PCG64 state (checked once per process)."""
    for seed in (0, 12345, 2**70 + 5):
        words = np.random.SeedSequence(seed).generate_state(4, np.uint64)
        st = np.random.PCG64(_State(words)).state["state"]
        if _pcg64_seeded(words) != (st["state"], st["inc"]):
            return False
    return True


_STATES: dict = {}  # (seed, key words) -> PCG64 (state, inc) right after seeding
_STATES_MAX = 1 << 18
_LOCAL = threading.local()


def keyed_state(seed: int, *key) -> tuple[int, int]:
    """The PCG64 (state, inc) of ``stream(seed, *key)`` right after seeding, as 128-bit ints.
    Seeding by numpy (a ``SeedSequence`` and a ``PCG64``) costs some 40 microseconds, by hand
    (``_seed_state``, ``_pcg64_seeded``) a few; a state seen before is looked up, so a tuning
    run that replays the same seeds thousands of times seeds each key once."""
    words = key_words(*key)
    k = (int(seed), words)
    got = _STATES.get(k)
    if got is None:
        fast = int(seed) >= 0 and words and _hand_seeding_agrees()
        if fast and _hand_pcg_agrees():
            got = _pcg64_seeded(_seed_state(int(seed), words))
        else:
            bg = np.random.PCG64(_State(_seed_state(int(seed), words)) if fast
                                 else np.random.SeedSequence(entropy=int(seed), spawn_key=words))
            st = bg.state["state"]
            got = (st["state"], st["inc"])
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()
        _STATES[k] = got
    return got


def transient_stream(seed: int, *key) -> np.random.Generator:
    """``stream(seed, *key)``'s draws, from one generator per thread that is reset to the
    keyed state (``keyed_state``): valid only until this thread's next call."""
    got = keyed_state(seed, *key)
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


def keyed_uniform(seed: int, ident, purpose: str) -> float:
    """``keyed_uniforms(seed, [ident], purpose)[0]`` as a float, without the array (a world
    draws one forecast at a time)."""
    digest = hashlib.blake2b(f"{int(seed)}\x1f{purpose}\x1f{ident}".encode(),
                             digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0**-53


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
