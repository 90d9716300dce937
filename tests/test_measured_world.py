"""The measured H200 worlds (``gfsim.worlds.measured``): the shipped tables load and conform,
children come from the measured neighbourhood, the measurements are the table's, and a bad
table is refused in one line naming the file, line and field."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import GfsimError
from gfsim.core.spaces import neighbours, point_key
from gfsim.worlds.conformance import check_world
from gfsim.worlds.measured import MeasuredWorld, load_table, shipped_tables
from gfsim.worlds.protocol import resolve_world

runner = CliRunner()
TASKS = shipped_tables()


def test_three_tables_ship_each_a_uniform_sample_of_a_space_measured_on_an_h200():
    assert {"softmax", "layernorm", "fp8_quant"} <= set(TASKS)
    for name in TASKS:
        t = load_table(name)
        assert t.header["hardware"]["device_name"] == "NVIDIA H200"
        assert t.header["measurer"]["clock"] in ("auto", "gpu")
        rows = list(t.first.values())
        assert all(r.get("timing_clock") == "gpu" for r in rows if r["outcome"] == "success")
        assert len(t.first) >= 100 and len(t.measured) >= len(t.first)
        # noise: the re-measured kernels moved by a few percent at most
        noise = t.noise()
        assert noise["remeasured"] >= 5 and noise["max_abs_log2"] < 0.1


@pytest.mark.parametrize("name", TASKS)
def test_a_measured_world_conforms(name):
    label, factory, seeded = resolve_world(f"h200:{name}")
    assert seeded and label == f"h200:{name}"
    assert check_world(factory(3), factory, seed=3) == []


def test_children_are_measured_neighbours_and_carry_the_tables_measurement():
    world = MeasuredWorld(["softmax"], seed=1)
    (tid,) = [t.task_id for t in world.tasks]
    table = world.tables[tid]
    root = world.root(tid)
    assert root.outcome == "success"
    p = table.points[root.state[0]]
    hood = {point_key(v, q) for v, q in neighbours(table.space, table.defaults, p["variant"],
                                                     p["params"], *table.radii)}
    seen = set()
    for i in range(200):
        child = world.child(root, i)
        key = child.state[0]
        assert key in hood and key in table.measured
        m = table.measurement(key)
        assert child.code_id == table.points[key]["binary"]
        ev = world.evaluation(child)
        assert ev["outcome"] == m["outcome"]
        if m["outcome"] == "success":
            assert ev["speedup"] == pytest.approx(m["speedup"], rel=1e-5)
            assert ev["runtime_ns"] == pytest.approx(world.task(tid).reference_runtime_ns
                                                     / ev["speedup"], rel=1e-6)
        assert ev["compile_s"] == pytest.approx(m["compile_s"], abs=1e-5)
        assert ev["cold_start_s"] == 0.0
        seen.add(key)
    assert len(seen) > 40  # the wide neighbourhood, not a handful of kernels
    assert world.child(root, 7) == world.child(root, 7)
    roots = {MeasuredWorld(["softmax"], seed=s).root(tid).state for s in range(8)}
    assert len(roots) > 1  # the seed kernel is drawn by the world seed


def test_provenance_says_what_is_measured_and_what_is_assumed():
    prov = MeasuredWorld(TASKS).provenance()
    assert prov["kind"] == "measured" and "SYNTHETIC" in prov["note"]
    assert prov["device_name"] == "NVIDIA H200"
    for t in prov["tables"]:
        assert 0 < t["coverage"] <= 1 and t["measured_points"] <= t["points"]
        assert t["hardware"]["triton"]


def test_synth_and_counterfactual_run_on_a_measured_world(tmp_path):
    out = tmp_path / "h200.jsonl"
    res = runner.invoke(app, ["synth", "--world", "h200:fp8_quant", "--driver", "puct",
                              "--steps", "4", "--seed", "2", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    from gfsim.replay_logs import load_log

    log = load_log(out, cache=False)
    assert log.header["hardware"]["device_name"] == "NVIDIA H200"
    assert log.header["provenance"]["kind"] == "measured"
    res = runner.invoke(app, ["counterfactual", "--world", "h200:softmax", "--seeds", "2",
                              "--steps", "3", "--policies", "all,topk:2", "--overgen", "1,2",
                              "--replay-seeds", "1", "--direct-reps", "2", "--jobs", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    (w,) = json.loads(res.stdout)["worlds"]
    assert w["kind"] == "measured" and len(w["cells"]) == 4
    for c in w["cells"]:
        assert math.isfinite(c["direct_log2"]["mean"])


def test_counterfactual_with_the_learned_cost_model_on_a_measured_world():
    """The direct runs and the replays read the cost model learned in each search: with it a
    forecast-reading policy decides differently from the world's what-if forecasts."""
    args = ["counterfactual", "--world", "h200:softmax", "--seeds", "2", "--steps", "4",
            "--policies", "all,topk:2", "--overgen", "1,4", "--replay-seeds", "1",
            "--direct-reps", "2", "--jobs", "1", "--json"]
    runs = {}
    for fc in (None, "costmodel"):
        res = runner.invoke(app, args + (["--forecaster", fc] if fc else []))
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["spec"]["forecaster"] == fc
        runs[fc] = {(c["policy"], c["overgen"]): c for c in out["worlds"][0]["cells"]}
    for cell in (("all", 1), ("all", 4)):  # no forecast read: the same searches
        assert runs[None][cell]["direct_log2"] == runs["costmodel"][cell]["direct_log2"]
    for f in (1, 4):  # topk:2 reads forecasts (it measures 2 of 4 children at F = 1)
        assert runs[None][("topk:2", f)]["direct_log2"] != \
            runs["costmodel"][("topk:2", f)]["direct_log2"]
    res = runner.invoke(app, args + ["--forecaster", "paper:gemini3-flash"])
    assert res.exit_code == 2 and "the learned forecaster's" in res.output


