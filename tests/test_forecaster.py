"""The live forecaster: prompt and parsing offline; both modes against a real vLLM server; faults
injected with a loopback proxy between client and server; ``gfsim forecast`` end to end."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from gfsim.cli.main import app
from gfsim.core.errors import SpecError
from gfsim.live.llm import prompt as P
from gfsim.live.llm.forecaster import (
    Forecast,
    ForecasterError,
    ForecastRequest,
    VllmForecaster,
    parse_forecaster,
    renormalise,
)
from gfsim.live.tasks import get_task

runner = CliRunner()
TINY_CONTEXT = 512  # the test model's --max-model-len


def request(task="softmax", i=0) -> ForecastRequest:
    t = get_task(task)
    cand = t.candidates()[i]
    return ForecastRequest(cand.candidate_id, cand.code, t.reference_code(),
                           f"{task}: {t.describe()}", {"device_name": "NVIDIA H200"})


def tool_body(args: dict | str, name=P.TOOL_NAME, finish="tool_calls") -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"choices": [{"finish_reason": finish, "message": {
        "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}}]}


def valid_args(probs=(0.05, 0.05, 0.1, 0.2, 0.3, 0.1, 0.1, 0.0), b=5) -> dict:
    return {"predicted_bin": b, **dict(zip(P.PROB_FIELDS, probs)), "reasoning": "fused pass"}


# -- offline: the prompt, the tool, parsing --------------------------------------------------------
def test_the_full_prompt_shows_both_kernels_the_bins_and_the_hardware():
    req = request("layernorm", 1)
    system, user = (m["content"] for m in P.tool_messages(req))
    for name, rng, _ in P.BINS:
        assert f"| {name} | {rng} |" in system
    assert "runtime of the reference / runtime of the candidate" in system
    assert all(f in system for f in P.PROB_FIELDS) and P.TOOL_NAME in system
    # Both kernels verbatim, the reference before the candidate, then the hardware table.
    assert f"```python\n{req.reference_code}\n```" in user
    assert f"```python\n{req.candidate_code}\n```" in user
    assert user.index("## Reference kernel") < user.index("## Candidate kernel") < user.index(
        "## Hardware")
    assert "| Device | NVIDIA H200 |" in user and "| Multiprocessors | 132 |" in user
    assert "| Compute capability | 9.0 |" in user
    assert "layer_norm" in req.reference_code and "@triton.jit" in req.candidate_code
    # No hardware given: no table.
    bare = ForecastRequest("c", "x = 1", "y = 2")
    assert "## Hardware" not in P.tool_messages(bare)[1]["content"]
    # The logprobs prompt shows one label per bin and asks for the label alone.
    labels = ("1", "2", "3", "4", "5", "6", "7", "8")
    sys_l, user_l = (m["content"] for m in P.label_messages(req, labels))
    assert "| 8 | EXTREME_SPEEDUP | S > 4.0 | more than 4x faster | 8 |" in sys_l
    assert user_l.endswith("Answer with one label: 1, 2, 3, 4, 5, 6, 7, 8.")


def test_cutting_keeps_the_structure_and_says_so():
    req = request("matmul", 0)
    full = P.tool_messages(req)
    cut = P.tool_messages(req, 0.25)
    assert len(cut[1]["content"]) < len(full[1]["content"])
    assert cut[1]["content"].count("characters cut to fit the context") == 2
    assert cut[0] == full[0]


def test_the_tool_schema_is_flat_and_complete():
    params = P.TOOL["function"]["parameters"]
    assert P.TOOL["function"]["name"] == "submit_kernel_runtime_estimate"
    assert params["required"] == ["predicted_bin", *P.PROB_FIELDS, "reasoning"]
    assert params["properties"]["predicted_bin"]["enum"] == list(range(1, 9))
    assert "$defs" not in json.dumps(P.TOOL) and "$ref" not in json.dumps(P.TOOL)
    # The compact form of the arguments is what the regex transport constrains to.
    line = json.dumps(valid_args(), separators=(", ", ": "))
    assert re.fullmatch(P.ARGUMENTS_REGEX, line)
    nine = line.replace('"predicted_bin": 5', '"predicted_bin": 9')
    assert not re.fullmatch(P.ARGUMENTS_REGEX, nine)


def test_renormalise_keeps_the_raw_sum_and_rejects_what_is_not_a_distribution():
    p, total, err = renormalise([0.1] * 8)
    assert err is None and total == pytest.approx(0.8) and p == pytest.approx([0.125] * 8)
    for bad in ([0.0] * 8, [0.1] * 7, [0.1] * 7 + [-0.1], [0.1] * 7 + [math.nan], None,
                [0.1] * 7 + ["x"]):
        assert renormalise(bad)[2] is not None


def parse(body, transport="tools") -> Forecast:
    out = Forecast("c", "f", "tool", [0.0] * 8)
    P.read_tool_answer(body, out, transport)
    return out


def test_tool_answers_are_read_as_the_reference_reads_them():
    ok = parse(tool_body(valid_args()))
    assert not ok.parse_failed and ok.raw_probability_sum == pytest.approx(0.9)
    assert ok.probs == pytest.approx(np.array([0.05, 0.05, 0.1, 0.2, 0.3, 0.1, 0.1, 0.0]) / 0.9)
    # The declared bin is kept even where it is not the most likely one.
    assert parse(tool_body(valid_args(b=2))).predicted_bin == 2
    cases = {
        "missing field": valid_args() | {"reasoning": None},
        "not a probability": valid_args() | {"p_high_speedup": 1.5},
        "not an integer in 1..8": valid_args() | {"predicted_bin": True},
        "all probabilities are zero": valid_args(probs=(0,) * 8),
        "empty reasoning": valid_args() | {"reasoning": "  "},
    }
    cases["missing field"].pop("reasoning")
    for expect, args in cases.items():
        f = parse(tool_body(args))
        assert f.parse_failed and expect in f.parse_error and f.probs == [0.0] * 8, expect
    assert "not JSON" in parse(tool_body('{"predicted_bin": 5,')).parse_error
    assert "unexpected tool" in parse(tool_body(valid_args(), name="other")).parse_error
    no_call = {"choices": [{"finish_reason": "stop", "message": {"content": "bin 5"}}]}
    assert "no tool call" in parse(no_call).parse_error
    content = {"choices": [{"message": {"content": json.dumps(valid_args())}}]}
    assert not parse(content, "json").parse_failed and parse(content).parse_failed


def test_forecaster_specs():
    f = parse_forecaster("vllm:http://127.0.0.1:9/v1,model=m,mode=tool,concurrency=2,"
                         "timeout=3,tool_transport=regex,max_prompt_tokens=100")
    assert (f.model, f.mode, f.concurrency, f.timeout_s, f.tool_transport,
            f.max_prompt_tokens) == ("m", "tool", 2, 3.0, "regex", 100)
    assert f.name == "vllm:m:tool" and f.root_url == "http://127.0.0.1:9"
    for spec, msg in (("openai:http://x", "expected vllm:URL"),
                      ("vllm:model=m", "first item after vllm: is the server URL"),
                      ("vllm:ftp://x,model=m", "not an http"), ("vllm:http://x", "model=NAME"),
                      ("vllm:http://x,model=m,color=red", "unknown key 'color'"),
                      ("vllm:http://x,model=m,retries=two", "not a int"),
                      ("vllm:http://x,model=m,mode=guess", "unknown mode"),
                      ("vllm:http://x,model=m,labels=emoji", "unknown labels"),
                      ("vllm:http://x,model=m,api_key_env=GFSIM_SURELY_UNSET", "is not set")):
        with pytest.raises(SpecError, match=re.escape(msg)):
            parse_forecaster(spec)


# -- a real vLLM server ----------------------------------------------------------------------------
def make(vllm, **kw) -> VllmForecaster:
    kw.setdefault("max_prompt_tokens", TINY_CONTEXT - 16)
    return VllmForecaster(kw.pop("url", vllm.url), vllm.model, **kw)


@pytest.mark.parametrize("labels", ["words", "digits"])
def test_logprobs_mode_reads_a_distribution_over_the_labels(vllm_server, labels):
    f = make(vllm_server, labels=labels)
    a, b = f.forecast(request()), f.forecast(request())
    assert not a.parse_failed and a.error is None and a.attempts == 1
    assert sum(a.probs) == pytest.approx(1.0) and len(a.probs) == 8
    assert a.raw_probability_sum == pytest.approx(1.0, abs=1e-3)  # processed log-probs
    assert a.predicted_bin == 1 + int(np.argmax(a.probs))
    assert a.probs == pytest.approx(b.probs, abs=1e-6)  # temperature 0: the same answer
    assert 0 < a.input_tokens <= TINY_CONTEXT - 16 and a.output_tokens == 1 and a.latency_s > 0
    assert a.prompt_truncated  # the tiny model's context is smaller than the prompt
    rec = a.record()
    assert rec["mode"] == "logprobs" and rec["forecaster"] == f"vllm:{vllm_server.model}:logprobs"
    # The OpenAI-standard request (logit_bias only, labels matched by their text) reads the
    # same distribution as the vLLM one (allowed_token_ids, labels matched by token id).
    plain = make(vllm_server, labels=labels, server="openai").forecast(request())
    assert plain.probs == pytest.approx(a.probs, abs=1e-5)
    # Another candidate, another answer: the prompt reaches the model.
    other = f.forecast(request("matmul", 3))
    assert not np.allclose(other.probs, a.probs, atol=1e-4)


def test_labels_that_are_not_single_tokens_are_refused_up_front(vllm_server):
    f = make(vllm_server, labels=[f"speedup bin number {b}" for b in range(1, 9)])
    with pytest.raises(ForecasterError, match="single-token labels"):
        f.forecast(request())


def test_tool_mode_with_the_prompt_cut_to_the_tiny_context(vllm_server):
    f = make(vllm_server, mode="tool", tool_transport="regex", max_tokens=330,
             max_prompt_tokens=TINY_CONTEXT - 330)
    a = f.forecast(request("layernorm", 2))
    assert a.error is None and not a.parse_failed, a.parse_error
    assert a.prompt_truncated and a.input_tokens <= TINY_CONTEXT - 330
    assert sum(a.probs) == pytest.approx(1.0) and 1 <= a.predicted_bin <= 8
    assert a.raw_probability_sum > 0 and a.reasoning and a.output_tokens > 50


def test_tool_mode_parse_failure_is_retried_once_then_recorded(vllm_server):
    # 20 tokens cannot hold the arguments: the answer is cut, the JSON does not parse.
    f = make(vllm_server, mode="tool", tool_transport="regex", max_tokens=20,
             max_prompt_tokens=TINY_CONTEXT - 20)
    a = f.forecast(request())
    assert a.parse_failed and a.error is None and a.attempts == 2
    assert "not JSON" in a.parse_error and "length" in a.parse_error
    assert a.probs == [0.0] * 8 and a.output_tokens == 40
    rec = a.record()
    assert rec["parse_failed"] is True and rec["attempts"] == 2


def test_a_server_without_a_tool_parser_is_a_clear_error(vllm_server):
    f = make(vllm_server, mode="tool", tool_transport="tools", max_tokens=100,
             max_prompt_tokens=TINY_CONTEXT - 100)
    with pytest.raises(ForecasterError, match="tool_transport=json or tool_transport=regex"):
        f.forecast(request())


# -- faults between client and server --------------------------------------------------------------
def through(vllm_server, proxy_, **kw) -> VllmForecaster:
    """A forecaster that talks through the proxy, one connection per request, so that each
    chat completion meets the proxy's next fault (label and token-count lookups pass)."""
    return make(vllm_server, url=proxy_.url(), backoff_s=0.01, keepalive=False, **kw)


