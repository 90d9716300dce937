"""Policy names -> classes: gfsim's own and plug-ins (``gfsim.core.plugins``: registered in
code with ``register_policy`` or through the ``gfsim.policies`` entry point). Errors list the
valid names."""

from __future__ import annotations

from gfsim.core.errors import SpecError
from gfsim.core.plugins import PluginError, Registry
from gfsim.core.specs import parse_spec
from gfsim.policies.base import Policy
from gfsim.policies.simple import AllPolicy, OraclePolicy, RandomPolicy
from gfsim.policies.surrogate import ExpectedValuePolicy, ThresholdPolicy, TopKPolicy

__all__ = ["POLICIES", "make_policy", "register_policy"]


def _policy_class(name: str | None, cls) -> str:
    """A plug-in policy is a ``Policy`` subclass with a ``name`` and a ``decide``; it goes by
    its ``name`` (an entry point's name must be the same)."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PluginError(f"policy plug-in {cls!r}: not a subclass of gfsim.policies.Policy")
    own = getattr(cls, "name", None)
    if not isinstance(own, str):
        raise PluginError(f"policy plug-in {cls.__name__}: it has no class attribute 'name'")
    if getattr(cls, "__abstractmethods__", None):
        raise PluginError(f"policy plug-in {cls.__name__}: it does not define "
                          f"{', '.join(sorted(cls.__abstractmethods__))}")
    return own  # (an entry point named otherwise is refused where it is loaded)


POLICIES: Registry = Registry(
    "gfsim.policies", "policy",
    {cls.name: cls for cls in (AllPolicy, RandomPolicy, OraclePolicy, TopKPolicy,
                               ThresholdPolicy, ExpectedValuePolicy)},
    check=_policy_class)


def register_policy(cls: type[Policy], *, replace: bool = False) -> type[Policy]:
    """Make ``cls`` (a ``Policy`` subclass) known by its ``name``, so that specs, the command
    line, tuning and caches can name it; returns it (usable as a class decorator).

    Examples:
        >>> import numpy as np
        >>> from gfsim.policies import Decisions, Policy, make_policy, register_policy
        >>> @register_policy
        ... class Never(Policy):
        ...     name = "doc-never"
        ...     state_fields = ()
        ...     def decide(self, batch, state):
        ...         n = len(batch)
        ...         return Decisions.build(np.zeros(n, bool), np.zeros(n), ("never",) * n)
        >>> make_policy("doc-never").spec()
        'doc-never'
    """
    POLICIES.register(cls, replace=replace)
    return cls


def make_policy(spec: str | Policy) -> Policy:
    """A policy from its spec, ``NAME``, ``NAME:VALUE`` or ``NAME:key=value,...``
    (``gfsim policies`` lists them); unknown names and keys raise ``SpecError`` naming the
    valid ones. A ``Policy`` given is returned as it is.

    Args:
        spec: e.g. ``"threshold:0.7"``, ``"topk:4"``, ``"random:0.5"``, ``"all"``, or a policy.

    Returns:
        The ``Policy``; ``spec()`` writes it back in full.

    Examples:
        >>> from gfsim.policies import make_policy
        >>> p = make_policy("threshold:0.7")
        >>> p.spec(), p.needs_forecast
        ('threshold:tau=0.7', True)
    """
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise SpecError(f"a policy is a spec (a string such as 'threshold:0.7') or a "
                        f"gfsim.policies.Policy, got {type(spec).__name__}")
    name, _ = parse_spec(spec)
    if name not in POLICIES:
        raise SpecError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[name].from_spec(spec)
