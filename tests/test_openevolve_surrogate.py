"""gfsim inside a real OpenEvolve run (CPU): ``gfsim.integrations.openevolve.Surrogate`` as the
evaluator's stage 1, OpenEvolve's LLM the mutation-operator server on loopback, the user's
evaluator gfsim's kernel measurer under the Triton interpreter. Skipped programs enter
OpenEvolve's database as not evaluated (never a success) and come back from
``gfsim import openevolve`` as not_measured; the wrapper's own log is a valid trajectory log."""

import asyncio
import contextlib
import json
import logging
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from gfsim.importers.openevolve import import_openevolve
from gfsim.integrations.mutation_server import MutationServer
from gfsim.replay_logs import load_log
from gfsim.replay_logs.io import iter_records

HANG_S = 600
EVALUATOR = '''
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.openevolve import Surrogate


def user_evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


def user_stage2(program_path):  # a later stage: says which programs reached it
    import hashlib
    import pathlib

    digest = hashlib.sha256(pathlib.Path(program_path).read_bytes()).hexdigest()
    with open({log!r} + ".stage2", "a") as f:
        f.write(digest + "\\n")
    return {{"stage2": 1.0}}


surrogate = Surrogate(user_evaluate, runtime_metric="runtime_ns", policy={policy!r},
                      forecaster={forecaster!r}, log={log!r}, task="softmax", seed=1)
evaluate_stage1 = surrogate.stage1
evaluate_stage2 = surrogate.gate(user_stage2)
evaluate = surrogate.stage1
'''


def run_openevolve(tmp_path: Path, policy: str, forecaster, iterations: int,
                   thresholds=(0.5,), evaluator: str | None = None, cap=None,
                   max_tokens: int | None = None, llm=None):
    """A real OpenEvolve run in ``tmp_path`` (the mutation server as its LLM, or ``llm``: a
    ``VllmServer``, whose tiny random model writes no program, so that OpenEvolve ends the run
    with its EvolutionFailedError, taken here as its end) with ``evaluator`` as its evaluator
    file (default: ``EVALUATOR``, stage 1 gated by ``policy``); ``cap``: a ``DollarCap`` its
    LLM is held to. Returns (the surrogate's log, the LLM requests the mutation server
    answered; None for ``llm``)."""
    from openevolve import OpenEvolve
    from openevolve.config import Config

    from gfsim.integrations.openevolve import openevolve_client
    from gfsim.live.tasks import get_task

    log = tmp_path / "surrogate.jsonl"
    (tmp_path / "initial.py").write_text(get_task("softmax").candidates()[0].code)
    (tmp_path / "evaluator.py").write_text((evaluator or EVALUATOR).format(
        policy=policy, forecaster=forecaster, log=str(log)))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    model = {"max_tokens": max_tokens} if max_tokens else {}
    if llm is not None:  # greedy: vLLM CPU 0.32's engine dies on a seeded sampler
        model["temperature"] = 0.0
    with (MutationServer(seed=0) if llm is None else contextlib.nullcontext()) as server:
        url, name = (server.url, "gfsim-mutation-operator") if llm is None else \
            (llm.url, llm.model)
        cfg = Config.from_dict({
            "max_iterations": iterations, "checkpoint_interval": 2, "random_seed": 0,
            "language": "python", "diff_based_evolution": False, "log_level": "INFO",
            "llm": {"api_key": "none", "retries": 0, "timeout": 60,
                    "models": [{"name": name, "api_base": url, **model}]},
            "database": {"num_islands": 1, "population_size": 20},
            "evaluator": {"timeout": 120, "max_retries": 0, "cascade_evaluation": True,
                          "cascade_thresholds": list(thresholds), "parallel_evaluations": 1}})
        if cap is not None:
            for m in cfg.llm.models:
                m.init_client = openevolve_client(cap)
        oe = OpenEvolve(str(tmp_path / "initial.py"), str(tmp_path / "evaluator.py"), cfg,
                        output_dir=str(tmp_path / "run"))
        try:
            # A hang guard, not a timing (a run takes about a minute): one CI run's OpenEvolve
            # waited on an iteration of its forked worker past 8 minutes.
            asyncio.run(asyncio.wait_for(oe.run(iterations=iterations), HANG_S))
        except Exception as exc:  # OpenEvolve's own end for a run that made no program
            if llm is None or type(exc).__name__ != "EvolutionFailedError":
                raise
        finally:  # OpenEvolve installs its own; they would outlive the run in this process
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for h in root.handlers[:]:  # and its log handlers (files in tmp_path)
                if h not in root_state[0]:
                    root.removeHandler(h)
                    h.close()
            root.setLevel(root_state[1])
        return log, server.requests if llm is None else None


