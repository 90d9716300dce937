"""``gfsim import openevolve``: a real OpenEvolve run (tests/data/openevolve, recorded by
experiments/make_openevolve_fixture.py) as a trajectory log that replays, checked against
OpenEvolve's own database loader; bad run folders refused in one line naming file and field,
with nothing written."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.importers.openevolve import import_openevolve
from gfsim.replay_logs import load_log

FIXTURE = Path(__file__).parent / "data" / "openevolve"
RUN = FIXTURE / "run"
runner = CliRunner()


def programs_on_disk(run: Path) -> dict:
    """Every program file's JSON by id, the later checkpoint's copy winning (read plainly)."""
    out = {}
    cps = sorted((run / "checkpoints").iterdir(), key=lambda d: int(d.name.split("_")[1]))
    for cp in cps:
        for f in (cp / "programs").glob("*.json"):
            out[f.stem] = json.loads(f.read_text())
    return out


def logged_iterations(run: Path) -> dict:
    pat = re.compile(r"Iteration (\d+): Program (\S+) \(parent: (\S+)\)")
    found = {}
    for f in (run / "logs").glob("*.log"):
        for m in pat.finditer(f.read_text()):
            found[m.group(2)] = (int(m.group(1)), m.group(3))
    return found


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("oe") / "run.jsonl"
    summary = import_openevolve(RUN, out, runtime_metric="runtime_ns", task="softmax",
                                openevolve_version="0.4.1")
    return summary, load_log(out), out


def test_the_fixture_is_a_real_labelled_openevolve_run():
    prov = json.loads((FIXTURE / "PROVENANCE.json").read_text())
    assert prov["openevolve_version"].startswith("0.4.")
    assert "NOT an LLM" in prov["llms"]["gfsim-mutation-operator"]
    assert "RANDOMLY INITIALISED" in prov["llms"]["tiny"]
    models = {p["metadata"].get("llm_model") for p in programs_on_disk(RUN).values()}
    assert {"tiny", "gfsim-mutation-operator"} <= models


def test_every_program_becomes_a_candidate_and_the_log_only_ones_are_not_attempted(imported):
    summary, log, _ = imported
    progs = programs_on_disk(RUN)
    migrants = {pid for pid, p in progs.items() if p["metadata"].get("migrant")}
    said = logged_iterations(RUN)
    log_only = set(said) - set(progs)
    assert migrants and log_only, "the fixture should hold migrant copies and dropped programs"
    # the figures docs/how-to/replay-openevolve.md gives
    assert summary["outcomes"] == {"success": 5, "compile_failed": 3, "not_attempted": 6}
    assert summary["candidates"] == 14 and len(migrants) == 2
    cands = log.candidates.set_index("candidate_id")
    assert set(cands.index) == (set(progs) - migrants) | log_only
    assert summary["migrant_copies"] == len(migrants) and summary["log_only"] == len(log_only)
    status = cands["status"]
    assert set(status[list(log_only)]) == {"not_attempted"}
    assert not set(log_only) & set(log.evaluations["candidate_id"])
    for pid in log_only:  # the log's parent and iteration, nothing invented
        parent = said[pid][1]
        parent = progs[parent]["parent_id"] if parent in migrants else parent
        assert cands.loc[pid, "parent_id"] == parent
        assert cands.loc[pid, "extra"]["openevolve"]["iteration"] == said[pid][0]
    # order: by iteration, so every parent comes before its children
    steps = cands["step"]
    for pid, parent in cands["parent_id"].dropna().items():
        assert steps[parent] < steps[pid]


def test_it_agrees_with_openevolves_own_database_loader(imported):
    from openevolve.config import DatabaseConfig
    from openevolve.database import ProgramDatabase

    _, log, _ = imported
    theirs = {}
    for cp in sorted((RUN / "checkpoints").iterdir(), key=lambda d: int(d.name.split("_")[1])):
        db = ProgramDatabase(DatabaseConfig(num_islands=2))
        db.load(str(cp))
        theirs.update(db.programs)
    copies = {pid: p.parent_id for pid, p in theirs.items() if p.metadata.get("migrant")}
    cands = log.candidates.set_index("candidate_id")
    ev = log.evaluations.set_index("candidate_id")
    seed = next(p for p in theirs.values() if p.parent_id is None)
    ref = seed.metrics["runtime_ns"]
    for pid, p in theirs.items():
        if pid in copies:
            assert pid not in cands.index
            continue
        parent = copies.get(p.parent_id, p.parent_id)
        got = cands.loc[pid, "parent_id"]
        assert (got if isinstance(got, str) else None) == parent
        assert cands.loc[pid, "code_sha256"] == hashlib.sha256(p.code.encode()).hexdigest()
        assert cands.loc[pid, "extra"]["openevolve"]["metrics"] == p.metrics
        if "error" in p.metrics:
            assert ev.loc[pid, "outcome"] == p.metrics["outcome"]
            assert ev.loc[pid, "extra"]["reason"] == p.metrics["error"]
        else:
            assert ev.loc[pid, "outcome"] == "success"
            assert ev.loc[pid, "speedup"] == pytest.approx(ref / p.metrics["runtime_ns"])


def test_the_header_and_run_record_say_where_it_came_from(imported):
    summary, log, _ = imported
    prov = log.header["provenance"]
    assert prov["openevolve"]["version"] == "0.4.1" and prov["runtime_metric"] == "runtime_ns"
    assert prov["openevolve"]["checkpoints"][0] == "checkpoint_3"
    cfg = log.runs[0]["configuration"]["openevolve"]
    assert cfg["islands"] == 2 and "no parent batches" in cfg["evaluation"]
    islands = {c["openevolve"]["island"] for c in log.candidates["extra"]
               if "island" in c["openevolve"]}
    assert islands <= {0, 1} and summary["iterations_without_a_program"] >= 1
    secs = log.candidates["gen_service_s"].dropna()
    assert len(secs) and (secs >= 0).all()  # iteration minus evaluation seconds
    assert log.evaluations["wall_s"].notna().any()


@pytest.mark.parametrize("policy", ["all", "threshold:0.7"])
def test_it_replays_open_loop_with_a_whatif_forecaster(imported, policy):
    _, _, out = imported
    res = runner.invoke(app, ["replay", "--log", str(out), "--policy", policy,
                              "--forecaster", "paper:gemini3-flash", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["candidates"] == len(load_log(out).candidates)
    assert 0 <= got["orphan_share"] <= 1 and got["best_speedup"] >= 1.0
    if policy == "all":
        assert got["orphan_share"] < 0.5  # only children of programs no checkpoint held
    res = runner.invoke(app, ["replay", "--log", str(out), "--policy", "threshold:0.7"])
    assert res.exit_code == 2 and "forecast" in res.output  # needs --forecaster: said so


def test_a_score_metric_and_a_given_reference(tmp_path):
    out = tmp_path / "s.jsonl"
    res = runner.invoke(app, ["import", "openevolve", str(RUN), "-o", str(out),
                              "--runtime-metric", "combined_score", "--higher-is-better",
                              "--reference-runtime", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["reference"] == 0.5
    log = load_log(out)
    ev = log.evaluations[log.evaluations["outcome"] == "success"].set_index("candidate_id")
    progs = programs_on_disk(RUN)
    for pid, row in ev.iterrows():
        assert row["speedup"] == pytest.approx(progs[pid]["metrics"]["combined_score"] / 0.5)


def _copy(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    return run


def _first_program(run: Path) -> Path:
    return sorted((run / "checkpoints" / "checkpoint_3" / "programs").glob("*.json"))[0]


def _cut(run):
    f = _first_program(run)
    f.write_text(f.read_text()[:200])
    return f.name


def _no_field(run):
    f = _first_program(run)
    prog = json.loads(f.read_text())
    del prog["iteration_found"]
    f.write_text(json.dumps(prog))
    return "'iteration_found'"


def _missing_parent(run):
    progs = programs_on_disk(run)
    child = next(pid for pid, p in progs.items() if p["parent_id"] in progs
                 and not p["metadata"].get("migrant")
                 and not progs[p["parent_id"]]["metadata"].get("migrant"))
    parent = progs[child]["parent_id"]
    for f in run.glob(f"checkpoints/*/programs/{parent}.json"):
        f.unlink()
    for f in (run / "logs").glob("*.log"):  # and no log line names it
        f.write_text("".join(ln for ln in f.read_text().splitlines(True)
                             if f"Program {parent}" not in ln))
    return "'parent_id'"


def _empty_checkpoint(run):
    for f in (run / "checkpoints" / "checkpoint_6" / "programs").glob("*.json"):
        f.unlink()
    return "checkpoint_6/programs"


BAD = {"a cut program file": _cut, "a program without a field": _no_field,
       "a missing parent": _missing_parent, "a checkpoint with no programs": _empty_checkpoint}


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_bad_run_folder_is_one_line_and_nothing_is_written(tmp_path, what):
    run = _copy(tmp_path)
    named = BAD[what](run)
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["import", "openevolve", str(run), "-o", str(out),
                              "--runtime-metric", "runtime_ns"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and str(run) in line and named in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_unsupported_version_and_a_missing_metric_are_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(GfsimError, match=r"0\.3\.2.*not supported.*0\.4"):
        import_openevolve(RUN, out, runtime_metric="runtime_ns", openevolve_version="0.3.2")
    with pytest.raises(GfsimError, match="`runtime_metric`.*runtime_ns"):
        import_openevolve(RUN, out)
    (tmp_path / "empty").mkdir()  # (a folder beside the output: one around it is refused)
    with pytest.raises(GfsimError, match="no checkpoints"):
        import_openevolve(tmp_path / "empty", out, runtime_metric="runtime_ns")
    assert not out.exists()


def test_a_runtime_metric_typo_lists_the_runs_metrics(tmp_path):
    """It blamed the seed program ("has no value > 0"); with --reference-runtime every program
    became 'incorrect'. It is one line naming the unknown metric and listing the run's."""
    out = tmp_path / "x.jsonl"
    for extra in ([], ["--reference-runtime", "1000"]):
        res = runner.invoke(app, ["import", "openevolve", str(RUN), "-o", str(out),
                                  "--runtime-metric", "runtim_ns", *extra])
        assert res.exit_code == 2, res.output
        assert res.output.strip() == (
            f"gfsim: error: {RUN}: --runtime-metric 'runtim_ns': no program of this run has "
            "that metric (its numeric metrics: combined_score, runtime_ns, speedup)")
        assert not out.exists()


