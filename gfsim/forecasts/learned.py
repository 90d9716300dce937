"""The learned forecaster (a surrogate, once called the cost model): gradient-boosted trees
over what a candidate is, trained prequentially on what the search has measured so far. No LLM.

What it reads about a candidate (its *features*, from the log's candidate records):

- ``source_meta.variant`` and ``source_meta.params``: the kernel family's variant and tunable
  parameters (live runs and measured worlds write them). A numeric parameter enters as its log2,
  a string one as one indicator per value;
- ``source_meta.features``: what the candidate's ahead-of-time compile reports without a GPU
  (``gfsim.live.tasks.aot.binary_features``, computed on the trusted side): the most registers
  per thread, shared and local memory (spills and stack) of any of its kernels, its kernel
  count and SASS instruction count, each as log2(1 + x);
- the parent's measured log2 speedup (the root's: the task's seed kernel).

The model is scikit-learn's ``HistGradientBoostingRegressor`` on the log2 speedup of measured
successes: already a dependency of gfsim (the world model), fast on the few hundred rows a
search holds, and it takes missing features (NaN) without imputation. Its 8-bin distribution is
a Gaussian around the prediction, integrated over the paper's bins, whose width is the root mean
square of the model's own past prequential errors (the last ``window``; the prior width until
``min_errors`` of them exist), floored at ``min_sigma``. Its fit is scikit-learn's boosting
loop compiled (``_Boosted`` and ``gfsim.forecasts.trees``: the same trees, bit for bit; on 40
to 150 rows some 4-6x faster than driving scikit-learn's own histogram builder and splitter
from Python, which serves where Numba is missing, and 8-13x faster than scikit-learn's fit),
and its trees predict a whole batch as arrays, as scikit-learn's ``predict`` would
(``_Boosted.predict``; ``_Forest`` where scikit-learn's own fit serves).

Prequential: within a search, every candidate of step s is forecast by a model fitted on the
evaluations of steps < s only. At step 0, and until ``min_train`` successes are measured, the
forecast is the PRIOR: centred on the parent's log2 speedup with width ``prior_sigma`` (1 log2,
an assumption). A failed candidate is forecast like any other; the model learns only from
successes. Nothing about a candidate's own measurement reaches its forecast.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from gfsim.core.errors import GfsimError, SpecError
from gfsim.forecasts.bins import PAPER_EDGES, gaussian_bins
from gfsim.forecasts.protocol import Forecaster

__all__ = ["BINARY_FEATURES", "LearnedForecaster", "LearnedModel", "parse_learned", "is_learned",
           "encode", "candidate_features", "recorded_features", "recorded_latency", "log_metas",
           "forecast_seconds",
           "prequential_records", "attach_learned", "PREFIX", "ALIASES", "MODE"]

PREFIX = "learned"
ALIASES = ("costmodel",)  # its name before it was called learned; specs and logs still use it
# The ``mode`` its forecast records carry in a log (logs written before the rename hold it).
MODE = "costmodel"
# What a candidate's ahead-of-time compile reports (gfsim.live.tasks.aot.binary_features): the
# kernel count, the most registers per thread, dynamic shared memory and local memory (bytes)
# of any one kernel, and the SASS instructions of all of them.
BINARY_FEATURES = ("kernels", "regs_max", "shared_max", "local_max", "sass_instructions")


@dataclass(frozen=True)
class LearnedForecaster(Forecaster):
    """The learned surrogate (``learned:k=v,...``, or ``costmodel:k=v,...`` as it was called):
    its settings, whose defaults are stated choices. A replay trains it within each search
    (``attach``; ``gfsim.simulator.learning``); a live run asks ``gfsim.live.llm.learned``'s form
    of it, which learns as the run measures."""

    mode: ClassVar[str] = MODE
    kind: ClassVar[str] = "learned"

    min_train: int = 8  # successes measured before the trees replace the prior
    prior_sigma: float = 1.0  # log2 width of the prior (an ASSUMPTION)
    min_sigma: float = 0.05  # floor of the learned width, log2
    min_errors: int = 5  # past errors needed before the width is learned
    window: int = 64  # past errors the width is learned from
    max_iter: int = 100  # boosting iterations
    max_depth: int = 3
    learning_rate: float = 0.1
    seed: int = 0
    prefix: str = PREFIX  # the name it was asked for by (PREFIX or an alias): its name's head

    @property
    def name(self) -> str:
        base = LearnedForecaster()
        diff = [f"{k}={v:g}" for k, v in asdict(self).items()
                if k != "prefix" and getattr(base, k) != v]
        return self.prefix + (":" + ",".join(diff) if diff else "")

    def attach(self, log):
        """``log`` with this forecaster's prequential forecasts added (``attach_learned``)."""
        return attach_learned(log, self)

    def __post_init__(self):
        if self.prefix not in (PREFIX, *ALIASES):
            raise SpecError(f"`forecaster` {self.prefix}: not a name of the learned forecaster "
                            f"({', '.join((PREFIX, *ALIASES))})")
        for key, lo, hi in (("min_train", 2, 10**6), ("prior_sigma", 1e-3, 10.0),
                            ("min_sigma", 1e-4, 10.0), ("min_errors", 1, 10**6),
                            ("window", 1, 10**6), ("max_iter", 1, 10**5), ("max_depth", 1, 64),
                            ("learning_rate", 1e-4, 1.0), ("seed", 0, 2**32 - 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise SpecError(f"`forecaster` {PREFIX}: {key}={v!r} outside [{lo}, {hi}]")


def is_learned(spec: str | None) -> bool:
    """Whether ``spec`` names the learned forecaster (``learned[:k=v,...]`` or an alias)."""
    return isinstance(spec, str) and spec.partition(":")[0] in (PREFIX, *ALIASES)


def parse_learned(spec: str) -> LearnedForecaster:
    """``learned`` or ``learned:min_train=8,prior_sigma=1,...`` (``LearnedForecaster``; the
    head may be an alias, ``costmodel``, which the forecaster's name then keeps)."""
    from gfsim.core.specs import parse_kv

    head, _, rest = spec.partition(":")
    if head not in (PREFIX, *ALIASES):
        raise SpecError(f"`forecaster` {spec!r}: not the learned forecaster "
                        f"({' or '.join((PREFIX, *ALIASES))}[:k=v,...])")
    fields = {k: f for k, f in LearnedForecaster.__dataclass_fields__.items()
              if k != "prefix"}
    kw: dict = {}
    for key, raw in parse_kv(rest, "`forecaster`") if rest else []:
        if key not in fields:
            raise SpecError(f"`forecaster` {spec!r}: unknown key {key!r}; valid: "
                            f"{', '.join(fields)}")
        kind = int if fields[key].type in ("int", int) else float
        try:
            kw[key] = kind(raw)
        except ValueError:
            raise SpecError(f"`forecaster` {spec!r}: {key}={raw!r} is not "
                            f"{'a whole number' if kind is int else 'a number'}") from None
    return LearnedForecaster(**kw, prefix=head)


def encode(meta: dict | None, parent_log2: float | None) -> dict[str, float]:
    """A candidate's features as named numbers (module docstring)."""
    out: dict[str, float] = {}
    meta = meta or {}
    if meta.get("variant") is not None:
        out[f"variant={meta['variant']}"] = 1.0
    for k, v in sorted((meta.get("params") or {}).items()):
        if isinstance(v, bool):
            out[f"p:{k}"] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(v):
            out[f"p:{k}"] = math.log2(v) if v > 0 else float(v)
        else:
            out[f"p:{k}={v}"] = 1.0
    for k in BINARY_FEATURES:
        v = (meta.get("features") or {}).get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            out[f"b:{k}"] = math.log2(1.0 + v)
    if parent_log2 is not None and math.isfinite(parent_log2):
        out["parent_log2"] = float(parent_log2)
    return out


def candidate_features(extra) -> dict | None:
    """The ``source_meta`` a candidate record carries, or None."""
    if isinstance(extra, dict) and isinstance(extra.get("source_meta"), dict):
        return extra["source_meta"]
    return None


def recorded_features(log) -> dict[str, dict]:
    """candidate id -> the compile features a live cost model recorded on its forecast of that
    candidate (``gfsim live --forecaster learned`` computes them on the trusted side and keeps
    them on the forecast record, not on the candidate's ``source_meta``)."""
    fc = log.forecasts
    if "extra" not in fc or not len(fc):
        return {}
    out: dict[str, dict] = {}
    for cid, mode, e in zip(fc["candidate_id"].tolist(), fc["mode"].tolist(), fc["extra"]):
        if mode == MODE and isinstance(e, dict) and isinstance(e.get("features"), dict) \
                and e["features"]:
            out.setdefault(cid, e["features"])
    return out


def log_metas(log) -> list[dict | None]:
    """Each candidate's ``source_meta`` (in the log's candidate order), with the compile
    features a live cost model recorded where the candidate record lacks them; an error if no
    candidate has any (the model would have nothing to learn from)."""
    cand = log.candidates
    extra = cand["extra"] if "extra" in cand else [None] * len(cand)
    metas = [candidate_features(e) for e in extra]
    recorded = recorded_features(log)
    for i, cid in enumerate(cand["candidate_id"].tolist()):
        if cid in recorded and metas[i] is not None and not metas[i].get("features"):
            metas[i] = {**metas[i], "features": recorded[cid]}
    if not any(m is not None for m in metas):
        raise GfsimError(f"{log.display_name}: no candidate carries source_meta (variant, params, "
                         "features); the cost model has nothing to learn from (live runs and "
                         "measured worlds write it)")
    return metas


def recorded_latency(log) -> dict[str, float]:
    """candidate id -> the seconds a live cost model's forecast of it held its slot (the
    compile for its features, with whatever it waited for)."""
    fc = log.forecasts
    out: dict[str, float] = {}
    for cid, mode, s in zip(fc["candidate_id"].tolist(), fc["mode"].tolist(),
                            fc["latency_s"].tolist()):
        if mode == MODE and isinstance(s, (int, float)) and s == s and s >= 0:
            out.setdefault(cid, float(s))
    return out


class LearnedModel:
    """The online model: ``observe`` measured successes, ``forecast`` a batch, ``score`` the
    batch's outcomes afterwards (for the width)."""

    def __init__(self, spec: LearnedForecaster = LearnedForecaster()):
        self.spec = spec
        self.rows: list[dict[str, float]] = []
        self.y: list[float] = []
        self.errors: list[float] = []
        self._forest = None  # the fitted trees (_Boosted or _Forest)
        self._columns: list[str] = []
        self._fitted_on = 0

    def observe(self, features: dict[str, float], log2_speedup: float) -> None:
        self.rows.append(features)
        self.y.append(float(log2_speedup))

    def score(self, predicted: float, log2_speedup: float) -> None:
        self.errors.append(float(predicted) - float(log2_speedup))

    @property
    def learned(self) -> bool:
        return len(self.y) >= self.spec.min_train

    def _fit(self) -> None:
        self._columns = sorted({k for r in self.rows for k in r})
        x, y = self._matrix(self.rows), np.asarray(self.y)
        min_leaf = max(2, len(self.y) // 20)
        if _Boosted.handles(self.spec, x):
            self._forest = _Boosted(x, y, self.spec, min_leaf)
        else:
            from sklearn.ensemble import HistGradientBoostingRegressor

            model = HistGradientBoostingRegressor(
                max_iter=self.spec.max_iter, max_depth=self.spec.max_depth,
                learning_rate=self.spec.learning_rate, min_samples_leaf=min_leaf,
                early_stopping=False, random_state=self.spec.seed)
            with _one_thread():
                model.fit(x, y)
            self._forest = _Forest(model)
        self._fitted_on = len(self.y)

    def _matrix(self, rows) -> np.ndarray:
        x = np.full((len(rows), len(self._columns)), np.nan)
        for i, r in enumerate(rows):
            for j, c in enumerate(self._columns):
                if c in r:
                    x[i, j] = r[c]
                elif "=" in c:  # an indicator absent is 0, a number absent is unknown
                    x[i, j] = 0.0
        return x

    def predict(self, rows: list[dict[str, float]]) -> tuple[np.ndarray, float, bool]:
        """(centres, width, learned) for candidates with these features: a whole batch at
        once (a row's centre does not depend on the others in its batch), fitting first only
        if ``observe`` added successes since the last fit."""
        s = self.spec
        if not self.learned:
            centre = np.array([r.get("parent_log2", 0.0) for r in rows], dtype=float)
            return centre, s.prior_sigma, False
        if self._fitted_on != len(self.y):  # refit only when the training set grew
            self._fit()
        centre = self._forest.predict(self._matrix(rows))
        if len(self.errors) >= s.min_errors:
            recent = np.asarray(self.errors[-s.window:])
            width = max(s.min_sigma, float(np.sqrt(np.mean(recent ** 2))))
        else:
            width = s.prior_sigma
        return centre, width, True


class _Boosted:
    """Scikit-learn's ``HistGradientBoostingRegressor`` fit for the cost model's settings
    (squared error, no early stopping, validation, categorical, monotonic or interaction
    constraints, ``max_depth`` <= 4 so that its 31-leaf cap never binds): the same bins,
    histograms, splits and leaf values, bit for bit, without the per-tree objects its grower
    and predictor make. The boosting loop runs compiled (``gfsim.forecasts.trees``), or, where
    Numba is missing, here in Python over scikit-learn's own histogram builder and splitter.

    Why: a search refits the model at every step on tens of rows, where those objects (about
    1 ms a tree: nodes, a heap, histogram views parsed from their buffer format, a predictor's
    arrays) were most of a fit and made a closed-loop search reading the cost model cost ~4x
    one reading the log's what-if forecasts; driving the two classes from Python still cost
    some 15-22 ms a fit (some 700 calls into them), the compiled loop some 2-5 ms.
    ``tests/test_learned_batch.py`` checks both fits and the predictions against
    scikit-learn's own, to the bit."""

    @staticmethod
    def handles(spec, x: np.ndarray) -> bool:
        """Whether this fit is scikit-learn's for these settings: trees of at most 16 leaves
        (its 31-leaf cap never binds, so the order it grows nodes in does not matter), bins
        from every row (it subsamples past 200,000), a value in every column (the cost model's
        columns always have one), and the compiled loop or its private histogram and splitter
        classes (with the signatures used here) present (else its own fit serves)."""
        if not 1 <= spec.max_depth <= 4 or not 2 <= x.shape[0] <= 200_000 or not x.shape[1]:
            return False
        if np.isnan(x).all(axis=0).any():  # a column with no value: scikit-learn's to handle
            return False
        return _compiled_available() or _sklearn_parts() is not None

    def __init__(self, x: np.ndarray, y: np.ndarray, spec, min_samples_leaf: int):
        n, nf = x.shape
        self.depth = depth = int(spec.max_depth)
        n_iter, lr = int(spec.max_iter), float(spec.learning_rate)
        # the bins of scikit-learn's _BinMapper (its thresholds, values to bins by binary
        # search, missing values to bin 255), without its per-feature thread pool
        cuts = [_bin_thresholds(x[:, j]) for j in range(nf)]
        nbnm = np.array([len(c) + 1 for c in cuts], dtype=np.uint32)
        missing_bin = 255
        binned = np.empty((n, nf), dtype=np.uint8, order="F")
        for j in range(nf):
            binned[:, j] = np.searchsorted(cuts[j], x[:, j], side="left")
        miss = np.isnan(x)
        binned[miss] = missing_bin
        has_missing = miss.any(axis=0).astype(np.uint8)
        self.base = float(np.mean(y, axis=0))
        if _compiled_available():  # the same loop, compiled (``forecasts.trees``)
            from gfsim.forecasts.trees import fit_trees

            self.feat, self.thr, self.mgl, self.val = fit_trees(
                binned, y, cuts, has_missing, n_iter, depth, lr, min_samples_leaf, self.base)
            return
        parts = _sklearn_parts()
        if parts is None:
            raise GfsimError("the learned forecaster's trees: neither Numba nor scikit-learn's "
                             "histogram classes can fit these bins")
        HistogramBuilder, Splitter = parts
        grad = np.empty(n, dtype=np.float32)
        hess = np.ones(1, dtype=np.float32)
        # one splitter for every tree (scikit-learn makes a new one per tree: the same state,
        # as it only finds splits here); the samples are partitioned here, as its
        # split_indices does on one thread (a stable partition of the node's range), without
        # the arrays that call allocates each time
        splitter = Splitter(binned, nbnm, missing_bin, has_missing, np.zeros(nf, np.uint8),
                            np.zeros(nf, np.int8), 0.0, 1e-3, min_samples_leaf, 0.0, True,
                            1.0, np.random.default_rng(0), 1)
        part = np.empty(n, dtype=np.uint32)
        everyone = np.arange(n, dtype=np.uint32)
        columns = [np.ascontiguousarray(binned[:, j]) for j in range(nf)]  # bins by feature
        last_bin, missing = (nbnm - 1).tolist(), has_missing.astype(bool).tolist()
        split_leaf = 2 * min_samples_leaf  # fewer samples: a leaf
        raw = np.zeros(n)
        raw += self.base
        n_int = 2 ** depth - 1
        self.feat = np.zeros((n_iter, n_int), dtype=np.int64)
        self.thr = np.full((n_iter, n_int), np.inf)
        self.mgl = np.ones((n_iter, n_int), dtype=bool)
        self.val = np.zeros((n_iter, 2 ** depth))
        for it in range(n_iter):
            grad[:] = raw - y
            part[:] = everyone
            # a builder per tree, as there: it keeps a copy of the root's gradients
            builder = HistogramBuilder(binned, 256, grad, hess, True, 1)
            hist = builder.compute_histograms_brute(part, None)
            # the root's sum: feature 0's histogram summed (its array, not the buffer view that
            # NumPy would parse the format of)
            sum_g = hist.base["sum_gradients"][0].sum()
            feat, thr, mgl, val = self.feat[it], self.thr[it], self.mgl[it], self.val[it]
            # (heap position, depth, samples, histograms, sum of gradients, value)
            todo = [(0, 0, part, hist, sum_g, 0.0)] if n >= 2 * min_samples_leaf else []
            leaves = [] if todo else [(0, part, 0.0)]
            while todo:
                p, d, idx, h, sg, v = todo.pop()
                si = splitter.find_node_split(len(idx), h, sg, float(len(idx)), v)
                if si.gain <= 0:
                    leaves.append((p, idx, v))
                    continue
                f, b = si.feature_idx, si.bin_idx
                col = columns[f][idx]
                goes_left = col <= b
                if si.missing_go_to_left:
                    goes_left |= col == missing_bin
                n_left = int(np.count_nonzero(goes_left))
                idx[:] = np.concatenate([idx[goes_left], idx[~goes_left]])
                left, right = idx[:n_left], idx[n_left:]  # views of the partition
                feat[p] = f
                thr[p] = np.inf if b == last_bin[f] else cuts[f][b]
                mgl[p] = si.missing_go_to_left if missing[f] else n_left > len(idx) - n_left
                kids = [(2 * p + 1, left, si.sum_gradient_left, si.value_left),
                        (2 * p + 2, right, si.sum_gradient_right, si.value_right)]
                if d + 1 == depth:
                    leaves += [(q, i, w) for q, i, _, w in kids]
                    continue
                split = [len(i) >= split_leaf for _, i, _, _ in kids]
                if not any(split):
                    leaves += [(q, i, w) for q, i, _, w in kids]
                    continue
                small = 0 if len(left) < len(right) else 1
                hs = builder.compute_histograms_brute(kids[small][1], None)
                hb = builder.compute_histograms_subtraction(h, hs, None)
                hk = (hs, hb) if small == 0 else (hb, hs)
                for (q, i, s, w), go, hh in zip(kids, split, hk):
                    if go:
                        todo.append((q, d + 1, i, hh, s, w))
                    else:
                        leaves.append((q, i, w))
            for p, idx, v in leaves:
                v = v * lr
                raw[idx] += v
                q = p
                while q < n_int:  # a leaf above the bottom: its value down the leftmost path
                    q = 2 * q + 1
                val[q - n_int] = v

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The trees' sum for rows ``x``, added tree by tree as scikit-learn adds them."""
        m, n_trees = len(x), len(self.feat)
        t = np.arange(n_trees)[None, :]
        r = np.arange(m)[:, None]
        pos = np.zeros((m, n_trees), dtype=np.int64)
        for _ in range(self.depth):
            xv = x[r, self.feat[t, pos]]
            left = (xv <= self.thr[t, pos]) | (np.isnan(xv) & self.mgl[t, pos])
            pos = 2 * pos + 2 - left
        vals = self.val[t, pos - (2 ** self.depth - 1)]
        # scikit-learn: zeros, += the baseline, += each tree in turn: a sequential sum
        return np.cumsum(np.concatenate([np.full((m, 1), self.base), vals], axis=1),
                         axis=1)[:, -1]


_ALMOST_INF = 1e300  # scikit-learn's cap on bin thresholds


def _bin_thresholds(col: np.ndarray) -> np.ndarray:
    """scikit-learn's ``_find_binning_thresholds`` (no sample weights)."""
    from numpy.lib.stride_tricks import sliding_window_view

    col = np.sort(col[~np.isnan(col)])
    distinct = np.unique(col).astype(np.float64)
    if len(distinct) <= 1:
        return np.asarray([], dtype=np.float64)
    if len(distinct) <= 255:
        t = sliding_window_view(distinct, 2).mean(axis=1)
    else:
        pct = np.linspace(0, 100, num=256)[1:-1]
        t = np.percentile(col, pct, method="averaged_inverted_cdf")
    u = np.unique(t)
    if u.shape[0] != t.shape[0]:
        t = u
    np.clip(t, a_min=None, a_max=_ALMOST_INF, out=t)
    return t


def _compiled_available() -> bool:
    """Whether ``forecasts.trees`` fits (Numba present and ``COMPILED``)."""
    if not COMPILED:
        return False
    from gfsim.forecasts.trees import available

    return available()


COMPILED = True  # tests and benchmarks switch it off to fit through scikit-learn's classes


def _sklearn_parts():
    """scikit-learn's histogram builder and splitter (private: present and with the
    signatures ``_Boosted`` calls in 1.4 to 1.9), or None."""
    if not _PARTS:
        try:
            from sklearn.ensemble._hist_gradient_boosting.histogram import HistogramBuilder
            from sklearn.ensemble._hist_gradient_boosting.splitting import Splitter

            x = np.zeros((4, 1), dtype=np.uint8, order="F")
            g, h = np.zeros(4, dtype=np.float32), np.ones(1, dtype=np.float32)
            sp = Splitter(x, np.ones(1, dtype=np.uint32), 255, np.zeros(1, dtype=np.uint8),
                          np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.int8), 0.0, 1e-3,
                          2, 0.0, True, 1.0, np.random.default_rng(0), 1)
            hist = HistogramBuilder(x, 256, g, h, True, 1).compute_histograms_brute(
                sp.partition, None)
            sp.find_node_split(4, hist, 0.0, 4.0, 0.0)
            hist.base["sum_gradients"]
            _PARTS.append((HistogramBuilder, Splitter))
        except Exception:  # noqa: BLE001 - another version: scikit-learn's own fit serves
            _PARTS.append(None)
    return _PARTS[0]


_PARTS: list = []


class _Forest:
    """A fitted ``HistGradientBoostingRegressor``'s trees as arrays, predicting a batch of rows
    down every tree at once, with the same result as its ``predict``, bit for bit: each row
    goes left where its value is at most the node's threshold (a missing value where the node
    sends them), and its raw prediction is the baseline plus each tree's leaf value in turn,
    the sum scikit-learn makes (``tests/test_learned_batch.py`` checks the equality).

    Why: scikit-learn's ``predict`` walks one tree at a time behind per-call checks and
    thread set-up, a few milliseconds for the ~16 children of a step, paid at every step of
    every search; here it is a few NumPy calls per tree level."""

    def __init__(self, model):
        trees = [p[0].nodes for p in model._predictors]  # one tree per iteration (regression)
        if any(t["is_categorical"].any() for t in trees):
            raise GfsimError("the cost model's trees split on no categorical feature")
        width = max((len(t) for t in trees), default=1)
        shape = (len(trees), width)
        self.feature = np.zeros(shape, dtype=np.intp)
        self.threshold = np.zeros(shape)
        self.missing_left = np.zeros(shape, dtype=bool)
        self.left = np.zeros(shape, dtype=np.intp)
        self.right = np.zeros(shape, dtype=np.intp)
        self.leaf = np.ones(shape, dtype=bool)
        self.value = np.zeros(shape)
        for i, t in enumerate(trees):
            k = len(t)
            self.feature[i, :k] = t["feature_idx"]
            self.threshold[i, :k] = t["num_threshold"]
            self.missing_left[i, :k] = t["missing_go_to_left"].astype(bool)
            self.left[i, :k], self.right[i, :k] = t["left"], t["right"]
            self.leaf[i, :k] = t["is_leaf"].astype(bool)
            self.value[i, :k] = t["value"]
        self.depth = max((int(t["depth"].max()) for t in trees), default=0)
        self.baseline = np.asarray(model._baseline_prediction, dtype=float).reshape(-1)[0]

    def predict(self, x: np.ndarray) -> np.ndarray:
        m, n_trees = x.shape[0], self.feature.shape[0]
        t = np.arange(n_trees)[None, :]
        r = np.arange(m)[:, None]
        node = np.zeros((m, n_trees), dtype=np.intp)
        for _ in range(self.depth):  # a row at a leaf stays there
            v = x[r, self.feature[t, node]]
            go_left = np.where(np.isnan(v), self.missing_left[t, node],
                               v <= self.threshold[t, node])
            node = np.where(self.leaf[t, node], node,
                            np.where(go_left, self.left[t, node], self.right[t, node]))
        # scikit-learn's sum: zeros, += the baseline, += each tree's value in turn
        steps = np.concatenate([np.full((m, 1), self.baseline), self.value[t, node]], axis=1)
        return np.cumsum(steps, axis=1)[:, -1] if m else np.zeros(0)


_CONTROLLER: list = []  # one ThreadpoolController per process, made on first use


def _one_thread():
    """The trees on one OpenMP thread: on the few hundred rows a search holds, threads cost
    more than they give (a fit took 0.5 s on 2 busy cores with them, 0.04 s without;
    ``experiments/bench_costmodel.py`` times a whole search both ways). The
    controller is made once: ``threadpool_limits`` rescans the loaded libraries each time
    (3.5 ms a call here, against 0.014 ms through a kept controller), and a search fits and
    predicts every step."""
    if not _CONTROLLER:
        import sklearn.ensemble  # noqa: F401 - its OpenMP runtime must be loaded to be found
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="openmp")


def distribution(centre: np.ndarray, width: float, edges=PAPER_EDGES) -> np.ndarray:
    """(n, 8) probabilities of a Gaussian in log2 over the bins between ``edges``, none zero."""
    p = np.maximum(gaussian_bins(centre, width, edges), 1e-9)
    return p / p.sum(axis=1, keepdims=True)


def prequential_records(log, spec: LearnedForecaster, *, train_on: set[str] | None = None,
                        memo: dict | None = None) -> tuple[list[dict], dict]:
    """Cost-model forecast records for every candidate of ``log`` (module docstring), and a
    summary: candidates with features, the steps forecast by the prior and by the trees.

    ``train_on``: the candidates whose measurements the model may learn from (default: every
    one the log measured). A replay under a policy that skips candidates passes the ones it
    measured, so that its forecaster learns what that search would have learned
    (``gfsim.simulator.learning``). ``memo``: a dict kept between calls on the same log and
    spec; a step whose training history is unchanged reuses its fitted forecasts."""
    edges = tuple(log.header.get("forecast_bin_edges") or PAPER_EDGES)
    if tuple(edges) != tuple(PAPER_EDGES):
        raise GfsimError(f"{log.display_name}: its forecasts use other bin edges than the paper's; "
                         "the cost model answers in the paper's bins")
    cand = log.candidates
    metas = log_metas(log)
    latency = recorded_latency(log)
    with_features = sum(m is not None for m in metas)
    ev = log.evaluations
    speed = {c: s for c, o, s in zip(ev["candidate_id"], ev["outcome"], ev["speedup"])
             if o == "success" and s == s and s > 0}
    seeds = {t["task_id"]: t.get("seed_speedup") for t in log.header.get("tasks", [])}
    recs: list[dict] = []
    summary = {"candidates": len(cand), "with_features": with_features, "prior": 0,
               "learned": 0, "searches": 0}
    col = {k: cand[k].tolist() for k in ("candidate_id", "search_id", "task_id", "parent_id",
                                          "step", "status")}
    parent_of = dict(zip(col["candidate_id"], col["parent_id"]))
    order = np.lexsort((cand["seq"].to_numpy(), cand["step"].to_numpy()))
    by_search: dict[str, list[int]] = {}
    for i in order:
        by_search.setdefault(col["search_id"][i], []).append(int(i))
    for sid, rows in by_search.items():
        summary["searches"] += 1
        model = LearnedModel(spec)
        history: list[str] = []  # the candidates learned from so far, in order
        steps: dict[int, list[int]] = {}
        for i in rows:
            steps.setdefault(int(col["step"][i]), []).append(i)
        for step in sorted(steps):
            idx = [i for i in steps[step] if col["status"][i] != "generation_failed"]
            if not idx:
                continue
            feats = []
            for i in idx:
                p = _parent_speedup(col["parent_id"][i], parent_of, speed, train_on)
                if p is None:
                    p = seeds.get(col["task_id"][i])
                feats.append(encode(metas[i], math.log2(p) if p else None))
            # What the model knows is fixed by the measurements it learned, in order: the same
            # history gives the same forecasts, so a memo can skip the fit.
            key = (sid, step, tuple(history))
            if memo is not None and key in memo:
                centre, width, learned = memo[key]
            else:
                centre, width, learned = model.predict(feats)
                if memo is not None:
                    memo[key] = (centre, width, learned)
            probs = distribution(centre, width, edges)
            summary["learned" if learned else "prior"] += len(idx)
            for i, c, p in zip(idx, centre, probs):
                cid = col["candidate_id"][i]
                recs.append({"kind": "forecast", "candidate_id": cid, "forecaster": spec.name,
                             "mode": MODE, "probs": [round(float(v), 9) for v in p],
                             "raw_probability_sum": 1.0, "predicted_bin": int(np.argmax(p)) + 1,
                             "parse_failed": False, "repeat": 0,
                             "input_tokens": 0, "output_tokens": 0,
                             "latency_s": latency.get(cid, forecast_seconds(metas[i])),
                             "centre_log2": round(float(c), 6), "width_log2": round(width, 6),
                             "trained_on": len(model.y), "learned": learned})
            # The step's measurements arrive after its decision: only now do they train.
            for i, f, c in zip(idx, feats, centre):
                cid = col["candidate_id"][i]
                s = speed.get(cid)
                if s is not None and (train_on is None or cid in train_on):
                    if learned:
                        model.score(c, math.log2(s))
                    model.observe(f, math.log2(s))
                    history.append(cid)
    return recs, summary


def _parent_speedup(parent, parent_of: dict, speed: dict, train_on) -> float | None:
    """The parent's measured speedup, as the search knew it: with ``train_on`` (a replay that
    skipped some candidates), the nearest ancestor that replay measured, since a parent it
    never measured has no speedup it could know; None: the seed kernel's."""
    seen = 0
    while isinstance(parent, str) and parent and seen < 10_000:
        if train_on is None or parent in train_on:
            return speed.get(parent)
        parent, seen = parent_of.get(parent), seen + 1
    return None


def forecast_seconds(meta) -> float:
    """Seconds a forecast costs where no live cost model recorded it: the ahead-of-time compile
    its features came from, where the log says (the trees themselves take milliseconds)."""
    v = ((meta or {}).get("features") or {}).get("seconds")
    return round(float(v), 3) if isinstance(v, (int, float)) and v >= 0 else 0.0


def attach_learned(log, spec: LearnedForecaster):
    """A copy of ``log`` whose forecasts also hold the cost model's (in memory)."""
    from gfsim.forecasts.attach import attach_records

    recs, _ = prequential_records(log, spec)
    return attach_records(log, recs, spec.name, MODE)
