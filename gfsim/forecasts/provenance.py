"""Where the numbers a command prints come from, said where people read them.

Three things a replay, a savings estimate, a tuning study or a score rests on and that its table
does not show:

- ``forecast_source``: whose forecasts the policy reads (or that are scored): a logged LLM's
  answers, what-if draws (SYNTHETIC: invented by a model from the log's own measured speedups),
  the learned cost model, a synthetic log's invented ones, imported ones, or none. One function
  decides, from the log's forecast records (their ``mode``) and the forecaster's name, so that
  every command says the same thing of the same forecasts.
- the log's known caveats (``gfsim.replay_logs.shipped.SHIPPED_CAVEATS``): what the docs admit
  about a shipped log, such as the inflated fp8 baselines of ``h200-live-v1``.
- ``hardware_note``: a log measured on one GPU priced by a cost preset of another (the default
  preset prices an A100): the timings stay the log's, only the prices move.
"""

from __future__ import annotations

import re

from gfsim.cost_models.catalog import GPUS
from gfsim.forecasts.registry import kind_of
from gfsim.replay_logs.shipped import log_caveats

__all__ = ["SOURCE_KINDS", "forecast_source", "hardware_note", "provenance", "provenance_notes",
           "log_gpu"]

# What a forecast can rest on. ``synthetic`` is a synthetic log's own forecasts (drawn by its
# generator); ``imported`` ones came with a log from outside (``gfsim import``), whose origin
# gfsim cannot check.
SOURCE_KINDS = ("llm", "whatif", "learned", "synthetic", "imported", "unknown", "none")
# (a plug-in forecaster's kind is its own word, beside these)

# A forecast record's ``mode`` -> kind. ``logprobs`` and ``tool`` are how an LLM answered (the
# live forecaster, the paper's logs through the importer).
_MODE_KIND = {"logprobs": "llm", "tool": "llm", "whatif": "whatif", "costmodel": "learned",
              "synthetic": "synthetic", "imported": "imported"}
# Where one forecaster's records carry several modes, the most invented one names them all: a
# column that is partly what-if is not an LLM's.
_PRIORITY = ("whatif", "synthetic", "learned", "imported", "llm", "unknown")


def _kind(name: str, modes: list[str], synthetic_log: bool) -> str:
    if modes:
        kinds = {_MODE_KIND.get(m, "unknown") for m in modes}
        kind = next(k for k in _PRIORITY if k in kinds)
    else:  # nothing logged under the name: what its maker makes
        kind = "unknown"
    if kind == "unknown":  # a plug-in's forecasts: the kind its maker says (any word)
        kind = kind_of(name)
    # A synthetic log's "LLM" answers were written by its generator, not by any LLM.
    return "synthetic" if kind == "llm" and synthetic_log else kind


def _logged_model(log, name: str) -> str | None:
    """The model a log's header names for forecaster ``name`` (``gfsim forecast`` and live runs
    keep a ``forecasters`` entry), if any."""
    for entry in log.header.get("forecasters") or []:
        if isinstance(entry, dict) and entry.get("name") == name and entry.get("model"):
            return str(entry["model"])
    return None


def _text(kind: str, name: str, modes: list[str], log) -> str:
    if kind == "whatif":
        preset = name.partition(":")[2].partition(",")[0] if name.startswith("paper:") else None
        fitted = (f"; its parameters are fitted to the paper's published figures for {preset}, "
                  f"it is not {preset}'s answers" if preset else "")
        return (f"SYNTHETIC what-if forecasts ({name}): invented by a model from the log's own "
                f"measured speedups (gfsim.forecasts.whatif, every parameter an assumption); "
                f"no LLM forecast these candidates{fitted}{_assumed_text(name, log)}")
    if kind == "learned":
        text = (f"the learned forecaster ({name}): gradient-boosted trees trained on the log's "
                "measurements, each forecast from earlier measurements only; no LLM")
        if log.is_synthetic:
            text += "; the log is SYNTHETIC, and so are the measurements it learned from"
        return text
    if kind == "llm":
        model = _logged_model(log, name)
        return (f"a logged LLM forecaster ({name}{', model ' + model if model else ''}, "
                f"{'/'.join(modes)}): the answers recorded in the log")
    if kind == "synthetic":
        gen = log.header["provenance"].get("generator") or "its generator"
        return (f"SYNTHETIC forecasts ({name}): drawn by the log's generator ({gen}) from "
                "stated assumptions; no LLM answered")
    if kind == "imported":
        return (f"imported forecasts ({name}): they came with the log from outside gfsim, "
                "which cannot say who made them")
    if kind != "unknown":
        return (f"forecasts of the plug-in forecaster {name} (kind {kind!r}, mode "
                f"{'/'.join(modes) or 'none'}): what they rest on is the plug-in's to say; "
                "no LLM is known to have answered")
    return f"logged forecasts ({name}, mode {'/'.join(modes) or 'none'}): origin not recorded"


