"""The example plug-in keeps gfsim's contracts, and gfsim finds it by its entry points."""

import gfsim
from gfsim.testing import CostModelContract, PolicyContract


class TestBudgetShare(PolicyContract):
    specs = ("budget-share", "budget-share:0.2")


class TestSpotA100(CostModelContract):
    names = ("spot-a100",)


def test_a_replay_names_the_plugin_by_its_spec():
    out = gfsim.compare(None, "budget-share:0.3", cost="spot-a100").to_dict()
    assert out["policy"] == "budget-share:share=0.3"
    assert out["cost_model"] == "spot-a100"