def small_request() -> ForecastRequest:
    return ForecastRequest("small", "def run(x):\n    return x * 2\n",
                           "def run(x):\n    return x + x\n", "toy", {})


def test_dropped_connections_are_retried_with_backoff(vllm_server, proxy):
    p = proxy(["drop", "drop"])
    a = through(vllm_server, p, retries=3).forecast(small_request())
    assert a.error is None and not a.parse_failed and a.attempts == 3
    assert p.seen[:3] == ["drop", "drop", "pass"]


@pytest.mark.parametrize("fault", ["drop", "garbage", "http500", "notjson"])
def test_a_server_that_never_answers_leaves_the_candidate_unforecast(vllm_server, proxy,
                                                                     fault):
    p = proxy(default=fault)
    f = through(vllm_server, p, retries=2)
    a = f.forecast(small_request())
    assert a.error is not None and "no answer after 3 attempts" in a.error
    assert not a.parse_failed and a.probs == [0.0] * 8 and a.attempts == 3
    rec = a.record()
    assert rec["error"] == a.error and "predicted_bin" not in rec
    expect = {"drop": "Error", "garbage": "Error", "http500": "HTTP 500",
              "notjson": "not JSON"}[fault]
    assert expect in a.error


@pytest.mark.slow
def test_a_slow_server_times_out_then_answers(vllm_server, proxy):
    # timeout_s is ten times a small forecast's answer or more (a 1 s limit failed under load);
    # the delay, three times timeout_s, always outlasts it
    p = proxy(["delay:15"])
    a = through(vllm_server, p, retries=1, timeout_s=5.0).forecast(small_request())
    assert a.error is None and a.attempts == 2 and p.seen[:2] == ["delay:15", "pass"]
    b = through(vllm_server, proxy(default="delay:15"), retries=1,
                timeout_s=5.0).forecast(small_request())
    assert b.error is not None and "Timeout" in b.error


