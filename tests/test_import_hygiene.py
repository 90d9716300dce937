"""Importers and outputs keep the user's files whole and private (issue 51): no command writes
over, or into, what it reads; KernelBench refuses a baseline of another GPU and a level the run
contradicts; headers keep a folder's name, not the user's path; the seconds and prices a run's
folder records reach the log; help and errors cite the documentation site."""

import hashlib
import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.replay_logs import load_log

DATA = Path(__file__).parent / "data"
KB = DATA / "kernelbench"
runner = CliRunner()


def _one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gfsim: error: "), res.output
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def runs(tmp_path):
    """Copies of every importer's fixture, so a refused write could be seen."""
    for name in ("shinka", "openevolve", "kernelbench", "search", "kernel_tuner",
                 "gpu_forecasters"):
        shutil.copytree(DATA / name, tmp_path / name)
    return tmp_path


# (arguments with {d} for the copies' folder, the input the output aims at)
OVER_INPUT = {
    "shinka database": (["import", "shinka", "{d}/shinka/run", "-o",
                         "{d}/shinka/run/programs.sqlite"], "shinka/run/programs.sqlite"),
    "shinka run folder": (["import", "shinka", "{d}/shinka/run", "-o", "{d}/shinka/run/x.jsonl"],
                          "shinka/run/programs.sqlite"),
    "openevolve run folder": (["import", "openevolve", "{d}/openevolve/run", "-o",
                               "{d}/openevolve/run/log.jsonl", "--runtime-metric",
                               "runtime_ns"], "openevolve/run/logs"),
    "kernelbench results": (["import", "kernelbench", "{d}/kernelbench/runs/list/eval_results.json",
                             "--baseline", "{d}/kernelbench/baseline_time_torch.json", "-o",
                             "{d}/kernelbench/runs/list/eval_results.json"],
                            "kernelbench/runs/list/eval_results.json"),
    "kernelbench run folder": (["import", "kernelbench",
                                "{d}/kernelbench/runs/list/eval_results.json", "--baseline",
                                "{d}/kernelbench/baseline_time_torch.json", "-o",
                                "{d}/kernelbench/runs/list/log.jsonl"],
                               "kernelbench/runs/list/generation_config.yaml"),
    "kernelbench baseline": (["import", "kernelbench", "{d}/kernelbench/runs/list", "--baseline",
                              "{d}/kernelbench/baseline_time_torch.json", "-o",
                              "{d}/kernelbench/baseline_time_torch.json"],
                             "kernelbench/baseline_time_torch.json"),
    "search file": (["import", "search", "{d}/search/small.jsonl", "-o",
                     "{d}/search/small.jsonl"], "search/small.jsonl"),
    "kernel tuner cache": (["import", "kernel-tuner", "{d}/kernel_tuner/tiny_cache.json", "-o",
                            "{d}/kernel_tuner/tiny_cache.json"], "kernel_tuner/tiny_cache.json"),
    "events": (["import", "gpu-forecasters-events", "{d}/gpu_forecasters/standard_events.jsonl",
                "-o", "{d}/gpu_forecasters/standard_events.jsonl"],
               "gpu_forecasters/standard_events.jsonl"),
    "eval-set rows": (["import", "gpu-forecasters-eval-set", "--rows",
                       "{d}/gpu_forecasters/eval_rows.jsonl", "--predictions",
                       "{d}/gpu_forecasters/eval_predictions.jsonl", "-o",
                       "{d}/gpu_forecasters/eval_predictions.jsonl"],
                      "gpu_forecasters/eval_predictions.jsonl"),
}


