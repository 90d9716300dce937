"""Issue 51, Deliver 4: the smaller replay and recommend defects a new user met on real runs
(nonsensical policy parameters, budgets overspent, silent early stops, SIMULATED figures
called measured, zero-width intervals, recommend's defaults on logs without forecasts,
silent long replays)."""

from __future__ import annotations

import pytest

from gfsim.core.errors import SpecError
from gfsim.policies import make_policy


# -- policy parameters that make no sense are refused, naming the valid range ---------------
@pytest.mark.parametrize("spec, valid", [
    ("topk:0", "k >= 1"),
    ("topk:k=-3", "k >= 1"),
    ("random:0", "range 0 to 1, 0 excluded"),
    ("oracle:p=0", "range 0 to 1, 0 excluded"),
    ("threshold:coverage=0", "range 0 to 1, 0 excluded"),
    ("threshold:tau=1.5", "range 0 to 1"),
])
def test_a_policy_parameter_outside_its_range_is_one_line_naming_the_range(spec, valid):
    with pytest.raises(SpecError) as info:
        make_policy(spec)
    assert valid in str(info.value) and "\n" not in str(info.value)


def test_the_smallest_sensible_values_still_build():
    assert make_policy("topk:1").k == 1
    assert make_policy("random:1").p == 1.0
