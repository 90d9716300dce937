"""``gfsim synth``: reproducible SYNTHETIC logs of both shapes, and the shipped synthetic-v1."""

import dataclasses
import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.forecasts.bins import PAPER_EDGES
from gfsim.replay_logs import SHIPPED_LOGS, load_log, resolve_log
from gfsim.worlds.landscape import LandscapeParams
from gfsim.worlds.synth import MAX_EXPANSIONS, build_records, synthesize

runner = CliRunner()
SHIPPED_ARGS = ["--seed", "1", "--candidates", "3000", "--tasks", "6"]


def records(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "traj.jsonl.gz"
    summary = synthesize(path, seed=3, candidates=1200, tasks=3)
    return path, summary


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "pairs.jsonl"
    summary = synthesize(path, seed=3, candidates=300, tasks=4, shape="pairs")
    return path, summary


def test_cli_reproduces_the_shipped_log_byte_for_byte(tmp_path):
    assert SHIPPED_LOGS["synthetic-v1"][1].startswith("SYNTHETIC:")
    assert "gfsim synth" in SHIPPED_LOGS["synthetic-v1"][1]
    out = tmp_path / "synthetic-v1.jsonl.gz"
    res = runner.invoke(app, ["synth", "--out", str(out), *SHIPPED_ARGS])
    assert res.exit_code == 0, res.output
    assert "3,000" in res.output and "SYNTHETIC" in res.output
    assert out.read_bytes() == resolve_log("synthetic-v1").read_bytes()
    # Running again over an existing file replaces it with the same bytes (no appending).
    res = runner.invoke(app, ["synth", "--out", str(out), *SHIPPED_ARGS])
    assert res.exit_code == 0 and out.read_bytes() == resolve_log("synthetic-v1").read_bytes()


def test_cli_reproduces_the_shipped_puct_log_byte_for_byte(tmp_path):
    assert "--driver puct" in SHIPPED_LOGS["synthetic-puct-v1"][1]
    out = tmp_path / "synthetic-puct-v1.jsonl.gz"
    res = runner.invoke(app, ["synth", "--out", str(out), "--seed", "1", "--tasks", "6",
                              "--driver", "puct", "--steps", "40"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == resolve_log("synthetic-puct-v1").read_bytes()


@pytest.mark.parametrize("args, fragment", [
    (["--driver", "puct", "--candidates", "10"], "drop --candidates"),
    (["--driver", "puct", "--shape", "pairs"], "trajectory logs only"),
    (["--driver", "bfs", "--candidates", "10"], "unknown driver 'bfs'"),
    (["--candidates"], None),
])
def test_bad_driver_options_exit_2(tmp_path, args, fragment):
    if fragment is None:
        res = runner.invoke(app, ["synth", "--out", str(tmp_path / "x.jsonl")])
        assert res.exit_code == 2 and "--candidates is required" in res.output
        return
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "x.jsonl"), *args])
    assert res.exit_code == 2 and fragment in res.output


