"""One step of the closed-loop fast path's events, compiled (Numba, compiled on first use and
cached on disk); kept apart so that importing ``gfsim.simulator.closed.fast`` does not import
Numba.

``run`` is ``_FastPuct.run_step``'s event loop for one step of one search: the step's children
admitted in order, then the heap of timed events (a segment's service ends, a queued request
gets its slot, a parent batch decides) popped by time and then by the order they were
scheduled, first come first served with a freed slot passed straight to the next in line, the
bookings summed in that order, the budget checked and the batch's measurements started when it
decides, each measurement's end booked in the anytime rows. The same operations on the same
floats in the same order as ``fast.py``'s Python loop, so the same answers to the bit
(``tests/test_puct_fast.py`` runs its SimPy comparisons both ways).

A batch decides with the decisions made for the whole step at its start (``measure``) while
the search's best is the one they were made with; where a measurement has raised the best
meanwhile, or where it would measure more children than the cap per parent allows, ``run``
returns the batch, and the Python side decides it again or caps it (as ``_FastPuct._decide``
does), then calls ``run`` once more to go on (``ist[RESUME]``).

What a child does comes packed per plan (``fast._Proto.packed``): ``[pre segments, post
segments, how its part before the decision ends (an outcome code, -1: it goes through), its
outcome code (-1: none), segments, bookings]``, then per segment ``[resource, on the GPU,
seconds held, first booking, bookings]`` and per booking ``[stage, seconds, usd, joules,
usd_imputed]``; a step's children's packs are concatenated in ``packed``.
"""

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)

# Heap entries: a segment's service ended (before / after the decision), a queued request got
# its slot (before / after), a parent batch decides.
PRE_END, POST_END, PRE_GRANT, POST_GRANT, DECIDE = 0, 1, 2, 3, 4
# A child's state (``fast._STATES``) and action (``fast._ACTIONS``).
BUDGET_STOPPED, MEASURED, SKIPPED, UNMEASURABLE, GENERATION_FAILED, FAILED_BEFORE = range(6)
NO_ACTION, SKIP, MEASURE = 0, 1, 2
# What stopped the search (``fast._STOPS``; codes past these are set by the Python side).
NOT_STOPPED, BY_GPU_EVALS, BY_GPU_HOURS, BY_SECONDS, BY_USD, BY_JOULES = range(6)
# ``fs`` (the search's floats), ``ist`` (its counters), ``cfg_f`` and ``cfg_i`` (its budget and
# settings), the columns of ``out_f`` and ``out_i`` (per child of the step).
NOW, USD, JOULES, GPU_BUSY, BEST, EARLY_BEST = range(6)
FS = 6
(EVALS, FORECASTS, GENERATED, UNMEASURABLE_N, STOPPED, BEST_I, N_ANYTIME, RESUME, HEAP_N,
 EID) = range(10)
IST = 10
(B_USD, B_JOULES, B_SECONDS, B_GPU_EVALS, B_GPU_HOURS, IDLE_USD_PER_HOUR, IDLE_W, HOUR,
 BUDGET_HOUR) = range(9)
CFG_F = 9
(MONEY_LIMITED, RESERVED, GPUS, FC_STAGE, K_SUCCESS, K_GENERATION_FAILED, K_UNMEASURABLE,
 K_PER_PARENT) = range(8)
CFG_I = 8
CAND_USD, T_START, T_END, MEASURED_SPEEDUP = range(4)
STATE, OUTCOME, ACTION = range(3)
START = -2  # ``ist[RESUME]`` before the step's children are admitted
HEAD = 6  # a pack's header, then 5 numbers per segment and per booking
ROW = 5


@_jit
def _move(ht, hk, dst, src):
    """Heap row ``src`` copied into row ``dst``."""
    ht[dst] = ht[src]
    for c in range(4):
        hk[dst, c] = hk[src, c]


@_jit
def _push(ht, hk, heap_n, t, eid, kind, i, s):
    """Insert (t, eid, kind, i, s) into the binary heap ordered by (t, eid); returns its size."""
    pos = heap_n
    while pos > 0:
        up = (pos - 1) >> 1
        if ht[up] < t or (ht[up] == t and hk[up, 0] < eid):
            break
        _move(ht, hk, pos, up)
        pos = up
    ht[pos] = t
    hk[pos, 0] = eid
    hk[pos, 1] = kind
    hk[pos, 2] = i
    hk[pos, 3] = s
    return heap_n + 1