@pytest.mark.slow
def test_skipped_programs_are_not_evaluated_and_everything_is_logged(tmp_path):
    # a first cascade threshold of 0: a skipped program's score (0) passes it, so OpenEvolve
    # goes on to stage 2, where the gate must stop it
    log_path, _ = run_openevolve(tmp_path, "random:0.5", None, iterations=6, thresholds=(0.0,))
    log = load_log(log_path)  # a valid trajectory log, written as the run went
    assert log.header["provenance"]["kind"] == "measured"
    assert log.runs[0]["configuration"]["policy"] == "random:p=0.5"
    dec = log.decisions.set_index("candidate_id")["action"]
    n = len(log.candidates)
    made = sum(len(re.findall(r"Iteration \d+: Program ", f.read_text()))
               for f in (tmp_path / "run" / "logs").glob("*.log"))
    assert n == 1 + made and made >= 5 and len(dec) == n  # the initial one, one per program
    assert dec.iloc[0] == "measure"  # the first program: the reference
    skipped = set(dec[dec == "skip"].index)
    measured = set(dec[dec == "measure"].index)
    assert skipped and len(measured) >= 2, "seed 1 skips some and measures some"
    assert set(log.evaluations["candidate_id"]) == measured
    assert set(log.candidates.set_index("candidate_id")["status"][list(skipped)]) == \
        {"deferred"}
    ev = log.evaluations.set_index("candidate_id")
    assert ev["wall_s"].notna().all()
    # stage 2 ran for measured programs only, though the skipped ones passed the threshold
    code_of = log.candidates.set_index("candidate_id")["code_sha256"]
    stage2 = Path(str(log_path) + ".stage2").read_text().split()
    only_skipped = {code_of[c] for c in skipped} - {code_of[c] for c in measured}
    assert stage2 and set(stage2) <= {code_of[c] for c in measured}
    assert only_skipped and not only_skipped & set(stage2)
    # OpenEvolve's own database: skipped programs carry the flag and a score of 0, never a
    # speedup; gfsim import openevolve reads them as not_measured
    progs = [json.loads(f.read_text()) for f in
             (tmp_path / "run" / "checkpoints").glob("checkpoint_*/programs/*.json")]
    flagged = {p["id"]: p for p in progs if p["metrics"].get("gfsim_skipped")}
    assert flagged and all(p["metrics"]["combined_score"] == 0.0 and "speedup" not in
                           p["metrics"] for p in flagged.values())
    summary = import_openevolve(tmp_path / "run", tmp_path / "imported.jsonl",
                                runtime_metric="runtime_ns")
    assert summary["outcomes"].get("not_measured", 0) == len(flagged)
    # (the database may drop a program before any checkpoint holds it: then only its log
    # line is left, and it imports as not_attempted)
    assert len(flagged) <= len(skipped) <= len(flagged) + summary["log_only"]
    # joined with the surrogate's log: every checkpointed program found its stage-1 record
    joined = import_openevolve(tmp_path / "run", tmp_path / "joined.jsonl",
                               runtime_metric="runtime_ns", surrogate_log=log_path)
    checkpointed = {p["id"] for p in progs if not p["metadata"].get("migrant")}
    assert checkpointed and joined["surrogate_matched"] == len(checkpointed)
    assert joined["forecasts"] == 0  # random:0.5 reads none
    assert "random:p=0.5" in load_log(tmp_path / "joined.jsonl").header["selection"]["rule"]
    # the wrapper's evaluations are the user's evaluator's: the same codes, the same outcomes
    by_code: dict = {}  # the same code can come twice (OpenEvolve may rewrite to it again)
    for _, r in iter_records(log_path):
        if r["kind"] == "candidate":
            by_code.setdefault(r["code_sha256"], []).append(r["candidate_id"])
    imported = load_log(tmp_path / "imported.jsonl")
    icands = imported.candidates.set_index("candidate_id")
    iev = imported.evaluations.set_index("candidate_id")
    for pid, row in iev.iterrows():
        ours = [c for c in by_code[icands.loc[pid, "code_sha256"]] if c in ev.index]
        assert row["outcome"] in {ev.loc[c, "outcome"] for c in ours}