def test_many_forecasts_keep_going_past_failures(vllm_server, proxy):
    p = proxy(["pass", "drop", "pass"])
    f = through(vllm_server, p, retries=0, concurrency=1)
    got = []
    out = f.forecast_many([small_request(), request(), request("matmul", 1)], got.append)
    assert len(out) == len(got) == 3
    assert [x.error is None for x in out] == [True, False, True]
    assert [x.candidate_id for x in out] == ["small", request().candidate_id,
                                             request("matmul", 1).candidate_id]


# -- gfsim forecast, end to end -------------------------------------------------------------------
def test_gfsim_forecast_adds_resumable_forecasts_to_the_shipped_h200_log(vllm_server, proxy,
                                                                          tmp_path):
    from gfsim.replay_logs import load_log

    out = tmp_path / "h200-fc.jsonl.gz"
    spec = (f"vllm:{vllm_server.url},model={vllm_server.model},mode=logprobs,labels=words,"
            f"max_prompt_tokens={TINY_CONTEXT - 16}")
    first = runner.invoke(app, ["forecast", "--log", "h200-suite-v0", "--forecaster", spec,
                                "--out", str(out), "--limit", "10", "--json"])
    assert first.exit_code == 0, first.output
    s1 = json.loads(first.output)
    assert (s1["forecast_now"], s1["answered"], s1["resumed"]) == (10, 10, False)
    # A server that cannot be reached at all is an error before anything is written.
    unreachable = spec.replace(vllm_server.url, "http://127.0.0.1:9/v1") + ",retries=0"
    res = runner.invoke(app, ["forecast", "--log", "h200-suite-v0", "--forecaster",
                              unreachable, "--out", str(out), "--json"])
    assert res.exit_code == 2 and "tokenize" in res.output
    # A server whose completions fail: the rest are recorded as errors (nothing dropped).
    from gfsim.live.llm.forecast_log import forecast_log

    f = through(vllm_server, proxy(default="drop"), retries=1, labels="words")
    s2 = forecast_log("h200-suite-v0", f, out)
    assert s2["resumed"] and s2["already_forecast"] == 10
    assert s2["error"] == 14 and s2["answered"] == 0
    mid = load_log(out)
    assert len(mid.forecasts) == 10 and len(mid.forecast_errors) == 14
    # Back up: a rerun asks exactly the 14 that got no answer.
    third = runner.invoke(app, ["forecast", "--log", "h200-suite-v0", "--forecaster", spec,
                                "--out", str(out), "--json"])
    assert third.exit_code == 0, third.output
    s3 = json.loads(third.output)
    assert (s3["already_forecast"], s3["forecast_now"], s3["answered"]) == (10, 14, 14)
    final = load_log(out)
    assert len(final.forecasts) == 24 and final.forecasts["candidate_id"].is_unique
    assert len(final.forecast_errors) == 14  # kept, never used as forecasts
    assert final.header["derived_from"]["log_id"] == "h200-suite-v0"
    assert final.header["forecasters"][0]["mode"] == "logprobs"
    assert len(final.evaluations) == 24  # every input record is still there
    scored = runner.invoke(app, ["score", "--log", str(out), "--json"])
    assert scored.exit_code == 0, scored.output
    assert validate_ok(out)


