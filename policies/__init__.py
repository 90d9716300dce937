"""Policies: which candidates go to the GPU. Pure: parameters in, decisions out."""

from gfsim.policies.base import Batch, Decisions, Policy, SearchState
from gfsim.policies.registry import POLICIES, make_policy

__all__ = ["Batch", "Decisions", "POLICIES", "Policy", "SearchState", "make_policy"]
