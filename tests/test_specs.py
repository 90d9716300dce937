import pytest

from gfsim.core.errors import SpecError
from gfsim.policies import POLICIES, make_policy
from gfsim.simulator import parse_budget


def test_bare_value_binds_the_first_parameter():
    assert make_policy("threshold:0.7").tau == 0.7
    assert make_policy("topk:2").k == 2
    p = make_policy("threshold:tau=0.4,score=margin,rho=0.9")
    assert (p.tau, p.score, p.rho) == (0.4, "margin", 0.9)


@pytest.mark.parametrize("spec, fragment", [
    ("nosuch", "valid: all, random, oracle, topk, threshold, ev"),
    ("threshold:tau=0.7,bogus=1", "valid: tau, score, rho, coverage"),
    ("threshold:score=entropy", "is not one of: maxprob, negentropy, margin"),
    ("threshold:abc", "is not a valid float"),
    ("random:p=1.5", "above its maximum"),
    ("topk:k=-1", "below its minimum"),
    ("all:3", "takes no parameters"),
    ("threshold:tau=0.5,coverage=0.3", "not both"),
    ("threshold:tau=0.5,tau=0.6", "given twice"),
    ("threshold:score=margin,0.7", "only the first item may be a bare value"),
    (":0.7", "has no name"),
])
def test_bad_specs_name_what_is_wrong(spec, fragment):
    with pytest.raises(SpecError, match=None) as info:
        make_policy(spec)
    assert fragment in str(info.value)


def test_budget_parses_every_key_and_rejects_bad_ones():
    b = parse_budget("usd=40,seconds=3600,joules=1e7,gpu_evals=300,steps=40")
    assert (b.usd, b.seconds, b.joules, b.gpu_evals, b.steps) == (40, 3600, 1e7, 300, 40)
    for bad, fragment in [("dollars=3", "unknown key 'dollars'"), ("usd=-1", "must be > 0"),
                          ("usd=abc", "not a number"), ("gpu_evals=2.5", "whole number"),
                          ("40", "expected key=value")]:
        with pytest.raises(SpecError) as info:
            parse_budget(bad)
        assert fragment in str(info.value)


def test_every_policy_is_listed_with_a_summary():
    assert set(POLICIES.builtins()) == {"all", "random", "oracle", "topk", "threshold", "ev"}
    assert all(POLICIES[n].summary for n in POLICIES.builtins())
