"""A dollar cap reached inside a real ShinkaEvolve 0.0.7 run (issue 55, item 3), recorded in
tests/data/shinka-cap by ``experiments/make_shinka_fixture.py --vllm-url URL --cap 4.0
--resume-cap 8.0 --resume-generations 16``: ShinkaEvolve's two LLMs (the vLLM CPU server with
the tiny model at a 32,768-token context, and the mutation server) each behind
``gfsim.integrations.cap_proxy``, its evaluations behind ``ShinkaGate(cap=...)``, one ledger.
The cap was reached mid-run; then the run was resumed on the same folder and ledger with a
larger cap. (ShinkaEvolve cannot be installed beside gfsim, so the run is read here, not run.)"""

import json
import sqlite3
from pathlib import Path

import pytest

from gfsim.importers.shinka import import_shinka
from gfsim.integrations.cap import CapReached, DollarCap
from gfsim.replay_logs import load_log

FIXTURE = Path(__file__).parent / "data" / "shinka-cap"
PROV = json.loads((FIXTURE / "PROVENANCE.json").read_text())
FIRST, RESUMED = PROV["cap"]["phases"]


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / name).read_text().splitlines()]


def _cap(phase: dict, tmp_path, upto: float) -> DollarCap:
    """The run's cap, on the ledger as it stood at ``upto``."""
    ledger = tmp_path / f"ledger-{phase['cap_usd']}.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in _lines("cap-ledger.jsonl")
                              if r["t"] <= upto))
    prices = {k: tuple(v) if isinstance(v, list) else v
              for k, v in PROV["cap"]["prices"].items() if k != "note"}
    return DollarCap(phase["cap_usd"], ledger, **prices)


def _programs() -> list[tuple]:
    """(generation, correct, private metrics) of each program ShinkaEvolve stored, island
    copies left out."""
    con = sqlite3.connect(f"file:{FIXTURE / 'run' / 'programs.sqlite'}?mode=ro", uri=True)
    rows = con.execute("SELECT generation, correct, private_metrics FROM programs WHERE "
                       "json_extract(metadata, '$._is_island_copy') IS NOT 1 "
                       "ORDER BY generation").fetchall()
    failed = [g for (g,) in con.execute("SELECT generation FROM attempt_log WHERE "
                                        "stage = 'proposal' AND status = 'failed'")]
    con.close()
    return rows, failed


def test_the_cap_was_reached_inside_the_run_and_nothing_started_after_it(tmp_path):
    assert PROV["shinka_evolve_version"] == "0.0.7" and FIRST["shinka_returncode"] == 0
    ledger = [r for r in _lines("cap-ledger.jsonl") if r["t"] <= FIRST["ended_t"]]
    reached = [r for r in ledger if r["kind"] == "reached"]
    assert len(reached) == 1 and reached[0]["cap_usd"] == FIRST["cap_usd"]
    k = ledger.index(reached[0])
    before, after = ledger[:k], ledger[k + 1:]
    assert not any(r["kind"] == "open" for r in after), "a reservation opened after the cap"
    proposals = [r for r in before if r["kind"] == "open" and r["what"] == "proposal"]
    evaluations = [r for r in before if r["kind"] == "open" and r["what"] == "evaluation"]
    # reached mid-run: after a third to a half of the run's generations
    assert FIRST["generations"] / 3 <= len(evaluations) <= FIRST["generations"] / 2 + 1
    cap = _cap(FIRST, tmp_path, FIRST["ended_t"])
    st = cap.status()
    assert st["reached"] == reached[0] and st["in_flight"] == 0
    assert st["spent_usd"] <= cap.usd + cap.eval_usd(st["longest_evaluation_s"])
    # the proxy: each proposal that reached the LLM had its reservation first, none after
    # the cap; every one after it was answered with the cap's why
    calls = [r for r in _lines("cap-proxy.jsonl") if r["t"] <= FIRST["ended_t"]]
    opened = {r["id"]: r for r in before if r["kind"] == "open"}
    sent = [r for r in calls if r["forwarded"]]
    assert len(sent) == len(proposals) >= 3
    for r in sent:
        assert opened[r["ticket"]]["t"] <= r["sent_t"] < reached[0]["t"]
    refused = [r for r in calls if not r["forwarded"]]
    assert refused and all(r["refused"] == reached[0]["why"] for r in refused)
    assert all(r["t"] >= reached[0]["t"] for r in refused)


