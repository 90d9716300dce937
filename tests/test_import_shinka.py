"""gfsim import shinka: a real ShinkaEvolve run (tests/data/shinka, recorded with the registry's
package) and hand-made databases in ShinkaEvolve 0.0.7's schema for each problem a run can
have."""

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.importers.shinka import import_shinka
from gfsim.replay_logs import load_log

FIXTURE = Path(__file__).parent / "data" / "shinka"

# ShinkaEvolve 0.0.7's tables (``sqlite3 programs.sqlite .schema`` of a run it wrote).
SCHEMA = """
CREATE TABLE programs (id TEXT PRIMARY KEY, code TEXT NOT NULL, language TEXT NOT NULL,
  parent_id TEXT, archive_inspiration_ids TEXT, top_k_inspiration_ids TEXT,
  generation INTEGER NOT NULL, timestamp REAL NOT NULL, code_diff TEXT, combined_score REAL,
  public_metrics TEXT, private_metrics TEXT, text_feedback TEXT, complexity REAL,
  embedding TEXT, embedding_pca_2d TEXT, embedding_pca_3d TEXT, embedding_cluster_id INTEGER,
  correct BOOLEAN DEFAULT 0, children_count INTEGER NOT NULL DEFAULT 0, metadata TEXT,
  migration_history TEXT, island_idx INTEGER, system_prompt_id TEXT);
CREATE TABLE archive (program_id TEXT PRIMARY KEY);
CREATE TABLE metadata_store (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE attempt_log (id INTEGER PRIMARY KEY AUTOINCREMENT, generation INTEGER NOT NULL,
  stage TEXT NOT NULL, status TEXT NOT NULL, details TEXT, created_at REAL NOT NULL);
"""


def program(pid, gen, parent=None, score=1.0, correct=True, island=0, metadata=None,
            public=None, private=None, feedback=""):
    meta = {"model_name": "m", "patch_type": "full" if parent else "init",
            "sampling_seconds": 2.5, "evaluation_seconds": 4.0, "api_costs": 0.01,
            "llm_result": {"input_tokens": 100, "output_tokens": 50, "thinking_tokens": 7}}
    meta.update(metadata or {})
    return (pid, f"# program {pid}\n", "python", parent, gen, 1000.0 + gen, score,
            json.dumps(public or {}), json.dumps(private or {}), feedback, int(correct),
            json.dumps(meta), island)


