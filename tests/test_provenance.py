"""Provenance where people read (issue 38, item 5): whose forecasts a replay, a savings
estimate, a tuning study or a score rests on; a shipped log's known caveats; a log priced as
another GPU's."""

import json

import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.cost_models import load_cost_model
from gfsim.forecasts.whatif import attach, parse_whatif
from gfsim.replay_logs import load_log, open_log
from gfsim.testing import LogBuilder

runner = CliRunner()


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


def text(res) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(res.output.split())


def measured_log(tmp_path, *, device="NVIDIA H200", forecasts=False, name="measured.jsonl"):
    """A tiny log measured (so its header says) on ``device``; with ``forecasts``, a logged
    LLM forecaster ``f`` (mode tool) forecast every candidate."""
    b = LogBuilder({"a": 1.0, "b": 1.0}, provenance_kind="measured", device_name=device)
    b.header["label_bin_convention"] = "paper"
    probs = (lambda k: LogBuilder.onehot(k, 0.7)) if forecasts else (lambda k: None)
    for task in ("a", "b"):
        root = b.candidate(task, 0, speedup=1.3, probs=probs(5))
        for step, s in enumerate((0.6, 2.5, 1.1, 5.0), start=1):
            b.candidate(task, step, parent=root, speedup=s, probs=probs(step + 2))
        b.candidate(task, 5, parent=root, outcome="compile_failed", speedup=None,
                    probs=probs(4))
    return b.write(tmp_path / name)


@pytest.fixture
def whatif_log(tmp_path):
    """A measured log with what-if forecasts written into it by `gfsim forecast`."""
    out = tmp_path / "whatif.jsonl.gz"
    invoke("forecast", "--log", measured_log(tmp_path), "--forecaster", "paper:gemini3-flash",
           "--out", out)
    return out


def test_score_labels_what_if_forecasts_on_a_measured_log_synthetic(whatif_log):
    res = invoke("score", "--log", whatif_log)
    assert "(measured)" in res.output  # the log's timings are measured ...
    out = text(res)
    # ... its forecasts are not Gemini's answers, and the text says so beside the column.
    assert "paper:gemini3-flash (SYNTHETIC)" in out
    assert "SYNTHETIC what-if forecasts (paper:gemini3-flash)" in out
    assert "not gemini3-flash's answers" in out
    js = json.loads(invoke("score", "--log", whatif_log, "--json").output)
    assert js["forecast_source"] == {**js["forecast_source"], "forecaster": "paper:gemini3-flash",
                                     "kind": "whatif", "synthetic": True}


def test_replay_says_the_policy_reads_synthetic_what_if_forecasts(tmp_path, whatif_log):
    for args in (("--log", whatif_log),  # recorded in the log
                 ("--log", measured_log(tmp_path), "--forecaster", "paper:gemini3-flash")):
        out = text(invoke("replay", *args, "--policy", "threshold:0.7"))
        assert "forecasts the policy reads: SYNTHETIC what-if forecasts (paper:gemini3-flash)" \
            in out
        js = json.loads(invoke("replay", *args, "--policy", "threshold:0.7", "--json").output)
        assert js["forecast_source"]["kind"] == "whatif" and js["forecast_source"]["synthetic"]
        assert any("SYNTHETIC" in n for n in js["notes"])


def test_a_logged_llm_and_the_cost_model_are_not_called_synthetic(tmp_path):
    from gfsim.forecasts.provenance import forecast_source

    log = load_log(measured_log(tmp_path, forecasts=True))
    src = forecast_source(log)
    assert (src["forecaster"], src["kind"], src["synthetic"]) == ("f", "llm", False)
    assert "SYNTHETIC" not in src["text"] and "logged LLM forecaster (f" in src["text"]
    out = text(invoke("replay", "--log", log.path, "--policy", "threshold:0.7"))
    assert "forecasts the policy reads: a logged LLM forecaster (f" in out
    assert "SYNTHETIC" not in out
    # The policy `all` reads none, whatever the log holds.
    assert forecast_source(log, read=False)["kind"] == "none"
    cm = forecast_source(open_log("h200-costmodel-all"))
    assert (cm["kind"], cm["synthetic"]) == ("learned", False)
    assert forecast_source(load_log(measured_log(tmp_path, name="none.jsonl")))["kind"] == "none"


