"""gfsim import kernelbench: every shape KernelBench's eval_results.json has had (the fixture is
made by hand in its writers' formats: tests/data/kernelbench/PROVENANCE.md)."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.importers.kernelbench import import_kernelbench
from gfsim.replay_logs import load_log

DATA = Path(__file__).parent / "data" / "kernelbench"
BASE = DATA / "baseline_time_torch.json"


def evaluations(path):
    log = load_log(path)
    ev = log.evaluations.set_index("candidate_id")
    return log, ev


def test_the_current_shape_imports_every_sample_with_kernelbenchs_speedup(tmp_path):
    s = import_kernelbench(DATA / "runs" / "list", tmp_path / "log.jsonl", baseline=BASE,
                           provenance="synthetic")
    assert s["shape"] == "list" and s["problems"] == 4 and s["candidates"] == 10
    assert s["outcomes"] == {"success": 5, "compile_failed": 1, "incorrect": 1,
                             "runtime_error": 1, "timeout": 1, "not_measured": 1}
    log, ev = evaluations(tmp_path / "log.jsonl")
    assert ev.loc["L1-P1-S0", "speedup"] == pytest.approx(2.66 / 2.9)  # baseline mean / runtime
    assert ev.loc["L1-P19-S1", "speedup"] == pytest.approx(0.0183 / 0.0009)
    assert ev.loc["L1-P2-S0", "outcome"] == "incorrect"
    assert ev.loc["L1-P2-S1", "outcome"] == "runtime_error"
    assert ev.loc["L1-P2-S2", "outcome"] == "timeout"
    assert "invalid syntax" in str(ev.loc["L1-P1-S1", "extra"])
    cands = log.candidates.set_index("candidate_id")
    assert cands.loc["L1-P23-S1", "status"] == "deferred"  # correct, never timed
    assert cands["parent_id"].isna().all()  # every sample a child of the reference
    assert cands.loc["L1-P19-S0", "task_id"] == "level1/19_ReLU"
    assert log.header["provenance"]["kind"] == "synthetic"
    flagged = json.loads(cands.loc["L1-P19-S1", "extra"]) if isinstance(
        cands.loc["L1-P19-S1", "extra"], str) else cands.loc["L1-P19-S1", "extra"]
    assert flagged["kernelbench"]["excessive_speedup"] is True


def test_the_old_and_the_forks_shapes(tmp_path):
    s = import_kernelbench(DATA / "runs" / "sample" / "eval_results.json", tmp_path / "a.jsonl",
                           baseline=BASE, level=1)
    assert s["shape"] == "sample" and s["outcomes"] == {"success": 2, "compile_failed": 1}
    _, ev = evaluations(tmp_path / "a.jsonl")
    assert ev.loc["L1-P23-S0", "speedup"] == pytest.approx(0.0471 / 0.0512)
    s = import_kernelbench(DATA / "runs" / "by_level", tmp_path / "c.jsonl", baseline=BASE)
    assert s["shape"] == "by_level" and s["outcomes"] == {"success": 2, "incorrect": 1}


@pytest.mark.parametrize("policy", ["all", "threshold:0.7"])
def test_the_results_replay_open_loop(tmp_path, policy):
    import_kernelbench(DATA / "runs" / "list", tmp_path / "log.jsonl", baseline=BASE)
    args = ["replay", "--log", str(tmp_path / "log.jsonl"), "--policy", policy, "--json"]
    if policy != "all":
        args += ["--forecaster", "paper:gemini3-flash"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    if policy == "all":
        assert out["gpu_evals"] == 9  # all but the one never timed
        # geometric mean over the four problems of each problem's best
        best = [2.66 / 2.31, 1.0, 0.0183 / 0.0009, 0.0471 / 0.0392]
        assert out["best_speedup"] == pytest.approx(
            (best[0] * best[1] * best[2] * best[3]) ** 0.25)
    else:
        assert out["gpu_evals"] <= 9


def _copy(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(DATA / "runs" / "list", run)
    return run


def _edit(run: Path, change) -> None:
    data = json.loads((run / "eval_results.json").read_text())
    change(data)
    (run / "eval_results.json").write_text(json.dumps(data))


@pytest.mark.parametrize("break_it, words", [
    (lambda run: (run / "eval_results.json").write_text('{"1": [{"compiled": true, '),
     ["eval_results.json", "not valid JSON"]),
    (lambda run: _edit(run, lambda d: d["2"][1].pop("correctness")),
     ["problem 2, sample 1", "field 'correctness'"]),
    (lambda run: _edit(run, lambda d: d.update({"77": [d["1"][0]]})),
     ["problem 77", "not in the baseline"]),
    (lambda run: _edit(run, lambda d: d.update({"x": [d["1"][0]]})),
     ["problem key 'x'"]),
    (lambda run: (run / "generation_config.yaml").unlink(),
     ["level is not known", "--level"]),
    (lambda run: (run / "eval_results.json").write_text('{"1": "done"}'),
     ["not a shape of KernelBench's eval_results.json"]),
])
def test_bad_input_is_one_line_naming_file_problem_sample_and_field(tmp_path, break_it, words):
    run = _copy(tmp_path)
    break_it(run)
    out = tmp_path / "log.jsonl"
    res = CliRunner().invoke(app, ["import", "kernelbench", str(run), "--baseline", str(BASE),
                                   "-o", str(out)])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), res.output
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


def test_a_baseline_without_a_mean_is_named(tmp_path):
    base = json.loads(BASE.read_text())
    del base["level1"]["19_ReLU.py"]["mean"]
    (tmp_path / "b.json").write_text(json.dumps(base))
    res = CliRunner().invoke(app, ["import", "kernelbench", str(DATA / "runs" / "list"),
                                   "--baseline", str(tmp_path / "b.json"),
                                   "-o", str(tmp_path / "log.jsonl")])
    assert res.exit_code != 0
    assert "level1, 19_ReLU.py: field 'mean'" in res.output
