"""gfsim's surrogate inside ShinkaEvolve (gfsim.integrations.shinka): the gate is the evaluation
script ShinkaEvolve runs for every program. Here it is run as ShinkaEvolve runs it (a process
per program, ``--program_path P --results_dir R``); a real ShinkaEvolve 0.0.7 run with the gate
is recorded in tests/data/shinka-surrogate (ShinkaEvolve cannot be installed beside gfsim: its
pins downgrade httpx, openai and rich), and imported here."""

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gfsim.importers.shinka import import_shinka
from gfsim.integrations.shinka import shinka_files
from gfsim.replay_logs import load_log
from gfsim.replay_logs.io import iter_records

FIXTURE = Path(__file__).parent / "data" / "shinka-surrogate"

GATE = '''
import json, pathlib, sys, time
from gfsim.integrations.cap import DollarCap
from gfsim.integrations.shinka import ShinkaGate


def evaluate(program_path):  # the user's evaluator: says which programs reached it
    time.sleep({pause!r})
    with open({marks!r}, "a") as f:
        f.write(pathlib.Path(program_path).name + "\\n")
    text = pathlib.Path(program_path).read_text()
    if "broken" in text:
        return {{"error": "RuntimeError: it broke", "runtime_ns": float("inf")}}
    ns = float(text.split()[-1])
    return {{"runtime_ns": ns, "combined_score": 1000.0 / ns, "note": "x"}}


ShinkaGate(evaluate, runtime_metric="runtime_ns", policy={policy!r}, log={log!r},
           task="toy", seed=1{extra}).main()
'''


def test_files_for_shinka_say_skipped_failed_and_measured():
    correct, metrics = shinka_files({"combined_score": 0.0, "gfsim_skipped": True,
                                     "gfsim_reason": "random:p=0.5 chose to skip it"})
    assert correct == {"correct": False, "error": "not evaluated: random:p=0.5 chose to skip it"}
    assert metrics["private"] == {"gfsim_skipped": True} and metrics["combined_score"] == 0.0
    # a failure: OpenEvolve's convention (an ``error`` metric) becomes ShinkaEvolve's
    correct, metrics = shinka_files({"error": "boom", "runtime_ns": math.inf})
    assert correct == {"correct": False, "error": "boom"}
    assert metrics["text_feedback"] == "boom" and "runtime_ns" not in metrics["public"]
    # a success: numbers under public; a ``correct`` the evaluator returns wins
    correct, metrics = shinka_files({"runtime_ns": 5.0, "combined_score": 2.0, "tag": "a"})
    assert correct == {"correct": True, "error": None}
    assert metrics["combined_score"] == 2.0 and metrics["public"] == {"runtime_ns": 5.0,
                                                                       "tag": "a"}
    assert shinka_files({"runtime_ns": 5.0, "correct": False})[0]["correct"] is False
    assert shinka_files({"combined_score": math.nan})[1]["combined_score"] == 0.0


def _run_gate(tmp_path: Path, programs: list[str], policy: str = "random:0.5",
              extra: str = "", pause: float = 0.0):
    log, marks = tmp_path / "gate.jsonl", tmp_path / "evaluated.txt"
    gate = tmp_path / "gate.py"
    gate.write_text(GATE.format(marks=str(marks), policy=policy, log=str(log), extra=extra,
                                pause=pause))
    results = []
    for i, text in enumerate(programs):
        prog = tmp_path / f"gen_{i}" / "main.py"
        prog.parent.mkdir()
        prog.write_text(text)
        out = tmp_path / f"gen_{i}" / "results"
        # as ShinkaEvolve's local job runs it (its own arguments after ours are ignored)
        subprocess.run([sys.executable, str(gate), "--program_path", str(prog),
                        "--results_dir", str(out)], check=True, cwd=tmp_path, timeout=120)
        results.append((json.loads((out / "correct.json").read_text()),
                        json.loads((out / "metrics.json").read_text())))
    evaluated = marks.read_text().split() if marks.exists() else []
    return log, results, evaluated


