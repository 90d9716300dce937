"""``ModelChildren``'s draws of invented children, compiled (Numba, compiled on first use and
cached on disk); kept apart so that importing ``gfsim.simulator.world_model`` does not import
Numba.

``invent`` is the loop of ``ModelChildren._expand`` after the logged children: per child, a
repeat of an earlier sibling, the next of a crb lineage, a crb neighbour's pair or a gbm draw,
then ``_invent``'s logged template, speedup and forecast template. It draws from the
expansion's keyed PCG64 stream, given as its state words, with numpy's own algorithms
(``next_double``, the buffered 32-bit halves and Lemire's bounded integers, as
``world_model._Draws``), and it works the floats out with the C library's functions in the
same order as the Python loop, so the children are the same to the bit; it writes what the
Python side needs to build each child into one row of ``out``.
"""

import math

import numba
import numpy as np

from gfsim.core.rng import _INIT_A, _INIT_B, _MIX_L, _MIX_R, _MULT_A, _MULT_B, _PCG_MULT, _POOL

_jit = numba.njit(cache=True, nogil=True)

# PCG64's 128-bit multiplier (numpy's PCG_DEFAULT_MULTIPLIER), as two 64-bit halves.
_MUL_HI = np.uint64(_PCG_MULT >> 64)
_MUL_LO = np.uint64(_PCG_MULT & 0xFFFFFFFFFFFFFFFF)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_S58 = np.uint64(58)
_S64 = np.uint64(64)
_TWO_M53 = 1.0 / 9007199254740992.0

# Kinds of child, column 0 of a row of ``out``.
REPEAT, LINEAGE, CRB, GBM = 0, 1, 2, 3
# Columns of a row of ``out``: kind, the repeated kind's index (repeats) or the logged
# template c, outcome code, speedup, forecast template index (-1: the template's own
# forecast), log2 move of the forecast, whether c is kept as the node's crb template.
COLUMNS = 7


@_jit
def _mulhi(a, b):
    # the high 64 bits of the 128-bit product a * b
    a_lo, a_hi = a & _M32, a >> _S32
    b_lo, b_hi = b & _M32, b >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    cross = (lo_lo >> _S32) + (hi_lo & _M32) + lo_hi
    return hi_hi + (hi_lo >> _S32) + (cross >> _S32)


@_jit
def _next64(st):
    # st: [state high, state low, inc high, inc low, has_uint32, uinteger] (uint64)
    # state = state * MUL + inc (mod 2^128), then the XSL-RR output of the new state
    s_hi, s_lo = st[0], st[1]
    lo = s_lo * _MUL_LO
    hi = _mulhi(s_lo, _MUL_LO) + s_hi * _MUL_LO + s_lo * _MUL_HI
    new_lo = lo + st[3]
    carry = np.uint64(1) if new_lo < lo else np.uint64(0)
    new_hi = hi + st[2] + carry
    st[0], st[1] = new_hi, new_lo
    x = new_hi ^ new_lo
    r = new_hi >> _S58
    return (x >> r) | (x << ((_S64 - r) & np.uint64(63)))


# numpy's SeedSequence constants (gfsim.core.rng), as unsigned 64-bit numbers
_SS_INIT_A, _SS_MULT_A = np.uint64(_INIT_A), np.uint64(_MULT_A)
_SS_INIT_B, _SS_MULT_B = np.uint64(_INIT_B), np.uint64(_MULT_B)
_SS_MIX_L, _SS_MIX_R = np.uint64(_MIX_L), np.uint64(_MIX_R)
_S16 = np.uint64(16)


@_jit
def _u32_words(x, out, at):
    # x's 32-bit words, least significant first (0: one word), as SeedSequence reads an int
    out[at] = x & _M32
    at += 1
    if x > _M32:
        out[at] = x >> _S32
        at += 1
    return at


@_jit
def _hashmix(value, h, mult):
    # SeedSequence's hashmix: (the hashed 32-bit value, the next hash constant)
    v = (value ^ h) & _M32
    h = (h * mult) & _M32
    v = (v * h) & _M32
    return v ^ (v >> _S16), h


@_jit
def _mix(x, y):
    # SeedSequence's mix of a pool word x with a hashed word y
    r = (_SS_MIX_L * x - _SS_MIX_R * y) & _M32
    return r ^ (r >> _S16)


