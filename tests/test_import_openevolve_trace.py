"""gfsim import openevolve reads OpenEvolve's evolution trace where a run has one: a real run
recorded with it on (tests/data/openevolve-trace, experiments/make_openevolve_fixture.py
--trace)."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.importers.openevolve import import_openevolve
from gfsim.replay_logs import load_log

RUN = Path(__file__).parent / "data" / "openevolve-trace" / "run"
ARGS = dict(runtime_metric="runtime_ns", task="softmax")


def trace_rows():
    return [json.loads(line) for line in (RUN / "evolution_trace.jsonl").read_text().splitlines()
            if line.strip()]


def test_the_trace_gives_every_evaluated_child_the_checkpoints_dropped(tmp_path):
    s = import_openevolve(RUN, tmp_path / "log.jsonl", **ARGS)
    assert s["sources"].startswith("checkpoints, logs and the evolution trace")
    assert s["trace_only"] > 0 and s["log_only"] == 0  # no program left as not_attempted
    assert "not_attempted" not in s["outcomes"]
    log = load_log(tmp_path / "log.jsonl")
    cands = log.candidates.set_index("candidate_id")
    ev = log.evaluations.set_index("candidate_id")
    for t in trace_rows():  # every child of the trace, with its metrics' outcome
        cid = t["child_id"]
        assert cid in cands.index
        m = t["child_metrics"]
        if "error" in m:
            assert ev.loc[cid, "outcome"] == m.get("outcome", "runtime_error")
        else:
            assert ev.loc[cid, "outcome"] == "success"
    assert log.header["provenance"]["openevolve"]["evolution_trace"] == ["evolution_trace.jsonl"]


def test_without_the_trace_the_same_programs_agree(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "evolution_trace.jsonl").unlink()
    plain = import_openevolve(run, tmp_path / "plain.jsonl", **ARGS)
    traced = import_openevolve(RUN, tmp_path / "traced.jsonl", **ARGS)
    assert plain["sources"] == "checkpoints and logs (no evolution trace)"
    assert plain["candidates"] == traced["candidates"]  # the log named the dropped ones
    a = load_log(tmp_path / "plain.jsonl").evaluations.set_index("candidate_id")
    b = load_log(tmp_path / "traced.jsonl").evaluations.set_index("candidate_id")
    both = a.index.intersection(b.index)
    assert len(both) == len(a) and len(b) > len(a)
    assert (a.loc[both, "outcome"] == b.loc[both, "outcome"]).all()


def test_failed_iterations_become_generation_failed_candidates(tmp_path):
    # The recorded run had no failed iteration: two are written here in the failures file's
    # format (OpenEvolve's EvolutionTracer.log_failure), parents taken from the trace.
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rows = trace_rows()
    fails = [{"iteration": rows[0]["iteration"], "timestamp": rows[0]["timestamp"] + 0.5,
              "error": "No valid diffs found in response", "parent_id": rows[0]["parent_id"],
              "evolution_mode": "full_rewrite", "island_id": 0,
              "token_usage": {"prompt_tokens": 900, "completion_tokens": 40}},
             {"iteration": rows[-1]["iteration"] + 1, "timestamp": rows[-1]["timestamp"] + 1,
              "error": "Iteration timed out", "parent_id": None}]
    (run / "evolution_trace_failures.jsonl").write_text(
        "".join(json.dumps(f) + "\n" for f in fails))
    s = import_openevolve(run, tmp_path / "log.jsonl", **ARGS)
    assert s["failed_iterations"] == 2 and s["outcomes"]["generation_failed"] == 2
    cands = load_log(tmp_path / "log.jsonl").candidates
    failed = cands[cands["status"] == "generation_failed"]
    assert sorted(failed["gen_failed_reason"]) == ["Iteration timed out",
                                                   "No valid diffs found in response"]
    assert set(failed["gen_input_tokens"].dropna()) == {900}


@pytest.mark.parametrize("line, words", [
    ('{"iteration": 3, "child_id": "x"}', ["evolution_trace.jsonl:", "field 'child_metrics'"]),
    ('{"iteration": 3, "child_id": "x", "child_metrics": {}, "parent_id": 7}',
     ["field 'parent_id'"]),
    ('{"iteration": 3, "child_id": ', ["evolution_trace.jsonl:", "not valid JSON"]),
])
def test_a_bad_trace_line_is_one_line_naming_file_line_and_field(tmp_path, line, words):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    with open(run / "evolution_trace.jsonl", "a") as f:
        f.write(line + "\n")
    out = tmp_path / "log.jsonl"
    res = CliRunner().invoke(app, ["import", "openevolve", str(run), "-o", str(out),
                                   "--runtime-metric", "runtime_ns"])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), res.output
    n = len(trace_rows()) + 1
    assert f"evolution_trace.jsonl:{n}" in lines[0] or "not valid JSON" in lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("policy", ["all", "threshold:0.7"])
def test_the_traced_run_replays_open_loop(tmp_path, policy):
    import_openevolve(RUN, tmp_path / "log.jsonl", **ARGS)
    args = ["replay", "--log", str(tmp_path / "log.jsonl"), "--policy", policy, "--json"]
    if policy != "all":
        args += ["--forecaster", "paper:gemini3-flash"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    log = load_log(tmp_path / "log.jsonl")
    measured = log.evaluations.loc[log.evaluations["outcome"] == "success", "speedup"]
    assert out["best_speedup"] <= measured.max() + 1e-12
