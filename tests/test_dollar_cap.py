"""A hard dollar cap over a whole run (gfsim.integrations.cap; issue 55, item 3): the ledger
reserves work in flight, refuses what would pass the cap and stays reached; inside a real
OpenEvolve 0.4.1 run it stops proposals and evaluations and the run ends cleanly."""

import asyncio
import json
import logging
import multiprocessing as mp
import signal
from pathlib import Path

import pytest

from gfsim.core.errors import GfsimError
from gfsim.integrations.cap import CapReached, DollarCap


def _records(cap: DollarCap) -> list[dict]:
    return [json.loads(line) for line in Path(cap.ledger).read_text().splitlines()]


def test_work_in_flight_counts_and_a_refusal_stops_everything_after_it(tmp_path):
    cap = DollarCap(1.0, tmp_path / "ledger.jsonl", gpu_usd_per_hour=3600.0)  # $1 a second
    a = cap.reserve("evaluation", 0.4, "a")
    b = cap.reserve("proposal", 0.4, "b")  # 0.8 in flight
    with pytest.raises(CapReached, match=r"\$0.8000 in flight"):
        cap.reserve("forecast", 0.3, "c")
    cap.settle(a, 0.1, seconds=0.1)
    cap.settle(b, 0.1)
    st = cap.status()
    assert st["spent_usd"] == pytest.approx(0.2) and st["in_flight_usd"] == 0
    assert st["settled"]["evaluation"] == pytest.approx(0.1)
    # $0.8 are left now, but the cap was reached: nothing starts any more
    with pytest.raises(CapReached):
        cap.reserve("proposal", 0.01)
    assert [r["kind"] for r in _records(cap)].count("reached") == 1
    assert st["reached"]["what"] == "forecast"
    assert cap.eval_usd(0.5) == pytest.approx(0.5)
    assert cap.eval_reservation() == pytest.approx(0.1)  # the longest evaluation so far


def test_bad_caps_and_a_foreign_ledger_are_refused(tmp_path):
    for bad in (0, -1, float("inf")):
        with pytest.raises(GfsimError, match="usd must be"):
            DollarCap(bad, tmp_path / "l.jsonl")
    with pytest.raises(GfsimError, match=">= 0"):
        DollarCap(1.0, tmp_path / "l.jsonl", gpu_usd_per_hour=-1)
    other = tmp_path / "other.jsonl"
    other.write_text("not json\n")
    with pytest.raises(GfsimError, match="other.jsonl:1"):
        DollarCap(1.0, other).status()


def _grab(args) -> int:
    cap, n = args
    got = 0
    for _ in range(n):
        try:
            ticket = cap.reserve("evaluation", 1.0)
        except CapReached:
            break
        cap.settle(ticket, 1.0, seconds=1.0)
        got += 1
    return got


def test_processes_sharing_a_cap_never_pass_it(tmp_path):
    cap = DollarCap(15.0, tmp_path / "ledger.jsonl")
    with mp.get_context("fork").Pool(4) as pool:  # (spawn cannot import this test file)
        got = pool.map(_grab, [(cap, 10)] * 4)
    assert sum(got) == 15
    assert cap.status()["spent_usd"] == pytest.approx(15.0)


EVALUATOR = '''
from gfsim.integrations.cap import DollarCap
from gfsim.integrations.kernel_evaluator import evaluate_kernel
from gfsim.integrations.openevolve import Surrogate

CAP = DollarCap({usd!r}, {ledger!r}, generator_usd_per_m=(100.0, 400.0),
                gpu_usd_per_hour=36.0, eval_reserve_s=5.0)


def user_evaluate(program_path):
    return evaluate_kernel(program_path, "softmax")


surrogate = Surrogate(user_evaluate, runtime_metric="runtime_ns", policy="all",
                      log={log!r}, task="softmax", seed=1, cap=CAP)
evaluate_stage1 = surrogate.stage1
evaluate = surrogate.stage1
'''


@pytest.mark.slow
def test_a_cap_reached_inside_a_real_openevolve_run_stops_it_cleanly(tmp_path):
    from openevolve import OpenEvolve
    from openevolve.config import Config

    from gfsim.importers.openevolve import import_openevolve
    from gfsim.integrations.mutation_server import MutationServer
    from gfsim.integrations.openevolve import openevolve_client
    from gfsim.live.tasks import get_task
    from gfsim.replay_logs import load_log

    usd, iterations = 1.5, 12
    ledger, log = tmp_path / "cap.jsonl", tmp_path / "surrogate.jsonl"
    cap = DollarCap(usd, ledger, generator_usd_per_m=(100.0, 400.0), gpu_usd_per_hour=36.0,
                    eval_reserve_s=5.0)
    (tmp_path / "initial.py").write_text(get_task("softmax").candidates()[0].code)
    (tmp_path / "evaluator.py").write_text(EVALUATOR.format(usd=usd, ledger=str(ledger),
                                                            log=str(log)))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    with MutationServer(seed=0) as server:
        cfg = Config.from_dict({
            "max_iterations": iterations, "checkpoint_interval": 2, "random_seed": 0,
            "language": "python", "diff_based_evolution": False, "log_level": "INFO",
            "llm": {"api_key": "none", "retries": 0, "timeout": 60,
                    "models": [{"name": "gfsim-mutation-operator", "api_base": server.url,
                                "max_tokens": 800}]},
            "database": {"num_islands": 1, "population_size": 20},
            "evaluator": {"timeout": 120, "max_retries": 0, "cascade_evaluation": False,
                          "parallel_evaluations": 1}})
        for model in cfg.llm.models:
            model.init_client = openevolve_client(cap)
        oe = OpenEvolve(str(tmp_path / "initial.py"), str(tmp_path / "evaluator.py"), cfg,
                        output_dir=str(tmp_path / "run"))
        try:
            asyncio.run(oe.run(iterations=iterations))  # ends: no exception
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for h in root.handlers[:]:
                if h not in root_state[0]:
                    root.removeHandler(h)
                    h.close()
            root.setLevel(root_state[1])
        answered = server.requests
    records = _records(cap)
    reached = [i for i, r in enumerate(records) if r["kind"] == "reached"]
    assert reached, "the cap was meant to be reached mid-run"
    # nothing started after it: no reservation opened, no LLM call answered beyond those opened
    assert not any(r["kind"] == "open" for r in records[reached[0]:])
    proposals = sum(1 for r in records if r["kind"] == "open" and r["what"] == "proposal")
    assert answered == proposals and 3 <= proposals < iterations  # reached mid-run
    st = cap.status()
    assert st["in_flight_usd"] == 0  # everything in flight finished and settled
    evals = [r for r in records if r["kind"] == "close" and r.get("seconds") is not None]
    one_eval = max(r["usd"] for r in evals)
    assert st["spent_usd"] <= usd + one_eval  # at most one evaluation's price over
    # the surrogate's log: every evaluation reserved first; programs the cap stopped say why
    sl = load_log(log)
    assert len(sl.evaluations) == len(evals)
    capped = sl.decisions[sl.decisions["reason"].fillna("").str.contains("dollar cap")]
    assert (capped["action"] == "skip").all()
    # OpenEvolve kept its checkpoints: the run imports (and can be resumed from them)
    summary = import_openevolve(tmp_path / "run", tmp_path / "imported.jsonl",
                                runtime_metric="runtime_ns")
    assert summary["candidates"] >= 1
    assert sorted((tmp_path / "run" / "checkpoints").glob("checkpoint_*"))
