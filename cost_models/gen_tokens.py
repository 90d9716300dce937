"""``--gen-tokens``: replace a cost model's prior for the tokens of one mutation.

The reference's logs never record mutation tokens, so generation USD rests on a prior; this
lets a user state their own and says so in the model's sources.
"""

from __future__ import annotations

import dataclasses
import math

from gfsim.core.errors import GfsimError
from gfsim.cost_models.model import PresetCostModel, Priors

__all__ = ["with_gen_tokens", "parse_gen_tokens"]

_GEN_TOKENS_KEYS = {"in": "in", "input": "in", "out": "out", "output": "out"}


def _gen_tokens_error(text: str, why: str) -> GfsimError:
    return GfsimError(f"`gen_tokens` {text!r}: {why}; expected IN,OUT or in=N,out=N "
                      "(input and output tokens per mutation), e.g. 4000,8000")


def parse_gen_tokens(text: str) -> dict[str, float]:
    """``"IN,OUT"`` or ``"in=N,out=N"`` (either key may be left out) -> ``{"in": N, "out": N}``
    (tokens per mutation)."""
    text = "" if text is None else str(text)
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise _gen_tokens_error(text, "empty item")
    if all("=" not in s for s in items):
        if len(items) != 2:
            raise _gen_tokens_error(text, f"{len(items)} bare number(s), need 2")
        raw = dict(zip(("in", "out"), items))
    elif all("=" in s for s in items):
        raw = {}
        for s in items:
            key, _, value = (x.strip() for x in s.partition("="))
            if key not in _GEN_TOKENS_KEYS:
                raise _gen_tokens_error(text, f"unknown key {key!r} (valid: in, out)")
            if _GEN_TOKENS_KEYS[key] in raw:
                raise _gen_tokens_error(text, f"{_GEN_TOKENS_KEYS[key]} given twice")
            raw[_GEN_TOKENS_KEYS[key]] = value
    else:
        raise _gen_tokens_error(text, "mixes bare numbers and key=value")
    tokens = {}
    for key, value in raw.items():
        try:
            n = float(value)
        except ValueError:
            raise _gen_tokens_error(text, f"{key}={value!r} is not a number") from None
        if not math.isfinite(n) or n < 0:
            raise _gen_tokens_error(text, f"{key}={value!r} must be a finite number >= 0")
        tokens[key] = n
    return tokens


def with_gen_tokens(model: PresetCostModel, text: str) -> PresetCostModel:
    """``model`` with the mutation-token prior replaced (see ``parse_gen_tokens``); its sources
    say the prior came from --gen-tokens."""
    tokens = parse_gen_tokens(text)
    if not isinstance(getattr(model, "priors", None), Priors):
        raise GfsimError(f"`gen_tokens`: cost model {getattr(model, 'name', model)!r} has no "
                         "priors to replace")
    old = model.priors
    priors = dataclasses.replace(old, gen_input_tokens=tokens.get("in", old.gen_input_tokens),
                                 gen_output_tokens=tokens.get("out", old.gen_output_tokens))
    sources = dict(model.sources)
    sources["priors.gen_*_tokens"] = (
        f"assumption given with --gen-tokens {text!r}: {priors.gen_input_tokens:,.0f} input and "
        f"{priors.gen_output_tokens:,.0f} output tokens per mutation (mutation tokens are never "
        "logged, so generation USD stays imputed)")
    return dataclasses.replace(model, priors=priors, sources=sources)
