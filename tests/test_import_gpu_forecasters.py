"""gfsim import gpu-forecasters-events / -eval-set, on fixtures written from the published
schema (docs/concepts/paper.md), not on the published files themselves."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.cost_models import load_cost_model
from gfsim.importers.gpu_forecasters import import_eval_set, import_events, recover_service
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator import replay

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "gpu_forecasters"
CAPS = {"gen": 1, "forecast": 1, "eval": 1}


def test_fifo_service_recovery():
    # Three requests at t=0 on one slot finishing at 10, 14, 20: served 0-10, 10-14, 14-20.
    assert recover_service([(0, 10), (0, 14), (0, 20)], 1) == [10, 4, 6]
    # Two slots: the third waits for the first slot to free at 10.
    assert recover_service([(0, 10), (0, 14), (0, 20)], 2) == [10, 14, 10]
    assert recover_service([(5, 6)], 3) == [1]


def test_the_standard_dialect(tmp_path):
    s = import_events(DATA / "standard_events.jsonl", tmp_path / "s.jsonl", capacities=CAPS)
    assert (s["dialect"], s["candidates"], s["evaluations"], s["forecasts"]) == (
        "standard", 4, 3, 0)
    log = load_log(tmp_path / "s.jsonl")
    c = log.candidates.set_index("candidate_id")
    # A mutation is a candidate; evaluated ones are named by their child node id.
    assert set(c.index) == {"C1", "m2", "C3", "C4"}
    assert not isinstance(c.loc["C1", "parent_id"], str) and c.loc["C3", "parent_id"] == "C1"
    assert c.loc["m2", "status"] == "generation_failed"
    ev = log.evaluations.set_index("candidate_id")
    assert ev.loc["C4", "speedup"] == 1.5 and ev.loc["C3", "outcome"] == "compile_failed"
    # Mutations m1 (0-10) and m2 (0-14) queued on one generator: m2 served 10-14.
    assert c.loc["C1", "gen_service_s"] == 10 and c.loc["m2", "gen_service_s"] == 4
    assert log.header["duration_basis"] == "service"
    assert log.header["tasks"][0]["reference_code"].startswith("def seed")
    r = replay(log, make_policy("all"), load_cost_model("serverless-a100"))
    assert r.best_speedup == 1.5 and r.searches[0].gpu_evals == 3


def test_published_rows_wrapping_the_lines_give_the_same_log(tmp_path):
    import_events(DATA / "standard_events.jsonl", tmp_path / "a.jsonl")
    b = import_events(DATA / "standard_rows.jsonl", tmp_path / "b.jsonl")
    assert b["task"] == "toy"  # from the row's source_search
    la, lb = load_log(tmp_path / "a.jsonl"), load_log(tmp_path / "b.jsonl")
    assert list(la.candidates["candidate_id"]) == list(lb.candidates["candidate_id"])
    assert list(la.evaluations["speedup"].fillna(0)) == list(lb.evaluations["speedup"].fillna(0))
    assert la.header["duration_basis"] == "queue_inclusive"


def test_the_filtered_dialect_keeps_forecasts_selection_and_deferred(tmp_path):
    s = import_events(DATA / "filtered_events.jsonl", tmp_path / "f.jsonl", capacities=CAPS)
    assert (s["dialect"], s["task"], s["deferred"]) == ("filtered", "toy", 1)
    log = load_log(tmp_path / "f.jsonl")
    assert log.header["forecast_relative_to"] == "seed"
    assert log.header["selection"]["k"] == 1
    assert log.header["hardware"]["multiprocessor_count"] == 108
    status = dict(zip(log.candidates["candidate_id"], log.candidates["status"]))
    assert status["r2"] == "deferred" and status["r1"] == "evaluated"
    fc = log.forecasts.set_index("candidate_id")
    assert fc.loc["r1", "input_tokens"] == 4000 and not fc.loc["r1", "parse_failed"]
    assert fc.loc["r3", "parse_failed"]  # forecast_failed: a parse failure, kept
    ev = log.evaluations.set_index("candidate_id")
    assert ev.loc["r4", "outcome"] == "timeout" and ev.loc["r1", "speedup"] == 1.8
    assert dict(zip(log.candidates["candidate_id"], log.candidates["parent_id"]))["r4"] == "r1"
    # A filtered log replays its own rule; a deferred candidate cannot be measured.
    r = replay(log, make_policy("all"), load_cost_model("serverless-a100"))
    assert r.searches[0].unmeasurable >= 1


def test_cli_imports_validate_score_and_replay(tmp_path):
    out = tmp_path / "f.jsonl.gz"
    res = runner.invoke(app, ["import", "gpu-forecasters-events",
                              str(DATA / "filtered_events.jsonl"),
                              "-o", str(out), "--capacity", "gen=1,forecast=1,eval=1", "--json"])
    assert res.exit_code == 0, res.output
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0
    assert runner.invoke(app, ["replay", "--log", str(out), "--policy", "all"]).exit_code == 0
    res = runner.invoke(app, ["import", "gpu-forecasters-events",
                              str(DATA / "filtered_events.jsonl"),
                              "-o", str(out), "--capacity", "compile=2"])
    assert res.exit_code == 2 and "valid: gen, forecast, gpus" in res.output


def test_a_truncated_last_line_warns_and_a_corrupt_middle_line_is_named(tmp_path):
    text = (DATA / "standard_events.jsonl").read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[:-25])  # the last line cut mid-way
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_events(cut, tmp_path / "o.jsonl")
    assert any("truncated" in str(w.message) for w in caught)
    lines = text.splitlines()
    lines[5] = lines[5][:30]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(GfsimError, match=r"bad.jsonl:6: not valid JSON"):
        import_events(bad, tmp_path / "o2.jsonl")
    assert not (tmp_path / "o2.jsonl").exists()
    lines = text.splitlines()
    lines[3] = json.dumps({"kind": "mutation_exploded", "request_id": "x"})
    odd = tmp_path / "odd.jsonl"
    odd.write_text("\n".join(lines) + "\n")
    with pytest.raises(GfsimError, match=r"odd.jsonl:4: field 'kind': unknown event"):
        import_events(odd, tmp_path / "o3.jsonl")


def test_the_eval_set_becomes_a_pairs_log_for_score(tmp_path):
    s = import_eval_set(DATA / "eval_rows.jsonl", DATA / "eval_predictions.jsonl",
                        tmp_path / "e.jsonl")
    assert s["pairs"] == 6 and s["forecasts_per_forecaster"] == {"gemini3_flash": 12,
                                                                 "gpt_oss_20b_untrained": 12}
    log = load_log(tmp_path / "e.jsonl")
    assert log.shape == "pairs" and set(log.tasks) == {"trimul", "fp8_quant"}
    fc = log.forecasts
    assert fc["parse_failed"].sum() == 1 and set(fc["repeat"]) == {0, 1}
    res = runner.invoke(app, ["score", "--log", str(tmp_path / "e.jsonl"), "--json"])
    assert res.exit_code == 0, res.output
    # The same files as Parquet.
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in ("eval_rows", "eval_predictions"):
        rows = [json.loads(x) for x in (DATA / f"{name}.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    s2 = import_eval_set(tmp_path / "eval_rows.parquet", tmp_path / "eval_predictions.parquet",
                         tmp_path / "p.jsonl")
    assert s2["pairs"] == 6
    assert list(load_log(tmp_path / "p.jsonl").forecasts["forecaster"]) == list(fc["forecaster"])
    res = runner.invoke(app, ["import", "gpu-forecasters-eval-set", "-o", str(tmp_path / "x"),
                              "--rows", str(DATA / "eval_rows.jsonl")])
    assert res.exit_code == 2 and "--predictions" in res.output


def test_eval_set_errors_name_the_line(tmp_path):
    preds = (DATA / "eval_predictions.jsonl").read_text().splitlines()
    p = json.loads(preds[2])
    p["comparison_id"] = "zz"
    preds[2] = json.dumps(p)
    bad = tmp_path / "p.jsonl"
    bad.write_text("\n".join(preds) + "\n")
    with pytest.raises(GfsimError, match=r"p.jsonl:3: field 'comparison_id': 'zz' is not in"):
        import_eval_set(DATA / "eval_rows.jsonl", bad, tmp_path / "o.jsonl")


SETTINGS = settings(max_examples=int(os.environ.get("GFSIM_HYPOTHESIS_EXAMPLES", "40")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=st.data(), fname=st.sampled_from(["standard_events.jsonl", "filtered_events.jsonl",
                                               "standard_rows.jsonl", "eval_rows.jsonl",
                                               "eval_predictions.jsonl"]))
def test_importers_never_crash_on_mangled_lines(tmp_path_factory, json_values, data, fname):
    tmp = tmp_path_factory.mktemp("gf")
    lines = (DATA / fname).read_text().splitlines()
    i = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    how = data.draw(st.sampled_from(["bytes", "json", "field", "drop"]))
    if how == "bytes":
        new = data.draw(st.binary(min_size=1, max_size=16))
    elif how == "json":
        new = json.dumps(data.draw(json_values)).encode()
    else:
        rec = json.loads(lines[i])
        target = rec.get("payload") if isinstance(rec.get("payload"), dict) else rec
        key = data.draw(st.sampled_from(sorted(target)))
        if how == "drop":
            del target[key]
        else:
            target[key] = data.draw(json_values)
        new = json.dumps(rec).encode()
    raw = [x.encode() for x in lines]
    raw[i] = new
    src = tmp / fname
    src.write_bytes(b"\n".join(raw) + b"\n")
    out = tmp / "out.jsonl"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fname.startswith("eval_rows"):
                import_eval_set(src, DATA / "eval_predictions.jsonl", out)
            elif fname.startswith("eval_predictions"):
                import_eval_set(DATA / "eval_rows.jsonl", src, out)
            else:
                import_events(src, out, capacities=CAPS)
    except GfsimError as exc:
        msg = str(exc)  # names the mangled file, or the other input where it stops matching
        assert "\n" not in msg and msg.startswith((str(src), str(DATA))), msg
        assert not out.exists()
    else:
        load_log(out)