@_jit
def _pop(ht, hk, heap_n):
    """Remove the heap's first entry and leave it in row ``heap_n - 1`` (past the new end);
    returns the new size."""
    t0, e0, k0, i0, s0 = ht[0], hk[0, 0], hk[0, 1], hk[0, 2], hk[0, 3]
    n = heap_n - 1
    t, e, k, i, s = ht[n], hk[n, 0], hk[n, 1], hk[n, 2], hk[n, 3]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        right = child + 1
        if right < n and (ht[right] < ht[child]
                          or (ht[right] == ht[child] and hk[right, 0] < hk[child, 0])):
            child = right
        if ht[child] < t or (ht[child] == t and hk[child, 0] < e):
            _move(ht, hk, pos, child)
            pos = child
        else:
            break
    ht[pos] = t
    hk[pos, 0] = e
    hk[pos, 1] = k
    hk[pos, 2] = i
    hk[pos, 3] = s
    ht[n] = t0
    hk[n, 0] = e0
    hk[n, 1] = k0
    hk[n, 2] = i0
    hk[n, 3] = s0
    return n


@_jit
def _spent(fs, cfg_f, cfg_i):
    """``_FastPuct._spent``: (usd, joules) so far, reserved GPUs' idle time priced in."""
    usd, joules = fs[USD], fs[JOULES]
    if cfg_i[RESERVED]:
        idle = cfg_i[GPUS] * fs[NOW] - fs[GPU_BUSY]
        if idle > 0:  # (the cost model's ``idle``)
            usd = usd + idle * cfg_f[IDLE_USD_PER_HOUR] / cfg_f[HOUR]
            joules = joules + idle * cfg_f[IDLE_W]
    return usd, joules


@_jit
def _exhausted(fs, ist, cfg_f, cfg_i):
    """``_FastPuct._exhausted``: the limit that stopped the search (0: none)."""
    if ist[STOPPED] != NOT_STOPPED:
        return ist[STOPPED]
    reason = NOT_STOPPED
    if ist[EVALS] >= cfg_f[B_GPU_EVALS]:
        reason = BY_GPU_EVALS
    elif fs[GPU_BUSY] >= cfg_f[B_GPU_HOURS] * cfg_f[BUDGET_HOUR]:
        reason = BY_GPU_HOURS
    elif fs[NOW] >= cfg_f[B_SECONDS]:
        reason = BY_SECONDS
    elif cfg_i[MONEY_LIMITED]:
        usd, joules = _spent(fs, cfg_f, cfg_i)
        if usd >= cfg_f[B_USD]:
            reason = BY_USD
        elif joules >= cfg_f[B_JOULES]:
            reason = BY_JOULES
    ist[STOPPED] = reason
    return reason


@_jit
def _measured(j, fs, ist, cfg_f, cfg_i, packed, base, speedup, noise, out_f, out_i, anytime,
              lo):
    """``_FastPuct._measured``: child j's measurement ended now."""
    out_f[j, T_END] = fs[NOW]
    outcome = np.int64(packed[base[j] + 3])
    out_i[j, OUTCOME] = outcome
    if outcome == cfg_i[K_SUCCESS]:
        s = speedup[j] * noise[j]
        out_f[j, MEASURED_SPEEDUP] = s
        if s > fs[BEST]:
            fs[BEST] = s
            ist[BEST_I] = lo + j
    usd, joules = _spent(fs, cfg_f, cfg_i)
    k = ist[N_ANYTIME]
    anytime[k, 0] = fs[NOW]
    anytime[k, 1] = usd
    anytime[k, 2] = joules
    anytime[k, 3] = ist[EVALS]
    anytime[k, 4] = fs[BEST]
    ist[N_ANYTIME] = k + 1



@_jit
def _acquire(j, s, post, fs, ist, cap, in_use, packed, base, ht, hk, q, qht):
    """Segment s of child j's part (before or after the decision) asks for its resource."""
    b = base[j]
    r = b + HEAD + ROW * (s + (np.int64(packed[b]) if post else 0))
    res = np.int64(packed[r])
    if in_use[res] < cap[res] and qht[res, 0] == qht[res, 1]:
        in_use[res] += 1
        ist[HEAP_N] = _push(ht, hk, ist[HEAP_N], fs[NOW] + packed[r + 2], ist[EID],
                            POST_END if post else PRE_END, j, s)
        ist[EID] += 1
    else:
        _enqueue(q, qht, res, POST_GRANT if post else PRE_GRANT, j, s)


