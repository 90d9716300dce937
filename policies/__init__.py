"""Policies: which candidates go to the GPU. Pure: parameters and a batch's forecasts in,
decisions out, randomness keyed. A registry maps spec names to classes, plug-ins' too
(``register_policy``, the ``gfsim.policies`` entry point). It reads forecasts
(``gfsim.forecasts``) and the core; it must not import the simulator or anything above it.
"""

from gfsim.policies.base import Batch, Decisions, Policy, SearchState
from gfsim.policies.registry import POLICIES, make_policy, register_policy

__all__ = ["Batch", "Decisions", "POLICIES", "Policy", "SearchState", "make_policy",
           "register_policy"]
