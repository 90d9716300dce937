"""``forecasts.trees``' compiled loop (Numba, compiled on first use and cached on disk):
kept apart so that importing ``gfsim.forecasts.trees`` does not import Numba."""

import numba
import numpy as np

_MISSING_BIN = 255
_N_BINS = 256
_MIN_HESSIAN = 1e-3  # scikit-learn's min_hessian_to_split

_jit = numba.njit(cache=True, nogil=True)


@_jit
def pairwise_block(a, lo, n):
    # NumPy's pairwise sum (``pairwise_sum_DOUBLE``) of a[lo:lo + n], 8 <= n <= 128: eight
    # running sums, then the rest in order
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@_jit
def pairwise_256(a):
    # NumPy's sum of 256 doubles: two blocks of 128 (its recursion's one level at this size;
    # written out, as Numba's cache does not keep recursive functions safely)
    return pairwise_block(a, 0, 128) + pairwise_block(a, 128, 128)


@_jit
def histograms(cols, grad, idx, lo, hi, nbnm, hg, hc, slot):
    # every feature's histogram of the samples idx[lo:hi], gradients added in that order; only
    # the bins the scans read (below nbnm: not the missing values' bin, whose sums the node's
    # totals imply)
    nf = cols.shape[0]
    for f in range(nf):
        top = nbnm[f]
        for b in range(top):
            hg[slot, f, b] = 0.0
            hc[slot, f, b] = 0
        col = cols[f]
        for k in range(lo, hi):
            s = idx[k]
            b = col[s]
            if b < top:
                hg[slot, f, b] += np.float64(grad[s])
                hc[slot, f, b] += 1


@_jit
def gain_of(sgl, shl, sgr, shr, loss):
    vl = -sgl / (shl + 0.0 + 1e-15)
    vr = -sgr / (shr + 0.0 + 1e-15)
    g = loss
    g -= sgl * vl
    g -= sgr * vr
    return g

@_jit
def best_split(hg, hc, slot, nbnm, has_missing, n, sg, sh, value, min_leaf):
    # (gain, feature, bin, missing to the left, sum_g left, sum_h left, n left); gain -1:
    # no split (scikit-learn's find_node_split, one thread)
    best = (-1.0, 0, 0, False, 0.0, 0.0, 0)
    loss = sg * value
    nf = hg.shape[1]
    for f in range(nf):
        fg, fb, fm, fsgl, fshl, fnl = -1.0, 0, False, 0.0, 0.0, 0
        found = False
        end = nbnm[f] - 1 + (1 if has_missing[f] else 0)
        sgl = 0.0
        shl = 0.0
        nl = 0
        for b in range(end):
            c = hc[slot, f, b]
            nl += c
            nr = n - nl
            shl += c
            shr = sh - shl
            sgl += hg[slot, f, b]
            sgr = sg - sgl
            if nl < min_leaf:
                continue
            if nr < min_leaf:
                break
            if shl < _MIN_HESSIAN:
                continue
            if shr < _MIN_HESSIAN:
                break
            g = gain_of(sgl, shl, sgr, shr, loss)
            if g > fg and g > 0.0:
                found = True
                fg, fb, fm, fsgl, fshl, fnl = g, b, False, sgl, shl, nl
        if has_missing[f] and nbnm[f] >= 2:
            sgr = 0.0
            shr = 0.0
            nr = 0
            for b in range(nbnm[f] - 2, -1, -1):
                c = hc[slot, f, b + 1]
                nr += c
                nl = n - nr
                shr += c
                shl = sh - shr
                sgr += hg[slot, f, b + 1]
                sgl = sg - sgr
                if nr < min_leaf:
                    continue
                if nl < min_leaf:
                    break
                if shr < _MIN_HESSIAN:
                    continue
                if shl < _MIN_HESSIAN:
                    break
                g = gain_of(sgl, shl, sgr, shr, loss)
                if g > fg and g > 0.0:
                    found = True
                    fg, fb, fm, fsgl, fshl, fnl = g, b, True, sgl, shl, nl
        if not found:
            fg = -1.0
        if f == 0 or fg > best[0]:
            best = (fg, f, fb, fm, fsgl, fshl, fnl)
    return best