def test_a_live_forecaster_reads_the_imported_log(imported, tmp_path, vllm_server):
    """``gfsim forecast`` with the real vLLM CPU server compares each program with the seed
    program (the task's reference code), and the forecasts replay under threshold:0.7."""
    _, log, out = imported
    progs = programs_on_disk(RUN)
    seed = next(p for p in progs.values() if p["parent_id"] is None)
    assert log.tasks["softmax"]["reference_code"] == seed["code"]
    spec = (f"vllm:{vllm_server.url},model={vllm_server.model},mode=logprobs,"
            "max_prompt_tokens=400")
    fc = tmp_path / "fc.jsonl"
    res = runner.invoke(app, ["forecast", "--log", str(out), "--forecaster", spec, "--out",
                              str(fc)])
    assert res.exit_code == 0, res.output
    with_code = int(log.candidates["has_code"].sum())
    assert len(load_log(fc).forecasts) == with_code == 8
    res = runner.invoke(app, ["replay", "--log", str(fc), "--policy", "threshold:0.7",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["forecasts"] == with_code


def test_a_surrogate_log_of_another_run_is_refused(tmp_path):
    from gfsim.integrations.openevolve import Surrogate

    prog = tmp_path / "p.py"
    prog.write_text("100\n")
    other = tmp_path / "other.jsonl"
    Surrogate(lambda path: {"runtime_ns": 100.0}, runtime_metric="runtime_ns",
              log=other).stage1(prog)
    out = tmp_path / "out.jsonl"
    for log, match in ((other, "no candidate's code_sha256 is the code of a program"),
                       (tmp_path / "missing.jsonl", "missing.jsonl: --surrogate-log: no such")):
        res = runner.invoke(app, ["import", "openevolve", str(RUN), "-o", str(out),
                                  "--runtime-metric", "runtime_ns", "--surrogate-log", str(log)])
        assert res.exit_code == 2 and match in res.output, res.output
        assert not out.exists()