@pytest.mark.slow
def test_the_gate_run_as_shinka_runs_it_skips_measures_and_logs(tmp_path):
    programs = [f"# program\nruntime {100 + 10 * i}" for i in range(7)] + ["# broken\n"]
    log_path, results, evaluated = _run_gate(tmp_path, programs)
    log = load_log(log_path)  # one valid trajectory log, written as the processes went
    assert log.runs[0]["configuration"]["policy"] == "random:p=0.5"
    assert log.runs[0].get("driver") == "shinka"
    dec = log.decisions.set_index("candidate_id")["action"]
    assert len(log.candidates) == len(dec) == len(programs)
    assert dec.iloc[0] == "measure"  # the first program: the reference
    skipped = [i for i, a in enumerate(dec) if a == "skip"]
    measured = [i for i, a in enumerate(dec) if a == "measure"]
    assert skipped and len(measured) >= 2, "seed 1 skips some and measures some"
    # the user's evaluator saw exactly the measured programs
    assert evaluated == ["main.py"] * len(measured)
    for i in skipped:  # ShinkaEvolve stores it as an incorrect program with the flag
        correct, metrics = results[i]
        assert correct["correct"] is False and correct["error"].startswith("not evaluated")
        assert metrics["private"] == {"gfsim_skipped": True}
        assert metrics["combined_score"] == 0.0
    for i in measured:
        correct, metrics = results[i]
        broken = "broken" in programs[i]
        assert correct["correct"] is (not broken)
        if not broken:
            assert metrics["public"]["runtime_ns"] == 100 + 10 * i
            assert metrics["combined_score"] == pytest.approx(1000 / (100 + 10 * i))
            assert "gfsim_skipped" not in metrics["private"]
    ev = log.evaluations.set_index("candidate_id")
    assert set(ev.index) == {log.candidates["candidate_id"][i] for i in measured}


