"""A synthetic kernel landscape: seeded tasks, a tree of mutations, and what a log would say.

Nothing here was measured. Every number comes from :class:`LandscapeParams`, whose fields are
all ASSUMPTIONS (the paper publishes no failure rates and no per-stage times); each field's
metadata says what it means and why its default was chosen, and ``gfsim synth`` writes them
all into the log header.

The landscape is a tree per task. The root is the task's seed kernel; ``child(parent, index)``
is the ``index``-th mutation of ``parent``. Every draw is *keyed*, never sequential (the design
page's randomness): a child comes from one generator keyed by (seed, task_id, parent
node_id, index), a forecast from one keyed by (seed, node_id, forecaster, repeat). So the same
node has the same speedup, outcome, stage times and forecasts whatever else was asked for and in
whatever order, which is what a closed-loop driver that expands arbitrary nodes needs.

Model of a child (log2 speedups are against the task's reference kernel):

- drift = parent.drift * drift_decay + Normal(0, drift_sigma)           (lineage drift)
- delta = clip(step_loc + step_scale * StudentT(step_df) + drift, +-step_clip)
- log2_speedup = parent.log2_speedup + delta - reversion * (parent.log2_speedup - log2 headroom)
- fragility = fragility_inherit * parent.fragility + Normal(0, fragility_sigma)
              + failed_parent_shift * [parent's outcome was a failure]
- outcome: multinomial logit; failure k has logit log(p_k / p_success) + shift, with
  shift = fragility + step_failure_coupling * max(delta, 0) for the kernel's own failures
  (compile_failed, runtime_error, incorrect, timeout) and 0 for infrastructure_failure.
  At fragility 0 and delta <= 0 the rates are exactly the p_* defaults.
- a successful child's measured speedup = 2**log2_speedup * LogNormal(0, measure_noise_sigma).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.core.rng import stream
from gfsim.forecasts.bins import PAPER_EDGES

__all__ = [
    "FAILURES",
    "GENERATION_FAILED",
    "KERNEL_FAILURES",
    "Landscape",
    "LandscapeParams",
    "Node",
    "Task",
    "bin_probabilities",
    "child_node_id",
]

GENERATION_FAILED = "generation_failed"  # a Node outcome only: the mutator returned no kernel
KERNEL_FAILURES = ("compile_failed", "runtime_error", "incorrect", "timeout")
FAILURES = (*KERNEL_FAILURES, "infrastructure_failure")
_OUTCOME_ORDER = ("success", *FAILURES)
STAGES = ("cold_start_s", "compile_s", "check_s", "timing_s")
# Which stages a failure ran: it stops after the stage that failed, later stages cost nothing.
STAGES_RUN = {
    "success": STAGES,
    "compile_failed": ("cold_start_s", "compile_s"),
    "runtime_error": ("cold_start_s", "compile_s", "check_s"),
    "incorrect": ("cold_start_s", "compile_s", "check_s"),
    "timeout": STAGES,
    "infrastructure_failure": ("cold_start_s",),
}
_LOG2_PAPER_EDGES = tuple(math.log2(e) for e in PAPER_EDGES)
_SQRT2 = math.sqrt(2.0)
_MAY_BE_NEGATIVE = frozenset({"headroom_log2_mean", "headroom_log2_min", "headroom_log2_max",
                              "step_loc", "forecast_bias"})


def _a(default, doc: str):
    """A parameter with its documentation (written into log headers as an assumption)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class LandscapeParams:
    """Every distribution parameter of the synthetic landscape. ALL ARE ASSUMPTIONS.

    Times are seconds, speedups are against the task's reference kernel, "log2" quantities are
    base-2 logs of a speedup, lognormal sigmas are in natural-log units. The defaults are stated
    in each field (``LandscapeParams.describe()`` lists them with their notes).
    """

    # --- tasks ---------------------------------------------------------------------------
    headroom_log2_mean: float = _a(
        0.5, "ASSUMPTION: mean of a task's log2 headroom, the speedup an unselected chain of "
             "mutations reverts toward (default 0.5, i.e. 1.41x); a greedy search's best lands "
             "about 2-3x above it, because selection keeps the heavy-tailed steps' lucky draws")
    headroom_log2_sigma: float = _a(
        0.5, "ASSUMPTION: spread (sd) of the log2 headroom across tasks (default 0.5)")
    headroom_log2_min: float = _a(-1.0, "ASSUMPTION: lower clip of the log2 headroom "
                                        "(default -1, i.e. 0.5x)")
    headroom_log2_max: float = _a(3.0, "ASSUMPTION: upper clip of the log2 headroom (default 3, "
                                       "i.e. 8x)")
    seed_log2_sigma: float = _a(
        0.25, "ASSUMPTION: the seed kernel's log2 speedup vs the reference is Normal(0, this): "
              "lognormal around 1 (default 0.25)")
    ref_runtime_ns_median: float = _a(
        250_000.0, "ASSUMPTION: median reference runtime in ns (default 250,000 = 0.25 ms)")
    ref_runtime_sigma: float = _a(
        1.0, "ASSUMPTION: lognormal sigma of the reference runtime across tasks (default 1.0)")

    # --- speedup walk --------------------------------------------------------------------
    step_df: float = _a(3.0, "ASSUMPTION: Student-t degrees of freedom of a mutation's log2 step "
                             "(default 3: heavy tails, rare big wins and losses)")
    step_scale: float = _a(0.25, "ASSUMPTION: scale of the Student-t log2 step (default 0.25)")
    step_loc: float = _a(-0.3, "ASSUMPTION: location of the log2 step; a typical mutation of a "
                               "kernel at its headroom makes it slower (default -0.3)")
    step_clip: float = _a(1.0, "ASSUMPTION: step + drift is clipped to +-this many log2 units: "
                               "no single mutation changes speed by more than 2x (default 1.0)")
    drift_decay: float = _a(0.5, "ASSUMPTION: a child's drift = parent's drift * this + noise "
                                 "(lineage momentum; default 0.5; the root's drift is 0)")
    drift_sigma: float = _a(0.05, "ASSUMPTION: sd of the drift noise per generation, in log2 "
                                  "(default 0.05)")
    reversion: float = _a(0.5, "ASSUMPTION: pull per mutation toward the task's log2 headroom, "
                               "as a fraction of the parent's distance from it; real searches "
                               "plateau instead of compounding (default 0.5)")

    # --- failures --------------------------------------------------------------------------
    p_generation_failed: float = _a(0.02, "ASSUMPTION: the mutator returns no kernel "
                                          "(default 0.02; independent of the parent)")
    p_compile_failed: float = _a(0.12, "ASSUMPTION: compile_failed rate at fragility 0 "
                                       "(default 0.12)")
    p_runtime_error: float = _a(0.05, "ASSUMPTION: runtime_error rate at fragility 0 "
                                      "(default 0.05)")
    p_incorrect: float = _a(0.08, "ASSUMPTION: incorrect-output rate at fragility 0 "
                                  "(default 0.08)")
    p_timeout: float = _a(0.01, "ASSUMPTION: timeout rate at fragility 0 (default 0.01)")
    p_infrastructure_failure: float = _a(
        0.01, "ASSUMPTION: infrastructure_failure rate; not the kernel's fault, so fragility "
              "does not move it (default 0.01)")
    fragility_root_sigma: float = _a(
        0.3, "ASSUMPTION: sd of the seed kernel's latent fragility (default 0.3)")
    fragility_inherit: float = _a(
        0.8, "ASSUMPTION: a child's fragility = parent's fragility * this + noise (default 0.8)")
    fragility_sigma: float = _a(0.4, "ASSUMPTION: sd of the fragility noise per generation "
                                     "(default 0.4)")
    failed_parent_shift: float = _a(
        0.7, "ASSUMPTION: added to the fragility of a child whose parent failed, so a failed "
             "kernel's children fail more often (default 0.7)")
    step_failure_coupling: float = _a(
        0.5, "ASSUMPTION: extra failure logit per log2 unit of attempted gain (positive "
             "step + drift); aggressive rewrites break more often (default 0.5)")

    # --- generation --------------------------------------------------------------------------
    generation_median_s: float = _a(
        30.0, "ASSUMPTION: median service time of one mutation (default 30 s); mutation tokens "
              "are not modelled (the reference never logs them)")
    generation_sigma: float = _a(0.5, "ASSUMPTION: lognormal sigma of the mutation time "
                                      "(default 0.5)")

    # --- evaluation ------------------------------------------------------------------------
    cold_start_median_s: float = _a(
        60.0, "ASSUMPTION: median container cold start (default 60 s). The four stage medians "
              "sum to 325 s = 5.4 min, the reference's ~5-6 GPU-minutes per evaluation "
              "(REFERENCE.md section 4)")
    compile_median_s: float = _a(15.0, "ASSUMPTION: median compile (Triton JIT in the GPU "
                                       "container) time (default 15 s)")
    check_median_s: float = _a(60.0, "ASSUMPTION: median correctness-check time (default 60 s)")
    timing_median_s: float = _a(190.0, "ASSUMPTION: median timing time, candidate and reference "
                                       "over all cases (default 190 s)")
    stage_sigma: float = _a(0.4, "ASSUMPTION: lognormal sigma of each stage time (default 0.4)")
    timeout_s: float = _a(900.0, "a timeout hangs in timing until the request's wall time "
                                 "reaches this (default 900 s, the reference's per-request "
                                 "timeout, REFERENCE.md section 4)")
    measure_noise_sigma: float = _a(
        0.01, "ASSUMPTION: lognormal sigma of measurement noise on a logged speedup around the "
              "latent one (default 0.01, i.e. ~1%)")

    # --- forecaster ------------------------------------------------------------------------
    forecast_bias: float = _a(0.0, "ASSUMPTION: mean error of the forecaster's predicted log2 "
                                   "speedup (default 0)")
    forecast_shrink: float = _a(
        0.8, "ASSUMPTION: predicted log2 S centre = shrink * true log2 S + bias + noise: "
             "shrinking toward S = 1 overestimates slow kernels and underestimates fast ones, "
             "as the paper reports of base models (default 0.8)")
    forecast_sigma: float = _a(0.5, "ASSUMPTION: sd of the predicted log2 speedup's error "
                                    "(default 0.5), times the forecast's difficulty")
    forecast_spread: float = _a(
        0.35, "ASSUMPTION: width (sd, log2) of the Gaussian the forecaster puts over the paper "
              "bins, times the forecast's difficulty; below forecast_sigma it is overconfident, "
              "as the paper's models are (default 0.35)")
    forecast_difficulty_sigma: float = _a(
        0.5, "ASSUMPTION: lognormal sigma of a per-forecast difficulty that scales both error "
             "and width, so that confidence carries some information (default 0.5)")
    forecast_temperature: float = _a(
        1.0, "ASSUMPTION: bin probabilities are raised to 1/temperature and renormalised "
             "(default 1: unchanged)")
    raw_sum_min: float = _a(0.81, "ASSUMPTION: raw (unnormalised) probability sums are "
                                  "uniform on [raw_sum_min, raw_sum_max] (default 0.81), inside "
                                  "[0.8, 1.1] after rounding each probability to 1e-4")
    raw_sum_max: float = _a(1.09, "ASSUMPTION: see raw_sum_min (default 1.09)")
    parse_failure_rate: float = _a(0.02, "ASSUMPTION: a forecast answer that cannot be parsed: "
                                         "all-zero probabilities (default 0.02)")
    fail_forecast: str = _a(
        "parent", "ASSUMPTION: what the forecaster says about a candidate that will fail: "
                  "'parent' forecasts it as a child at its parent's latent speedup (the "
                  "forecaster cannot see a failure coming), 'own' from its own latent speedup "
                  "(default 'parent')")
    forecast_input_tokens_median: float = _a(
        3800.0, "median forecast input tokens (default 3,800; REFERENCE.md section 6)")
    forecast_input_tokens_sigma: float = _a(0.3, "ASSUMPTION: lognormal sigma of input tokens "
                                                 "(default 0.3)")
    forecast_input_tokens_min: int = _a(2100, "input tokens clipped from below "
                                              "(default 2,100; REFERENCE.md section 6)")
    forecast_input_tokens_max: int = _a(7200, "input tokens clipped from above "
                                              "(default 7,200; REFERENCE.md section 6)")
    forecast_output_tokens_median: float = _a(
        8800.0, "median forecast output tokens (default 8,800; REFERENCE.md section 6)")
    forecast_output_tokens_sigma: float = _a(0.6, "ASSUMPTION: lognormal sigma of output tokens "
                                                  "(default 0.6)")
    forecast_output_tokens_min: int = _a(200, "output tokens clipped from below (default 200; "
                                              "REFERENCE.md section 6)")
    forecast_output_tokens_max: int = _a(21000, "output tokens clipped from above "
                                                "(default 21,000; REFERENCE.md section 6)")
    forecast_latency_median_s: float = _a(
        41.0, "median forecast latency (default 41 s; REFERENCE.md section 6): latency = "
              "output tokens / a lognormal decode rate whose median gives this at the median "
              "output length")
    forecast_rate_sigma: float = _a(0.2, "ASSUMPTION: lognormal sigma of the decode rate "
                                         "(default 0.2)")
    forecast_latency_min_s: float = _a(2.0, "latency clipped from below (default 2 s; "
                                            "REFERENCE.md section 6)")
    forecast_latency_max_s: float = _a(207.0, "latency clipped from above (default 207 s; "
                                              "REFERENCE.md section 6)")

    def __post_init__(self):
        bad = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "fail_forecast":
                if v not in ("parent", "own"):
                    bad.append(f"fail_forecast must be 'parent' or 'own', got {v!r}")
            elif not (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v)):
                bad.append(f"{f.name} must be a finite number, got {v!r}")
            elif f.name.startswith("p_") or f.name == "parse_failure_rate":
                if not 0.0 <= v < 1.0:
                    bad.append(f"{f.name} must be in [0, 1), got {v}")
            elif f.name not in _MAY_BE_NEGATIVE and v < 0:
                bad.append(f"{f.name} must be >= 0, got {v}")
        if not bad:
            if sum(self.failure_rates().values()) >= 1.0:
                bad.append("the failure rates p_* must sum to less than 1")
            if self.step_df <= 0 or self.forecast_temperature <= 0 or self.forecast_spread <= 0:
                bad.append("step_df, forecast_temperature and forecast_spread must be > 0")
            if not 0.0 < self.raw_sum_min <= self.raw_sum_max:
                bad.append("need 0 < raw_sum_min <= raw_sum_max")
            if self.headroom_log2_min > self.headroom_log2_max:
                bad.append("need headroom_log2_min <= headroom_log2_max")
            if not 0.0 <= self.reversion <= 1.0:
                bad.append("reversion must be in [0, 1]")
        if bad:
            raise GfsimError("landscape parameters: " + "; ".join(bad))

    def failure_rates(self) -> dict[str, float]:
        """Base failure rates (at fragility 0 and no attempted gain), in FAILURES order."""
        return {k: getattr(self, "p_" + k) for k in FAILURES}

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Field name -> its documentation (each says whether it is an assumption)."""
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}

    def as_assumptions(self) -> dict[str, dict[str, Any]]:
        """Every value with its note, labelled, for a log header's provenance."""
        return {f.name: {"value": getattr(self, f.name),
                         "label": "assumption" if "ASSUMPTION" in f.metadata["doc"]
                         else "from REFERENCE.md",
                         "note": f.metadata["doc"].replace("ASSUMPTION: ", "")}
                for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Task:
    """A synthetic task: its reference kernel, seed kernel and headroom."""

    task_id: str
    description: str
    reference_runtime_ns: float
    seed_speedup: float
    headroom_log2: float
    root_fragility: float

    @property
    def headroom_speedup(self) -> float:
        return 2.0 ** self.headroom_log2

    def header_entry(self) -> dict:
        return {"task_id": self.task_id, "description": self.description,
                "reference_runtime_ns": self.reference_runtime_ns,
                "seed_speedup": self.seed_speedup,
                "headroom_speedup": round(self.headroom_speedup, 6)}


@dataclass(frozen=True, slots=True)
class Node:
    """A kernel in the landscape. ``log2_speedup``, ``drift`` and ``fragility`` are latent.

    ``outcome`` is one of the schema's evaluation outcomes, or ``"generation_failed"`` when the
    mutator returned no kernel (then there is nothing to forecast, evaluate or mutate).
    ``speedup`` is the measured speedup (latent times measurement noise) of a success, else None.
    """

    node_id: str
    task_id: str
    parent_id: str | None
    depth: int
    index: int
    log2_speedup: float
    drift: float
    fragility: float
    outcome: str
    speedup: float | None
    parent_log2_speedup: float | None = field(default=None, repr=False)
    generation_s: float = field(default=0.0, repr=False)
    stage_s: tuple[float, float, float, float] = field(default=(0.0, 0.0, 0.0, 0.0), repr=False)

    @property
    def failed(self) -> bool:
        """True for any outcome but success (a generation failure included)."""
        return self.outcome != "success"

    @property
    def is_root(self) -> bool:
        return self.parent_id is None


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def _sig6(x: float) -> float:
    return float(f"{x:.6g}")


def child_node_id(task_id: str, parent_id: str, index: int) -> str:
    """A short id that depends only on the path (parent id, index): the same in any order."""
    digest = hashlib.blake2b(f"{parent_id}/{index}".encode(), digest_size=6).hexdigest()
    return f"{task_id}-{digest}"


class Landscape:
    """Seeded tasks and the keyed tree of their mutations (see the module docstring)."""

    def __init__(self, params: LandscapeParams | None = None, seed: int = 0, n_tasks: int = 6):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise GfsimError(f"seed must be a whole number >= 0, got {seed!r}")
        if isinstance(n_tasks, bool) or not isinstance(n_tasks, (int, np.integer)) or n_tasks < 1:
            raise GfsimError(f"the number of tasks must be >= 1, got {n_tasks!r}")
        self.params = params if params is not None else LandscapeParams()
        self.seed = int(seed)
        p = self.params
        width = max(2, len(str(n_tasks - 1)))
        self.tasks: list[Task] = []
        for i in range(int(n_tasks)):
            task_id = f"task-{i:0{width}d}"
            z = stream(self.seed, "task", task_id).standard_normal(4)
            headroom = _clip(p.headroom_log2_mean + p.headroom_log2_sigma * z[0],
                             p.headroom_log2_min, p.headroom_log2_max)
            ref_ns = round(p.ref_runtime_ns_median * math.exp(p.ref_runtime_sigma * z[1]), 3)
            seed_speedup = _sig6(2.0 ** (p.seed_log2_sigma * z[2]))
            self.tasks.append(Task(
                task_id=task_id,
                description=(f"SYNTHETIC task {i}: a made-up kernel, reference runtime "
                             f"{ref_ns / 1000:.1f} us, headroom {2.0 ** headroom:.2f}x; "
                             "nothing was measured"),
                reference_runtime_ns=ref_ns,
                seed_speedup=seed_speedup,
                headroom_log2=float(headroom),
                root_fragility=float(p.fragility_root_sigma * z[3]),
            ))
        self._by_id = {t.task_id: t for t in self.tasks}
        rates = p.failure_rates()
        p_success = 1.0 - sum(rates.values())
        # Odds of each failure against success at fragility 0; fragility multiplies the odds
        # of the kernel's own failures by exp(shift) and leaves infrastructure failures alone.
        self._base_odds = tuple(r / p_success for r in rates.values())
        self._moved = tuple(k in KERNEL_FAILURES for k in FAILURES)
        self._stage_medians = (p.cold_start_median_s, p.compile_median_s, p.check_median_s,
                               p.timing_median_s)
        self._fc_rate_median = p.forecast_output_tokens_median / p.forecast_latency_median_s

    def provenance(self) -> dict:
        """The ``World`` protocol's header provenance: every parameter, labelled."""
        return {"kind": "synthetic", "world": "landscape",
                "note": ("SYNTHETIC: the keyed speedup landscape (gfsim.worlds.landscape); "
                         "nothing was generated by an LLM or measured on a GPU"),
                "seed": self.seed, "params": self.params.as_assumptions()}

    # --- tasks and nodes -------------------------------------------------------------------

    def task(self, task) -> Task:
        """A task by id, index or Task."""
        if isinstance(task, Task):
            return task
        if isinstance(task, (int, np.integer)) and not isinstance(task, bool):
            if not 0 <= task < len(self.tasks):
                raise KeyError(f"task index {task} out of range 0..{len(self.tasks) - 1}")
            return self.tasks[int(task)]
        try:
            return self._by_id[task]
        except KeyError:
            raise KeyError(f"unknown task {task!r}; valid: {', '.join(self._by_id)}") from None

    def root(self, task) -> Node:
        """The task's seed kernel: depth 0, drift 0, a success at the seed speedup."""
        t = self.task(task)
        return Node(node_id=f"{t.task_id}-root", task_id=t.task_id, parent_id=None, depth=0,
                    index=0, log2_speedup=math.log2(t.seed_speedup), drift=0.0,
                    fragility=t.root_fragility, outcome="success", speedup=t.seed_speedup)

    def outcome_probabilities(self, fragility: float, gain: float = 0.0) -> dict[str, float]:
        """P(outcome) of a kernel with this fragility after an attempted log2 gain ``gain``."""
        return dict(zip(_OUTCOME_ORDER, self._outcome_probs(fragility, gain)))

    def _outcome_probs(self, fragility: float, gain: float) -> list[float]:
        """[success, *FAILURES] probabilities (a multinomial logit; see the module docstring)."""
        shift = fragility + self.params.step_failure_coupling * max(gain, 0.0)
        factor = math.exp(shift)
        w = [o * factor if moved else o for o, moved in zip(self._base_odds, self._moved)]
        total = 1.0 + math.fsum(w)
        return [1.0 / total, *(x / total for x in w)]

    def child(self, parent: Node, index: int) -> Node:
        """The ``index``-th mutation of ``parent``, keyed by (seed, task, parent id, index)."""
        if parent.outcome == GENERATION_FAILED:
            raise ValueError(f"{parent.node_id} was never generated; it has no children")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"a child index is a whole number >= 0, got {index!r}")
        p = self.params
        task = self._by_id[parent.task_id]
        rng = stream(self.seed, parent.task_id, parent.node_id, int(index))
        # Fixed layout, whatever the branches below: u = [generation failed, outcome],
        # z = [drift, fragility, measurement, generation time, 4 stage times], t = the step.
        u = rng.random(2)
        z = rng.standard_normal(8)
        t = float(rng.standard_t(p.step_df))

        drift = parent.drift * p.drift_decay + p.drift_sigma * float(z[0])
        delta = _clip(p.step_loc + p.step_scale * t + drift, -p.step_clip, p.step_clip)
        log2_s = parent.log2_speedup + delta - p.reversion * (
            parent.log2_speedup - task.headroom_log2)
        fragility = (p.fragility_inherit * parent.fragility + p.fragility_sigma * float(z[1])
                     + (p.failed_parent_shift if parent.failed else 0.0))
        if u[0] < p.p_generation_failed:
            outcome = GENERATION_FAILED
        else:
            outcome, acc = FAILURES[-1], 0.0
            for name, prob in zip(_OUTCOME_ORDER, self._outcome_probs(fragility, delta)):
                acc += prob
                if u[1] < acc:
                    outcome = name
                    break
        speedup = None
        if outcome == "success":
            speedup = _sig6(2.0 ** log2_s * math.exp(p.measure_noise_sigma * float(z[2])))
        stage = tuple(float(m * math.exp(p.stage_sigma * zz))
                      for m, zz in zip(self._stage_medians, z[4:8]))
        return Node(
            node_id=child_node_id(parent.task_id, parent.node_id, int(index)),
            task_id=parent.task_id, parent_id=parent.node_id, depth=parent.depth + 1,
            index=int(index), log2_speedup=float(log2_s), drift=float(drift),
            fragility=float(fragility), outcome=outcome, speedup=speedup,
            parent_log2_speedup=parent.log2_speedup,
            generation_s=float(p.generation_median_s * math.exp(p.generation_sigma * float(z[3]))),
            stage_s=stage,
        )

    # --- log fields ------------------------------------------------------------------------

    def generation(self, node: Node) -> dict:
        """The candidate's ``generation`` fields: service_s, and failed_reason on a failure.

        No token counts: the reference never logs mutation tokens (the cost model's prior does).
        """
        gen = {"service_s": round(node.generation_s, 3)}
        if node.outcome == GENERATION_FAILED:
            gen["failed_reason"] = "synthetic: the mutator returned no kernel"
        return gen

    def forecast(self, node: Node, forecaster: str = "synthetic", repeat: int = 0) -> dict:
        """A forecast record for ``node``, keyed by (seed, node_id, forecaster, repeat).

        Probabilities are over the PAPER-convention bins, relative to the reference kernel, and
        stored unnormalised (rounded to 1e-4) with their raw sum, as a model returns them.
        """
        if node.outcome == GENERATION_FAILED:
            raise ValueError(f"{node.node_id} was never generated; there is nothing to forecast")
        p = self.params
        rng = stream(self.seed, node.node_id, forecaster, int(repeat))
        # Fixed layout: u = [parse failure, raw sum]; z = [error, difficulty, input tokens,
        # output tokens, decode rate].
        u = rng.random(2)
        z = rng.standard_normal(5)
        in_tok = int(_clip(round(p.forecast_input_tokens_median
                                 * math.exp(p.forecast_input_tokens_sigma * z[2])),
                           p.forecast_input_tokens_min, p.forecast_input_tokens_max))
        out_tok = int(_clip(round(p.forecast_output_tokens_median
                                  * math.exp(p.forecast_output_tokens_sigma * z[3])),
                            p.forecast_output_tokens_min, p.forecast_output_tokens_max))
        latency = _clip(out_tok / (self._fc_rate_median * math.exp(p.forecast_rate_sigma * z[4])),
                        p.forecast_latency_min_s, p.forecast_latency_max_s)
        rec = {"kind": "forecast", "candidate_id": node.node_id, "forecaster": forecaster,
               "mode": "synthetic"}
        if u[0] < p.parse_failure_rate:
            rec.update(probs=[0.0] * 8, raw_probability_sum=0.0, predicted_bin=None,
                       parse_failed=True)
        else:
            target = self.forecast_target_log2(node)
            difficulty = math.exp(p.forecast_difficulty_sigma * float(z[1]))
            centre = (p.forecast_shrink * target + p.forecast_bias
                      + p.forecast_sigma * difficulty * float(z[0]))
            probs = bin_probabilities(centre, p.forecast_spread * difficulty,
                                      p.forecast_temperature)
            raw = p.raw_sum_min + (p.raw_sum_max - p.raw_sum_min) * float(u[1])
            probs = [round(x * raw, 4) for x in probs]
            rec.update(probs=probs, raw_probability_sum=round(math.fsum(probs), 6),
                       predicted_bin=1 + max(range(8), key=probs.__getitem__),
                       parse_failed=False)
        rec.update(input_tokens=in_tok, output_tokens=out_tok, latency_s=round(latency, 3),
                   repeat=int(repeat))
        return rec

    def forecast_target_log2(self, node: Node) -> float:
        """The latent log2 speedup a forecast is centred on (before shrink, bias and noise)."""
        if (node.failed and self.params.fail_forecast == "parent"
                and node.parent_log2_speedup is not None):
            return node.parent_log2_speedup
        return node.log2_speedup

    def evaluation(self, node: Node) -> dict:
        """An evaluation record: outcome, measured speedup and the stage times it ran.

        A failure stops after its stage (compile_failed: no check or timing; runtime_error and
        incorrect: no timing); a timeout hangs in timing until wall_s = timeout_s; an
        infrastructure failure costs only the cold start. service_s = wall_s (serverless).
        """
        if node.outcome == GENERATION_FAILED:
            raise ValueError(f"{node.node_id} was never generated; there is nothing to evaluate")
        task = self._by_id[node.task_id]
        ran = STAGES_RUN[node.outcome]
        stages = {k: (round(v, 3) if k in ran else 0.0) for k, v in zip(STAGES, node.stage_s)}
        wall = round(math.fsum(stages.values()), 3)
        if node.outcome == "timeout":
            before = stages["cold_start_s"] + stages["compile_s"] + stages["check_s"]
            stages["timing_s"] = round(max(self.params.timeout_s - before, 0.0), 3)
            wall = round(max(self.params.timeout_s, before), 3)
        rec = {"kind": "evaluation", "candidate_id": node.node_id, "outcome": node.outcome}
        if node.outcome == "success":
            rec.update(speedup=node.speedup,
                       runtime_ns=round(task.reference_runtime_ns / node.speedup, 3))
        rec.update(ref_runtime_ns=task.reference_runtime_ns, **stages, wall_s=wall,
                   service_s=wall)
        return rec


def bin_probabilities(centre_log2: float, width_log2: float, temperature: float = 1.0) -> list:
    """A Gaussian(centre, width) in log2 speedup integrated over the paper bins, tempered."""
    cdf = [0.5 * (1.0 + math.erf((e - centre_log2) / (width_log2 * _SQRT2)))
           for e in _LOG2_PAPER_EDGES]
    probs = [max(b - a, 0.0) for a, b in zip([0.0, *cdf], [*cdf, 1.0])]
    if temperature != 1.0:
        tempered = [x ** (1.0 / temperature) for x in probs]
        # A very low temperature can underflow every bin: then it is all on the most likely.
        probs = tempered if math.fsum(tempered) > 0 else [
            float(i == max(range(8), key=probs.__getitem__)) for i in range(8)]
    total = math.fsum(probs)
    return [x / total for x in probs]