def test_same_bytes_in_a_fresh_process(tmp_path):
    inproc = tmp_path / "a.jsonl.gz"
    synthesize(inproc, seed=9, candidates=400, tasks=2)
    # cwd away from the checkout: `python -m` puts cwd first on sys.path, and the source
    # tree's gfsim/ folder would shadow the installed package.
    proc = subprocess.run([sys.executable, "-m", "gfsim.cli.main", "synth", "--out",
                           "b.jsonl.gz", "--seed", "9", "--candidates", "400", "--tasks", "2"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote b.jsonl.gz" in proc.stdout
    assert (tmp_path / "b.jsonl.gz").read_bytes() == inproc.read_bytes()
    other = tmp_path / "c.jsonl.gz"
    synthesize(other, seed=10, candidates=400, tasks=2)
    assert other.read_bytes() != inproc.read_bytes()


def test_one_gzip_member_with_mtime_zero(traj):
    data = traj[0].read_bytes()
    assert data[:2] == b"\x1f\x8b" and data[4:8] == b"\x00\x00\x00\x00"
    assert data.count(b"\x1f\x8b\x08") >= 1
    assert len(gzip.decompress(data).splitlines()) == traj[1]["records"]


def test_trajectory_header_says_what_it_is(traj):
    log = load_log(traj[0])
    h = log.header
    assert h["log_shape"] == "trajectory" and h["label_bin_convention"] == "reference-code"
    assert h["forecast_bin_edges"] == list(PAPER_EDGES) and h["forecast_relative_to"] == "reference"
    assert h["hardware"] == {"device_name": "synthetic (no GPU)"}
    assert h["duration_basis"] == "service" and h["generator"] == {"model": "synthetic"}
    prov = h["provenance"]
    assert prov["kind"] == "synthetic" and prov["generator"] == "gfsim synth" and prov["seed"] == 3
    assert "nothing" in prov["note"] and "measured" in prov["note"]
    assert prov["parent_selection"].startswith("NOT the reference PUCT")
    params = prov["params"]
    assert set(params) == {f.name for f in dataclasses.fields(LandscapeParams)}
    assert all(v["label"] in ("assumption", "from REFERENCE.md") for v in params.values())
    assert params["p_compile_failed"] == {**params["p_compile_failed"], "value": 0.12,
                                          "label": "assumption"}
    assert [t["task_id"] for t in h["tasks"]] == ["task-00", "task-01", "task-02"]
    assert set(h["timing_protocol"]) >= {"l2_flush", "statistic", "max_reps"}


def test_trajectory_is_a_measure_all_search_per_task(traj):
    path, summary = traj
    log = load_log(path)
    c = log.candidates
    assert len(c) == 1200 and summary["candidates"] == 1200
    assert c.groupby("task_id").size().tolist() == [400, 400, 400]
    assert len(log.runs) == 3 and {r["driver"] for r in log.runs} == {"synth-greedy"}
    status = log.status_counts()
    assert status["deferred"] == status["not_attempted"] == 0
    assert 8 <= status["generation_failed"] <= 45  # ~2% of 1,200
    gen_failed = set(c.loc[c["status"] == "generation_failed", "candidate_id"])
    assert not gen_failed & set(log.forecasts["candidate_id"])
    assert set(log.forecasts["candidate_id"]) == set(log.evaluations["candidate_id"]) == (
        set(c["candidate_id"]) - gen_failed)
    assert c[["gen_input_tokens", "gen_output_tokens"]].isna().all().all()  # never logged
    step0 = c[c["step"] == 0]
    assert step0.groupby("search_id").size().tolist() == [4, 4, 4]
    assert step0["parent_id"].isna().all()
    assert c.groupby(["search_id", "step"]).size().max() == 8
    assert not c.loc[c["step"] > 0, "parent_id"].isna().any()  # seed re-expanded: never here


def test_parents_follow_the_stated_greedy_rule():
    recs = build_records(seed=3, candidates=1200, tasks=3)
    parent_of, speed, order = {}, {}, []
    steps = defaultdict(list)
    for r in recs:
        if r["kind"] == "candidate":
            parent_of[r["candidate_id"]] = r["parent_id"]
            order.append((r["search_id"], r["step"], r["candidate_id"]))
        elif r["kind"] == "evaluation" and r["outcome"] == "success":
            speed[r["candidate_id"]] = r["speedup"]
        elif r["kind"] == "step":
            steps[r["search_id"]].append(r)

    def ancestors(cid):
        out = set()
        while parent_of.get(cid):
            cid = parent_of[cid]
            out.add(cid)
        return out

    checked = 0
    for search, recs_ in steps.items():
        expansions = Counter()
        for st in recs_:
            if st["step"] == 0:
                assert st["parent_ids"] == []
                continue
            before = [cid for s, k, cid in order if s == search and k < st["step"]]
            eligible = [cid for cid in before if cid in speed and expansions[cid] < MAX_EXPANSIONS]
            ids = st["parent_ids"]
            assert 1 <= len(ids) <= 2
            assert st["parent_scores"] == [speed[i] for i in ids]
            assert speed[ids[0]] == max(speed[i] for i in eligible)  # greedy
            if len(ids) == 2:
                a, b = ids
                assert a not in ancestors(b) and b not in ancestors(a)  # lineage blocking
                unrelated = [i for i in eligible if i != a and a not in ancestors(i)
                             and i not in ancestors(a)]
                assert speed[b] == max(speed[i] for i in unrelated)
            for cid in ids:
                expansions[cid] += 1
            checked += 1
            kids = [cid for s, k, cid in order if s == search and k == st["step"]]
            assert {parent_of[k] for k in kids} == set(ids)
    assert checked > 100


def test_pairs_log_loads_and_is_refused_by_replay(pairs):
    path, summary = pairs
    log = load_log(path)
    assert log.shape == "pairs" and not log.runs and not log.steps
    assert len(log.candidates) == 300 and summary["outcomes"]["success"] == 300
    assert (log.candidates["step"] == 0).all() and log.candidates["parent_id"].isna().all()
    assert (log.evaluations["outcome"] == "success").all()
    assert set(log.forecasts["candidate_id"]) == set(log.candidates["candidate_id"])
    assert log.candidates.groupby("task_id").size().tolist() == [75, 75, 75, 75]
    assert log.header["provenance"]["pairs"]
    res = runner.invoke(app, ["replay", "--log", str(path)])
    assert res.exit_code == 2, res.output
    assert "pairs" in res.output and res.output.startswith("gfsim: error:")


def test_progress_and_json_summary(tmp_path):
    seen = []
    summary = synthesize(tmp_path / "x.jsonl", seed=0, candidates=1234, tasks=5,
                         progress=seen.append)
    assert sum(seen) == 1234
    res = runner.invoke(app, ["synth", "-o", str(tmp_path / "y.jsonl"), "-n", "1234", "-k", "5",
                              "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["candidates"] == 1234 and out["tasks"] == 5 and out["shape"] == "trajectory"
    assert set(out["best_speedup"]) == {f"task-0{i}" for i in range(5)}
    assert out["outcomes"] == summary["outcomes"]
    assert (tmp_path / "x.jsonl").read_bytes() == (tmp_path / "y.jsonl").read_bytes()
    assert out["bytes"] == (tmp_path / "y.jsonl").stat().st_size


@pytest.mark.parametrize("args, fragment", [
    (["--candidates", "0"], "--candidates must be a whole number >= 1"),
    (["--candidates", "5", "--tasks", "0"], "--tasks must be a whole number >= 1"),
    (["--candidates", "5", "--tasks", "6"], "every task needs at least one candidate"),
    (["--candidates", "5", "--seed", "-1"], "--seed must be a whole number >= 0"),
    (["--candidates", "5", "--shape", "tree"], "unknown shape 'tree'; valid: trajectory, pairs"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, fragment):
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "z.jsonl"), *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gfsim: error:") and fragment in lines[0]
    assert not (tmp_path / "z.jsonl").exists()


def test_bad_output_paths_exit_2(tmp_path):
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "z.txt"), "-n", "5", "-k", "1"])
    assert res.exit_code == 2 and ".jsonl or .jsonl.gz" in res.output
    (tmp_path / "d.jsonl").mkdir()
    res = runner.invoke(app, ["synth", "--out", str(tmp_path / "d.jsonl"), "-n", "5", "-k", "1"])
    assert res.exit_code == 2 and "directory" in res.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = runner.invoke(app, ["synth", "--out", str(blocker / "x.jsonl"), "-n", "5", "-k", "1"])
    assert res.exit_code == 2 and "cannot write" in res.output


def test_shipped_synthetic_v1_summary():
    log = load_log(resolve_log("synthetic-v1"))
    assert log.is_synthetic and log.shape == "trajectory"
    assert len(log.candidates) == 3000 and len(log.header["tasks"]) == 6
    assert resolve_log("synthetic-v1").stat().st_size < 1_000_000
    best = log.evaluations.merge(log.candidates[["candidate_id", "task_id"]]).groupby(
        "task_id")["speedup"].max()
    assert ((best > 1.5) & (best < 20)).all()  # plausible searches, not runaway compounding
