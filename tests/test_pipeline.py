"""--pipeline: the stage order, and what compiling before forecasting saves."""

import pytest

from gfsim.core.errors import SpecError
from gfsim.cost_models import Capacities, Usage, load_cost_model
from gfsim.policies import make_policy
from gfsim.replay_logs import load_log
from gfsim.simulator import replay
from gfsim.simulator.pipeline import DEFAULT_PIPELINE, parse_pipeline
from gfsim.testing import LogBuilder

COMPILE_FIRST = "generate,compile,forecast,decide,check,time"
RESERVED = load_cost_model("reserved-h100")
SERVERLESS = load_cost_model("serverless-a100")
CAPS = Capacities(generator=8, forecaster=8, compile_workers=8, gpus=8)


def test_default_order_and_parsing():
    assert str(DEFAULT_PIPELINE) == "generate,forecast,decide,compile,check,time"
    p = parse_pipeline(COMPILE_FIRST)
    assert p.before == ("generate", "compile", "forecast") and p.after == ("check", "time")


@pytest.mark.parametrize("text, fragment", [
    ("generate,forecast,decide,compile,check", "missing time"),
    ("generate,forecast,decide,compile,check,time,time", "repeats time"),
    ("generate,forecast,decide,compile,check,bench", "unknown stage 'bench'"),
    ("forecast,generate,decide,compile,check,time", "generate must come before forecast"),
    ("generate,forecast,decide,check,compile,time", "compile must come before check"),
    ("generate,decide,forecast,compile,check,time", "forecast must come before decide"),
    ("generate,forecast,compile,check,time,decide", "decide must come before time"),
])
def test_bad_orders_say_which_rule_they_break(text, fragment):
    with pytest.raises(SpecError) as info:
        parse_pipeline(text)
    assert fragment in str(info.value)


def compile_failures_log(tmp_path):
    b = LogBuilder()
    for i in range(6):
        failed = i % 2 == 0  # half the candidates do not compile
        b.candidate("t", 0, outcome="compile_failed" if failed else "success",
                    speedup=None if failed else 1.1 + i / 10, probs=LogBuilder.onehot(6, 0.4))
    return load_log(b.write(tmp_path / "log.jsonl"))


def test_compiling_first_on_cpu_saves_forecasts_and_gpu_time(tmp_path):
    log = compile_failures_log(tmp_path)
    policy = make_policy("threshold:0.7")
    default = replay(log, policy, RESERVED, capacities=CAPS).searches[0]
    early = replay(log, policy, RESERVED, capacities=CAPS,
                   pipeline=parse_pipeline(COMPILE_FIRST)).searches[0]
    assert default.forecasts == 6 and early.forecasts == 3
    one_forecast = RESERVED.cost(Usage("forecasting", 5.0, 3000, 500)).usd
    saved = default.stages["forecasting"].usd - early.stages["forecasting"].usd
    assert saved == pytest.approx(3 * one_forecast)
    # Compile failures stop before decide: they are neither forecast nor counted as GPU
    # evaluations, and the GPU stages are the same three successes either way.
    assert default.gpu_evals == 6 and early.gpu_evals == 3
    assert early.table["state"][0] == "failed_before_decision"
    assert early.table["outcome"][0] == "compile_failed"
    for stage in ("check", "timing", "compilation"):
        assert early.stages[stage].seconds == pytest.approx(default.stages[stage].seconds)
    assert early.best_speedup == default.best_speedup


def test_compiling_first_on_the_gpu_host_pays_a_second_cold_start(tmp_path):
    log = compile_failures_log(tmp_path)
    policy = make_policy("all")
    default = replay(log, policy, SERVERLESS, capacities=CAPS).searches[0]
    early = replay(log, policy, SERVERLESS, capacities=CAPS,
                   pipeline=parse_pipeline(COMPILE_FIRST)).searches[0]
    # Default: one container per candidate (6 cold starts of 1 s). Compile first: a container
    # to compile each (6), then a fresh one for each success's check and timing (3).
    assert default.stages["cold_start"].seconds == 6.0
    assert early.stages["cold_start"].seconds == 9.0