@_jit
def seeded(seed, key):
    """The state words (``world_model._state_words``) of ``gfsim.core.rng.stream(seed, *k)``
    right after seeding, where ``key`` holds ``key_words(*k)`` (uint64) and 0 <= seed < 2^63:
    numpy's ``SeedSequence(entropy=seed, spawn_key=key)`` hashed into its pool and out to four
    64-bit words (``rng._seed_state``), then ``PCG64``'s seeding from them (``rng._pcg64_seeded``),
    so that the draws are ``transient_stream``'s."""
    entropy = np.zeros(_POOL + 2 * len(key), dtype=np.uint64)
    n = _u32_words(np.uint64(seed), entropy, 0)
    n = max(n, _POOL)  # padded with zeros: there is a spawn key
    for w in key:
        n = _u32_words(w, entropy, n)
    pool = np.zeros(_POOL, dtype=np.uint64)
    h = _SS_INIT_A
    for i in range(_POOL):  # (entropy holds at least _POOL words)
        pool[i], h = _hashmix(entropy[i], h, _SS_MULT_A)
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                v, h = _hashmix(pool[src], h, _SS_MULT_A)
                pool[dst] = _mix(pool[dst], v)
    for src in range(_POOL, n):
        for dst in range(_POOL):
            v, h = _hashmix(entropy[src], h, _SS_MULT_A)
            pool[dst] = _mix(pool[dst], v)
    words = np.zeros(4, dtype=np.uint64)  # generate_state(4, uint64): 8 32-bit words, pairs
    h = _SS_INIT_B
    for i in range(2 * _POOL):
        v, h = _hashmix(pool[i % _POOL], h, _SS_MULT_B)
        words[i // 2] |= v << (_S32 * np.uint64(i % 2))
    # PCG64: inc = (words[2:4] << 1) | 1; state 0 stepped, plus words[0:2], stepped again
    st = np.zeros(6, dtype=np.uint64)
    st[2] = (words[2] << np.uint64(1)) | (words[3] >> np.uint64(63))
    st[3] = (words[3] << np.uint64(1)) | np.uint64(1)
    lo = st[3] + words[1]  # state = inc + initial state (0 * MUL + inc, plus it)
    st[0] = st[2] + words[0] + (np.uint64(1) if lo < st[3] else np.uint64(0))
    st[1] = lo
    _next64(st)
    return st


@_jit
def _random(st):
    return float(_next64(st) >> _S11) * _TWO_M53


@_jit
def _u32(st):
    if st[4] != 0:
        st[4] = 0
        return st[5]
    x = _next64(st)
    st[4] = 1
    st[5] = x >> _S32
    return x & _M32


@_jit
def _integers(st, k):
    # numpy's Generator.integers(k), 0 < k < 2^32: Lemire's method on buffered 32-bit halves
    if k <= 0:
        raise ValueError("integers: empty range")
    if k == 1:
        return np.int64(0)
    kk = np.uint64(k)
    m = _u32(st) * kk
    left = m & _M32
    if left < kk:
        threshold = (_M32 - (kk - np.uint64(1))) % kk
        while left < threshold:
            m = _u32(st) * kk
            left = m & _M32
    return np.int64(m >> _S32)


@_jit
def raw(st, n):
    """The next ``n`` 64-bit outputs (for the check that this is numpy's PCG64)."""
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        out[i] = _next64(st)
    return out


@_jit
def mixed(st, ks):
    """A ``random()`` then an ``integers(k)`` per k, as floats (the same check)."""
    out = np.empty(2 * len(ks))
    for i in range(len(ks)):
        out[2 * i] = _random(st)
        out[2 * i + 1] = _integers(st, ks[i])
    return out


@_jit
def _interval(st, top):
    # numpy's random_interval: uniform on [0, top] by masked rejection (32-bit draws below
    # 2^32)
    if top == 0:
        return np.int64(0)
    mx = np.uint64(top)
    mask = mx
    mask |= mask >> np.uint64(1)
    mask |= mask >> np.uint64(2)
    mask |= mask >> np.uint64(4)
    mask |= mask >> np.uint64(8)
    mask |= mask >> np.uint64(16)
    mask |= mask >> _S32
    if mx <= _M32:
        value = _u32(st) & mask
        while value > mx:
            value = _u32(st) & mask
    else:
        value = _next64(st) & mask
        while value > mx:
            value = _next64(st) & mask
    return np.int64(value)


@_jit
def permute(st, a):
    """``a`` shuffled in place as numpy's ``Generator.permutation`` of it draws."""
    for i in range(len(a) - 1, 0, -1):
        j = _interval(st, i)
        t = a[j]
        a[j] = a[i]
        a[i] = t


@_jit
def _bisect_left(a, x):
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def _bisect_right(a, x):
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@_jit
def _held(speedup, frontier, headroom, two):
    # children.held_to_log (``two`` is 2.0: a constant base would let LLVM call exp2 for
    # pow, which is not always the same float as the C library's pow that Python calls)
    if not speedup > frontier:
        return speedup
    if not headroom > 1.0:
        return frontier
    h = math.log2(headroom)
    return frontier * two ** (-h * math.expm1(-math.log2(speedup / frontier) / h))


@_jit
def invent(st, n_need, n_kinds, size, kids, lin_ps, family, near_all, near_own, weight,
           row_c, row_outcome, row_step, cdf, classes, residuals, q0, q1, q2,
           bo_start, bo_len, bo_flat, outcome_of, speedup_of, has_fc, where, parent_target,
           fc_target, fc_k, node_speedup, base, frontier, headroom, success, gen_failed,
           z90, two, out):
    """``n_need`` invented children of one expansion into ``out`` (module doc). ``family``:
    0 crb, 1 gbm; ``n_kinds``: the node's distinct kernels so far; ``kids``: a crb lineage's
    logged children not drawn yet (shuffled here first, as ``_lineage``'s permutation; the
    first ``n_need`` are the lineage), ``lin_ps`` their logged parent's speedup; ``cdf``
    empty: gbm's probabilities had no mass (outcome ``classes[0]``); ``fc_k``: ``K_NEAREST``;
    ``two``:
    2.0, given, so that the speedup's power is the C library's ``pow`` (``_held``)."""
    kinds = n_kinds
    permute(st, kids)
    n_lin = min(len(kids), n_need)
    lin = 0
    m = len(fc_target)
    for slot in range(n_need):
        kind = -1
        c = -1
        outcome = -1
        step = math.nan
        keep = 0.0
        if kinds > 0:
            p = kinds / size
            if 1.0 < p:
                p = 1.0
            if _random(st) < p:
                kind = REPEAT
        if kind == REPEAT:
            out[slot, 0] = REPEAT
            out[slot, 1] = _integers(st, kinds)
            continue
        if lin < n_lin:
            kind = LINEAGE
            c = kids[lin]
            ps = lin_ps
            lin += 1
            s = speedup_of[c]
            step = math.log2(s / ps) if s == s and s > 0 else math.nan
            outcome = outcome_of[c]
            keep = 1.0
        elif family == 0:
            kind = CRB
            rows = near_all
            if len(near_own) > 0 and _random(st) < weight:
                rows = near_own
            r = rows[_integers(st, len(rows))]
            outcome = row_outcome[r]
            step = row_step[r]
            c = row_c[r]
            if c >= 0:
                keep = 1.0
        else:
            kind = GBM
            k = _bisect_right(cdf, _random(st)) if len(cdf) > 0 else 0
            outcome = classes[k]
            if outcome == success:
                r = residuals[_integers(st, len(residuals))]
                w = (q2 - q0) / z90
                if 0.05 > w:
                    w = 0.05
                step = q1 + r * w
        # ``_invent``
        if c < 0:
            n_same = bo_len[outcome]
            c = bo_flat[bo_start[outcome] + _integers(st, n_same)]
        speedup = math.nan
        if outcome == success:
            speedup = node_speedup * two ** step
            if not math.isfinite(speedup):
                speedup = math.nan
        if speedup > frontier:
            speedup = _held(speedup, frontier, headroom, two)
        j = -1
        move = 0.0
        if has_fc[c]:
            if outcome == success and m > 0:
                truth = math.log2(speedup / base)
                k = fc_k if fc_k < m else m
                at = _bisect_left(fc_target, truth) if truth == truth else m
                lo = at - k // 2
                if lo < 0:
                    lo = 0
                if lo > m - k:
                    lo = m - k
                j = lo + _integers(st, k)
                move = truth - fc_target[j]
            else:
                w = where[c]
                if w >= 0:
                    move = math.log2(node_speedup / base) - parent_target[w]
        out[slot, 0] = kind
        out[slot, 1] = c
        out[slot, 2] = outcome
        out[slot, 3] = speedup
        out[slot, 4] = j
        out[slot, 5] = move
        out[slot, 6] = keep
        if outcome != gen_failed:
            kinds += 1


@_jit
def _before(x, y):
    # x sorts strictly before y in numpy's order (NaN last)
    return x < y or (y != y and x == x)


@_jit
def _k_smallest(d, rows, k, out):
    # the k rows with the smallest d, nearest first, ties (and NaNs) in row order: a stable
    # argsort's first k (``world_model._k_smallest``), by insertion into out[:k]
    top = np.empty(k)
    n = 0
    for i in range(len(rows)):
        x = d[i]
        if n == k and not _before(x, top[k - 1]):
            continue
        at = n if n < k else k - 1
        while at > 0 and _before(x, top[at - 1]):
            if at < k:
                top[at] = top[at - 1]
                out[at] = out[at - 1]
            at -= 1
        top[at] = x
        out[at] = rows[i]
        if n < k:
            n += 1


@_jit
def neighbours(feats, scale, weights, zs, own, k, every, mine):
    """``_Member.neighbours_many``'s rows for every features row of ``zs``: the ``k`` nearest
    of all rows into ``every``, of ``own`` into ``mine`` (where there are more rows than k;
    else the rows themselves, in order). The distance is numpy's: per feature ((f - z) /
    scale) squared times the weight, summed in feature order."""
    n, m = feats.shape
    d = np.empty(n)
    d_own = np.empty(len(own))
    rows = np.arange(n)
    for q in range(zs.shape[0]):
        for i in range(n):
            acc = 0.0
            for f in range(m):
                x = (feats[i, f] - zs[q, f]) / scale[f]
                acc += x * x * weights[f]
            d[i] = acc
        if 0 < k < n:
            _k_smallest(d, rows, k, every[q])
        else:
            every[q, :n] = rows
        no = len(own)
        if 0 < k < no:
            for j in range(no):
                d_own[j] = d[own[j]]
            _k_smallest(d_own, own, k, mine[q])
        else:
            mine[q, :no] = own
