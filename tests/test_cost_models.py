import pytest

from gfsim.cost_models import Usage, load_cost_model
from gfsim.errors import GfsimError


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