def _assumed_text(name: str, log) -> str:
    """What a what-if forecaster's forecasts of candidates without a measured speedup (failed
    or never evaluated) rest on, and how many there are; children a closed-loop replay
    invents are forecast by the same model."""
    from gfsim.forecasts.whatif import assumed_forecasts, parse_whatif, whatif_model

    n = assumed_forecasts(log, name)
    if not n:
        return ""
    total = int((log.forecasts["forecaster"] == name).sum())
    model = whatif_model(log, name)
    if model is None:
        try:
            model = parse_whatif(name)
        except Exception:  # noqa: BLE001 - a name written by another version: say less
            model = None
    said = model.assumption() if model is not None else "see gfsim.forecasts.whatif"
    return (f"; {n} of its {total} forecasts are of candidates without a measured speedup "
            f"(failed or never evaluated), drawn by an ASSUMPTION ({said}; the paper's data "
            "holds no forecast of a failed kernel); invented children are forecast by the "
            "same model")


def forecast_source(log, forecaster: str | None = None, *, read: bool = True) -> dict:
    """``{"forecaster", "kind", "synthetic", "text"}`` for the forecasts of ``forecaster`` in
    ``log`` (None: the first logged one, as a replay picks). ``read=False``: no policy reads
    any, whatever the log holds. ``kind`` is one of ``SOURCE_KINDS``; ``synthetic`` is true
    where the forecasts were invented (what-if, a synthetic log's) or learned from a synthetic
    log; ``text`` says it in a line, with SYNTHETIC in capitals where it applies."""
    names = log.forecasters()
    name = forecaster if forecaster is not None else (names[0] if names else None)
    if not read or name is None:
        why = "the policy reads no forecasts" if not read else "the log holds no forecasts"
        return {"forecaster": None, "kind": "none", "synthetic": False, "text": f"none: {why}"}
    fc = log.forecasts
    # .unique() first: stepping through an Arrow-backed column value by value cost a
    # cached 100,000-candidate replay a fifth of a second.
    modes = sorted({str(m) for m in fc.loc[fc["forecaster"] == name, "mode"].unique()}) \
        if len(fc) else []
    kind = _kind(name, modes, log.is_synthetic)
    synthetic = kind in ("whatif", "synthetic") or log.is_synthetic
    return {"forecaster": name, "kind": kind, "synthetic": synthetic,
            "text": _text(kind, name, modes, log)}


def _gpu_key(text) -> str | None:
    """The cost catalog's GPU (``a100``, ``h200``, ...) a device name names, or None where it
    names none or several: a guess is worse than no note."""
    if not isinstance(text, str):
        return None
    words = set(re.split(r"[^a-z0-9]+", text.lower()))
    found = [key for key in GPUS if key in words]
    return found[0] if len(found) == 1 else None


def log_gpu(log) -> str | None:
    """The device name a measured log's header gives, or None (a synthetic log measured
    nothing)."""
    if log.header["provenance"].get("kind") == "synthetic":
        return None
    hw = log.header.get("hardware") or {}
    for field in ("device_name", "gpu", "gpu_name", "device", "name"):
        if isinstance(hw.get(field), str) and hw[field]:
            return hw[field]
    return None


def hardware_note(log, model) -> str | None:
    """A line where ``log`` was measured on one GPU and ``model`` prices another; None where
    either is unknown or they agree."""
    measured_on = log_gpu(log)
    log_key, priced_key = _gpu_key(measured_on), _gpu_key(model.gpu.name)
    if log_key is None or priced_key is None or log_key == priced_key:
        return None
    billing = getattr(model, "billing", "serverless")
    return (f"log measured on {measured_on}; priced as {model.name} ({model.gpu.name}): "
            f"the seconds the log recorded are {measured_on}'s, not rescaled, those it did "
            "not record come from the cost model's priors (see the imputed share), and the "
            f"prices are another GPU's; pass --cost {billing}-{log_key} to price the log's GPU")


def provenance(log, forecaster: str | None = None, model=None, *, read: bool = True) -> dict:
    """The JSON fields every replaying command adds: ``forecast_source``, ``log_caveats`` (the
    known caveats of the log) and ``hardware_note`` (None unless the prices are another
    GPU's)."""
    return {"forecast_source": forecast_source(log, forecaster, read=read),
            "log_caveats": log_caveats(log),
            "hardware_note": hardware_note(log, model) if model is not None else None}


def provenance_notes(prov: dict, log_name: str, *, what: str = "forecasts the policy reads"
                     ) -> list[str]:
    """``provenance``'s fields as the notes a command prints under its tables."""
    notes = [f"{what}: {prov['forecast_source']['text']}"]
    notes += [f"known caveat of {log_name}: {c}" for c in prov["log_caveats"]]
    if prov.get("hardware_note"):
        notes.append(prov["hardware_note"])
    return notes
