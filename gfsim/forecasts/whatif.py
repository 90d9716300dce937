"""What-if forecasters: synthetic forecasts drawn from a log's own measured speedups.

One generative model (every parameter is an assumption, and says so): for a candidate whose true
log2 speedup (in the log's forecast frame) is x, the forecaster's point estimate is

    x_hat = anchor + beta * (x - anchor) + sigma * z,     z ~ N(0, 1) keyed by
                                                           (seed, candidate, forecaster, repeat)

so beta < 1 pulls estimates toward the anchor (log2 1.19x, the middle of the bins): slow kernels
are over-forecast and fast (> 4x) ones under-forecast, as the paper reports of base models. Its
stated distribution is a Gaussian of a fixed width (0.5 in log2, about one bin either side: an
assumption; a forecaster does not know its own error) around x_hat, integrated over the paper's
bins and tempered (p ** (1 / temp), renormalised: temp < 1 is overconfident, temp > 1 hedges).
With probability ``parse_fail`` the answer does not parse. Accuracy, ECE and speedup recovered are
outputs of (sigma, beta, temp), not inputs.

A forecaster reads a candidate before it is measured, so it forecasts the kernels that will fail
too. The paper's data holds no forecast of a failed kernel (its evaluation set is 424 *correct*
pairs; its filtered searches' forecasts of failed kernels are not published), so how a
forecaster sees one is an ASSUMPTION, chosen by ``failed`` (``FAILURE_DISTRIBUTIONS``) and put
through the same model as a latent log2 speedup x (in the forecast frame):

- ``parent`` (default): a forecaster reads code, not outcomes, so a kernel that will fail is
  forecast as if it ran at its parent's speedup (its nearest measured ancestor's, else the seed
  kernel's), as gfsim's worlds forecast failed nodes (``gfsim.worlds.kit``);
- ``low``: it is forecast as a kernel of the paper's two lowest bins, x uniform on
  [``FAILURE_LOG2_LO``, ``FAILURE_LOG2_HI``] = [-3, -1] (0.125x to 0.5x), keyed per (seed,
  candidate, forecaster, repeat): a forecaster that mostly sees failures coming.

A candidate the log never evaluated is forecast by the same assumption (it was generated, so a
forecaster would have read it); only one that was never generated (no code) stays unforecast.

Presets ``paper:NAME`` are this model with (sigma, temp) fitted so that, on a synthetic replica of
the paper's evaluation set (424 pairs x 3 repeats, bin-balanced, correct kernels only, six tasks:
``gfsim.worlds.replica``), gfsim's speedup-recovered and ECE land on the published figures
(docs/concepts/paper.md; ``experiments/fit_paper_forecasters.py`` redoes the fit). This is a
calibration to a population, not a reproduction: the figures depend on what is forecast, and
"recovered" is gfsim's definition.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from gfsim.core.errors import SpecError
from gfsim.core.rng import keyed_uniforms
from gfsim.forecasts.bins import PAPER_EDGES, gaussian_bins
from gfsim.forecasts.protocol import Forecaster

__all__ = ["WhatIfForecaster", "PRESETS", "PAPER_TARGETS", "parse_whatif", "is_whatif",
           "attach", "whatif_records", "whatif_model", "FAILURE_DISTRIBUTIONS",
           "FAILURE_LOG2_LO", "FAILURE_LOG2_HI", "assumed_forecasts"]

ANCHOR = math.log2(1.19)  # ASSUMPTION: where a biased forecaster's estimates are pulled to
WIDTH = 0.5  # ASSUMPTION: log2 width of the forecaster's stated distribution
_LOG2_PAPER_EDGES = np.log2(np.asarray(PAPER_EDGES, dtype=float))  # gaussian_bins' edges
# ASSUMPTION (the paper's data has no forecast of a failed kernel): how a forecaster sees a
# kernel that will fail, by the ``failed`` parameter; ``low``: log2 speedup uniform on [lo, hi].
FAILURE_LOG2_LO, FAILURE_LOG2_HI = -3.0, -1.0
FAILURE_DISTRIBUTIONS = {
    "parent": "a failed kernel is forecast as if it ran at its parent's speedup (the forecaster "
              "reads code, not outcomes)",
    "low": "a failed kernel is forecast as if its speedup were log-uniform on [0.125x, 0.5x] "
           "(the paper's bins 1-2)",
}
DEFAULT_FAILED = "parent"


@dataclass(frozen=True)
class WhatIfForecaster(Forecaster):
    """The generative forecaster; ``name`` goes into every forecast record. It draws from a
    candidate's measured speedup, so it forecasts logs (``attach``), never a candidate before
    it is measured."""

    mode: ClassVar[str] = "whatif"
    kind: ClassVar[str] = "whatif"

    name: str
    sigma: float = 1.0
    beta: float = 0.7
    temp: float = 1.0
    parse_fail: float = 0.0
    seed: int = 0
    failed: str = DEFAULT_FAILED  # how a failed kernel is seen (FAILURE_DISTRIBUTIONS)

    def __post_init__(self):
        if self.failed not in FAILURE_DISTRIBUTIONS:
            raise SpecError(f"what-if forecaster {self.name}: failed={self.failed!r}; valid: "
                            f"{', '.join(FAILURE_DISTRIBUTIONS)}")
        for key, lo, hi in (("sigma", 1e-3, 10.0), ("beta", -2.0, 2.0), ("temp", 1e-3, 10.0),
                            ("parse_fail", 0.0, 1.0)):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and lo <= v <= hi):
                raise SpecError(f"what-if forecaster {self.name}: {key}={v!r} outside "
                                f"[{lo}, {hi}]")

    def distribution(self, true_log2: np.ndarray, ids, repeat: int = 0):
        """(probs (n, 8) over the paper bins, parse_failed (n,)) for candidates ``ids``."""
        true_log2 = np.asarray(true_log2, dtype=float)
        keys = [f"{self.name}\x1f{c}\x1f{repeat}" for c in ids]
        u1 = keyed_uniforms(self.seed, keys, "whatif:u1")
        u2 = keyed_uniforms(self.seed, keys, "whatif:u2")
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
        failed = keyed_uniforms(self.seed, keys, "whatif:parse") < self.parse_fail
        centre = ANCHOR + self.beta * (true_log2 - ANCHOR) + self.sigma * z
        p = gaussian_bins(centre, WIDTH)
        logp = np.log(np.maximum(p, 1e-300)) / self.temp
        logp -= logp.max(axis=1, keepdims=True)
        p = np.exp(logp)
        p /= p.sum(axis=1, keepdims=True)
        p[failed] = 0.0
        return p, failed

    def failure_log2(self, ids, parent_log2, repeat: int = 0) -> np.ndarray:
        """The latent log2 speedups (forecast frame) that failed candidates ``ids``, whose
        parents stood at ``parent_log2`` in that frame, are forecast from (``failed``; keyed
        per seed, candidate, forecaster and repeat): what ``distribution`` then reads as their
        truth."""
        if self.failed == "parent":
            return np.asarray(parent_log2, dtype=float)
        keys = [f"{self.name}\x1f{c}\x1f{repeat}" for c in ids]
        u = keyed_uniforms(self.seed, keys, "whatif:failure")
        return FAILURE_LOG2_LO + (FAILURE_LOG2_HI - FAILURE_LOG2_LO) * u

    def assumption(self) -> str:
        """The failure assumption in words, for notes."""
        return f"failed={self.failed}: {FAILURE_DISTRIBUTIONS[self.failed]}"

    def distribution_one(self, true_log2: float, cid, repeat: int = 0) -> tuple[list | None,
                                                                              bool]:
        """``distribution`` of one candidate: (its 8 probabilities as floats, or None when its
        answer does not parse, parse_failed), the same values as that row of
        ``distribution([true_log2], [cid], repeat)`` (the same operations in the same order:
        numpy's ufuncs for every function, float arithmetic for the rest). A world draws its
        forecasts one child at a time, where the array version's overhead is most of the
        cost."""
        from scipy.special import ndtr

        from gfsim.core.rng import keyed_uniform

        key = f"{self.name}\x1f{cid}\x1f{repeat}"
        if keyed_uniform(self.seed, key, "whatif:parse") < self.parse_fail:
            return None, True
        u1 = keyed_uniform(self.seed, key, "whatif:u1")
        u2 = keyed_uniform(self.seed, key, "whatif:u2")
        z = float(np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2))
        centre = ANCHOR + self.beta * (float(true_log2) - ANCHOR) + self.sigma * z
        cdf = ndtr((_LOG2_PAPER_EDGES - centre) / WIDTH).tolist()
        mass = [a - b for a, b in zip(cdf + [1.0], [0.0] + cdf)]
        p = np.array([m if m >= 0.0 or m != m else 0.0 for m in mass])  # np.clip(m, 0, None)
        logp = np.log(np.maximum(p, 1e-300)) / self.temp
        logp -= logp.max()
        p = np.exp(logp)
        p /= p.sum()
        return p.tolist(), False

    def attach(self, log, repeats: int = 1):
        """``attach(log, self, repeats)``."""
        return attach(log, self, repeats)

    def params(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "name"}


# Published figures (docs/concepts/paper.md): speedup recovered (percent, mean over the five
# budgets and six tasks) and ECE; None where the paper gives none.
PAPER_TARGETS = {
    "gemini3-flash": (93.12, 0.624),
    "gpt-oss-120b": (86.85, None),
    "gpt-oss-20b": (82.88, 0.441),
    "deepseek-v4": (79.86, None),
    "gpt-oss-20b-brier": (82.88 + 2.06, 0.441 - 0.106),
}
# Fitted by experiments/fit_paper_forecasters.py (beta fixed at 0.7 and parse_fail at 0.01,
# both assumptions; where the paper gives no ECE, temp stays 1).
PRESETS = {
    "gemini3-flash": dict(sigma=0.6796, temp=0.0852),
    "gpt-oss-120b": dict(sigma=1.5001, temp=1.0),
    "gpt-oss-20b": dict(sigma=2.6816, temp=1.8359),
    "deepseek-v4": dict(sigma=2.3732, temp=1.0),
    "gpt-oss-20b-brier": dict(sigma=1.691, temp=1.6392),
}
PRESET_BETA = 0.7
PRESET_PARSE_FAIL = 0.01


def is_whatif(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(("paper:", "synthetic:"))


def parse_whatif(spec: str) -> WhatIfForecaster:
    """``paper:gemini3-flash[,seed=N][,failed=parent|low]`` or
    ``synthetic:sigma=..,beta=..,temp=..,parse_fail=..[,seed=N][,failed=parent|low]``; a
    ``failed`` other than the default shows in the name."""
    from gfsim.core.specs import parse_kv

    kind, _, rest = spec.partition(":")
    items = parse_kv(rest, "`forecaster`")
    if kind == "paper":
        if not items or items[0][0] is not None or items[0][1] not in PRESETS:
            raise SpecError(f"`forecaster` {spec!r}: paper: takes a preset; valid: "
                            f"{', '.join(PRESETS)}")
        preset = items[0][1]
        extra = dict(items[1:])
        if set(extra) - {"seed", "failed"}:
            raise SpecError(f"`forecaster` {spec!r}: a paper: preset takes only seed=N and "
                            f"failed={'|'.join(FAILURE_DISTRIBUTIONS)}")
        failed = _failed_of(spec, extra.get("failed", DEFAULT_FAILED))
        return WhatIfForecaster(f"paper:{preset}" + _failed_suffix(failed), beta=PRESET_BETA,
                                parse_fail=PRESET_PARSE_FAIL, seed=_seed_of(spec, extra),
                                failed=failed, **PRESETS[preset])
    if kind != "synthetic":
        raise SpecError(f"`forecaster` {spec!r}: expected paper:NAME or synthetic:k=v,...")
    kw: dict = {}
    for key, raw in items:
        if key == "failed":
            kw[key] = _failed_of(spec, raw)
            continue
        if key not in ("sigma", "beta", "temp", "parse_fail", "seed"):
            raise SpecError(f"`forecaster` {spec!r}: unknown key {key!r}; valid: sigma, beta, "
                            "temp, parse_fail, seed, failed")
        try:
            kw[key] = int(raw) if key == "seed" else float(raw)
        except ValueError:
            raise SpecError(f"`forecaster` {spec!r}: {key}={raw!r} is not a number") from None
    name = "synthetic:" + ",".join(f"{k}={kw[k]:g}" for k in ("sigma", "beta", "temp",
                                                             "parse_fail") if k in kw)
    return WhatIfForecaster(name + _failed_suffix(kw.get("failed", DEFAULT_FAILED)), **kw)


def _failed_of(spec: str, raw) -> str:
    if raw not in FAILURE_DISTRIBUTIONS:
        raise SpecError(f"`forecaster` {spec!r}: failed={raw!r}; valid: "
                        f"{', '.join(FAILURE_DISTRIBUTIONS)}")
    return raw


def _failed_suffix(failed: str) -> str:
    return "" if failed == DEFAULT_FAILED else f",failed={failed}"


def _seed_of(spec: str, extra: dict) -> int:
    try:
        return int(extra.get("seed", 0))
    except ValueError:
        raise SpecError(f"`forecaster` {spec!r}: seed={extra['seed']!r} is not a whole "
                        "number") from None


def _truth(log):
    """(candidate ids, their log2 speedups in the log's forecast frame, assumed?, parents' log2
    speedups in that frame): every candidate a forecaster would read (all that were
    generated), in log order. A successful one has its measured speedup; one whose evaluation
    failed, or that the log never evaluated, has NaN, which the failure assumption fills."""
    from gfsim.forecasts.scoring import true_speedups

    truth = true_speedups(log)
    cands = log.candidates
    made = cands[cands["gen_failed_reason"].isna()] if "gen_failed_reason" in cands else cands
    ids = made["candidate_id"].tolist()
    ev = log.evaluations
    ok = ev[ev["outcome"] == "success"] if len(ev) else ev
    measured = dict(zip(ok["candidate_id"], ok["speedup"].astype(float))) if len(ok) else {}
    # A parent-relative success whose parent was not measured: over its nearest measured
    # ancestor, the base a replay converts its forecast with (simulator.traces).
    orphan = [c for c in ids if c not in truth and c in measured]
    base = dict(zip(orphan, _ancestor_log2(log, orphan, measured, "reference")))
    x = np.array([math.log2(truth[c]) if c in truth else
                  math.log2(measured[c]) - base[c] if c in base else np.nan for c in ids])
    assumed = np.isnan(x)
    assumed_ids = [c for c, a in zip(ids, assumed) if a]
    return ids, x, assumed, _ancestor_log2(log, assumed_ids, measured)


def _ancestor_log2(log, ids, measured: dict, frame: str | None = None) -> np.ndarray:
    """log2 of the speedup of each candidate's nearest successfully measured ancestor (the
    search's seed kernel if none), in ``frame`` (default: the log's forecast frame; 0 in the
    parent frame, whose base is that ancestor)."""
    frame = frame or log.header.get("forecast_relative_to") or "reference"
    if frame == "parent" or not ids:
        return np.zeros(len(ids))
    cands = log.candidates.set_index("candidate_id")
    parent_of = cands["parent_id"].to_dict()
    run_seed = {r["search_id"]: r.get("seed_speedup") for r in log.runs}
    out = []
    for c in ids:
        seed = float(run_seed.get(cands.at[c, "search_id"])
                     or log.tasks[cands.at[c, "task_id"]].get("seed_speedup") or 1.0)
        p, s = parent_of.get(c), None
        while isinstance(p, str) and s is None:
            s = measured.get(p)
            p = parent_of.get(p)
        s = seed if s is None or not s > 0 else s
        out.append(math.log2(s / seed) if frame == "seed" else math.log2(s))
    return np.array(out, dtype=float)


def assumed_forecasts(log, name: str) -> int:
    """How many of forecaster ``name``'s forecasts in ``log`` are of candidates the log holds
    no speedup for (a failed evaluation, or none): for a what-if forecaster, the ones that
    rest on its failure assumption (``failed``)."""
    fc = log.forecasts
    if not len(fc):
        return 0
    ids = set(fc.loc[fc["forecaster"] == name, "candidate_id"])
    ev = log.evaluations
    ok = set(ev.loc[ev["outcome"] == "success", "candidate_id"]) if len(ev) else set()
    return len(ids - ok)


def whatif_records(log, forecaster: WhatIfForecaster, repeats: int = 1) -> list[dict]:
    """Forecast records for every candidate of ``log`` that was generated: from its measured
    speedup, or by the forecaster's failure assumption (``failed``) where its evaluation
    failed or the log holds none."""
    ids, x, failed_eval, parent_x = _truth(log)
    fail_ids = [c for c, f in zip(ids, failed_eval) if f]
    out = []
    for r in range(repeats):
        if fail_ids:
            x = x.copy()
            x[failed_eval] = forecaster.failure_log2(fail_ids, parent_x, r)
        probs, failed = forecaster.distribution(x, ids, r)
        for cid, p, f in zip(ids, probs, failed):
            out.append({"kind": "forecast", "candidate_id": cid, "forecaster": forecaster.name,
                        "mode": "whatif", "probs": [float(v) for v in p],
                        "raw_probability_sum": 0.0 if f else 1.0,
                        "predicted_bin": None if f else int(np.argmax(p)) + 1,
                        "parse_failed": bool(f), "repeat": r})
    return out


def attach(log, forecaster: WhatIfForecaster, repeats: int = 1):
    """A copy of ``log`` whose forecasts also hold ``forecaster``'s (in memory): every
    generated candidate, those without a measured speedup (failed, or never evaluated) by its
    failure assumption; tokens and latency come from the cost model's priors
    (imputed). The copy keeps the forecaster (``whatif_model``), so that a closed-loop replay
    forecasts the children it invents with the same model."""
    from gfsim.forecasts.attach import attach_records

    out = attach_records(log, whatif_records(log, forecaster, repeats), forecaster.name,
                         "whatif")
    out.__dict__["whatif_models"] = {**log.__dict__.get("whatif_models", {}),
                                     forecaster.name: forecaster}
    return out


def whatif_model(log, name: str | None) -> WhatIfForecaster | None:
    """The what-if forecaster ``attach`` drew forecasts ``name`` of ``log`` with, if any."""
    return log.__dict__.get("whatif_models", {}).get(name) if name else None
