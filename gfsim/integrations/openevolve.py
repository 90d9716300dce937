"""A selective surrogate inside an OpenEvolve run: a forecaster and a gfsim policy in front of
your evaluator, through OpenEvolve's cascade evaluation (tested with OpenEvolve 0.4.1).

In the evaluator file you give OpenEvolve::

    from gfsim.integrations.openevolve import Surrogate
    from my_evaluator import evaluate as my_evaluate

    surrogate = Surrogate(my_evaluate, runtime_metric="runtime_ns",
                          policy="threshold:0.7",
                          forecaster="vllm:http://127.0.0.1:8000/v1,model=M,mode=logprobs",
                          log="gfsim-surrogate.jsonl")
    evaluate_stage1 = surrogate.stage1  # cascade_evaluation: true (OpenEvolve's default)
    evaluate = surrogate.stage1         # the same gate when cascade evaluation is off
    # your later cascade stages, if you have them, behind the same decision:
    # evaluate_stage2 = surrogate.gate(my_evaluate_stage2)

Stage 1, for each program: the program is logged as a candidate; the forecaster is asked for
its 8-bin speedup forecast against the reference (the first program evaluated, OpenEvolve's
initial program, unless ``reference_code`` is given); the policy decides on a batch of one
(OpenEvolve evaluates one program at a time). The first program is always measured: it is the
reference.

- A program not chosen is returned as not evaluated: ``{"combined_score": skipped_score,
  "gfsim_skipped": True}``. It enters OpenEvolve's database with that score and flag, never
  as a success; ``gfsim import openevolve`` reads the flag as ``not_measured``. Its forecast
  and the decision are logged. OpenEvolve goes on to stage 2 when the stage-1 score reaches
  the first cascade threshold, which ``skipped_score`` may well do (a threshold of 0, or
  negative scores): so later stages are exported through ``gate``, which hands a skipped
  program its stage-1 result again instead of calling your stage.
- A chosen program goes to your evaluator (``evaluate``: your ``evaluate``, or your
  ``evaluate_stage1`` if you have cascade stages; export ``surrogate.gate(your_stage2)`` as
  ``evaluate_stage2``, and so on), whose result is returned unchanged and logged as an
  evaluation: its
  outcome and speedup by ``gfsim import openevolve``'s rules (``runtime_metric``,
  ``higher_is_better``, ``reference_runtime``, else the first program's value), its seconds as
  ``wall_s``.

The log is a gfsim trajectory log (header, run, then candidate, forecast, decision and
evaluation records), written as it goes: every record appended and fsynced under a file lock,
since OpenEvolve evaluates in several processes and re-executes the evaluator file for every
program (all state is in the log). A crash loses nothing written. OpenEvolve does not tell an
evaluator a program's parent, so the log's candidates are roots; ``gfsim import openevolve
RUN_DIR --surrogate-log LOG`` gives the parent links with this log's forecasts joined by code.

A dollar cap over the whole run (``gfsim.integrations.cap.DollarCap``): give the same cap to
the surrogate (``Surrogate(..., cap=cap)``: forecasts and evaluations) and to OpenEvolve's LLM
(each model's ``init_client=openevolve_client(cap)``: proposals). Once it is reached no
proposal, forecast or evaluation starts: a proposal's call raises (OpenEvolve counts the
iteration as one that made no program and goes on to its last iteration, saving its
checkpoints as usual, so the run ends cleanly and can be resumed with a larger cap), and a
program stage 1 would have measured is skipped with the cap as its reason. The ledger file
says when and why the cap was reached.

Forecasters: ``vllm:URL,model=...`` (``gfsim.live.llm.forecaster.parse_forecaster``) or any
``gfsim.live.llm.forecaster.Forecaster``. A what-if forecaster cannot work here (it draws from the
measured speedup, which does not exist yet), nor can an oracle policy; both are refused.
Policies that read no forecast (``all``, ``random:P``) need none.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import math
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from gfsim.core.errors import GfsimError

__all__ = ["Surrogate", "SKIPPED_FLAG", "openevolve_client"]

SKIPPED_FLAG = "gfsim_skipped"


class Surrogate:
    """The stage-1 gate; see the module doc. ``search_id``/``task`` name the run in the log;
    ``device`` goes into its header's hardware."""

    def __init__(self, evaluate, *, runtime_metric: str, policy: str = "all",
                 forecaster=None, log="gfsim-surrogate.jsonl", higher_is_better: bool = False,
                 reference_runtime: float | None = None, reference_code: str | None = None,
                 task: str = "task", task_description: str = "", skipped_score: float = 0.0,
                 seed: int = 0, search_id: str = "openevolve", device: str = "unknown",
                 cap=None):
        from gfsim.policies import make_policy

        self.user_evaluate = evaluate
        self.runtime_metric = runtime_metric
        self.higher_is_better = higher_is_better
        self.reference_runtime = reference_runtime
        self.reference_code = reference_code
        self.task, self.task_description = task, task_description
        self.skipped_score, self.seed = float(skipped_score), seed
        self.search_id, self.device = search_id, device
        self.cap = cap  # a DollarCap over the run (gfsim.integrations.cap), or None
        self.log = Path(log).resolve()
        self.policy = make_policy(policy)
        if self.policy.needs_truth:
            raise GfsimError(f"policy {policy}: an oracle reads true speedups, which a live run "
                             "does not have before it measures")
        from gfsim.forecasts.registry import make_forecaster

        forecaster = make_forecaster(forecaster)
        if forecaster is not None and forecaster.kind == "whatif":
            raise GfsimError(f"forecaster {forecaster.name}: a what-if forecaster draws from the "
                             "measured speedup, which a program has not got before it is "
                             "measured; give a vllm: forecaster")
        self.forecaster = forecaster
        if self.policy.needs_forecast and forecaster is None:
            raise GfsimError(f"policy {policy} reads forecasts: give a forecaster")

    # -- the log: all state lives there --------------------------------------------------------
    @contextmanager
    def _locked(self):
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log.with_name(self.log.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _append(self, *records: dict) -> None:
        from gfsim.replay_logs import LogWriter

        with LogWriter(self.log) as w:
            w.append_many([{k: v for k, v in r.items() if v is not None} for r in records])

    def _state(self) -> dict:
        """What the log holds so far (called under the lock)."""
        from gfsim.replay_logs.io import iter_records

        st = {"candidates": 0, "first_code": None, "reference": self.reference_runtime,
              "best": 1.0, "evals": 0}
        if not self.log.exists():
            return st
        for _, rec in iter_records(self.log):
            kind = rec.get("kind")
            if kind == "candidate":
                st["candidates"] += 1
                if st["first_code"] is None:
                    st["first_code"] = rec.get("code")
            elif kind == "decision" and rec.get("action") == "measure":
                st["evals"] += 1
            elif kind == "evaluation":
                if rec.get("reference_value") is not None and st["reference"] is None:
                    st["reference"] = rec["reference_value"]
                if rec.get("speedup"):
                    st["best"] = max(st["best"], rec["speedup"])
        return st

    def _header(self) -> list[dict]:
        from gfsim.forecasts.bins import PAPER_EDGES
        from gfsim.replay_logs import SCHEMA_VERSION

        fc = self.forecaster.describe() if self.forecaster is not None else None
        return [
            {"kind": "header", "schema_version": SCHEMA_VERSION, "log_id": self.search_id,
             "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "provenance": {"kind": "measured", "note": "written by gfsim.integrations."
                            "openevolve (a selective surrogate in front of an OpenEvolve "
                            "evaluator) as the run went; evaluations are the user's "
                            "evaluator's"},
             "log_shape": "trajectory", "label_bin_convention": "paper",
             "forecast_bin_edges": list(PAPER_EDGES), "forecast_relative_to": "reference",
             "hardware": {"device_name": self.device},
             "tasks": [{"task_id": self.task, "seed_speedup": 1.0,
                        **({"description": self.task_description}
                           if self.task_description else {})}],
             "duration_basis": "service",
             "generator": {"model": "OpenEvolve's LLM ensemble"}},
            {"kind": "run", "search_id": self.search_id, "driver": "openevolve",
             "configuration": {"policy": self.policy.spec(), "forecaster": fc,
                               "runtime_metric": self.runtime_metric,
                               "higher_is_better": self.higher_is_better,
                               "evaluation": "one program at a time (no parent batches)"}}]

    # -- stage 1 ------------------------------------------------------------------------------
    def stage1(self, program_path):
        """OpenEvolve's ``evaluate_stage1``: forecast, decide, then evaluate or skip."""
        code = Path(program_path).read_text(encoding="utf-8")
        digest = hashlib.sha256(code.encode()).hexdigest()
        with self._locked():
            st = self._state()
            n = st["candidates"]
            cid = f"{self.search_id}-{n:05d}"  # the order it came in (its code: code_sha256)
            head = self._header() if not self.log.exists() else []
            self._append(*head, {"kind": "candidate", "candidate_id": cid,
                                 "search_id": self.search_id, "task_id": self.task,
                                 "step": n, "seq": 0, "code_sha256": digest, "code": code})
        reference_code = self.reference_code or st["first_code"] or code
        forecast, capped = None, None
        if self.forecaster is not None and n > 0:
            forecast, capped = self._capped_forecast(cid, code, reference_code)
        if capped is not None:
            decision = None
        elif n == 0:
            decision = {"kind": "decision", "candidate_id": cid, "policy": self.policy.spec(),
                        "action": "measure", "reason": "the first program: the reference"}
        else:
            decision = self._decide(cid, forecast, st, n)
        ticket = None
        if capped is None and decision["action"] == "measure" and self.cap is not None:
            from gfsim.integrations.cap import CapReached

            try:
                ticket = self.cap.reserve("evaluation", None, cid)
            except CapReached as exc:
                capped = str(exc)
        if capped is not None:
            decision = {"kind": "decision", "candidate_id": cid, "policy": self.policy.spec(),
                        "action": "skip", "reason": capped}
        with self._locked():
            self._append(*([forecast] if forecast else []), decision)
        if decision["action"] != "measure":
            return self._skipped(decision)
        return self._measure(cid, program_path, n == 0, ticket)

    def _capped_forecast(self, cid: str, code: str, reference_code: str):
        """(the forecast, None), or (None, why) where the dollar cap refuses it."""
        if self.cap is None:
            return self._forecast(cid, code, reference_code), None
        from gfsim.integrations.cap import CapReached

        from gfsim.integrations.cap import chat_bytes
        from gfsim.live.llm.prompt import PROMPT_TEMPLATE_BYTES

        limit = getattr(self.forecaster, "max_tokens", None)
        # The forecaster's prompt: the code, the reference, the task, and its own text (gfsim's
        # prompt template, unless the forecaster says how much it adds).
        around = getattr(self.forecaster, "prompt_overhead_bytes", PROMPT_TEMPLATE_BYTES)
        size = chat_bytes([code, reference_code, self.task_description or ""]) + around
        try:  # (_forecast raises no CapReached: it turns a forecaster's GfsimError into a record)
            with self.cap.llm_call("forecaster", size, limit, cid) as bill:
                forecast = self._forecast(cid, code, reference_code)
                read = forecast.get("input_tokens")  # what it read and wrote, else the reservation
                if isinstance(read, int) and read > 0:
                    bill.usd = self.cap.llm_usd("forecaster", read,
                                                forecast.get("output_tokens") or 0)
        except CapReached as exc:
            return None, str(exc)
        return forecast, None

    # -- later cascade stages -------------------------------------------------------------
    def gate(self, evaluate_later):
        """A later cascade stage (``evaluate_stage2``/``3``) behind stage 1's decision: a
        program stage 1 skipped gets its skipped result again, whatever the cascade threshold;
        a measured one goes to ``evaluate_later``. The decision is looked up in the log by
        the program's code (the latest candidate with that code that has a decision)."""
        def stage(program_path):
            code = Path(program_path).read_text(encoding="utf-8")
            with self._locked():
                decision = self._decision_for(hashlib.sha256(code.encode()).hexdigest())
            if decision is None:
                raise GfsimError(f"{program_path}: a later cascade stage got a program stage 1 "
                                 f"never logged in {self.log}: export surrogate.stage1 as "
                                 "evaluate_stage1 from the same evaluator file")
            if decision["action"] != "measure":
                return self._skipped(decision)
            return evaluate_later(program_path)

        stage.__name__ = getattr(evaluate_later, "__name__", "stage")
        stage.__doc__ = self.gate.__doc__
        return stage

    def _decision_for(self, digest: str) -> dict | None:
        """The decision on the latest candidate whose code has this hash (under the lock)."""
        from gfsim.replay_logs.io import iter_records

        if not self.log.exists():
            return None
        ids, decisions = [], {}
        for _, rec in iter_records(self.log):
            if rec.get("kind") == "candidate" and rec.get("code_sha256") == digest:
                ids.append(rec["candidate_id"])
            elif rec.get("kind") == "decision":
                decisions[rec["candidate_id"]] = rec
        decided = [decisions[c] for c in ids if c in decisions]
        return decided[-1] if decided else None

    def _forecast(self, cid: str, code: str, reference_code: str) -> dict:
        from gfsim.live.llm.forecaster import ForecastRequest

        req = ForecastRequest(candidate_id=cid, candidate_code=code,
                              reference_code=reference_code, task=self.task_description,
                              hardware={"device_name": self.device}, search_id=self.search_id,
                              task_name=self.task)
        try:
            return self.forecaster.forecast(req).record()
        except GfsimError as exc:  # a forecaster that cannot work at all: say so, measure
            return {"kind": "forecast", "candidate_id": cid, "forecaster": self.forecaster.name,
                    "mode": getattr(self.forecaster, "mode", "unknown"), "probs": [0.0] * 8,
                    "error": str(exc)[:500]}

    def _decide(self, cid: str, forecast: dict | None, st: dict, n: int) -> dict:
        import numpy as np

        from gfsim.forecasts.bins import PAPER_EDGES
        from gfsim.policies.base import Batch, SearchState

        probs = np.zeros((1, 8))
        has = np.array([forecast is not None and not forecast.get("error")])
        failed = np.zeros(1, bool)
        if has[0]:
            p = np.asarray(forecast["probs"], dtype=float)
            failed[0] = bool(forecast.get("parse_failed")) or p.sum() <= 0
            if not failed[0]:
                probs[0] = p / p.sum()
        batch = Batch((cid,), probs, has, failed, np.ones(1), tuple(PAPER_EDGES))
        state = SearchState(search_id=self.search_id, task_id=self.task, step=n,
                            best_speedup=st["best"], gpu_evals=st["evals"], seed=self.seed)
        d = self.policy.decide(batch, state)
        rec = {"kind": "decision", "candidate_id": cid, "policy": self.policy.spec(),
               "action": "measure" if bool(d.measure[0]) else "skip",
               "reason": d.reason[0] or None}
        if math.isfinite(float(d.score[0])):
            rec["score"] = float(d.score[0])
        return rec

    def _skipped(self, decision: dict):
        metrics = {"combined_score": self.skipped_score, SKIPPED_FLAG: True}
        why = f"not evaluated: {decision['policy']} chose to skip it" + (
            f" ({decision['reason']})" if decision.get("reason") else "")
        try:
            from openevolve.evaluation_result import EvaluationResult
        except ImportError:  # called outside OpenEvolve: a plain dict says the same
            return metrics
        return EvaluationResult(metrics=metrics, artifacts={"gfsim": why})

    def _timed(self, t0: float, ticket: str | None) -> float:
        """The evaluation's seconds since ``t0``, settled on the cap's ``ticket`` if any."""
        wall = time.perf_counter() - t0
        if ticket is not None:
            self.cap.settle(ticket, self.cap.eval_usd(wall), wall)
        return wall

    def _measure(self, cid: str, program_path, first: bool, ticket: str | None = None):
        from gfsim.importers.openevolve import outcome_of

        t0 = time.perf_counter()
        try:
            result = self.user_evaluate(program_path)
        except BaseException as exc:
            wall = self._timed(t0, ticket)
            with self._locked():
                self._append({"kind": "evaluation", "candidate_id": cid,
                              "outcome": "runtime_error", "wall_s": wall,
                              "reason": f"the evaluator raised {type(exc).__name__}: "
                                        f"{str(exc)[:1000]}"})
            raise
        wall = self._timed(t0, ticket)
        metrics = getattr(result, "metrics", result)
        metrics = metrics if isinstance(metrics, dict) else {}
        outcome, value, error = outcome_of(metrics, self.runtime_metric)
        if outcome == "not_measured":  # the user's own evaluator set our flag: keep it apart
            outcome, value, error = "infrastructure_failure", None, "the evaluator set " \
                                                                   f"{SKIPPED_FLAG}"
        ev = {"kind": "evaluation", "candidate_id": cid, "outcome": outcome, "wall_s": wall,
              "reason": error,
              "metrics": {k: v for k, v in metrics.items()
                          if isinstance(v, (int, float, str, bool))
                          and not (isinstance(v, float) and not math.isfinite(v))}}
        with self._locked():
            ref = self._state()["reference"]
            if first and ref is None and value is not None:
                ref = value
                ev["reference_value"] = value
            if outcome == "success":
                if ref is None:
                    ev.update(outcome="infrastructure_failure",
                              reason=f"no reference {self.runtime_metric} (the first program "
                                     "gave none): give reference_runtime")
                else:
                    ev["speedup"] = value / ref if self.higher_is_better else ref / value
                    ev["metric_value"] = value
            self._append(ev)
        return result