def test_a_live_vllm_forecaster_gates_with_threshold(tmp_path, vllm_server):
    from gfsim.policies import make_policy
    from gfsim.policies.base import Batch, SearchState

    spec = (f"vllm:{vllm_server.url},model={vllm_server.model},mode=logprobs,"
            "max_prompt_tokens=400,timeout=60")
    log_path, _ = run_openevolve(tmp_path, "threshold:0.7", spec, iterations=3)
    log = load_log(log_path)
    fc = log.forecasts.set_index("candidate_id")
    cands = list(log.candidates["candidate_id"])
    assert set(fc.index) == set(cands[1:])  # every program but the reference was forecast
    assert log.runs[0]["configuration"]["forecaster"]["name"]
    policy = make_policy("threshold:0.7")
    dec = log.decisions.set_index("candidate_id")
    for cid in cands[1:]:  # each decision is the policy's on the logged forecast
        probs = np.array([fc.loc[cid, f"p{b}"] for b in range(1, 9)], float)[None, :]
        ok = bool(np.isfinite(probs).all() and probs.sum() > 0)
        batch = Batch((cid,), np.nan_to_num(probs), np.array([ok]), np.array([False]),
                      np.ones(1), tuple(log.header["forecast_bin_edges"]))
        d = policy.decide(batch, SearchState("s", "softmax", 0, 1.0, 0, 1))
        assert (dec.loc[cid, "action"] == "measure") == bool(d.measure[0])
    # the run's folder imported with the surrogate's log: parent links and the real forecasts
    summary = import_openevolve(tmp_path / "run", tmp_path / "joined.jsonl",
                                runtime_metric="runtime_ns", surrogate_log=log_path)
    joined = load_log(tmp_path / "joined.jsonl")
    assert summary["forecasts"] >= 1 and joined.header["selection"]
    code_of = log.candidates.set_index("candidate_id")["code_sha256"]
    ours = {code_of[c]: fc.loc[c, [f"p{b}" for b in range(1, 9)]].to_numpy(float)
            for c in fc.index}
    jfc = joined.forecasts.set_index("candidate_id")
    jcode = joined.candidates.set_index("candidate_id")["code_sha256"]
    for cid in jfc.index:
        got = jfc.loc[cid, [f"p{b}" for b in range(1, 9)]].to_numpy(float)
        assert np.allclose(got, ours[jcode[cid]])


def _runtime_of(path):
    """A cheap user evaluator: the runtime a program states (its file's first line)."""
    text = Path(path).read_text()
    if "raise" in text:
        raise RuntimeError("the evaluator broke")
    return {"combined_score": 1.0, "runtime_ns": float(text.split()[0])}


def test_what_cannot_work_live_is_refused(tmp_path):
    from gfsim.core.errors import GfsimError
    from gfsim.integrations.openevolve import Surrogate

    log = tmp_path / "s.jsonl"
    for kw, match in ((dict(policy="oracle"), "oracle"),
                      (dict(policy="threshold:0.7"), "give a forecaster"),
                      (dict(policy="all", forecaster="paper:gemini3-flash"), "what-if")):
        with pytest.raises(GfsimError, match=match):
            Surrogate(_runtime_of, runtime_metric="runtime_ns", log=log, **kw)
    assert not log.exists()


def _stage1_many(args):
    log, paths = args
    from gfsim.integrations.openevolve import Surrogate

    s = Surrogate(_runtime_of, runtime_metric="runtime_ns", policy="random:0.5", log=log)
    return [s.stage1(p) for p in paths]


