import json

import pytest
from typer.testing import CliRunner

from gfsim.core.errors import GfsimError, SpecError
from gfsim.cost_models import (
    LLMS,
    PRESETS,
    Usage,
    figures,
    load_cost_model,
    parse_gen_tokens,
    with_gen_tokens,
)


def test_paper_preset_bills_a100_per_second_with_compile_on_the_gpu():
    m = load_cost_model("serverless-a100")
    assert (m.billing, m.compile_on, m.gpu.usd_per_hour) == ("serverless", "gpu_host", 2.50)
    # An hour of timing costs the hourly rate; compile is GPU time in this setup.
    assert m.cost(Usage("timing", 3600)).usd == pytest.approx(2.50)
    assert m.cost(Usage("compilation", 3600)).usd == pytest.approx(2.50)


def test_reserved_h100_compiles_on_cpu_at_modal_cpu_price():
    m = load_cost_model("reserved-h100")
    assert m.cost(Usage("compilation", 3600)).usd == pytest.approx(0.0472)
    assert m.cost(Usage("timing", 3600)).usd == pytest.approx(3.95)


def test_llm_stages_price_tokens_per_million():
    m = load_cost_model("serverless-a100")
    c = m.cost(Usage("forecasting", seconds=41, input_tokens=1e6, output_tokens=1e6))
    assert c.usd == pytest.approx(0.50 + 3.00)
    assert c.joules == pytest.approx(1e6 * 0.08 + 1e6 * 0.8)


def test_toml_overrides_any_value(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "serverless-a100"\nbilling = "reserved"\n'
                    '[forecaster]\nusd_per_m_output = 0.2\n[priors]\ngen_output_tokens = 100\n')
    m = load_cost_model(str(path))
    assert m.billing == "reserved" and m.forecaster.usd_per_m_output == 0.2
    assert m.priors.gen_output_tokens == 100.0
    assert "override" in m.sources