@_jit
def _enqueue(q, qht, res, kind, j, s):
    size = q.shape[1]
    at = qht[res, 1] % size
    q[res, at, 0] = kind
    q[res, at, 1] = j
    q[res, at, 2] = s
    qht[res, 1] += 1


@_jit
def _prepared(j, fs, ist, cfg_i, packed, base, out_i, batch_of, remaining, ht, hk):
    """``_FastPuct._prepared``: child j's part before the decision is done."""
    ist[GENERATED] += 1
    ended = np.int64(packed[base[j] + 2])
    if ended == cfg_i[K_GENERATION_FAILED]:
        out_i[j, STATE] = GENERATION_FAILED
    elif ended == cfg_i[K_UNMEASURABLE]:
        out_i[j, STATE] = UNMEASURABLE
        ist[UNMEASURABLE_N] += 1
    elif ended >= 0:
        out_i[j, STATE] = FAILED_BEFORE
        out_i[j, OUTCOME] = ended
    b = batch_of[j]
    remaining[b] -= 1
    if remaining[b] == 0:
        ist[HEAP_N] = _push(ht, hk, ist[HEAP_N], fs[NOW], ist[EID], DECIDE, b, 0)
        ist[EID] += 1


@_jit
def _decided(b, fs, ist, cfg_f, cfg_i, cap, packed, speedup, noise, batch_lo, live_lo, measure,
             out_f, out_i, anytime, lo, ht, hk, q, qht, in_use, base, chosen):
    """``_FastPuct._decide`` once batch b's decisions are in ``measure``: skip or measure each
    child that reached the decision (while no budget is spent), then start the measurements,
    in order (SimPy starts each as a new process, before anything else at this instant)."""
    k = live_lo[b]
    n_chosen = 0
    for j in range(batch_lo[b], batch_lo[b + 1]):
        if packed[base[j] + 2] >= 0:  # its part before the decision ended it
            continue
        m = measure[k]
        k += 1
        if m == 0:
            out_i[j, ACTION] = SKIP
            out_i[j, STATE] = SKIPPED
            continue
        out_i[j, ACTION] = MEASURE
        if _exhausted(fs, ist, cfg_f, cfg_i) != NOT_STOPPED:
            pass  # stays budget_stopped
        elif packed[base[j] + 3] < 0:
            out_i[j, STATE] = UNMEASURABLE
            ist[UNMEASURABLE_N] += 1
        else:
            ist[EVALS] += 1
            out_i[j, STATE] = MEASURED
            out_f[j, T_START] = fs[NOW]
            chosen[n_chosen] = j
            n_chosen += 1
    for c in range(n_chosen):
        j = chosen[c]
        if packed[base[j] + 1] > 0:
            _acquire(j, 0, True, fs, ist, cap, in_use, packed, base, ht, hk, q, qht)
        else:
            _measured(j, fs, ist, cfg_f, cfg_i, packed, base, speedup, noise, out_f, out_i,
                      anytime, lo)