def test_processes_evaluating_at_once_write_one_valid_log(tmp_path):
    """OpenEvolve evaluates in several processes: the lock keeps one header, unique ids and
    steps, and every record whole; a failing evaluator is logged, then raised as before."""
    import multiprocessing as mp

    from gfsim.integrations.openevolve import Surrogate

    log = tmp_path / "s.jsonl"
    seed = tmp_path / "seed.py"
    seed.write_text("200\n")
    first = Surrogate(_runtime_of, runtime_metric="runtime_ns", log=log).stage1(seed)
    assert first == {"combined_score": 1.0, "runtime_ns": 200.0}
    jobs = []
    for w in range(4):
        paths = []
        for k in range(5):
            p = tmp_path / f"p{w}-{k}.py"
            p.write_text(f"{100 + 10 * w + k}\n")
            paths.append(str(p))
        jobs.append((str(log), paths))
    pool = mp.get_context("fork").Pool(4)
    try:
        results = [r for rs in pool.map(_stage1_many, jobs, chunksize=1) for r in rs]
    finally:  # workers leave when the work is done: no signal needed, none relied on
        pool.close()
        pool.join()
    bad = tmp_path / "bad.py"
    bad.write_text("raise\n")
    s = Surrogate(_runtime_of, runtime_metric="runtime_ns", policy="all", log=log)
    with pytest.raises(RuntimeError, match="broke"):
        s.stage1(bad)
    got = load_log(log)
    assert len(got.candidates) == 22 and sorted(got.candidates["step"]) == list(range(22))
    assert got.candidates["candidate_id"].is_unique
    metrics = [getattr(r, "metrics", r) for r in results]  # skips: OpenEvolve's result type
    skipped = [m for m in metrics if m.get("gfsim_skipped")]
    assert skipped and all(m["combined_score"] == 0.0 for m in skipped)
    assert all("gfsim" in r.artifacts for r in results if hasattr(r, "artifacts"))
    ev = got.evaluations.set_index("candidate_id")
    assert len(ev) == 1 + (20 - len(skipped)) + 1
    assert ev.iloc[0]["speedup"] == 1.0
    for cid, row in ev.iloc[1:-1].iterrows():
        assert row["outcome"] == "success" and 1.4 < row["speedup"] <= 2.0  # 200 / 100..134
    assert ev.iloc[-1]["outcome"] == "runtime_error"
    assert "the evaluator broke" in ev.iloc[-1]["extra"]["reason"]


def test_a_later_stage_runs_only_for_what_stage1_measured(tmp_path):
    from gfsim.core.errors import GfsimError
    from gfsim.integrations.openevolve import SKIPPED_FLAG, Surrogate

    log = tmp_path / "s.jsonl"
    reached = []
    s = Surrogate(_runtime_of, runtime_metric="runtime_ns", policy="random:0.5", log=log)
    later = s.gate(lambda path: reached.append(Path(path).name) or {"stage2": 1.0})
    outcome = {}
    for k in range(12):
        p = tmp_path / f"p{k}.py"
        p.write_text(f"{100 + k}\n")
        first = s.stage1(p)
        metrics = getattr(first, "metrics", first)  # an EvaluationResult inside OpenEvolve
        outcome[p.name] = "skip" if metrics.get(SKIPPED_FLAG) else "measure"
        again = later(p)
        if outcome[p.name] == "skip":  # the stage-1 result again, the user's stage not called
            assert getattr(again, "metrics", again) == metrics
        else:
            assert again == {"stage2": 1.0}
    assert set(outcome.values()) == {"skip", "measure"}
    assert reached == [n for n, a in outcome.items() if a == "measure"]
    stray = tmp_path / "stray.py"
    stray.write_text("1\n")
    with pytest.raises(GfsimError, match="stray.py: a later cascade stage got a program stage 1"):
        later(stray)


CAPPED = '''
from gfsim.integrations.cap import DollarCap
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.openevolve import Surrogate

CAP = DollarCap(USD, LEDGER, generator_usd_per_m=(100.0, 400.0), gpu_usd_per_hour=36.0,
                eval_reserve_s=5.0)


def user_evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


surrogate = Surrogate(user_evaluate, runtime_metric="runtime_ns", policy={policy!r},
                      log={log!r}, task="softmax", seed=1, cap=CAP)
evaluate_stage1 = surrogate.stage1
evaluate = surrogate.stage1
'''