def make_db(path: Path, programs, attempts=(), wal=False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
    con.executescript(SCHEMA)
    con.executemany("INSERT INTO programs (id, code, language, parent_id, generation, "
                    "timestamp, combined_score, public_metrics, private_metrics, "
                    "text_feedback, correct, metadata, island_idx) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", programs)
    con.executemany("INSERT INTO attempt_log (generation, stage, status, details, created_at) "
                    "VALUES (?,?,?,?,?)", attempts)
    con.commit()
    con.close()
    return path


def small_run(tmp_path, **kw) -> Path:
    run = tmp_path / "run"
    make_db(run / "programs.sqlite", [
        program("p0", 0),
        program("p1", 1, "p0", score=1.5),
        program("p2", 2, "p1", score=0.0, correct=False, feedback="Traceback: boom"),
        program("p3", 3, "p0", score=0.5, island=1),
    ], attempts=[(4, "proposal", "failed", json.dumps({
        "parent_id": "p1", "failure_class": "PatchError",
        "failure_reason": "no code block in the answer", "model_name": "m"}), 1010.0)], **kw)
    return run


def test_a_run_imports_with_lineage_outcomes_seconds_and_failed_proposals(tmp_path):
    run = small_run(tmp_path)
    summary = import_shinka(run, tmp_path / "log.jsonl")
    assert summary["outcomes"] == {"success": 3, "incorrect": 1, "generation_failed": 1}
    assert summary["failed_proposals"] == 1 and summary["reference"] == 1.0
    log = load_log(tmp_path / "log.jsonl")
    cands = log.candidates.set_index("candidate_id")
    assert cands.loc["p1", "parent_id"] == "p0" and cands.loc["p3", "parent_id"] == "p0"
    assert cands.loc["attempt-1", "parent_id"] == "p1"
    assert cands.loc["attempt-1", "status"] == "generation_failed"
    assert "no code block" in cands.loc["attempt-1", "gen_failed_reason"]
    ev = log.evaluations.set_index("candidate_id")
    assert ev.loc["p1", "speedup"] == pytest.approx(1.5)
    assert ev.loc["p3", "speedup"] == pytest.approx(0.5)
    assert ev.loc["p2", "outcome"] == "incorrect" and "boom" in str(ev.loc["p2", "extra"])
    assert cands.loc["p1", "gen_service_s"] == 2.5
    assert cands.loc["p1", "gen_output_tokens"] == 57  # thinking tokens count as output
    assert ev.loc["p1", "wall_s"] == 4.0
    assert log.header["provenance"]["database_sha256"] == hashlib.sha256(
        (run / "programs.sqlite").read_bytes()).hexdigest()


def test_a_runtime_metric_and_a_given_reference(tmp_path):
    run = tmp_path / "run"
    make_db(run / "programs.sqlite", [
        program("p0", 0, public={"runtime_ms": 2.0}),
        program("p1", 1, "p0", public={"runtime_ms": 0.5}),
    ])
    import_shinka(run, tmp_path / "a.jsonl", metric="public.runtime_ms", lower_is_better=True)
    ev = load_log(tmp_path / "a.jsonl").evaluations.set_index("candidate_id")
    assert ev.loc["p1", "speedup"] == pytest.approx(4.0)
    import_shinka(run, tmp_path / "b.jsonl", metric="public.runtime_ms", lower_is_better=True,
                  reference=1.0)
    ev = load_log(tmp_path / "b.jsonl").evaluations.set_index("candidate_id")
    assert ev.loc["p0", "speedup"] == pytest.approx(0.5)


def test_island_copies_are_not_candidates_and_their_children_link_to_the_original(tmp_path):
    run = tmp_path / "run"
    make_db(run / "programs.sqlite", [
        program("p0", 0),
        program("p0-copy", 0, island=1, metadata={"_is_island_copy": True,
                                                  "_original_program_id": "p0"}),
        program("p1", 1, "p0-copy", score=2.0, island=1),
        program("p2", 2, "p1", private={"gfsim_skipped": True}, score=0.0, correct=False),
    ])
    summary = import_shinka(run, tmp_path / "log.jsonl")
    assert summary["island_copies"] == 1 and summary["candidates"] == 3
    log = load_log(tmp_path / "log.jsonl")
    cands = log.candidates.set_index("candidate_id")
    assert "p0-copy" not in cands.index and cands.loc["p1", "parent_id"] == "p0"
    assert cands.loc["p2", "status"] == "deferred"  # gfsim's surrogate skipped it


def test_a_live_run_in_wal_mode_is_read_and_never_touched(tmp_path):
    run = tmp_path / "run"
    db = make_db(run / "programs.sqlite", [program("p0", 0)], wal=True)
    # A writer that keeps its connection open: its rows sit in the write-ahead log.
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO programs (id, code, language, parent_id, generation, timestamp,"
                   " combined_score, correct, metadata) VALUES ('p1', 'x', 'python', 'p0', 1,"
                   " 1001.0, 3.0, 1, '{}')")
    writer.commit()
    files = sorted(run.iterdir())
    assert (run / "programs.sqlite-wal").stat().st_size > 0
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}
    summary = import_shinka(run, tmp_path / "log.jsonl")
    assert summary["candidates"] == 2  # the committed row in the WAL is imported
    assert sorted(run.iterdir()) == files
    assert {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in files} == before
    writer.close()


def test_an_old_runs_database_named_none(tmp_path):
    run = tmp_path / "run"
    make_db(run / "None", [program("p0", 0), program("p1", 1, "p0", score=3.0)])
    assert import_shinka(run, tmp_path / "log.jsonl")["database"] == "None"


def _drop_column(db: Path, column: str) -> None:
    con = sqlite3.connect(db)
    con.execute(f"ALTER TABLE programs DROP COLUMN {column}")
    con.commit()
    con.close()


def _set(db: Path, sql: str) -> None:
    con = sqlite3.connect(db)
    con.execute(sql)
    con.commit()
    con.close()


@pytest.mark.parametrize("break_it, words", [
    (lambda run: _drop_column(run / "programs.sqlite", "correct"),
     ["table programs", "no column 'correct'"]),
    (lambda run: (run / "programs.sqlite").write_bytes(b"not a database\n" * 10),
     ["programs.sqlite", "not a SQLite database"]),
    (lambda run: _set(run / "programs.sqlite",
                      "UPDATE programs SET metadata = '{\"cut' WHERE id = 'p1'"),
     ["table programs, id 'p1'", "field 'metadata'", "not valid JSON"]),
    (lambda run: _set(run / "programs.sqlite",
                      "UPDATE programs SET parent_id = 'ghost' WHERE id = 'p1'"),
     ["table programs, id 'p1'", "field 'parent_id'", "'ghost'", "no program row"]),
    (lambda run: _set(run / "programs.sqlite",
                      "UPDATE attempt_log SET details = '[1, 2' WHERE id = 1"),
     ["table attempt_log, id 1", "field 'details'", "not valid JSON"]),
    (lambda run: _set(run / "programs.sqlite", "UPDATE programs SET correct = 'yes'"),
     ["table programs, id 'p0'", "field 'correct'"]),
    (lambda run: _set(run / "programs.sqlite", "DELETE FROM programs"),
     ["table programs", "no programs"]),
    (lambda run: (run / "programs.sqlite").unlink(),
     ["no ShinkaEvolve database", "--db"]),
])
def test_bad_input_is_one_line_naming_file_table_row_and_field(tmp_path, break_it, words):
    run = small_run(tmp_path)
    break_it(run)
    out = tmp_path / "log.jsonl"
    res = CliRunner().invoke(app, ["import", "shinka", str(run), "-o", str(out)])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), res.output
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists() and not list(tmp_path.glob("log*"))


