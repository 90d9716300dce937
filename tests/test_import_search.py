"""``gfsim import search``: a bring-your-own-search file as a trajectory log that replays, and
every kind of bad line refused in one line naming the file, line and field, with nothing
written."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.importers.search import import_search
from gfsim.replay_logs import load_log

SMALL = Path(__file__).parent / "data" / "search" / "small.jsonl"
runner = CliRunner()


def lines():
    return [json.loads(x) for x in SMALL.read_text().splitlines()]


def write(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_the_small_file_becomes_a_log_that_replays(tmp_path):
    s = import_search(SMALL, tmp_path / "log.jsonl")
    assert s["candidates"] == 7 and s["forecasts"] == 6
    assert s["outcomes"] == {"success": 4, "compile_failed": 1, "incorrect": 1,
                             "not_measured": 1}
    log = load_log(tmp_path / "log.jsonl")
    assert log.shape == "trajectory" and log.header["provenance"]["kind"] == "measured"
    assert log.status_counts()["deferred"] == 1  # not_measured: the tool's filter skipped it
    ev = log.evaluations.set_index("candidate_id")
    assert ev.loc["c1", "speedup"] == pytest.approx(200000 / 150000)  # against the root
    assert ev.loc["c3", "speedup"] == pytest.approx(1.6)  # given as a speedup
    cand = log.candidates.set_index("candidate_id")
    assert cand.loc["c3", "parent_id"] == "c1" and list(cand["step"]) == list(range(7))
    for policy in ("all", "threshold:0.7"):
        res = runner.invoke(app, ["replay", "--log", str(tmp_path / "log.jsonl"), "--policy",
                                  policy, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["best_speedup"] == pytest.approx(200000 / 110000)


def test_order_reorders_and_a_given_reference_wins(tmp_path):
    recs = lines()[:4]
    for k, r in enumerate(recs):
        r["order"] = [0, 2, 1, 3][k]
    src = write(tmp_path / "o.jsonl", recs)
    import_search(src, tmp_path / "log.jsonl", reference_runtime_ns=300000.0, device="H100")
    log = load_log(tmp_path / "log.jsonl")
    assert list(log.candidates["candidate_id"]) == ["seed", "c2", "c1", "c3"]
    assert log.evaluations.set_index("candidate_id").loc["c1", "speedup"] == \
        pytest.approx(2.0)
    assert log.header["hardware"]["device_name"] == "H100"


BAD = {
    "no id": (0, lambda r: r.pop("id"), "id"),
    "duplicate id": (2, lambda r: r.update(id="c1"), "id"),
    "unknown parent": (1, lambda r: r.update(parent="zz"), "parent"),
    "parent later": (1, lambda r: r.update(parent="c3"), "parent"),
    "bad outcome": (1, lambda r: r.update(outcome="great"), "outcome"),
    "success without a time": (3, lambda r: r.pop("speedup"), "speedup"),
    "speedup on a failure": (2, lambda r: r.update(speedup=2.0), "speedup"),
    "negative runtime": (1, lambda r: r.update(runtime_ns=-1), "runtime_ns"),
    "seven probabilities": (1, lambda r: r["forecast"].update(probs=[0.1] * 7),
                            "forecast.probs"),
    "string tokens": (1, lambda r: r.update(input_tokens="4k"), "input_tokens"),
    "two tasks in a search": (3, lambda r: r.update(task="matmul"), "task"),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_bad_line_is_one_line_naming_file_line_and_field(tmp_path, what):
    k, change, field = BAD[what]
    recs = lines()
    change(recs[k])
    src = write(tmp_path / "bad.jsonl", recs)
    out = tmp_path / "out.jsonl"
    with pytest.raises(GfsimError) as exc:
        import_search(src, out)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{src}:") and f"'{field}'" in msg, msg
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_file_with_a_cut_last_line_or_nothing_in_it_is_refused(tmp_path):
    src = tmp_path / "cut.jsonl"
    src.write_text(SMALL.read_text()[:-40])
    with pytest.raises(GfsimError, match="truncated"):
        import_search(src, tmp_path / "out.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(GfsimError, match="no candidates"):
        import_search(tmp_path / "empty.jsonl", tmp_path / "out.jsonl")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_in_any_field_is_a_log_or_one_line(tmp_path_factory, json_values, data):
    tmp = tmp_path_factory.mktemp("byo")
    recs = lines()
    k = data.draw(st.integers(0, len(recs) - 1))
    field = data.draw(st.sampled_from(sorted(recs[k]) + ["order", "forecast"]))
    recs[k][field] = data.draw(json_values)
    src, out = tmp / "f.jsonl", tmp / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    try:
        import_search(src, out)
    except GfsimError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(src))
        assert not out.exists()
    else:
        load_log(out)


def test_not_attempted_has_no_record_but_its_candidate_and_evaluation_s_is_wall_s(tmp_path):
    recs = lines()[:3]
    recs[2].update(outcome="not_attempted")
    recs[2].pop("speedup", None)
    recs[2].pop("runtime_ns", None)
    recs[1]["evaluation_s"] = 2.5
    src = write(tmp_path / "n.jsonl", recs)
    s = import_search(src, tmp_path / "log.jsonl")
    assert s["outcomes"].get("not_attempted") == 1
    log = load_log(tmp_path / "log.jsonl")
    cid = recs[2]["id"]
    assert log.candidates.set_index("candidate_id").loc[cid, "status"] == "not_attempted"
    assert cid not in set(log.decisions["candidate_id"]) | set(log.evaluations["candidate_id"])
    assert log.evaluations.set_index("candidate_id").loc[recs[1]["id"], "wall_s"] == 2.5