def _copy(tmp_path: Path, name: str = "layernorm") -> Path:
    src = load_table(name).path
    for suffix in ("", ".binaries", ".reference"):
        shutil.copy(src.parent / f"{name}{suffix}.jsonl.gz", tmp_path)
    return tmp_path / f"{name}.jsonl.gz"


def _rewrite(path: Path, edit) -> None:
    lines = gzip.open(path, "rt").read().splitlines()
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(edit(lines)) + "\n")


@pytest.mark.parametrize("edit, words", [
    (lambda L: L[1:], ":1: expected a header"),
    (lambda L: [json.dumps({k: v for k, v in json.loads(L[0]).items() if k != "space"})]
     + L[1:], ":1: field space: missing"),
    (lambda L: L[:3] + ['{"kind": "measurement", "binary_sha256": "x", "outc'], ":4: not JSON"),
    (lambda L: L[:2] + [json.dumps({**json.loads(L[1]), "speedup": -1})] + L[3:],
     ":3: field speedup"),
    (lambda L: L[:2] + [json.dumps({k: v for k, v in json.loads(L[1]).items()
                                    if k != "outcome"})] + L[3:], ":3: field outcome: missing"),
])
def test_a_bad_table_is_one_line_naming_file_line_and_field(tmp_path, edit, words):
    path = _copy(tmp_path)
    _rewrite(path, edit)
    with pytest.raises(GfsimError) as err:
        MeasuredWorld([str(path)])
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and words in msg, msg


def test_a_missing_binaries_table_or_task_is_named(tmp_path):
    path = _copy(tmp_path)
    (tmp_path / "layernorm.binaries.jsonl.gz").unlink()
    with pytest.raises(GfsimError, match="binaries table"):
        MeasuredWorld([str(path)])
    res = runner.invoke(app, ["counterfactual", "--world", "h200:nope", "--seeds", "2"])
    assert res.exit_code != 0 and "no such measured table" in res.output
    assert "softmax" in res.output  # the shipped ones are listed