def test_shinkaevolve_kept_every_program_and_ended_by_itself(tmp_path):
    """Every program the gate saw is in ShinkaEvolve's database; the generations after the cap
    failed as proposals, with the proxy's refusal as the LLM's answer ShinkaEvolve recorded,
    and ShinkaEvolve stopped itself when its generations were handed out."""
    gate = load_log(FIXTURE / "gfsim-surrogate.jsonl")
    summary = import_shinka(FIXTURE / "run", tmp_path / "log.jsonl", task="softmax",
                            surrogate_log=FIXTURE / "gfsim-surrogate.jsonl")
    programs, failed = _programs()
    assert summary["surrogate_matched"] == len(gate.candidates) == len(programs)
    assert summary["failed_proposals"] == len(failed)
    # the gate measured every program (policy all) but those the cap stopped, each after its
    # reservation; a program it stopped is stored as not evaluated, the cap its reason
    dec = gate.decisions.set_index("candidate_id")
    capped = dec[dec["action"] != "measure"]
    assert capped["reason"].str.contains("dollar cap").all()
    evals = [r for r in _lines("cap-ledger.jsonl")
             if r["kind"] == "open" and r["what"] == "evaluation"]
    assert sorted(r["about"] for r in evals) == sorted(dec.index[dec["action"] == "measure"])
    skipped = [p for p in programs if json.loads(p[2] or "{}").get("gfsim_skipped")]
    assert len(skipped) == len(capped) and not any(correct for _, correct, _ in skipped)
    # the first run: programs up to the cap, then only failed proposals to its last generation
    first = [g for g, _, _ in programs if g < FIRST["generations"]]
    after_cap = set(range(max(first) + 1, FIRST["generations"]))
    assert len(after_cap) >= FIRST["generations"] / 3 and after_cap <= set(failed)
    reached = next(r for r in _lines("cap-ledger.jsonl") if r["kind"] == "reached")
    for g in sorted(after_cap):
        assert json.loads((FIXTURE / "run" / f"gen_{g}" / "failure.json").read_text())[
            "failure_stage"] == "proposal"
        answers = list((FIXTURE / "run" / f"gen_{g}" / "attempts").rglob("llm_response.txt"))
        assert answers and all(reached["why"] in a.read_text() for a in answers)
    stderr = (FIXTURE / FIRST["stderr"]).read_text()
    assert "Generation budget exhausted before reaching target" in stderr
    assert f"missing_generations={sorted(after_cap)}" in stderr


def test_the_run_resumed_with_a_larger_cap_on_the_same_ledger(tmp_path):
    """Resumable: ShinkaEvolve went on from its database (past the failed generations: its
    proposals at the generations after the first run's, each stored or failed), and the same
    ledger went on from what the first run spent, under the larger cap."""
    assert RESUMED["cap_usd"] > FIRST["cap_usd"] and RESUMED["shinka_returncode"] == 0
    programs, failed = _programs()
    resumed = [g for g, _, _ in programs if g >= FIRST["generations"]]
    went_on = set(resumed) | {g for g in failed if g >= FIRST["generations"]}
    assert went_on and min(went_on) == FIRST["generations"]
    assert max(went_on) < RESUMED["generations"]
    ledger = [r for r in _lines("cap-ledger.jsonl") if r["t"] > FIRST["ended_t"]]
    assert sum(r["kind"] == "open" and r["what"] == "evaluation" for r in ledger) == \
        len(resumed)
    cap = _cap(RESUMED, tmp_path, RESUMED["ended_t"])
    st = cap.status()
    spent_before = _cap(FIRST, tmp_path, FIRST["ended_t"]).status()["spent_usd"]
    assert st["spent_usd"] > spent_before and st["in_flight"] == 0
    assert st["spent_usd"] <= cap.usd + cap.eval_usd(st["longest_evaluation_s"])
    assert st["reached"] is None or st["reached"]["cap_usd"] == RESUMED["cap_usd"]
    with pytest.raises(CapReached, match="dollar cap"):  # the first cap stays reached
        _cap(FIRST, tmp_path, RESUMED["ended_t"]).reserve("proposal", 0.0)