@pytest.mark.slow
def test_a_dollar_cap_reached_inside_the_run_stops_it_cleanly(tmp_path):
    """Issue 55, item 3: once the cap is reached no proposal or evaluation starts, what was in
    flight settles, the run ends at its last iteration with its checkpoints, and the cap is
    passed by at most one evaluation's price."""
    from gfsim.integrations.cap import DollarCap

    usd, iterations = 2.5, 12
    ledger = tmp_path / "cap.jsonl"
    cap = DollarCap(usd, ledger, generator_usd_per_m=(100.0, 400.0), gpu_usd_per_hour=36.0,
                    eval_reserve_s=5.0)
    evaluator = CAPPED.replace("USD", repr(usd)).replace("LEDGER", repr(str(ledger)))
    log_path, answered = run_openevolve(tmp_path, "all", None, iterations,
                                        evaluator=evaluator, cap=cap, max_tokens=800)
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    reached = [i for i, r in enumerate(records) if r["kind"] == "reached"]
    assert reached, "the cap was meant to be reached mid-run"
    # nothing started after it: no reservation opened, no LLM call answered beyond those opened
    assert not any(r["kind"] == "open" for r in records[reached[0]:])
    proposals = sum(1 for r in records if r["kind"] == "open" and r["what"] == "proposal")
    assert answered == proposals and 3 <= proposals < iterations  # reached mid-run
    st = cap.status()
    assert st["in_flight_usd"] == 0  # everything in flight finished and settled
    evals = [r for r in records if r["kind"] == "close" and r.get("seconds") is not None]
    assert st["spent_usd"] <= usd + max(r["usd"] for r in evals)  # one evaluation over, at most
    # the surrogate's log: every evaluation reserved first; programs the cap stopped say why
    log = load_log(log_path)
    assert len(log.evaluations) == len(evals)
    # the programs OpenEvolve's forked workers evaluated were measured too, not only the
    # initial one (on a GPU, a worker forked after CUDA started could measure none)
    assert (log.evaluations["outcome"] == "success").sum() >= 2, log.evaluations
    capped = log.decisions[log.decisions["reason"].fillna("").str.contains("dollar cap")]
    assert (capped["action"] == "skip").all()
    # OpenEvolve kept its checkpoints: the run imports, and can be resumed from them
    summary = import_openevolve(tmp_path / "run", tmp_path / "imported.jsonl",
                                runtime_metric="runtime_ns")
    assert summary["candidates"] >= proposals
    assert sorted((tmp_path / "run" / "checkpoints").glob("checkpoint_*"))



@pytest.mark.slow
def test_a_dollar_cap_holds_a_run_whose_llm_is_a_real_vllm_server(tmp_path, vllm_long_server):
    """Issue 55, item 3, with a real LLM server: OpenEvolve's LLM the vLLM CPU server (the tiny,
    random model: its proposals hold no program). The cap settles each proposal at the tokens
    vLLM reported, never more than it reserved (a reservation of a token per 3 characters was
    passed here: 4,804 prompt tokens where 1,847 were reserved, and the run spent $1.22 of a
    $1 cap), is reached mid-run, and nothing starts after it; the run ends with its
    checkpoints."""
    from gfsim.integrations.cap import DollarCap

    usd, iterations, max_tokens = 1.5, 12, 64
    prices = (100.0, 400.0)
    ledger = tmp_path / "cap.jsonl"
    cap = DollarCap(usd, ledger, generator_usd_per_m=prices, gpu_usd_per_hour=36.0,
                    eval_reserve_s=5.0)
    evaluator = CAPPED.replace("USD", repr(usd)).replace("LEDGER", repr(str(ledger)))
    run_openevolve(tmp_path, "all", None, iterations, evaluator=evaluator, cap=cap,
                   max_tokens=max_tokens, llm=vllm_long_server)
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    reached = [i for i, r in enumerate(records) if r["kind"] == "reached"]
    assert reached, "the cap was meant to be reached mid-run"
    assert not any(r["kind"] == "open" for r in records[reached[0]:])
    opened = {r["id"]: r for r in records if r["kind"] == "open" and r["what"] == "proposal"}
    closed = {r["id"]: r for r in records if r["kind"] == "close" and r["id"] in opened}
    assert 2 <= len(opened) < iterations and set(closed) == set(opened)
    # Settled at what vLLM reported, within the reservation (the prompt at a token per UTF-8
    # byte, with the chat template's tokens, and max_tokens out): the cap is not passed.
    least_prompt = prices[0] / 1e6  # a prompt of at least a token
    for ticket, close in closed.items():
        assert least_prompt < close["usd"] < opened[ticket]["usd"], (close, opened[ticket])
    st = cap.status()
    assert st["in_flight_usd"] == 0
    evals = [r["usd"] for r in records if r["kind"] == "close" and r.get("seconds") is not None]
    assert st["spent_usd"] <= usd + max(evals, default=0.0)
    summary = import_openevolve(tmp_path / "run", tmp_path / "imported.jsonl",
                                runtime_metric="runtime_ns")
    assert summary["candidates"] >= 1
    assert sorted((tmp_path / "run" / "checkpoints").glob("checkpoint_*"))
