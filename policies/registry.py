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
    """A policy from its spec, ``NAME``, ``NAME:VALUE`` or ``NAME:key=value,...``
    (``gfsim policies`` lists them); unknown names and keys raise ``SpecError`` naming the
    valid ones.

    Args:
        spec: e.g. ``"threshold:0.7"``, ``"topk:4"``, ``"random:0.5"``, ``"all"``.

    Returns:
        The ``Policy``; ``spec()`` writes it back in full.

    Examples:
        >>> from gfsim.policies import make_policy
        >>> p = make_policy("threshold:0.7")
        >>> p.spec(), p.needs_forecast
        ('threshold:tau=0.7', True)
    """
    name, _ = parse_spec(spec)
    if name not in POLICIES:
        raise SpecError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[name].from_spec(spec)
