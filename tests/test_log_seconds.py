"""The log's own evaluation seconds in a replay (issue 51, deliver 1): a whole evaluation's
seconds split across the stages that ran, priors only for what the log lacks, and cold starts
by the cost model's instance policy, stated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gfsim.core.errors import GfsimError
from gfsim.cost_models import load_cost_model
from gfsim.importers.openevolve import import_openevolve
from gfsim.policies.registry import make_policy
from gfsim.replay_logs.log import load_log
from gfsim.simulator.children import LogChildren
from gfsim.simulator.replay import replay
from gfsim.simulator.traces import build_traces
from gfsim.testing import LogBuilder

DATA = Path(__file__).parent / "data"
EVAL_STAGES = ("compilation", "check", "timing")


def _whole_seconds_log(tmp_path, evals, gen_s=1.0, cold=None) -> Path:
    """One search, a candidate a step: ``evals`` = [(outcome, wall_s, recorded stages)], the
    evaluation keeping only ``wall_s`` and the stages named in the dict."""
    b = LogBuilder(device_name="NVIDIA H100")
    parent = None
    for step, (outcome, wall_s, stages) in enumerate(evals):
        parent = b.candidate("t", step, parent=parent, outcome=outcome, speedup=1.1,
                             gen_s=gen_s)
        ev = b.records[-1]
        for k in ("cold_start_s", "compile_s", "check_s", "timing_s"):
            ev.pop(k)
        ev.update(stages, wall_s=wall_s)
        if cold is not None:
            ev["cold_start_s"] = cold
    return b.write(tmp_path / "log.jsonl")


@pytest.fixture(scope="module")
def openevolve_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("oe") / "oe.jsonl"
    import_openevolve(DATA / "openevolve" / "run", out, runtime_metric="runtime_ns")
    return load_log(out)


def _evaluated(t):
    return np.array([o is not None for o in t.outcome]) & ~np.asarray(t.gen_failed)


def test_openevolve_evaluation_seconds_are_the_logs_split_not_priors(openevolve_log):
    logged = openevolve_log.evaluations.set_index("candidate_id")["wall_s"].astype(float)
    (t,) = build_traces(openevolve_log, load_cost_model("serverless-a100"))
    ev = _evaluated(t)
    replayed = sum(np.asarray(t.stage_s[k])[ev] for k in EVAL_STAGES)
    by_id = dict(zip(np.array(t.candidate_ids)[ev], replayed))
    assert by_id.keys() == set(logged.index)
    for cid, secs in by_id.items():
        assert secs == pytest.approx(logged[cid])  # each evaluation its own logged seconds
    for k in EVAL_STAGES:  # recorded (split), not imputed: no USD rests on priors for them
        assert not np.asarray(t.stage_imputed[k])[ev].any()
        assert not t.price[k][2][ev].any()
    assert all(np.asarray(t.stage_split)[ev])


def test_the_split_follows_the_outcome_the_priors_proportions_and_recorded_stages(tmp_path):
    path = _whole_seconds_log(tmp_path, [("success", 16.0, {}),
                                         ("compile_failed", 3.0, {}),
                                         ("incorrect", 9.0, {}),
                                         ("runtime_error", 6.0, {"compile_s": 2.0})])
    (t,) = build_traces(load_log(path), load_cost_model("reserved-h100"))
    got = [tuple(t.stage_s[k][i] for k in EVAL_STAGES) for i in range(4)]
    assert got[0] == pytest.approx((2.0, 4.0, 10.0))  # 1:2:5 of the priors
    assert got[1] == pytest.approx((3.0, 0.0, 0.0))  # only compile ran
    assert got[2] == pytest.approx((3.0, 6.0, 0.0))  # compile and check, 1:2
    assert got[3] == pytest.approx((2.0, 4.0, 0.0))  # the recorded compile kept, the rest left
    assert t.stage_split == [True] * 4


def test_priors_fill_only_what_the_log_lacks(tmp_path):
    path = _whole_seconds_log(tmp_path, [("success", 16.0, {}), ("success", None, {})])
    model = load_cost_model("reserved-h100")
    (t,) = build_traces(load_log(path), model)
    assert [t.stage_imputed["timing"][i] for i in range(2)] == [False, True]
    assert t.stage_s["timing"][1] == model.priors.timing_s
    assert t.stage_split == [True, False]


def _cold_starts(path, spec):
    (t,) = build_traces(load_log(path), load_cost_model(spec))
    return [s for s, e in zip(t.stage_s["cold_start"], _evaluated(t)) if e]


def test_cold_starts_follow_the_instance_policy(tmp_path):
    evals = [("success", 8.0, {})] * 5
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    quick = _whole_seconds_log(tmp_path / "a", evals, gen_s=1.0)
    slow = _whole_seconds_log(tmp_path / "b", evals, gen_s=100.0)
    # Modal's default: a container stays warm 60 s; steps 1 s apart reuse it.
    assert _cold_starts(quick, "serverless-h100") == [30.0, 0, 0, 0, 0]
    # A generation longer than the window: each evaluation finds its container gone.
    assert _cold_starts(slow, "serverless-h100") == [30.0] * 5
    assert _cold_starts(quick, "serverless-h100:provider=runpod") == [30.0, 0, 0, 0, 0]
    assert _cold_starts(slow, "serverless-h100:provider=runpod") == [30.0] * 5
    # The paper's setup: a fresh container for every evaluation.
    assert _cold_starts(quick, "serverless-a100") == [30.0] * 5
    assert _cold_starts(quick, "serverless-h100:keep_warm=0") == [30.0] * 5
    assert _cold_starts(quick, "reserved-h100") == [0.0] * 5


def test_a_recorded_cold_start_is_kept(tmp_path):
    path = _whole_seconds_log(tmp_path, [("success", 20.0, {})] * 3, cold=4.0)
    assert _cold_starts(path, "serverless-h100") == [4.0] * 3
    (t,) = build_traces(load_log(path), load_cost_model("serverless-h100"))
    # the wall seconds less the recorded cold start are split
    assert sum(t.stage_s[k][0] for k in EVAL_STAGES) == pytest.approx(16.0)


def test_both_engines_charge_the_policy_s_cold_starts_and_the_replay_says_so(openevolve_log):
    model = load_cost_model("serverless-h100")
    runs = {engine: replay(openevolve_log, make_policy("all"), model, engine=engine,
                           orphans_dropped=False) for engine in ("des", "fast")}
    des, fast = (runs[e].searches[0] for e in ("des", "fast"))
    assert des.engine != fast.engine
    assert des.stages["cold_start"].seconds == fast.stages["cold_start"].seconds
    assert des.total.usd == pytest.approx(fast.total.usd)
    assert des.total.seconds == pytest.approx(fast.total.seconds)
    # fewer cold starts than evaluations: the container stays warm between steps
    assert 0 < des.stages["cold_start"].seconds < 30.0 * des.gpu_evals
    note = next(n for n in runs["fast"].notes if n.startswith("evaluation seconds"))
    assert "split from the log's whole-evaluation seconds (6.6 s)" in note
    assert "stays warm 60 s after its last evaluation" in note


def test_drawn_children_copy_their_template_s_logged_seconds(openevolve_log):
    model = load_cost_model("serverless-a100")
    (t,) = build_traces(openevolve_log, model)
    children = LogChildren(t).draw("seed", t.seed_speedup, 0, 4, seed=0)
    children += LogChildren(t).draw("seed", t.seed_speedup, 0, 12, seed=1)[-4:]  # fallback
    assert any(c.draw_source == "fallback" for c in children)
    index = {cid: i for i, cid in enumerate(t.candidate_ids)}
    logged = openevolve_log.evaluations.set_index("candidate_id")["wall_s"].astype(float)
    for c in children:
        if c.outcome is None:
            continue
        secs = sum(c.stage_s[k] for k in EVAL_STAGES)
        assert secs == pytest.approx(logged[c.template])
        assert c.price["timing"][2] == 0.0  # none of it imputed
        assert c.stage_s == {k: t.stage_s[k][index[c.template]] for k in c.stage_s}


def test_keep_warm_is_a_cost_spec_option_and_a_toml_key(tmp_path):
    assert load_cost_model("serverless-h100").keep_warm_s == 60.0
    assert load_cost_model("serverless-h100:provider=runpod").keep_warm_s == 5.0
    assert load_cost_model("serverless-a100").keep_warm_s == 0.0
    assert load_cost_model("serverless-a100:keep_warm=120").keep_warm_s == 120.0
    with pytest.raises(GfsimError, match="keep_warm applies to serverless presets only"):
        load_cost_model("reserved-h100:keep_warm=10")
    toml = tmp_path / "c.toml"
    toml.write_text('base = "serverless-h200"\nkeep_warm_s = 300\n')
    m = load_cost_model(str(toml))
    assert m.keep_warm_s == 300.0 and "user-supplied" in m.sources["keep_warm_s"]
    assert "300 s" in m.instance_policy()
    toml.write_text('base = "serverless-h200"\nkeep_warm_s = -1\n')
    with pytest.raises(GfsimError, match="keep_warm_s"):
        load_cost_model(str(toml))


def test_the_replay_json_carries_the_seconds_note(openevolve_log, tmp_path):
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    path = tmp_path / "oe.jsonl"
    path.write_bytes(Path(openevolve_log.path).read_bytes())
    out = CliRunner().invoke(app, ["replay", "--log", str(path), "--policy", "all", "--json"])
    assert out.exit_code == 0, out.output
    notes = json.loads(out.output)["notes"]
    note = next(n for n in notes if n.startswith("evaluation seconds"))
    assert "a fresh serverless container for every evaluation" in note
    assert "8 charged (0 the log's, 8 at the prior, 240 s)" in note


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page,args", [
    ("replay-openevolve.md", ["openevolve", "tests/data/openevolve/run", "--runtime-metric",
                              "runtime_ns", "--task", "softmax"]),
    ("replay-shinka.md", ["shinka", "tests/data/shinka/run", "--task", "softmax"]),
])
def test_the_replay_pages_show_the_fixtures_logged_and_replayed_seconds(page, args, tmp_path,
                                                                        monkeypatch):
    """The docs' table of logged versus replayed seconds is what the fixture gives now."""
    from typer.testing import CliRunner

    from gfsim.cli.main import app

    monkeypatch.chdir(ROOT)
    out = tmp_path / "log.jsonl"
    res = CliRunner().invoke(app, ["import", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = (ROOT / "docs" / "how-to" / page).read_text()

    def row(label):
        line = next(x for x in text.splitlines() if x.startswith(f"| {label} |"))
        return [c.strip() for c in line.strip("|").split("|")][1:]

    log = load_log(out)
    logged = float(log.evaluations["wall_s"].astype(float).sum())
    stages = row("compile + check + timing")
    assert float(stages[0].split()[0]) == pytest.approx(logged, abs=0.05)
    colds = row("cold starts")
    for cell, cold, spec in zip(stages[1:], colds[1:], ("serverless-a100", "serverless-h100",
                                                        "reserved-h100")):
        r = replay(log, make_policy("all"), load_cost_model(spec), orphans_dropped=False)
        s = r.searches[0].stages
        now = sum(s[k].seconds for k in EVAL_STAGES)
        assert float(cell.split("/")[1]) == pytest.approx(now, abs=0.05), (spec, cell)
        assert float(cold.split("/")[1].split()[0]) == pytest.approx(s["cold_start"].seconds)


def test_a_step_of_several_evaluations_starts_one_container_per_gpu_it_uses(tmp_path):
    b = LogBuilder(device_name="NVIDIA H100")
    root = b.candidate("t", 0, outcome="success", speedup=1.2, gen_s=1.0)
    for step in (1, 2):  # three children of the root a step, two GPUs
        for _ in range(3):
            b.candidate("t", step, parent=root, outcome="success", gen_s=1.0)
            b.records[-1].pop("cold_start_s")
    b.records[2].pop("cold_start_s")  # the root's evaluation: no recorded cold start either
    path = b.write(tmp_path / "log.jsonl")
    cold = _cold_starts(path, "serverless-h100:gpus=2")
    assert cold == [30.0, 30.0, 0, 0, 0, 0, 0]  # the root's container, then a second one
    assert _cold_starts(path, "serverless-h100:gpus=4") == [30.0, 30.0, 30.0, 0, 0, 0, 0]