@_jit
def fit(cols, y, cut, nbnm, has_missing, n_iter, depth, lr, min_leaf, base):
    nf, n = cols.shape
    n_int = 2 ** depth - 1
    feat = np.zeros((n_iter, n_int), dtype=np.int64)
    thr = np.full((n_iter, n_int), np.inf)
    mgl = np.ones((n_iter, n_int), dtype=np.bool_)
    val = np.zeros((n_iter, 2 ** depth))
    raw = np.zeros(n)
    raw += base
    grad = np.empty(n, dtype=np.float32)
    idx = np.empty(n, dtype=np.int64)
    scratch = np.empty(n, dtype=np.int64)
    # histograms by heap position (a node's are its parent's slot reused by subtraction)
    hg = np.zeros((n_int, nf, _N_BINS))
    hc = np.zeros((n_int, nf, _N_BINS), dtype=np.int64)
    root_g = np.zeros(_N_BINS)
    # the stack of nodes to split: heap position, depth, range, sum of gradients, value
    st_p = np.empty(n_int, dtype=np.int64)
    st_d = np.empty(n_int, dtype=np.int64)
    st_lo = np.empty(n_int, dtype=np.int64)
    st_hi = np.empty(n_int, dtype=np.int64)
    st_sg = np.empty(n_int)
    st_v = np.empty(n_int)
    # leaves: heap position, range, value
    lf_p = np.empty(2 ** depth, dtype=np.int64)
    lf_lo = np.empty(2 ** depth, dtype=np.int64)
    lf_hi = np.empty(2 ** depth, dtype=np.int64)
    lf_v = np.empty(2 ** depth)
    split_leaf = 2 * min_leaf
    for it in range(n_iter):
        for i in range(n):
            grad[i] = np.float32(raw[i] - y[i])
            idx[i] = i
        histograms(cols, grad, idx, 0, n, nbnm, hg, hc, 0)
        # the root's sum of gradients: NumPy's sum over feature 0's whole histogram (its
        # missing values' bin and the empty ones too), as _Boosted took it
        for b in range(_N_BINS):
            root_g[b] = 0.0
        col0 = cols[0]
        for i in range(n):
            root_g[col0[i]] += np.float64(grad[i])
        sum_g = pairwise_256(root_g)
        top = 0
        nleaf = 0
        if n >= split_leaf:
            st_p[0], st_d[0], st_lo[0], st_hi[0], st_sg[0], st_v[0] = 0, 0, 0, n, sum_g, 0.0
            top = 1
        else:
            lf_p[0], lf_lo[0], lf_hi[0], lf_v[0] = 0, 0, n, 0.0
            nleaf = 1
        while top > 0:
            top -= 1
            p, d, lo, hi, sg, v = st_p[top], st_d[top], st_lo[top], st_hi[top], \
                st_sg[top], st_v[top]
            m = hi - lo
            g, f, b, left_missing, sgl, shl, nl = best_split(
                hg, hc, p, nbnm, has_missing, m, sg, np.float64(m), v, min_leaf)
            if g <= 0:
                lf_p[nleaf], lf_lo[nleaf], lf_hi[nleaf], lf_v[nleaf] = p, lo, hi, v
                nleaf += 1
                continue
            # a stable partition of the node's samples: left ones first
            col = cols[f]
            a = lo
            r = 0
            for k in range(lo, hi):
                s = idx[k]
                c = col[s]
                if c <= b or (left_missing and c == _MISSING_BIN):
                    idx[a] = s
                    a += 1
                else:
                    scratch[r] = s
                    r += 1
            for k in range(r):
                idx[a + k] = scratch[k]
            n_left = a - lo
            feat[it, p] = f
            thr[it, p] = np.inf if b == nbnm[f] - 1 else cut[f, b]
            mgl[it, p] = left_missing if has_missing[f] else n_left > m - n_left
            sgr = sg - sgl
            shr = np.float64(m) - shl
            vl = -sgl / (shl + 0.0 + 1e-15)
            vr = -sgr / (shr + 0.0 + 1e-15)
            ql, qr = 2 * p + 1, 2 * p + 2
            mid = lo + n_left
            go_l = n_left >= split_leaf
            go_r = (hi - mid) >= split_leaf
            if d + 1 == depth or not (go_l or go_r):
                lf_p[nleaf], lf_lo[nleaf], lf_hi[nleaf], lf_v[nleaf] = ql, lo, mid, vl
                lf_p[nleaf + 1], lf_lo[nleaf + 1], lf_hi[nleaf + 1], lf_v[nleaf + 1] = \
                    qr, mid, hi, vr
                nleaf += 2
                continue
            # the smaller child's histograms built, the other's by subtraction from the
            # parent's, as scikit-learn does (children above the bottom level: their heap
            # positions have slots)
            if n_left < hi - mid:
                histograms(cols, grad, idx, lo, mid, nbnm, hg, hc, ql)
                small, big = ql, qr
            else:
                histograms(cols, grad, idx, mid, hi, nbnm, hg, hc, qr)
                small, big = qr, ql
            for ff in range(nf):
                for bb in range(nbnm[ff]):
                    hg[big, ff, bb] = hg[p, ff, bb] - hg[small, ff, bb]
                    hc[big, ff, bb] = hc[p, ff, bb] - hc[small, ff, bb]
            if go_l:
                st_p[top], st_d[top], st_lo[top], st_hi[top], st_sg[top], st_v[top] = \
                    ql, d + 1, lo, mid, sgl, vl
                top += 1
            else:
                lf_p[nleaf], lf_lo[nleaf], lf_hi[nleaf], lf_v[nleaf] = ql, lo, mid, vl
                nleaf += 1
            if go_r:
                st_p[top], st_d[top], st_lo[top], st_hi[top], st_sg[top], st_v[top] = \
                    qr, d + 1, mid, hi, sgr, vr
                top += 1
            else:
                lf_p[nleaf], lf_lo[nleaf], lf_hi[nleaf], lf_v[nleaf] = qr, mid, hi, vr
                nleaf += 1
        for k in range(nleaf):
            v = lf_v[k] * lr
            for j in range(lf_lo[k], lf_hi[k]):
                raw[idx[j]] += v
            q = lf_p[k]
            while q < n_int:  # a leaf above the bottom: its value down the leftmost path
                q = 2 * q + 1
            val[it, q - n_int] = v
    return feat, thr, mgl, val