@_jit
def run(fs, ist, stages, cfg_f, cfg_i, cap, packed, speedup, noise, batch_lo, live_lo, measure,
        out_f, out_i, anytime, lo, ht, hk, q, qht, in_use, remaining, base, batch_of, chosen):
    """The step's events until they are done (returns -1) or until a batch must be decided
    again or capped (returns it: put its decisions in ``measure``, set ``ist[RESUME]`` to it
    and call again with the same arrays); ``stages``: seconds, usd, joules and usd_imputed per
    cost stage, summed as the bookings come. Children are numbered from 0 in the step (``lo`` + j in
    the search); batch b is children ``batch_lo[b]`` to ``batch_lo[b + 1]`` (an empty one never
    decides), and its children that reach the decision are entries ``live_lo[b]`` to
    ``live_lo[b + 1]`` of ``measure`` (1: measure it). ``ht``/``hk`` (the heap: times; eid,
    kind, child, segment), ``q``/``qht`` (per resource a ring of queued requests and its head
    and tail), ``in_use``, ``remaining`` (children per batch not yet prepared), ``base`` (each
    child's place in ``packed``), ``batch_of`` and ``chosen`` are the step's own: sized by
    the caller (heap n + batches + 1 rows, rings n + 1), filled here."""
    n = len(speedup)
    nb = len(batch_lo) - 1
    resume = ist[RESUME]
    ist[RESUME] = -1
    if resume == START:  # admit every child, in order, each asking for its first resource
        ist[HEAP_N] = 0
        ist[EID] = 0
        in_use[:] = 0
        qht[:, :] = 0
        at = 0
        for j in range(n):
            base[j] = at
            at += HEAD + ROW * (np.int64(packed[at + 4]) + np.int64(packed[at + 5]))
        for b in range(nb):
            remaining[b] = batch_lo[b + 1] - batch_lo[b]
            for j in range(batch_lo[b], batch_lo[b + 1]):
                batch_of[j] = b
        for j in range(n):
            if packed[base[j]] > 0:
                _acquire(j, 0, False, fs, ist, cap, in_use, packed, base, ht, hk, q, qht)
            else:
                _prepared(j, fs, ist, cfg_i, packed, base, out_i, batch_of, remaining, ht, hk)
    elif resume >= 0:
        _decided(resume, fs, ist, cfg_f, cfg_i, cap, packed, speedup, noise, batch_lo, live_lo,
                 measure, out_f, out_i, anytime, lo, ht, hk, q, qht, in_use, base, chosen)
    while ist[HEAP_N] > 0:
        ist[HEAP_N] = _pop(ht, hk, ist[HEAP_N])
        top = ist[HEAP_N]  # (the popped entry sits past the heap's end)
        t, kind, j, s = ht[top], hk[top, 1], hk[top, 2], hk[top, 3]
        fs[NOW] = t
        if kind <= POST_END:  # a segment ends: release, book, go on
            post = kind == POST_END
            pre_n = np.int64(packed[base[j]])
            r = base[j] + HEAD + ROW * (s + (pre_n if post else 0))
            res = np.int64(packed[r])
            total = packed[r + 2]
            if qht[res, 0] < qht[res, 1]:  # the slot passes straight to the next in line
                at = qht[res, 0] % q.shape[1]
                qht[res, 0] += 1
                ist[HEAP_N] = _push(ht, hk, ist[HEAP_N], t, ist[EID], q[res, at, 0],
                                    q[res, at, 1], q[res, at, 2])
                ist[EID] += 1
            else:
                in_use[res] -= 1
            usd = fs[USD]
            joules = fs[JOULES]
            spent = out_f[j, CAND_USD]
            first = base[j] + HEAD + ROW * (np.int64(packed[base[j] + 4])
                                            + np.int64(packed[r + 3]))
            for k in range(np.int64(packed[r + 4])):
                w = first + ROW * k
                stage = np.int64(packed[w])
                u = packed[w + 2]
                jl = packed[w + 3]
                stages[0, stage] += packed[w + 1]
                stages[1, stage] += u
                stages[2, stage] += jl
                stages[3, stage] += packed[w + 4]
                usd += u
                joules += jl
                spent += u
                if stage == cfg_i[FC_STAGE]:
                    ist[FORECASTS] += 1
            out_f[j, CAND_USD] = spent
            fs[USD] = usd
            fs[JOULES] = joules
            if packed[r + 1] != 0:
                fs[GPU_BUSY] += total
            s += 1
            if s < (np.int64(packed[base[j] + 1]) if post else pre_n):
                _acquire(j, s, post, fs, ist, cap, in_use, packed, base, ht, hk, q, qht)
            elif not post:
                _prepared(j, fs, ist, cfg_i, packed, base, out_i, batch_of, remaining, ht, hk)
            else:
                _measured(j, fs, ist, cfg_f, cfg_i, packed, base, speedup, noise, out_f, out_i,
                          anytime, lo)
        elif kind == DECIDE:
            if live_lo[j + 1] > live_lo[j]:  # (a batch that nothing reached has no decision)
                if fs[BEST] != fs[EARLY_BEST]:
                    return j  # decided again, with the best as it is now, by the caller
                chosen_n = 0
                for x in range(live_lo[j], live_lo[j + 1]):
                    chosen_n += measure[x] != 0
                if chosen_n > cfg_i[K_PER_PARENT]:
                    return j  # capped per parent by the caller (the cap reads the batch)
                _decided(j, fs, ist, cfg_f, cfg_i, cap, packed, speedup, noise, batch_lo,
                         live_lo, measure, out_f, out_i, anytime, lo, ht, hk, q, qht, in_use,
                         base, chosen)
        else:  # a queued request got its slot: it holds it for its service time
            post = kind == POST_GRANT
            r = base[j] + HEAD + ROW * (s + (np.int64(packed[base[j]]) if post else 0))
            ist[HEAP_N] = _push(ht, hk, ist[HEAP_N], t + packed[r + 2], ist[EID], kind - 2, j, s)
            ist[EID] += 1
    return -1