def test_a_policy_that_reads_forecasts_needs_a_forecaster_and_says_so(tmp_path):
    gate = tmp_path / "gate.py"
    gate.write_text(GATE.format(marks=str(tmp_path / "m"), policy="threshold:0.7",
                                log=str(tmp_path / "g.jsonl"), extra="", pause=0.0))
    (tmp_path / "p.py").write_text("runtime 5")
    proc = subprocess.run([sys.executable, str(gate), "--program_path", str(tmp_path / "p.py"),
                           "--results_dir", str(tmp_path / "r")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0 and "reads forecasts: give a forecaster" in proc.stderr
    assert not (tmp_path / "r").exists()  # ShinkaEvolve sees no result, not a success


# -- the recorded run: ShinkaEvolve 0.0.7 with the gate as its evaluation script -------------
def _decisions() -> dict:
    """code sha256 -> the gate's decisions on programs with that code, in evaluation order
    (the mutation operator can propose the same code again)."""
    code, out = {}, {}
    for _, rec in iter_records(FIXTURE / "gfsim-surrogate.jsonl"):
        if rec["kind"] == "candidate":
            code[rec["candidate_id"]] = rec["code_sha256"]
        elif rec["kind"] == "decision":
            out.setdefault(code[rec["candidate_id"]], []).append(rec["action"])
    return out


def test_the_recorded_run_skipped_programs_shinka_stored_as_never_measured(tmp_path):
    import hashlib

    prov = json.loads((FIXTURE / "PROVENANCE.json").read_text())
    assert prov["shinka_evolve_version"] == "0.0.7" and prov["surrogate"]["policy"]
    gate_log = load_log(FIXTURE / "gfsim-surrogate.jsonl")  # valid, written as the run went
    actions = gate_log.decisions["action"].value_counts().to_dict()
    assert actions.get("skip", 0) >= 2 and actions.get("measure", 0) >= 3, actions
    # every program but the reference was forecast by the real vLLM server; its tiny random
    # model's answer cannot always be sent (logprobs of -inf: HTTP 400), and such a forecast
    # is logged with its error, not as a forecast
    raw = [r for _, r in iter_records(FIXTURE / "gfsim-surrogate.jsonl")
           if r["kind"] == "forecast"]
    assert len(raw) == len(gate_log.candidates) - 1
    usable = {r["candidate_id"] for r in raw if not r.get("error")}
    assert set(gate_log.forecasts["candidate_id"]) == usable and len(usable) >= 3
    summary = import_shinka(FIXTURE / "run", tmp_path / "log.jsonl", task="softmax",
                            surrogate_log=FIXTURE / "gfsim-surrogate.jsonl")
    # every program ShinkaEvolve evaluated (not its island copies) is a gate candidate
    assert summary["surrogate_matched"] == len(gate_log.candidates)
    assert summary["forecasts"] == len(usable)
    assert "random:p=0.5" in load_log(tmp_path / "log.jsonl").header["selection"]["rule"]
    log = load_log(tmp_path / "log.jsonl")
    decided = _decisions()
    con = sqlite3.connect(f"file:{FIXTURE / 'run' / 'programs.sqlite'}?mode=ro", uri=True)
    rows = con.execute("SELECT id, code, parent_id, correct, private_metrics FROM programs "
                       "WHERE json_extract(metadata, '$._is_island_copy') IS NOT 1 "
                       "ORDER BY generation, timestamp").fetchall()
    con.close()
    assert len(rows) == len(gate_log.candidates)
    skipped_ids = set()
    for pid, code, _, correct, private in rows:
        action = decided[hashlib.sha256(code.encode()).hexdigest()].pop(0)
        flagged = bool(json.loads(private or "{}").get("gfsim_skipped"))
        assert flagged == (action == "skip"), pid  # ShinkaEvolve stored what the gate wrote
        if flagged:
            assert not correct  # never a success
            skipped_ids.add(pid)
    assert skipped_ids
    # a skipped program is never a parent: ShinkaEvolve samples parents among correct ones
    assert not skipped_ids & {parent for _, _, parent, _, _ in rows}
    outcome = log.evaluations.set_index("candidate_id")["outcome"]
    assert summary["outcomes"].get("not_measured", 0) == len(skipped_ids)
    assert all(outcome.get(pid, "not_measured") == "not_measured" for pid in skipped_ids)
    assert not (set(outcome[outcome == "success"].index) & skipped_ids)


def test_a_gate_log_of_another_run_is_refused_in_one_line(tmp_path):
    from gfsim.core.errors import GfsimError

    other = Path(__file__).parent / "data" / "shinka" / "run"  # the run without the gate
    with pytest.raises(GfsimError) as e:
        import_shinka(FIXTURE / "run", tmp_path / "x.jsonl", surrogate_log=tmp_path / "no")
    assert "no such file" in str(e.value) and "\n" not in str(e.value)
    # a gate log whose programs this run never had
    log, _, _ = _run_gate(tmp_path, ["# program\nruntime 100", "# program\nruntime 90"],
                          policy="all")
    with pytest.raises(GfsimError, match="no candidate's code_sha256 is the code") as e:
        import_shinka(other, tmp_path / "x.jsonl", surrogate_log=log)
    assert "\n" not in str(e.value) and not (tmp_path / "x.jsonl").exists()


@pytest.mark.slow
def test_a_dollar_cap_stops_the_gate_s_evaluations(tmp_path):
    """Issue 55, item 3 (ShinkaEvolve's evaluations): the gate takes the run's DollarCap; once
    it is reached, a program the policy would measure is written as not evaluated, with the
    cap as its reason, and the user's evaluator never sees it."""
    from gfsim.integrations.cap import DollarCap

    ledger = tmp_path / "cap.jsonl"
    # $1 per second of evaluation; each evaluation sleeps 0.25 s: the cap covers about three
    extra = (f", cap=DollarCap(0.9, {str(ledger)!r}, gpu_usd_per_hour=3600.0, "
             "eval_reserve_s=0.3)")
    programs = [f"# program\nruntime {100 + 10 * i}" for i in range(6)]
    log_path, results, evaluated = _run_gate(tmp_path, programs, policy="all", extra=extra,
                                             pause=0.25)
    cap = DollarCap(0.9, ledger, gpu_usd_per_hour=3600.0, eval_reserve_s=0.3)  # the gate's
    st = cap.status()
    assert st["reached"] is not None and st["in_flight_usd"] == 0
    assert st["spent_usd"] <= 0.9 + cap.eval_usd(st["longest_evaluation_s"])  # one over, at most
    assert 2 <= len(evaluated) < len(programs)
    log = load_log(log_path)
    dec = log.decisions.set_index("candidate_id")
    capped = dec[dec["reason"].fillna("").str.contains("dollar cap")]
    assert len(capped) == len(programs) - len(evaluated)
    assert (capped["action"] == "skip").all()
    for correct, metrics in results[len(evaluated):]:
        assert correct["correct"] is False and "dollar cap" in correct["error"]
        assert metrics["private"] == {"gfsim_skipped": True}