def validate_ok(path) -> bool:
    res = runner.invoke(app, ["validate", str(path)])
    return res.exit_code == 0


def test_gfsim_forecast_refuses_logs_without_code(tmp_path):
    res = runner.invoke(app, ["forecast", "--log", "synthetic-mini", "--forecaster",
                              "vllm:http://127.0.0.1:9/v1,model=m", "--out",
                              str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "no candidate carries code" in res.output
    res = runner.invoke(app, ["forecast", "--log", "h200-suite-v0", "--forecaster",
                              "vllm:http://127.0.0.1:9/v1", "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "model=NAME is required" in res.output


def test_a_forecast_with_no_answer_leaves_the_candidate_unforecast_in_a_replay(tmp_path):
    """An ``error`` record is kept in the log but never used as a forecast: every policy
    measures that candidate as unforecast (unless told to skip unusable forecasts)."""
    from gfsim.cost_models import load_cost_model
    from gfsim.policies import make_policy
    from gfsim.replay_logs import load_log
    from gfsim.simulator import replay
    from gfsim.testing import LogBuilder

    b = LogBuilder()
    sure_slow = LogBuilder.onehot(1)  # confident it is slow: threshold skips it
    kept = b.candidate("t", 0, probs=sure_slow, speedup=0.2)
    lost = b.candidate("t", 0, probs=sure_slow, speedup=3.0)
    # Replace the second candidate's forecast with what a failed request leaves behind.
    for i, r in enumerate(b.records):
        if r["kind"] == "forecast" and r["candidate_id"] == lost:
            b.records[i] = Forecast(lost, "f", "tool", [0.0] * 8, error="no answer after 4 "
                                    "attempts: ConnectError", attempts=4).record()
    log = load_log(b.write(tmp_path / "log.jsonl"))
    assert list(log.forecasts["candidate_id"]) == [kept]
    assert list(log.forecast_errors["candidate_id"]) == [lost]
    res = replay(log, make_policy("threshold:0.7"), load_cost_model("serverless-a100"))
    tab = res.searches[0].table
    got = dict(zip(tab["candidate_id"], zip(tab["action"], tab["reason"])))
    assert got[kept][0] == "skip"
    assert got[lost] == ("measure", "unforecast")
    assert res.searches[0].best_speedup == 3.0
    skip = replay(log, make_policy("threshold:tau=0.7,on_parse_failure=skip"),
                  load_cost_model("serverless-a100"))
    assert dict(zip(skip.searches[0].table["candidate_id"],
                    skip.searches[0].table["action"]))[lost] == "skip"


LOCAL_SCRIPT = """
import json, sys
from gfsim.live.llm.forecaster import VllmLocalForecaster, ForecastRequest
if __name__ == "__main__":
    reqs = [ForecastRequest(**r) for r in json.loads(sys.argv[2])]
    f = VllmLocalForecaster(sys.argv[1], labels="words", max_prompt_tokens=int(sys.argv[3]),
                            max_model_len=512, dtype="float32", enforce_eager=True)
    print("RESULT " + json.dumps([x.record() for x in f.forecast_many(reqs)]))
"""


def test_the_in_process_backend_agrees_with_the_server(vllm_server, tmp_path):
    """vllm.LLM in a process of its own (vLLM's interpreter: gfsim's venv has no vllm) reads
    the same distribution as the HTTP server running the same model."""
    import os
    import subprocess
    import sys
    from dataclasses import asdict
    from pathlib import Path

    python, model_dir = os.environ.get("GFSIM_VLLM_PYTHON"), os.environ.get(
        "GFSIM_VLLM_MODEL_DIR")
    if not (python and model_dir):
        msg = "GFSIM_VLLM_PYTHON and GFSIM_VLLM_MODEL_DIR (vLLM's python, the tiny model) unset"
        if os.environ.get("GFSIM_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    reqs = [request(), request("matmul", 2)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([python, "-c", LOCAL_SCRIPT, model_dir,
                           json.dumps([asdict(r) for r in reqs]), str(TINY_CONTEXT - 16)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    local = json.loads(line[0][len("RESULT "):])
    served = make(vllm_server, labels="words").forecast_many(reqs)
    for a, b in zip(local, served):
        assert a["candidate_id"] == b.candidate_id and a["input_tokens"] == b.input_tokens
        assert a["probs"] == pytest.approx(b.probs, abs=1e-4)
        assert a["predicted_bin"] == b.predicted_bin
    assert sys.executable != python