@pytest.mark.parametrize("text, fragment", [
    ('base = "nope"', "base 'nope' is not a preset"),
    ("[gpu]\nwatts = 3", "unknown key 'watts'; valid: name, usd_per_hour"),
    ("[gpu]\nusd_per_hour = -1", "expected a number >= 0"),
    ("[capacities]\ngpus = 0", "capacity gpus must be an integer >= 1"),
    ("colour = 1", "unknown key 'colour'"),
    ("billing = 'monthly'", "billing must be serverless or reserved"),
    ("[gpu\n", "not valid TOML"),
])
def test_bad_toml_names_the_problem(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(GfsimError) as info:
        load_cost_model(str(path))
    assert fragment in str(info.value)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(GfsimError, match="valid: serverless-a100, reserved-h100"):
        load_cost_model("cheap-gpu")


# -- presets for five GPUs, two providers and five LLM endpoints ----------------------------
MODAL = {"a100": 2.50, "l40s": 1.95, "h100": 3.95, "h200": 4.54, "b200": 6.25}
RUNPOD = {"a100": 0.00076, "l40s": 0.00053, "h100": 0.00116, "h200": 0.00155, "b200": 0.00240}
BOARD = {"a100": 400, "l40s": 350, "h100": 700, "h200": 700, "b200": 1000}


def test_every_gpu_has_a_serverless_and_a_reserved_preset():
    assert set(PRESETS.builtins()) == {
        f"{b}-{g}" for b in ("serverless", "reserved") for g in MODAL}
    assert set(LLMS) == {"gemini-3-flash", "gpt-oss-120b", "gpt-oss-20b", "deepseek-v4-flash",
                         "self-hosted-gpt-oss-20b"}


@pytest.mark.parametrize("gpu", sorted(MODAL))
def test_serverless_presets_bill_modal_per_second_with_cold_starts(gpu):
    m = load_cost_model(f"serverless-{gpu}")
    assert (m.billing, m.compile_on, m.capacities.gpus) == ("serverless", "gpu_host", 16)
    assert m.priors.cold_start_s == 30.0
    assert m.cost(Usage("timing", 3600)).usd == pytest.approx(MODAL[gpu])
    assert m.cost(Usage("cold_start", 3600)).usd == pytest.approx(MODAL[gpu])
    assert m.gpu.board_w == BOARD[gpu] and m.gpu.active_w == pytest.approx(0.6 * BOARD[gpu])
    assert "modal.com/pricing" in m.sources["gpu.usd_per_hour"]
    assert m.idle(3600).usd == 0


@pytest.mark.parametrize("gpu", sorted(MODAL))
def test_reserved_presets_assume_the_modal_list_price_and_compile_on_cpu(gpu):
    m = load_cost_model(f"reserved-{gpu}")
    assert (m.billing, m.compile_on, m.capacities.gpus) == ("reserved", "cpu", 1)
    assert m.priors.cold_start_s == 0.0
    assert m.idle(3600).usd == pytest.approx(MODAL[gpu])
    assert m.cost(Usage("compilation", 3600)).usd == pytest.approx(0.0472)
    assert m.sources["gpu.usd_per_hour"].startswith("assumption")


def test_h200_idle_power_is_the_probe_and_others_scale_by_board_power():
    h200 = load_cost_model("serverless-h200").gpu
    assert (h200.idle_w_context, h200.idle_w_no_context) == (123.0, 81.0)
    assert "probe" in load_cost_model("serverless-h200").sources["gpu.idle_w_*"]
    b200 = load_cost_model("reserved-b200")
    assert (b200.gpu.idle_w_context, b200.gpu.idle_w_no_context) == (176.0, 116.0)  # x 1000/700
    assert b200.sources["gpu.idle_w_*"].startswith("assumption")
    # The two original presets keep their figures exactly.
    a100 = load_cost_model("serverless-a100").gpu
    assert (a100.idle_w_context, a100.idle_w_no_context, a100.active_w) == (70.0, 46.0, 240.0)
    h100 = load_cost_model("reserved-h100").gpu
    assert (h100.idle_w_context, h100.idle_w_no_context, h100.active_w) == (123.0, 81.0, 420.0)


def test_runpod_provider_bills_its_per_second_price():
    m = load_cost_model("serverless-h200:provider=runpod")
    assert m.cost(Usage("timing", 3600)).usd == pytest.approx(0.00155 * 3600)
    assert "docs.runpod.io" in m.sources["gpu.usd_per_hour"]
    for gpu, per_s in RUNPOD.items():
        hour = load_cost_model(f"serverless-{gpu}:runpod").cost(Usage("check", 3600)).usd
        assert hour == pytest.approx(per_s * 3600)
    assert load_cost_model("serverless-h200:provider=modal").gpu.usd_per_hour == 4.54


def test_llm_endpoints_price_forecasts_and_mutations():
    m = load_cost_model("serverless-h200:forecaster=gpt-oss-20b,generator=deepseek-v4-flash")
    million = dict(seconds=10, input_tokens=1e6, output_tokens=1e6)
    assert m.cost(Usage("forecasting", **million)).usd == pytest.approx(0.05 + 0.20)
    assert m.cost(Usage("generation", **million)).usd == pytest.approx(0.14 + 0.28)
    assert m.cost(Usage("forecasting", **million)).joules == pytest.approx(0.08e6 + 0.8e6)
    assert "chosen with forecaster=gpt-oss-20b" in m.sources["forecaster"]
    assert m.name == "serverless-h200:forecaster=gpt-oss-20b,generator=deepseek-v4-flash"
    big = load_cost_model("reserved-h100:forecaster=gpt-oss-120b")
    assert big.cost(Usage("forecasting", **million)).usd == pytest.approx(0.15 + 0.60)
    # The defaults stay Gemini 3 Flash for both.
    plain = load_cost_model("serverless-b200")
    assert plain.generator.name == plain.forecaster.name == "gemini-3-flash"


def test_self_hosted_price_is_the_h100_hour_over_its_token_rate():
    per_token_out = 3.95 / (2765 * 3600)  # $/h over tokens per hour
    m = load_cost_model("reserved-h100:forecaster=self-hosted-gpt-oss-20b")
    c = m.cost(Usage("forecasting", seconds=1, input_tokens=1e6, output_tokens=1e6))
    assert c.usd == pytest.approx(1e6 * per_token_out * 1.1)  # input 10x cheaper
    assert m.forecaster.j_per_output_token == 0.8
    source = m.sources["forecaster"]
    assert "3.95 / (2,765 x 3600) x 1e6 = $0.3968" in source and "assumption" in source


def test_spec_options_set_gpus_and_reject_unknown_names():
    assert load_cost_model("reserved-h200:gpus=4").capacities.gpus == 4
    with pytest.raises(SpecError, match="valid: provider, forecaster, generator, gpus"):
        load_cost_model("serverless-h200:colour=red")
    with pytest.raises(SpecError) as info:
        load_cost_model("serverless-h200:forecaster=gpt-5")
    assert "gemini-3-flash, gpt-oss-120b, gpt-oss-20b, deepseek-v4-flash" in str(info.value)
    with pytest.raises(SpecError, match="not one of: modal, runpod"):
        load_cost_model("serverless-h200:provider=aws")
    with pytest.raises(SpecError, match="provider applies to serverless presets only"):
        load_cost_model("reserved-h200:provider=runpod")
    with pytest.raises(SpecError, match="below its minimum"):
        load_cost_model("reserved-h200:gpus=0")
    with pytest.raises(SpecError) as info:
        load_cost_model("serverless-x100:gpus=2")
    assert "unknown cost preset 'serverless-x100'" in str(info.value)
    assert "serverless-b200" in str(info.value) and "reserved-l40s" in str(info.value)


def test_toml_can_choose_llms_and_start_from_a_spec(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "serverless-l40s:provider=runpod"\nforecaster_llm = "gpt-oss-20b"\n'
                    'generator_llm = "gpt-oss-120b"\n[forecaster]\nusd_per_m_output = 0.1\n')
    m = load_cost_model(str(path))
    assert m.gpu.usd_per_hour == pytest.approx(0.00053 * 3600)
    assert m.generator.name == "gpt-oss-120b" and m.forecaster.usd_per_m_input == 0.05
    assert m.forecaster.usd_per_m_output == 0.1
    assert str(path) in m.sources["forecaster.usd_per_m_output"]
    assert m.name == ("serverless-l40s:provider=runpod,forecaster=gpt-oss-20b,"
                      "generator=gpt-oss-120b+mine.toml")
    path.write_text('forecaster_llm = "llama"\n')
    with pytest.raises(GfsimError, match="forecaster_llm = 'llama' is not one of: gemini-3-flash"):
        load_cost_model(str(path))


SOURCE_WORDS = ("assumption", "estimate", "modal.com", "docs.runpod.io", "vendor spec", "probe",
                "provider page", "eval-set-predictions", "gfsim.github.io/gfsim/concepts/paper/",
                "set by the cost spec")


@pytest.mark.parametrize("spec", [*PRESETS.builtins(),
                                  "serverless-b200:runpod,generator=gpt-oss-20b,gpus=3",
                                  "reserved-l40s:forecaster=self-hosted-gpt-oss-20b"])
def test_every_figure_has_a_source_or_says_assumption(spec):
    m = with_gen_tokens(load_cost_model(spec), "1000,2000")
    rows = figures(m)
    assert {r["key"] for r in rows} >= {"gpu.usd_per_hour", "priors.gen_output_tokens",
                                         "capacities.gpus", "forecaster.j_per_output_token"}
    for r in rows:
        assert r["source"], r  # names and billing: the preset's description
        if isinstance(r["value"], (int, float)):  # every number: a source, or says it is a guess
            assert any(w in r["source"] for w in SOURCE_WORDS), r
    energy = next(r for r in rows if r["key"] == "generator.j_per_output_token")
    assert energy["source"].startswith("estimate")


@pytest.mark.parametrize("text, expected", [
    ("4000,8000", {"in": 4000.0, "out": 8000.0}),
    (" 1e3 , 250 ", {"in": 1000.0, "out": 250.0}),
    ("in=4000,out=9000", {"in": 4000.0, "out": 9000.0}),
    ("out=500", {"out": 500.0}),
    ("input=1,output=2", {"in": 1.0, "out": 2.0}),
])
def test_parse_gen_tokens(text, expected):
    assert parse_gen_tokens(text) == expected


def test_with_gen_tokens_replaces_the_prior_and_says_so():
    base = load_cost_model("serverless-a100")
    m = with_gen_tokens(base, "in=2000,out=6000")
    assert (m.priors.gen_input_tokens, m.priors.gen_output_tokens) == (2000.0, 6000.0)
    assert "--gen-tokens" in m.sources["priors.gen_*_tokens"]
    assert m.priors.forecast_output_tokens == base.priors.forecast_output_tokens
    assert base.priors.gen_output_tokens == 8000.0  # the original is untouched
    only_out = with_gen_tokens(base, "out=100")
    assert (only_out.priors.gen_input_tokens, only_out.priors.gen_output_tokens) == (4000.0, 100.0)


@pytest.mark.parametrize("text, fragment", [
    ("", "empty item"),
    ("4000", "1 bare number(s), need 2"),
    ("1,2,3", "3 bare number(s), need 2"),
    ("4000,", "empty item"),
    ("in=4000,8000", "mixes bare numbers and key=value"),
    ("in=1,tokens=2", "unknown key 'tokens' (valid: in, out)"),
    ("in=1,input=2", "in given twice"),
    ("many,lots", "in='many' is not a number"),
    ("100,-5", "out='-5' must be a finite number >= 0"),
    ("nan,5", "must be a finite number"),
])
def test_bad_gen_tokens_name_the_problem(text, fragment):
    with pytest.raises(GfsimError) as info:
        with_gen_tokens(load_cost_model("serverless-a100"), text)
    assert fragment in str(info.value) and "expected IN,OUT or in=N,out=N" in str(info.value)


# -- gfsim costs -------------------------------------------------------------------------
runner = CliRunner()


def test_costs_lists_every_preset_and_llm():
    from gfsim.cli.main import app

    res = runner.invoke(app, ["costs"])
    assert res.exit_code == 0, res.output
    for name in [*PRESETS.builtins(), *LLMS]:
        assert name in res.output
    res = runner.invoke(app, ["costs", "--json"])
    out = json.loads(res.output)
    rows = {p["name"]: p for p in out["presets"]}
    assert rows["serverless-b200"]["usd_per_hour"] == 6.25
    assert rows["serverless-h200"]["runpod_usd_per_hour"] == pytest.approx(5.58)
    assert rows["reserved-l40s"]["runpod_usd_per_hour"] is None
    llms = {r["name"]: r for r in out["llms"]}
    assert (llms["gpt-oss-20b"]["usd_per_m_input"], llms["gpt-oss-20b"]["usd_per_m_output"]) == (
        0.05, 0.20)


def test_costs_of_one_preset_shows_every_figure_with_its_source():
    from gfsim.cli.main import app

    res = runner.invoke(app, ["costs", "serverless-b200", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["name"] == "serverless-b200" and out["gpu"]["usd_per_hour"] == 6.25
    by_key = {r["key"]: r for r in out["figures"]}
    assert by_key["gpu.board_w"]["value"] == 1000
    assert "vendor spec" in by_key["gpu.board_w"]["source"]
    assert "modal.com/pricing" in by_key["gpu.usd_per_hour"]["source"]
    res = runner.invoke(app, ["costs", "serverless-b200:provider=runpod"])
    assert res.exit_code == 0 and "8.64" in res.output and "docs.runpod.io" in res.output
    res = runner.invoke(app, ["costs", "serverless-b200:forecaster=claude"])
    assert res.exit_code == 2
    assert res.output.startswith("gfsim: error:") and "gpt-oss-20b" in res.output