@pytest.mark.parametrize("case", list(OVER_INPUT))
def test_no_import_writes_over_or_into_what_it_reads(runs, case):
    args, aimed = OVER_INPUT[case]
    before = {p: _digest(p) for p in runs.rglob("*") if p.is_file()}
    res = runner.invoke(app, [a.format(d=runs) for a in args])
    line = _one_line_error(res)
    out = args[args.index("-o") + 1].format(d=runs)
    assert out in line and ("--out" in line)
    assert "reads" in line  # names both: the output, and the input or folder it hits
    after = {p: _digest(p) for p in runs.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing replaced
    assert (runs / aimed).exists()


def test_an_output_linked_to_an_input_is_refused_too(runs, tmp_path):
    db = runs / "shinka" / "run" / "programs.sqlite"
    link = tmp_path / "elsewhere.sqlite"
    link.symlink_to(db)
    hard = tmp_path / "hard.jsonl"
    os.link(runs / "search" / "small.jsonl", hard)
    for args in (["import", "shinka", str(db.parent), "-o", str(link)],
                 ["import", "search", str(runs / "search" / "small.jsonl"), "-o", str(hard)]):
        before = _digest(Path(args[2]) if args[1] == "search" else db)
        line = _one_line_error(runner.invoke(app, args))
        assert args[-1] in line
        assert _digest(Path(args[2]) if args[1] == "search" else db) == before


def test_other_commands_refuse_an_output_over_their_log(tmp_path):
    log = tmp_path / "t.jsonl"
    shutil.copy(DATA / "tiny.jsonl", log)
    digest = _digest(log)
    (tmp_path / "c.csv").symlink_to(log)
    (tmp_path / "p.png").symlink_to(log)
    os.link(log, tmp_path / "hard.jsonl")
    settings = tmp_path / "settings.toml"
    settings.write_text("")
    for args in (["replay", "--log", str(log), "--policy", "all", "--candidates-out",
                  str(tmp_path / "c.csv")],
                 ["replay", "--log", str(log), "--policy", "all", "--plot",
                  str(tmp_path / "p.png")],
                 ["score", "--log", str(log), "--plot", str(tmp_path / "p.png")],
                 ["forecast", "--log", str(log), "-f", "paper:gemini3-flash", "-o",
                  str(tmp_path / "hard.jsonl")],
                 ["live", "-o", str(settings), "--config", str(settings), "--measurer",
                  "interpret"]):
        line = _one_line_error(runner.invoke(app, args))
        assert "this command reads" in line, line
    assert _digest(log) == digest and settings.read_text() == ""


def test_kernelbench_refuses_a_baseline_timed_on_another_gpu_unless_forced(tmp_path):
    base = json.loads((KB / "baseline_time_torch.json").read_text())
    for stats in base["level1"].values():
        stats["hardware"] = "NVIDIA A100-SXM4-80GB"
    (tmp_path / "a100.json").write_text(json.dumps(base))
    args = ["import", "kernelbench", str(KB / "runs" / "list"), "--baseline",
            str(tmp_path / "a100.json"), "-o", str(tmp_path / "log.jsonl")]
    line = _one_line_error(runner.invoke(app, args))
    assert "NVIDIA A100-SXM4-80GB" in line and "NVIDIA H100 80GB HBM3" in line
    assert "--force" in line and not (tmp_path / "log.jsonl").exists()
    res = runner.invoke(app, args + ["--force"])
    assert res.exit_code == 0, res.output
    kb = load_log(tmp_path / "log.jsonl").header["provenance"]["kernelbench"]
    assert kb["hardware"] == {"results": ["NVIDIA H100 80GB HBM3"],
                              "baseline": ["NVIDIA A100-SXM4-80GB"]}
    assert "--force" in kb["forced"]


def test_kernelbench_refuses_a_level_the_run_contradicts_unless_forced(tmp_path):
    base = json.loads((KB / "baseline_time_torch.json").read_text())
    base["level2"] = base["level1"]  # a baseline that has the problems at level 2 as well
    (tmp_path / "b.json").write_text(json.dumps(base))
    args = ["import", "kernelbench", str(KB / "runs" / "list"), "--baseline",
            str(tmp_path / "b.json"), "-o", str(tmp_path / "log.jsonl"), "--level", "2"]
    line = _one_line_error(runner.invoke(app, args))
    assert "--level 2" in line and "level 1" in line and "generation_config.yaml" in line
    assert not (tmp_path / "log.jsonl").exists()
    assert runner.invoke(app, args + ["--force"]).exit_code == 0
    assert load_log(tmp_path / "log.jsonl").candidates["task_id"].str.startswith("level2/").all()
    line = _one_line_error(runner.invoke(app, [
        "import", "kernelbench", str(KB / "runs" / "by_level"), "--baseline",
        str(tmp_path / "b.json"), "-o", str(tmp_path / "other.jsonl"), "--level", "2"]))
    assert "--level 2" in line and "(1)" in line


IMPORTS = {
    "search": ["import", "search", "{d}/search/small.jsonl"],
    "kernel-tuner": ["import", "kernel-tuner", "{d}/kernel_tuner/tiny_cache.json"],
    "openevolve": ["import", "openevolve", "{d}/openevolve/run", "--runtime-metric",
                   "runtime_ns"],
    "shinka": ["import", "shinka", "{d}/shinka/run"],
    "kernelbench": ["import", "kernelbench", "{d}/kernelbench/runs/list", "--baseline",
                    "{d}/kernelbench/baseline_time_torch.json"],
    "events": ["import", "gpu-forecasters-events", "{d}/gpu_forecasters/standard_events.jsonl"],
    "eval-set": ["import", "gpu-forecasters-eval-set", "--rows",
                 "{d}/gpu_forecasters/eval_rows.jsonl", "--predictions",
                 "{d}/gpu_forecasters/eval_predictions.jsonl"],
}


@pytest.mark.parametrize("name", list(IMPORTS))
def test_a_log_keeps_no_absolute_path_of_the_users_folders(runs, tmp_path, name):
    out = tmp_path / "out" / "log.jsonl"
    out.parent.mkdir()
    res = runner.invoke(app, [a.format(d=runs) for a in IMPORTS[name]] + ["-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert str(runs) not in text and str(runs.resolve()) not in text
    header = json.loads(text.splitlines()[0])
    assert json.dumps(header["provenance"]).count("/") < 20  # names, not paths


def test_shinka_prices_and_dollars_reach_the_header(runs, tmp_path):
    run = runs / "shinka" / "run"
    # a pricing_snapshot.json as ShinkaEvolve writes it (its catalog, USD per token)
    (run / "pricing_snapshot.json").write_text(json.dumps({
        "source": "live", "fetched_at": "2026-12-01T10:00:00Z", "etag": None, "sha256": "ab",
        "stale": False, "catalog_sha256": "cd",
        "catalog": [{"model_name": "local/tiny@http://127.0.0.1:8019/v1",
                     "api_model_name": "tiny", "provider": "local", "kind": "llm",
                     "input_price": 2e-7, "output_price": 8e-7},
                    {"model_name": "gpt-x", "api_model_name": "gpt-x", "provider": "openai",
                     "kind": "llm", "input_price": 1e-6, "output_price": 4e-6}]}))
    out = tmp_path / "log.jsonl"
    assert runner.invoke(app, ["import", "shinka", str(run), "-o", str(out)]).exit_code == 0
    gen = load_log(out).header["generator"]
    assert gen["models"]["local/tiny@http://127.0.0.1:8019/v1"] == 8
    prices = gen["prices"]
    assert "pricing_snapshot.json" in prices["source"] and "live" in prices["source"]
    assert prices["usd_per_million_tokens"] == {
        "local/tiny@http://127.0.0.1:8019/v1": {"input": 0.2, "output": 0.8}}
    assert prices["unpriced"] == ["local/gfsim-mutation-operator@http://127.0.0.1:41679/v1"]
    assert "api_costs" in gen["usd_paid"]["source"] and gen["usd_paid"]["llm"] >= 0
    (run / "pricing_snapshot.json").write_text('{"catalog": 3}')
    line = _one_line_error(runner.invoke(app, ["import", "shinka", str(run), "-o",
                                               str(tmp_path / "x.jsonl")]))
    assert "pricing_snapshot.json" in line and "catalog" in line


def test_every_second_the_run_folders_record_reaches_the_log(tmp_path):
    from gfsim.importers.openevolve import import_openevolve
    from gfsim.importers.shinka import import_shinka

    import_shinka(DATA / "shinka" / "run", tmp_path / "s.jsonl")
    log = load_log(tmp_path / "s.jsonl")
    measured = log.evaluations
    assert measured["wall_s"].notna().all()  # metadata.evaluation_seconds, every program
    programs = log.candidates[log.candidates["candidate_id"].isin(measured["candidate_id"])]
    assert programs["gen_service_s"].notna().all()  # metadata.sampling_seconds
    # a failed proposal's LLM call: its attempt_log details' sampling timestamps (4 in the run)
    failed = log.candidates[log.candidates["candidate_id"].str.startswith("attempt-")]
    assert len(failed) == 4 and (failed["gen_service_s"] > 1.0).all()
    assert failed["gen_service_s"].sum() == pytest.approx(26.8, abs=0.05)
    import_openevolve(DATA / "openevolve" / "run", tmp_path / "o.jsonl",
                      runtime_metric="runtime_ns")
    log = load_log(tmp_path / "o.jsonl")
    assert log.evaluations["wall_s"].notna().all()  # "Evaluated program ... in Es"
    assert json.dumps(log.header["generator"]["models"]) != "{}"
    # programs only the log names (no checkpoint kept them) keep their seconds too: the
    # iteration's, the evaluation's, and the generation's (their difference)
    cands = log.candidates.to_dict("records")
    named = [c for c in cands if "named by the log" in str(c["extra"])]
    assert len(named) == 6
    for c in named:
        extra = c["extra"] if isinstance(c["extra"], dict) else json.loads(c["extra"])
        oe = extra["openevolve"]
        assert c["gen_service_s"] == pytest.approx(oe["iteration_s"] - oe["evaluation_s"])


def test_kernelbench_keeps_the_seconds_it_timed(tmp_path):
    from gfsim.importers.kernelbench import import_kernelbench

    import_kernelbench(KB / "runs" / "list", tmp_path / "k.jsonl",
                       baseline=KB / "baseline_time_torch.json")
    extras = {c["candidate_id"]: (c["extra"] if isinstance(c["extra"], dict)
                                  else json.loads(c["extra"]))
              for c in load_log(tmp_path / "k.jsonl").candidates.to_dict("records")}
    assert extras["L1-P1-S0"]["kernelbench"]["timed_runs_s"] == pytest.approx(100 * 2.9 / 1e3)
    # the GPU the results record names the log's hardware where --device is not given
    header = load_log(tmp_path / "k.jsonl").header
    assert header["hardware"]["device_name"] == "NVIDIA H100 80GB HBM3"


def test_help_and_the_package_point_at_the_documentation_site():
    from gfsim.core.docs import DOCS_URL, cite_docs, docs_url

    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["urls"]["Documentation"] == DOCS_URL
    mkdocs = (Path(__file__).parents[1] / "mkdocs.yml").read_text()
    assert f"site_url: {DOCS_URL}\n" in mkdocs
    assert docs_url("docs/how-to/replay-shinka.md") == DOCS_URL + "how-to/replay-shinka/"
    assert cite_docs("see docs/index.md.") == f"see {DOCS_URL}."
    for args in (["-h"], ["import", "shinka", "-h"], ["import", "openevolve", "-h"],
                 ["import", "kernelbench", "-h"], ["import", "search", "-h"]):
        res = runner.invoke(app, args, terminal_width=200)
        assert res.exit_code == 0 and DOCS_URL in res.output, res.output
        assert ".md" not in res.output, res.output


@pytest.mark.parametrize("name, args", [
    ("openevolve", ["import", "openevolve", ".", "--runtime-metric", "runtime_ns"]),
    ("shinka", ["import", "shinka", "."]),
])
def test_a_run_given_as_dot_is_named_by_its_folder(runs, tmp_path, monkeypatch, name, args):
    monkeypatch.chdir(runs / name / "run")  # `gfsim import ... .` from inside the run folder
    out = tmp_path / "log.jsonl"
    res = runner.invoke(app, args + ["-o", str(out)])
    assert res.exit_code == 0, res.output  # (an empty log_id failed validation before)
    header = load_log(out).header
    assert header["log_id"] == "run" and header["provenance"]["source"] == "run"
