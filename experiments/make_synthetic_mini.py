"""Write the shipped SYNTHETIC replay log ``synthetic-mini`` (nothing in it was measured).

Three toy tasks, one measure-all search each: 16 steps, step 0 expands the seed kernel into 4
children, later steps pick 2 parents among the measured successes and ask for 4 children each
(4 + 15 * 8 = 124 candidates per task). Every candidate that was generated gets one forecast
and one evaluation, so the log supports counterfactual policy comparisons.

Every draw comes from ``gfsim.core.rng.stream(seed, <what the draw is about>)``, and the output is
written in one gzip member with mtime 0, so the same seed gives the same bytes.

    python experiments/make_synthetic_mini.py [--out PATH] [--seed N]
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gfsim.core.rng import stream
from gfsim.forecasts.bins import PAPER_EDGES, speedup_to_bin
from gfsim.replay_logs import SCHEMA_VERSION, LogWriter

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "replay_logs/data/synthetic-mini.jsonl.gz"
LOG_ID = "synthetic-mini"
CREATED_AT = "2026-11-29T00:00:00Z"  # fixed so that the file is byte-reproducible
FORECASTER = "synthetic-noisy"
DRIVER = "trace-synthetic"

STEPS = 16
PARENTS_PER_STEP = 2
SAMPLES_PER_PARENT = 4
PARENT_POOL = 4  # parents come from the top few measured successes
P_GREEDY_PARENT = 0.7  # otherwise a uniformly random one of the pool

# task_id, description, reference runtime (ns), headroom: the speedup mutations drift back to
TASKS = (
    ("softmax", "SYNTHETIC row-wise softmax over a 4096 x 4096 fp32 matrix", 48_000.0, 2.0),
    ("layernorm", "SYNTHETIC layer norm over 8192 rows of width 2048, bf16", 61_000.0, 1.5),
    ("matmul", "SYNTHETIC 4096^3 bf16 matrix multiply", 1_250_000.0, 1.1),
)

# --- Stated assumptions (recorded in the header's provenance) --------------------------------
LOG2_STEP_DF = 3  # Student-t degrees of freedom of a child's log2-speedup step
LOG2_STEP_SCALE = 0.35
LOG2_STEP_CLIP = 1.5  # the t tail is heavy; no single mutation changes speed by more than 2.8x
LOG2_DRIFT = -0.2  # a typical mutation makes the kernel a little slower
# Without a pull back, greedy parents on a heavy-tailed walk compound to 100x+ in 16 steps and
# nearly every kernel lands in bin 8; real searches plateau. The pull is toward the task's headroom.
LOG2_REVERSION = 0.5
P_GENERATION_FAILED = 0.02
OUTCOME_RATES = {  # of generated candidates; success takes the rest
    "compile_failed": 0.12,
    "runtime_error": 0.05,
    "incorrect": 0.08,
    "timeout": 0.01,
    "infrastructure_failure": 0.01,
}
GEN_SERVICE_MEDIAN_S, GEN_SERVICE_SIGMA = 30.0, 0.5
# Medians chosen so that a successful evaluation takes ~5.4 GPU-minutes all-in, as the reference's
# serverless A100 setup does (~30 GPU-hours per 40-step search, docs/concepts/paper.md).
STAGE_MEDIAN_S = {"cold_start_s": 60.0, "compile_s": 15.0, "check_s": 60.0, "timing_s": 190.0}
STAGE_SIGMA = 0.4
TIMEOUT_S = 900.0
P_PARSE_FAILED = 0.02
P_SHIFT_1, P_SHIFT_2 = 0.15, 0.05  # forecast peak off by one / by two bins
FORECAST_WIDTH_BINS = (0.5, 1.8)  # uniform range of the Gaussian width over bins
FORECAST_JITTER_SIGMA = 0.3  # log-normal noise on each bin's weight
RAW_SUM_RANGE = (0.81, 1.09)  # inside [0.8, 1.1] even after rounding each prob to 1e-4
FC_INPUT_TOKENS_MEDIAN, FC_INPUT_SIGMA = 3800.0, 0.3  # docs/concepts/paper.md
FC_OUTPUT_TOKENS_MEDIAN, FC_OUTPUT_SIGMA = 8800.0, 0.6  # docs/concepts/paper.md
FC_TOKENS_PER_S_MEDIAN, FC_RATE_SIGMA = FC_OUTPUT_TOKENS_MEDIAN / 41.0, 0.2  # median ~41 s
# Observed ranges of the same rows (docs/concepts/paper.md); draws are clipped to them.
FC_INPUT_RANGE, FC_OUTPUT_RANGE, FC_LATENCY_RANGE_S = (2100, 7200), (200, 21000), (2.0, 207.0)


def assumptions() -> dict:
    """Every made-up number, each labelled as an assumption, for the header."""

    def a(value, note):
        return {"label": "assumption", "value": value, "note": note}

    return {
        "speedup_walk": a(
            {"log2_step": f"student_t(df={LOG2_STEP_DF}) * {LOG2_STEP_SCALE}, clipped to "
                          f"+-{LOG2_STEP_CLIP}", "log2_drift_per_mutation": LOG2_DRIFT,
             "log2_reversion": LOG2_REVERSION,
             "headroom_speedup": {t: h for t, _d, _r, h in TASKS}},
            "child log2 speedup = parent log2 speedup (seed: log2 seed_speedup) + step + drift "
            "- reversion * (parent log2 speedup - log2 headroom)"),
        "parent_selection": a({"pool": f"top {PARENT_POOL} measured successes",
                               "p_greedy": P_GREEDY_PARENT},
                              "each parent is the pool's best with p_greedy, else a random one"),
        "clock": a("a step's requests all start when the step starts; the next step starts when "
                   "the step's last candidate is generated, forecast and evaluated", "no queueing"),
        "generation_failure_rate": a(P_GENERATION_FAILED, "mutator returns no kernel"),
        "outcome_rates": a(OUTCOME_RATES, "of generated candidates; success is the rest"),
        "generation_service_s": a({"lognormal_median": GEN_SERVICE_MEDIAN_S,
                                   "sigma": GEN_SERVICE_SIGMA}, "mutation tokens are not modelled"),
        "evaluation_stage_s": a({"lognormal_medians": STAGE_MEDIAN_S, "sigma": STAGE_SIGMA},
                                "medians sum to ~5.4 min, the reference's ~5-6 GPU-minutes per "
                                "evaluation (REFERENCE.md section 4); a failure stops after "
                                "its stage; a timeout hangs in timing until "
                                f"wall_s = {TIMEOUT_S}; an infrastructure failure costs only the "
                                "cold start"),
        "forecast_shape": a(
            {"peak": "true paper-convention bin (a failure's forecast: its parent's speedup)",
             "p_shift_1": P_SHIFT_1, "p_shift_2": P_SHIFT_2, "width_bins": FORECAST_WIDTH_BINS,
             "jitter_sigma": FORECAST_JITTER_SIGMA, "raw_sum_range": RAW_SUM_RANGE,
             "parse_failure_rate": P_PARSE_FAILED},
            "a noisy Gaussian over bins; probs stored unnormalised"),
        "forecast_usage": a(
            {"input_tokens_median": FC_INPUT_TOKENS_MEDIAN, "input_sigma": FC_INPUT_SIGMA,
             "output_tokens_median": FC_OUTPUT_TOKENS_MEDIAN, "output_sigma": FC_OUTPUT_SIGMA,
             "latency_s": f"output_tokens / lognormal(median {FC_TOKENS_PER_S_MEDIAN:.1f} tok/s, "
                          f"sigma {FC_RATE_SIGMA})",
             "clip_ranges": {"input_tokens": FC_INPUT_RANGE, "output_tokens": FC_OUTPUT_RANGE,
                             "latency_s": FC_LATENCY_RANGE_S}},
            "medians and ranges from REFERENCE.md section 6 (eval-set-predictions rows); "
            "the log-normal spread is assumed"),
    }


# --- Draws ---------------------------------------------------------------------------------

def lognormal(rng, median: float, sigma: float) -> float:
    return float(median * math.exp(sigma * rng.standard_normal()))


def clip(x: float, bounds: tuple) -> float:
    return max(bounds[0], min(bounds[1], x))


def draw_child_log2(seed: int, task: str, idx: int, parent_log2: float, headroom: float) -> float:
    rng = stream(seed, task, idx, "speedup")
    step = clip(LOG2_STEP_SCALE * float(rng.standard_t(LOG2_STEP_DF)),
                (-LOG2_STEP_CLIP, LOG2_STEP_CLIP))
    pull = LOG2_REVERSION * (parent_log2 - math.log2(headroom))
    return parent_log2 + step + LOG2_DRIFT - pull


def draw_outcome(seed: int, task: str, idx: int) -> str:
    u = float(stream(seed, task, idx, "outcome").random())
    for outcome, rate in OUTCOME_RATES.items():
        if u < rate:
            return outcome
        u -= rate
    return "success"


def draw_forecast_probs(seed: int, task: str, idx: int, true_bin: int) -> tuple[list, float]:
    """Unnormalised probs (rounded to 1e-4) and their sum; all zeros on a parse failure."""
    rng = stream(seed, task, idx, FORECASTER, 0)
    if rng.random() < P_PARSE_FAILED:
        return [0.0] * 8, 0.0
    u = rng.random()
    shift = 2 if u < P_SHIFT_2 else 1 if u < P_SHIFT_2 + P_SHIFT_1 else 0
    sign = 1 if rng.random() < 0.5 else -1
    peak = min(8, max(1, true_bin + sign * shift))
    width = rng.uniform(*FORECAST_WIDTH_BINS)
    weights = [math.exp(-0.5 * ((b - peak) / width) ** 2 + FORECAST_JITTER_SIGMA
                        * rng.standard_normal()) for b in range(1, 9)]
    scale = rng.uniform(*RAW_SUM_RANGE) / math.fsum(weights)
    probs = [round(w * scale, 4) for w in weights]
    return probs, round(math.fsum(probs), 6)


# --- Records -------------------------------------------------------------------------------

@dataclass
class Node:
    """A generated candidate as the search sees it."""

    cid: str
    log2_speedup: float  # the true one for a success; the parent's otherwise (forecast anchor)
    measured: float | None  # measured speedup of a success, else None


def header(seed: int) -> dict:
    return {
        "kind": "header",
        "schema_version": SCHEMA_VERSION,
        "log_id": LOG_ID,
        "created_at": CREATED_AT,
        "provenance": {
            "kind": "synthetic",
            "generator": "experiments/make_synthetic_mini.py",
            "seed": seed,
            "note": "SYNTHETIC: every number in this log was drawn from the stated assumptions; "
                    "nothing was generated by an LLM or measured on a GPU.",
            "assumptions": assumptions(),
        },
        "log_shape": "trajectory",
        "label_bin_convention": "reference-code",
        "forecast_bin_edges": list(PAPER_EDGES),
        "forecast_relative_to": "reference",
        "hardware": {"device_name": "synthetic (no GPU)"},
        "tasks": [{"task_id": t, "description": d, "reference_runtime_ns": r, "seed_speedup": 1.0}
                  for t, d, r, _h in TASKS],
        "timing_protocol": {"l2_flush": False, "input_clone_timed": True, "statistic": "mean",
                            "rse_target": 0.001, "max_reps": 100},
        "duration_basis": "service",
        "generator": {"model": "synthetic"},
    }


def choose_parents(seed: int, task: str, step: int, successes: list[Node]) -> list[Node]:
    """Two parents from the top few measured successes: greedy mostly, sometimes random.

    With fewer than two successes so far, take what there is; with none, re-expand the seed
    (an empty list, written like step 0).
    """
    pool = sorted(successes, key=lambda n: -n.measured)[:PARENT_POOL]
    rng = stream(seed, task, step, "parents")
    chosen: list[Node] = []
    while pool and len(chosen) < PARENTS_PER_STEP:
        pick = 0 if rng.random() < P_GREEDY_PARENT else int(rng.integers(len(pool)))
        chosen.append(pool.pop(pick))
    return chosen


def evaluation(seed: int, task: str, idx: int, cid: str, outcome: str, log2_s: float,
               ref_ns: float) -> dict:
    rng = stream(seed, task, idx, "evaluation")
    stages = {k: round(lognormal(rng, m, STAGE_SIGMA), 3) for k, m in STAGE_MEDIAN_S.items()}
    # A failure stops after the stage that failed; later stages cost nothing.
    ran = {"compile_failed": ("cold_start_s", "compile_s"),
           "runtime_error": ("cold_start_s", "compile_s", "check_s"),
           "incorrect": ("cold_start_s", "compile_s", "check_s"),
           "infrastructure_failure": ("cold_start_s",)}.get(outcome, tuple(stages))
    stages = {k: (v if k in ran else 0.0) for k, v in stages.items()}
    if outcome == "timeout":  # hung while timing until the request timed out
        stages["timing_s"] = round(TIMEOUT_S - stages["cold_start_s"] - stages["compile_s"]
                                   - stages["check_s"], 3)
    wall = TIMEOUT_S if outcome == "timeout" else round(math.fsum(stages.values()), 3)
    rec = {"kind": "evaluation", "candidate_id": cid, "outcome": outcome}
    if outcome == "success":
        speedup = float(f"{2.0 ** log2_s:.6g}")
        rec.update(speedup=speedup, runtime_ns=round(ref_ns / speedup, 3))
    rec.update(ref_runtime_ns=ref_ns, **stages, wall_s=wall, service_s=wall)
    return rec


def forecast(seed: int, task: str, idx: int, cid: str, anchor_log2: float) -> dict:
    true_bin = int(speedup_to_bin(2.0 ** anchor_log2, "paper"))
    probs, raw_sum = draw_forecast_probs(seed, task, idx, true_bin)
    parse_failed = raw_sum == 0.0
    rng = stream(seed, task, idx, FORECASTER, 0, "usage")
    out_tokens = int(clip(round(lognormal(rng, FC_OUTPUT_TOKENS_MEDIAN, FC_OUTPUT_SIGMA)),
                          FC_OUTPUT_RANGE))
    in_tokens = int(clip(round(lognormal(rng, FC_INPUT_TOKENS_MEDIAN, FC_INPUT_SIGMA)),
                         FC_INPUT_RANGE))
    # Latency follows the answer's length at a noisy decode rate (median ~41 s overall).
    latency = clip(out_tokens / lognormal(rng, FC_TOKENS_PER_S_MEDIAN, FC_RATE_SIGMA),
                   FC_LATENCY_RANGE_S)
    return {
        "kind": "forecast", "candidate_id": cid, "forecaster": FORECASTER, "mode": "tool",
        "probs": probs, "raw_probability_sum": raw_sum,
        "predicted_bin": None if parse_failed else 1 + max(range(8), key=probs.__getitem__),
        "parse_failed": parse_failed, "input_tokens": in_tokens, "output_tokens": out_tokens,
        "latency_s": round(latency, 3), "repeat": 0,
    }


def search_records(seed: int, task: str, ref_ns: float, headroom: float,
                   seed_speedup: float = 1.0) -> list[dict]:
    """run, then per step: the step record and each child's candidate/forecast/evaluation."""
    search_id = f"{task}-s0"
    records = [{"kind": "run", "search_id": search_id, "driver": DRIVER, "configuration": {
        "steps": STEPS, "parents_per_step": PARENTS_PER_STEP,
        "samples_per_parent": SAMPLES_PER_PARENT, "k": SAMPLES_PER_PARENT}}]
    successes: list[Node] = []
    idx, clock = 0, 0.0
    for step in range(STEPS):
        parents = [] if step == 0 else choose_parents(seed, task, step, successes)
        records.append({"kind": "step", "search_id": search_id, "step": step,
                        "parent_ids": [p.cid for p in parents],
                        "parent_scores": [p.measured for p in parents]})
        slots = parents or [None]  # None: the seed kernel, which has no candidate record
        step_end = clock
        for seq in range(len(slots) * SAMPLES_PER_PARENT):
            parent = slots[seq // SAMPLES_PER_PARENT]
            parent_log2 = math.log2(seed_speedup) if parent is None else parent.log2_speedup
            node, recs, done = child(seed, task, idx, search_id, step, seq, parent, parent_log2,
                                     clock, ref_ns, headroom)
            records += recs
            if node.measured is not None:
                successes.append(node)
            step_end = max(step_end, done)
            idx += 1
        clock = step_end  # the next step starts when this one's last candidate is done
    return records


def child(seed, task, idx, search_id, step, seq, parent, parent_log2, clock, ref_ns, headroom):
    """One child: its records, what the search learns and when it is done (clock seconds)."""
    cid = f"{task}-{idx:04d}"
    rng = stream(seed, task, idx, "generation")
    service = round(lognormal(rng, GEN_SERVICE_MEDIAN_S, GEN_SERVICE_SIGMA), 3)
    gen = {"started_s": round(clock, 3), "completed_s": round(clock + service, 3),
           "service_s": service}
    cand = {"kind": "candidate", "candidate_id": cid, "search_id": search_id, "task_id": task,
            "parent_id": None if parent is None else parent.cid, "step": step, "seq": seq,
            "generation": gen}
    if rng.random() < P_GENERATION_FAILED:
        gen["failed_reason"] = "synthetic: the mutator returned no kernel"
        return Node(cid, parent_log2, None), [cand], gen["completed_s"]
    code = f"# SYNTHETIC kernel {cid} for {task} (parent {cand['parent_id']}), seed {seed}\n"
    cand["code_sha256"] = hashlib.sha256(code.encode()).hexdigest()
    outcome = draw_outcome(seed, task, idx)
    log2_s = (draw_child_log2(seed, task, idx, parent_log2, headroom) if outcome == "success"
              else parent_log2)
    fc = forecast(seed, task, idx, cid, log2_s)
    ev = evaluation(seed, task, idx, cid, outcome, log2_s, ref_ns)
    done = gen["completed_s"] + fc["latency_s"] + ev["wall_s"]
    return Node(cid, log2_s, ev.get("speedup")), [cand, fc, ev], done


def build(seed: int) -> list[dict]:
    records = [header(seed)]
    for task, _desc, ref_ns, headroom in TASKS:
        records += search_records(seed, task, ref_ns, headroom)
    return records


def summary(records: list[dict]) -> str:
    cands = [r for r in records if r["kind"] == "candidate"]
    evals = [r for r in records if r["kind"] == "evaluation"]
    fcs = [r for r in records if r["kind"] == "forecast"]
    gen_failed = sum(1 for c in cands if c["generation"].get("failed_reason"))
    outcomes = Counter(e["outcome"] for e in evals)
    lines = [f"{LOG_ID}: {len(records)} records, {len(cands)} candidates "
             f"({gen_failed} generation failures), {len(fcs)} forecasts "
             f"({sum(f['parse_failed'] for f in fcs)} parse failures), {len(evals)} evaluations",
             "outcomes: " + ", ".join(f"{k} {outcomes[k]}" for k in ("success", *OUTCOME_RATES))]
    by_cand = {c["candidate_id"]: c["task_id"] for c in cands}
    for task, *_ in TASKS:
        best = max((e["speedup"] for e in evals
                    if e.get("speedup") and by_cand[e["candidate_id"]] == task), default=None)
        n = sum(1 for c in cands if c["task_id"] == task)
        lines.append(f"  {task}: {n} candidates, best measured speedup {best}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .jsonl[.gz] path")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    records = build(args.seed)
    args.out.unlink(missing_ok=True)  # LogWriter appends; start from an empty file
    with LogWriter(args.out) as w:
        w.append_many(records)  # one batch = one gzip member, so the bytes are reproducible
    print(f"wrote {args.out}")
    print(summary(records))


if __name__ == "__main__":
    main()
