"""What a ShinkaEvolve run paid for its LLM calls, as its folder records it, for the log's
``header["generator"]``: the models it called (how many programs each wrote), the API dollars
its own accounting charged (each program's ``metadata.api_costs``, ``embed_cost`` and
``novelty_cost``), and the prices it charged them at, where the run folder keeps its price
catalog (``pricing_snapshot.json``: ShinkaEvolve writes the catalog a run used there, USD per
token, since its models.dev pricing). A later cost model can price the log's tokens at the
run's own prices instead of a prior; nothing here is a prior.
"""

from __future__ import annotations

from pathlib import Path

from gfsim.importers.common import BadField, is_number, load_json

__all__ = ["run_prices", "SNAPSHOT"]

SNAPSHOT = "pricing_snapshot.json"
_USD = {"api_costs": "llm", "embed_cost": "embedding", "novelty_cost": "novelty"}
_RATES = {"input_price": "input", "output_price": "output",
          "input_price_tier2": "input_tier2", "output_price_tier2": "output_tier2"}


def run_prices(run: Path, records: list) -> dict:
    """``{"models": {name: programs}, "usd_paid": {...}, "prices": {...}}`` of the run whose
    imported ``(where, record)`` pairs are ``records`` (each with its ``shinka`` extra)."""
    models: dict[str, int] = {}
    paid = {v: 0.0 for v in _USD.values()}
    for _, rec in records:
        extra = rec.get("shinka") or {}
        if isinstance(extra.get("model"), str) and extra["model"]:
            models[extra["model"]] = models.get(extra["model"], 0) + 1
        for key, value in (extra.get("usd") or {}).items():
            paid[_USD[key]] += value
    return {"models": dict(sorted(models.items())),
            "usd_paid": {**{k: round(v, 9) for k, v in paid.items()},
                         "source": "measured: ShinkaEvolve's own accounting, each program's "
                                   "metadata api_costs, embed_cost and novelty_cost"},
            "prices": _snapshot_prices(run, set(models))}


def _snapshot_prices(run: Path, models: set[str]) -> dict:
    """The rates of the run's models in its ``pricing_snapshot.json`` (USD per million tokens),
    or a line saying the folder holds none."""
    path = run / SNAPSHOT
    if not path.is_file():
        return {"source": f"not recorded: the run folder holds no {SNAPSHOT} (ShinkaEvolve "
                          "writes one since its models.dev pricing)"}
    doc = load_json(path, run)
    if not isinstance(doc, dict) or not isinstance(doc.get("catalog"), list):
        raise BadField(path, "catalog", "expected ShinkaEvolve's price catalog (an object "
                                        "with a list of models)")
    rates = {}
    for k, entry in enumerate(doc["catalog"]):
        if not isinstance(entry, dict):
            raise BadField(f"{path}: catalog[{k}]", None, "expected an object")
        names = {entry.get("model_name"), entry.get("api_model_name")} & models
        if not names or entry.get("kind", "llm") != "llm":
            continue
        got = {}
        for field, ours in _RATES.items():
            value = entry.get(field)
            if value is None:
                continue
            if not (is_number(value) and value >= 0):
                raise BadField(f"{path}: catalog[{k}]", field, "expected USD per token >= 0")
            got[ours] = round(value * 1e6, 9)
        if is_number(entry.get("tier_threshold")):
            got["tier2_above_input_tokens"] = entry["tier_threshold"]
        for name in sorted(names):
            rates[name] = got
    when = ", ".join(f"{k} {doc[k]}" for k in ("source", "fetched_at") if doc.get(k))
    return {"source": f"measured: the run's {SNAPSHOT} (ShinkaEvolve's price catalog"
                      + (f": {when}" if when else "") + ")",
            "catalog_sha256": doc.get("catalog_sha256"),
            "usd_per_million_tokens": dict(sorted(rates.items())),
            "unpriced": sorted(models - set(rates)) or None}
