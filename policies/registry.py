"""Policy names -> classes. Errors list the valid names."""

from __future__ import annotations

from gfsim.core.errors import SpecError
from gfsim.core.specs import parse_spec
from gfsim.policies.base import Policy
from gfsim.policies.simple import AllPolicy, OraclePolicy, RandomPolicy
from gfsim.policies.surrogate import ExpectedValuePolicy, ThresholdPolicy, TopKPolicy

__all__ = ["POLICIES", "make_policy"]

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (AllPolicy, RandomPolicy, OraclePolicy, TopKPolicy, ThresholdPolicy,
                               ExpectedValuePolicy)
}


def make_policy(spec: str) -> Policy:
    """``threshold:0.7`` -> ThresholdPolicy(tau=0.7). Unknown names/keys raise SpecError."""
    name, _ = parse_spec(spec)
    if name not in POLICIES:
        raise SpecError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[name].from_spec(spec)