def test_forecasts_of_a_synthetic_log_are_synthetic_whatever_their_mode(tmp_path):
    from gfsim.forecasts.provenance import forecast_source

    b = LogBuilder({"a": 1.0})  # provenance synthetic, forecaster f in mode tool
    b.candidate("a", 0, speedup=1.5, probs=LogBuilder.onehot(5))
    src = forecast_source(load_log(b.write(tmp_path / "s.jsonl")))
    assert (src["kind"], src["synthetic"]) == ("synthetic", True)
    assert src["text"].startswith("SYNTHETIC")
    # A what-if spec drawn in memory is what-if by its records' mode, and by its name alone.
    log = load_log(measured_log(tmp_path))
    drawn = attach(log, parse_whatif("synthetic:sigma=0.5"))
    assert forecast_source(drawn, "synthetic:sigma=0.5")["kind"] == "whatif"


def test_savings_and_tune_say_where_the_forecasts_came_from(tmp_path, whatif_log):
    sv = json.loads(invoke("savings", "--log", whatif_log, "--seeds", 2, "--json").output)
    assert sv["forecast_source"]["kind"] == "whatif" and sv["forecast_source"]["synthetic"]
    out = text(invoke("savings", "--log", whatif_log, "--seeds", 2))
    assert "forecasts the policy reads: SYNTHETIC what-if" in out
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    tune = ("tune", "--log", whatif_log, "--param", "tau=0.5:0.9", "--trials", 1, "--seeds", 1,
            "--validate-seeds", 0, "--storage", storage)
    js = json.loads(invoke(*tune, "--json").output)
    assert js["forecast_source"]["kind"] == "whatif" and js["forecast_source"]["synthetic"]
    assert "forecasts the policy reads: SYNTHETIC what-if" in text(invoke(*tune))


def test_the_fp8_caveat_of_h200_live_v1_shows_in_logs_and_in_its_replay():
    out = text(invoke("replay", "--log", "h200-live-v1", "--policy", "threshold:0.7"))
    assert "known caveat of h200-live-v1: the baseline timings of this log drift" in out
    assert "fp8 seed-0 speedups of its first 5 steps (up to 102x) rest on an inflated " \
           "baseline" in out
    listed = text(invoke("logs"))
    assert "caveat, h200-live-v1: the baseline timings of this log drift" in listed
    rows = {r["name"]: r for r in json.loads(invoke("logs", "--json").output)}
    from gfsim.replay_logs import SHIPPED_CAVEATS

    assert any("inflated baseline" in c and "fp8" in c for c in SHIPPED_CAVEATS["h200-live-v1"])
    assert rows["h200-live-v1"]["caveats"] == list(SHIPPED_CAVEATS["h200-live-v1"])
    assert rows["synthetic-puct-v1"]["caveats"] == []


def test_an_h200_log_priced_as_an_a100_gets_a_note_and_as_an_h200_none(tmp_path):
    path = measured_log(tmp_path)
    out = text(invoke("replay", "--log", path, "--policy", "all"))  # default serverless-a100
    assert ("log measured on NVIDIA H200; priced as serverless-a100 (A100-80GB): the seconds "
            "the log recorded are NVIDIA H200's, not rescaled, those it did not record come "
            "from the cost model's priors (see the imputed share), and the prices are another "
            "GPU's; pass --cost serverless-h200") in out
    assert "timings are the log's" not in out  # it said so of seconds it took from priors
    same = invoke("replay", "--log", path, "--policy", "all", "--cost", "serverless-h200")
    assert "log measured on" not in text(same)
    js = json.loads(invoke("replay", "--log", path, "--policy", "all", "--cost",
                           "reserved-h200", "--json").output)
    assert js["hardware_note"] is None
    from gfsim.forecasts.provenance import hardware_note

    log = load_log(path)
    assert "--cost reserved-h200" in hardware_note(log, load_cost_model("reserved-a100"))


def test_no_hardware_note_where_either_gpu_is_unknown(tmp_path):
    from gfsim.forecasts.provenance import hardware_note

    a100 = load_cost_model("serverless-a100")
    assert hardware_note(load_log(measured_log(tmp_path, device="test-gpu")), a100) is None
    # A synthetic log measured nothing, whatever its header's device name.
    b = LogBuilder({"a": 1.0}, device_name="NVIDIA H200")
    b.candidate("a", 0, speedup=1.5)
    assert hardware_note(load_log(b.write(tmp_path / "s.jsonl")), a100) is None
    a100_log = load_log(measured_log(tmp_path, device="NVIDIA A100-SXM4-80GB", name="a.jsonl"))
    assert hardware_note(a100_log, a100) is None
