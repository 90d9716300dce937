"""A selective surrogate inside a ShinkaEvolve run: a forecaster and a gfsim policy in front of
your evaluator (tested inside a real ShinkaEvolve 0.0.7 run: tests/data/shinka-surrogate).

ShinkaEvolve has no evaluation hook: it runs an evaluation script for every program,
``python SCRIPT --program_path P --results_dir R``, and reads ``R/correct.json`` and
``R/metrics.json``. So the surrogate is that script. Give ShinkaEvolve a file like::

    # gate.py: ShinkaEvolve's eval_program_path, run by gfsim's Python
    #   (LocalJobConfig(eval_program_path="gate.py", python_executable=GFSIM_PYTHON))
    from gfsim.integrations.shinka import ShinkaGate
    from my_evaluator import evaluate   # program_path -> metrics dict

    ShinkaGate(evaluate, runtime_metric="runtime_ns", policy="threshold:0.7",
               forecaster="vllm:http://127.0.0.1:8000/v1,model=M,mode=logprobs",
               log="/abs/path/gfsim-surrogate.jsonl").main()

For each program, as ``gfsim.integrations.openevolve.Surrogate`` does inside OpenEvolve (the
same code decides and logs): the program is logged as a candidate, forecast against the
reference (the first program evaluated, ShinkaEvolve's initial program), and the policy decides;
the first program is always measured.

- A program not chosen is written as not evaluated: ``correct.json`` ``{"correct": false,
  "error": "not evaluated: ..."}`` and ``metrics.json`` with ``combined_score`` =
  ``skipped_score`` and ``private.gfsim_skipped: true``. ShinkaEvolve stores it as an
  incorrect program, so it never counts as a success, is never a parent and never enters the
  archive; ``gfsim import shinka`` reads the flag as ``not_measured``.
- A chosen program goes to your ``evaluate`` (a function of the program's path returning a
  metrics dict, OpenEvolve's convention: a metric ``error`` marks a failure; ``correct``, if it
  returns one, overrides), and its metrics are written in ShinkaEvolve's files:
  ``combined_score``, the other numbers under ``public``, the error as ``text_feedback``.

``cap=`` (a ``gfsim.integrations.cap.DollarCap``) holds the evaluations to the run's dollar cap,
as in OpenEvolve: once it is reached a program is written as not evaluated, the cap its reason.
ShinkaEvolve's own LLM calls are held to the same cap, on the same ledger, by
``gfsim.integrations.cap_proxy`` (``gfsim cap-proxy``) in front of its LLM server
(tests/data/shinka-cap).

One valid gfsim trajectory log is written as the run goes (``log``; appended under a file lock,
since ShinkaEvolve evaluates in separate processes: all state is in the log). ShinkaEvolve does
not tell the evaluation script a program's parent, so the log's candidates are roots; import the
run with ``gfsim import shinka RUN -o LOG --surrogate-log GATE_LOG`` for the parent links with
the gate's forecasts and its policy as the log's selection (docs/how-to/replay-shinka.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from gfsim.integrations.openevolve import SKIPPED_FLAG, Surrogate

__all__ = ["ShinkaGate", "shinka_files"]


class _ShinkaSurrogate(Surrogate):
    def _header(self) -> list[dict]:
        head, run = super()._header()
        head["provenance"]["note"] = ("written by gfsim.integrations.shinka (a selective "
                                      "surrogate in front of a ShinkaEvolve evaluator) as the "
                                      "run went; evaluations are the user's evaluator's")
        head["generator"] = {"model": "ShinkaEvolve's LLM ensemble"}
        run["driver"] = "shinka"
        return [head, run]


def shinka_files(metrics: dict, skipped_score: float = 0.0) -> tuple[dict, dict]:
    """(correct.json, metrics.json) for ShinkaEvolve from the metrics the surrogate returns
    (the user's, or the skipped flag's)."""
    if metrics.get(SKIPPED_FLAG) is True:
        why = metrics.get("gfsim_reason") or "gfsim's surrogate chose to skip it"
        return ({"correct": False, "error": f"not evaluated: {why}"},
                {"combined_score": skipped_score, "public": {},
                 "private": {SKIPPED_FLAG: True}, "text_feedback": f"not evaluated: {why}"})
    error = metrics.get("error")
    correct = metrics.get("correct")
    if not isinstance(correct, bool):
        correct = "error" not in metrics and not metrics.get("timeout")
    score = metrics.get("combined_score")
    if not (isinstance(score, (int, float)) and not isinstance(score, bool)
            and math.isfinite(score)):
        score = 0.0
    public = {k: v for k, v in metrics.items()
              if k not in ("combined_score", "correct", "error")
              and isinstance(v, (int, float, str, bool))
              and not (isinstance(v, float) and not math.isfinite(v))}
    return ({"correct": bool(correct), "error": str(error)[:4000] if error else None},
            {"combined_score": float(score), "public": public, "private": {},
             "text_feedback": str(error)[:4000] if error else ""})


class ShinkaGate:
    """ShinkaEvolve's evaluation script, with the surrogate's gate in front of ``evaluate``;
    the keyword arguments are ``gfsim.integrations.openevolve.Surrogate``'s."""

    def __init__(self, evaluate, **surrogate):
        surrogate.setdefault("search_id", "shinka")
        self.skipped_score = float(surrogate.get("skipped_score", 0.0))
        self.surrogate = _ShinkaSurrogate(evaluate, **surrogate)

    def evaluate(self, program_path) -> tuple[dict, dict]:
        """(correct.json, metrics.json) for one program: skipped, or evaluated by yours."""
        result = self.surrogate.stage1(program_path)
        metrics = getattr(result, "metrics", result)
        metrics = dict(metrics) if isinstance(metrics, dict) else {}
        arts = getattr(result, "artifacts", None)
        if metrics.get(SKIPPED_FLAG) is True and isinstance(arts, dict) and arts.get("gfsim"):
            metrics["gfsim_reason"] = arts["gfsim"].removeprefix("not evaluated: ")
        return shinka_files(metrics, self.skipped_score)

    def main(self, argv=None) -> None:
        """Run as ShinkaEvolve runs its evaluation script (other arguments are ignored)."""
        ap = argparse.ArgumentParser(description="gfsim's surrogate as a ShinkaEvolve "
                                                 "evaluation script")
        ap.add_argument("--program_path", required=True)
        ap.add_argument("--results_dir", required=True)
        args, _ = ap.parse_known_args(argv)
        correct, metrics = self.evaluate(args.program_path)
        os.makedirs(args.results_dir, exist_ok=True)
        for name, data in (("metrics.json", metrics), ("correct.json", correct)):
            tmp = Path(args.results_dir) / (name + ".partial")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, Path(args.results_dir) / name)