def openevolve_client(cap):
    """``init_client`` for an OpenEvolve model (``LLMModelConfig.init_client``) that holds its
    calls to ``cap`` (a ``DollarCap``): each call reserves its prompt and its ``max_tokens``
    at the generator's prices, settles the tokens the API reported (the reservation where it
    reported none), and raises ``CapReached`` instead of calling once the cap is reached.
    Picklable, as OpenEvolve's worker processes need."""
    return functools.partial(_capped_openai, cap)


def _capped_openai(cap, model_cfg):
    from openevolve.llm.openai import OpenAILLM

    return _capped_llm_class()(OpenAILLM(model_cfg), cap, getattr(model_cfg, "max_tokens", None),
                               str(getattr(model_cfg, "name", "")))


@functools.cache
def _capped_llm_class():
    """OpenEvolve's ``LLMInterface`` around another, held to a dollar cap (made on first use:
    OpenEvolve is imported only where it runs)."""
    from openevolve.llm.base import LLMInterface

    class CappedLLM(LLMInterface):
        def __init__(self, inner, cap, max_tokens, name):
            self.inner, self.cap, self.max_tokens, self.name = inner, cap, max_tokens, name
            self.last_usage = None

        async def generate(self, prompt: str, **kwargs) -> str:
            from gfsim.integrations.cap import chat_bytes

            return await self._call(chat_bytes([prompt]), kwargs,
                                    lambda: self.inner.generate(prompt, **kwargs))

        async def generate_with_context(self, system_message, messages, **kwargs) -> str:
            from gfsim.integrations.cap import chat_bytes

            size = chat_bytes([system_message or "", *(messages or ())])
            return await self._call(size, kwargs, lambda: self.inner.generate_with_context(
                system_message, messages, **kwargs))

        async def _call(self, size: int, kwargs: dict, call):
            limit = kwargs.get("max_tokens") or self.max_tokens
            with self.cap.llm_call("generator", size, limit, self.name) as bill:
                out = await call()  # (CapReached before it: no call)
                self.last_usage = getattr(self.inner, "last_usage", None)
                bill.usd = self.cap.usage_usd("generator", self.last_usage)
                return out

    return CappedLLM
