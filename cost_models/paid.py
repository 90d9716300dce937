"""Token prices as a run paid them: the generator's rates from what the run's folder recorded
(an imported log's ``header["generator"]``), else from the catalog entry of the model the run
named, else the cost model's own generator, said which.

The importers record a run's models (programs each) and, where the folder keeps them, the
rates it charged (ShinkaEvolve's ``pricing_snapshot.json``: ``prices.usd_per_million_tokens``).
OpenEvolve 0.4.1 records each program's model and tokens but no price: its models are looked
up by name in the price catalog (``catalog.LLMS``), and a model the catalog lacks is priced at
the cost model's generator.
"""

from __future__ import annotations

import dataclasses

from gfsim.cost_models import catalog

__all__ = ["paid_generator"]


def paid_generator(model, generator: dict | None):
    """(``model`` with its generator's token prices as the run paid them, where it says;
    ``{"source", "models"}``: where each price came from). ``generator``: the log header's
    ``generator`` record (None: the log says nothing, and ``model`` is returned as it is).

    The run's rates are averaged over its models weighted by the programs each wrote; a model
    neither the run's record nor the catalog prices counts at the cost model's rate."""
    spec = model.generator
    preset = (f"the cost model's generator ({model.name}: {spec.name}, "
              f"${spec.usd_per_m_input:g} / ${spec.usd_per_m_output:g} per 1M input / output "
              "tokens; assumed)")
    generator = generator if isinstance(generator, dict) else {}
    models = {str(k): v for k, v in (generator.get("models") or {}).items()
              if isinstance(v, (int, float)) and v > 0}
    if not models:
        return model, {"source": f"{preset}: the log names no generator model", "models": {}}
    recorded = (generator.get("prices") or {}).get("usd_per_million_tokens") or {}
    per_model, sources = {}, {}
    for name in models:
        rates = recorded.get(name)
        if isinstance(rates, dict) and "input" in rates and "output" in rates:
            per_model[name] = (float(rates["input"]), float(rates["output"]))
            sources[name] = "measured: the run's recorded price"
            continue
        known = catalog.LLMS.get(_catalog_name(name))
        if known is not None:
            per_model[name] = (known.usd_per_m_input, known.usd_per_m_output)
            sources[name] = f"named preset: catalog {known.name} ({known.source})"
            continue
        per_model[name] = (spec.usd_per_m_input, spec.usd_per_m_output)
        sources[name] = "assumed: not in the run's record nor the catalog; the cost model's"
    if all(s.startswith("assumed") for s in sources.values()):
        return model, {"source": f"{preset}: the run recorded no price for its models and "
                                 "the catalog names none of them", "models": sources}
    total = sum(models.values())
    inp = sum(models[n] * per_model[n][0] for n in models) / total
    out = sum(models[n] * per_model[n][1] for n in models) / total
    kinds = sorted({s.split(":")[0] for s in sources.values()})
    paid = dataclasses.replace(model, name=f"{model.name} (generator at the run's prices)",
                               generator=dataclasses.replace(spec, usd_per_m_input=inp,
                                                             usd_per_m_output=out))
    return paid, {"source": f"{' and '.join(kinds)}: ${inp:.4g} / ${out:.4g} per 1M input / "
                            "output tokens, the run's models weighted by the programs each "
                            "wrote", "models": sources}


def _catalog_name(name: str) -> str:
    """``gemini-3-flash`` for ``google/gemini-3-flash``, ``local/x@http://...`` -> ``x``."""
    return name.split("@", 1)[0].rsplit("/", 1)[-1].strip().lower()