def test_versions_outside_the_tested_range_are_refused(tmp_path):
    run = small_run(tmp_path)
    with pytest.raises(GfsimError, match="0.1.2' is not supported"):
        import_shinka(run, tmp_path / "log.jsonl", shinka_version="0.1.2")
    assert import_shinka(run, tmp_path / "log.jsonl", shinka_version="0.0.7")["candidates"]


def test_a_database_link_out_of_the_run_is_refused(tmp_path):
    outside = make_db(tmp_path / "elsewhere" / "programs.sqlite", [program("p0", 0)])
    run = tmp_path / "run"
    run.mkdir()
    (run / "programs.sqlite").symlink_to(outside)
    with pytest.raises(GfsimError, match="leads outside"):
        import_shinka(run, tmp_path / "log.jsonl")


# -- the real run --------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE.with_name("shinka-surrogate")],
                         ids=["plain", "with-gfsims-gate"])
def test_the_recorded_run_matches_shinkas_own_loader(tmp_path, fixture):
    # loader_view.json is what shinka.utils.load_programs_to_df read from the recorded run
    # (experiments/make_shinka_fixture.py): programs, parents, outcomes and island copies.
    summary = import_shinka(fixture / "run", tmp_path / "log.jsonl", shinka_version="0.0.7")
    view = json.loads((fixture / "loader_view.json").read_text())
    rows = {r["id"]: r for r in view["programs"]}
    copies = {pid: r["copy_of"] for pid, r in rows.items() if r["copy_of"]}
    assert copies and view["attempt_log_rows"] > 0  # the run exercises both
    log = load_log(tmp_path / "log.jsonl")
    cands = log.candidates.set_index("candidate_id")
    ev = log.evaluations.set_index("candidate_id")
    programs = [pid for pid in cands.index if not pid.startswith("attempt-")]
    assert sorted(programs) == sorted(set(rows) - set(copies))
    assert summary["island_copies"] == len(copies)
    assert summary["failed_proposals"] == view["attempt_log_rows"]
    assert (cands["status"] == "generation_failed").sum() == view["attempt_log_rows"]
    seed = min((r for r in rows.values() if r["parent_id"] is None and not r["copy_of"]),
               key=lambda r: r["generation"])
    for pid in programs:
        r = rows[pid]
        parent = copies.get(r["parent_id"], r["parent_id"])
        got = cands.loc[pid, "parent_id"]
        assert (got if isinstance(got, str) else None) == parent, pid
        success = r["correct"] and (r["combined_score"] or 0) > 0
        outcome = ev.loc[pid, "outcome"] if pid in ev.index else cands.loc[pid, "status"]
        assert (outcome == "success") == success, pid
        if success:
            assert ev.loc[pid, "speedup"] == pytest.approx(r["combined_score"] /
                                                           seed["combined_score"])
    prov = json.loads((fixture / "PROVENANCE.json").read_text())
    assert prov["shinka_evolve_version"] == "0.0.7"


@pytest.mark.parametrize("policy", ["all", "threshold:0.7"])
def test_the_recorded_run_replays_open_loop(tmp_path, policy):
    import_shinka(FIXTURE / "run", tmp_path / "log.jsonl", task="softmax")
    log = load_log(tmp_path / "log.jsonl")
    args = ["replay", "--log", str(tmp_path / "log.jsonl"), "--policy", policy, "--json"]
    if policy != "all":  # the run has no forecasts: the paper's fitted forecaster draws them
        args += ["--forecaster", "paper:gemini3-flash"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    measured = log.evaluations.loc[log.evaluations["outcome"] == "success", "speedup"]
    assert 1.0 <= out["best_speedup"] <= measured.max() + 1e-12
    if policy == "all":  # every program the run evaluated, and none of its failed proposals
        assert out["gpu_evals"] == len(log.evaluations)
        assert out["best_speedup"] == pytest.approx(measured.max())
    else:
        assert 1 <= out["gpu_evals"] <= len(log.evaluations)


def test_shinkas_loader_reads_what_the_fixture_recorded():
    shinka = pytest.importorskip("shinka.utils")  # installed only where the fixture is made
    df = shinka.load_programs_to_df(str(FIXTURE / "run"), verbose=False)
    view = json.loads((FIXTURE / "loader_view.json").read_text())
    assert sorted(df["id"]) == sorted(r["id"] for r in view["programs"])
