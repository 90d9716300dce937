"""Presets and the cost spec. Every figure names its source or says 'assumption'/'estimate'.

A preset describes one deployment: the GPU and how it is billed, where compilation runs, the
LLM endpoints for generation and forecasting, how many of each resource exist, and the priors
used for usage a log did not record. ``load_cost_model`` takes

- ``PRESET`` or ``PRESET:key=value,...`` with keys ``provider`` (modal|runpod, serverless
  presets only), ``forecaster`` and ``generator`` (an LLM endpoint name), ``gpus`` (int) and
  ``keep_warm`` (seconds a serverless container stays warm after an evaluation);
- or a TOML file with ``base = "PRESET[:key=value,...]"``, optional top-level
  ``provider``/``forecaster_llm``/``generator_llm``/``keep_warm_s``, and tables overriding
  any value.

Instance policy: a reserved GPU stays warm (no cold starts); a serverless container stays warm
``keep_warm_s`` after its last evaluation (the provider's default; 0 for ``serverless-a100``,
the paper's fresh container per evaluation), and ``simulator.traces`` charges a cold start to
an evaluation that finds none warm on the log's schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

from gfsim.core.docs import docs_url
from gfsim.core.errors import GfsimError, SpecError
from gfsim.core.plugins import PluginError, Registry
from gfsim.core.specs import Param, bind_params, format_spec, parse_spec
from gfsim.cost_models import catalog
from gfsim.cost_models.catalog import GPUS, SOURCES
from gfsim.cost_models.model import (
    Capacities,
    CpuSpec,
    GpuSpec,
    LlmSpec,
    PresetCostModel,
    Priors,
)

__all__ = [
    "GpuSpec",
    "CpuSpec",
    "LlmSpec",
    "Priors",
    "Capacities",
    "PresetCostModel",
    "PRESETS",
    "LLMS",
    "SPEC_PARAMS",
    "DEFAULT_LLM",
    "load_cost_model",
    "register_cost_model",
]

DEFAULT_LLM = "gemini-3-flash"


def _llm(name: str) -> LlmSpec:
    f = catalog.LLMS[name]
    j_out = catalog.J_PER_OUTPUT_TOKEN
    return LlmSpec(name, f.usd_per_m_input, f.usd_per_m_output,
                   j_out / catalog.INPUT_TOKEN_DISCOUNT, j_out)


LLMS: dict[str, LlmSpec] = {name: _llm(name) for name in catalog.LLMS}


def _usd(x: float) -> str:
    return f"${x:.2f}" if round(x, 2) == x else f"${x:.4f}"


def _llm_source(name: str, role: str, chosen: bool) -> str:
    f = catalog.LLMS[name]
    text = (f"{f.label} {_usd(f.usd_per_m_input)}/{_usd(f.usd_per_m_output)} per 1M tokens "
            f"in/out ({f.source})")
    if chosen:
        return f"{text}; chosen with {role}={name}"
    if role == "generator":
        return "assumption: the mutator is billed like " + text
    return text


SPEC_PARAMS = (
    Param("provider", catalog.PROVIDERS, "modal", "who bills the serverless GPU"),
    Param("forecaster", tuple(LLMS), DEFAULT_LLM, "LLM endpoint of the forecaster"),
    Param("generator", tuple(LLMS), DEFAULT_LLM, "LLM endpoint of the mutator"),
    Param("gpus", int, None, "GPUs (serverless: concurrent containers)", low=1),
    Param("keep_warm", float, None, "seconds a serverless container stays warm after an "
          "evaluation (0: a fresh container, and a cold start, per evaluation)", low=0.0),
)

# How long a serverless container stays warm after its last job, by provider (their defaults).
_KEEP_WARM_S = {"modal": (60.0, "modal.com/docs/guide/cold-start: containers spin down after "
                                "60 s of inactivity by default"),
                "runpod": (5.0, "docs.runpod.io/serverless/endpoints/endpoint-configurations: "
                                "idle timeout 5 s by default")}

_COMMON_SOURCES = {
    "cpu.usd_per_core_hour": SOURCES["cpu.usd_per_core_hour"],
    "cpu.w_per_core": SOURCES["cpu.w_per_core"],
    "*.j_per_*_token": SOURCES["llm_energy"],
    "priors.gen_*_tokens": "assumption: mutation tokens are never logged; taken of the same order "
    "as a forecast (~3.8k in, ~8.8k out, eval-set-predictions rows)",
    "priors.generation_s": "assumption: as long as a typical forecast (~41 s, Gemini 3 Flash)",
    "priors.forecast_*": "eval-set-predictions rows: ~3.8k in, ~8.8k out tokens, ~41 s",
    "priors.compile_s": "H200 probe: Triton JIT 0.3-1.7 s per new kernel",
    "priors.check_s": "assumption: 2 s of correctness calls per candidate",
    "priors.timing_s": "assumption: 5 s of CUDA-event timing of candidate and reference",
    "priors.cold_start_s": "assumption: 30 s per fresh serverless container",
    "capacities.*": "assumption: 16 concurrent generator and forecaster calls, 4 compile workers",
}


def _half_up(x: float) -> float:
    return float(math.floor(x + 0.5))


def _gpu(key: str) -> tuple[GpuSpec, dict]:
    g = GPUS[key]
    if key == "h200":
        ctx, no_ctx = catalog.H200_IDLE_W_CONTEXT, catalog.H200_IDLE_W_NO_CONTEXT
        idle = SOURCES["idle_measured"]
    else:
        scale = g.board_w / GPUS["h200"].board_w
        ctx = _half_up(catalog.H200_IDLE_W_CONTEXT * scale)
        no_ctx = _half_up(catalog.H200_IDLE_W_NO_CONTEXT * scale)
        idle = (f"{SOURCES['idle_scaled']}: {ctx:g} W with a context, {no_ctx:g} W without on "
                f"a {g.board_w:g} W board (whole watts)")
    active = round(catalog.ACTIVE_SHARE_OF_BOARD * g.board_w, 1)
    spec = GpuSpec(g.name, usd_per_hour=g.modal_usd_per_hour, board_w=g.board_w,
                   idle_w_context=ctx, idle_w_no_context=no_ctx, active_w=active)
    return spec, {"gpu.board_w": f"vendor spec: {g.board_spec}", "gpu.idle_w_*": idle,
                  "gpu.active_w": SOURCES["active"]}


def _build(billing: str, key: str, **options) -> PresetCostModel:
    """The preset ``BILLING-KEY`` with spec options (see SPEC_PARAMS) applied."""
    preset = f"{billing}-{key}"
    g = GPUS[key]
    gpu, sources = _gpu(key)
    sources = {**_COMMON_SOURCES, **sources}
    keep_warm_s = 0.0
    if billing == "serverless":
        compile_on, priors, n_gpus = "gpu_host", Priors(), 16
        sources["preset"] = (
            "the paper's setup: a fresh serverless A100-80GB container per candidate, Triton JIT "
            f"inside it ({docs_url('concepts/paper.md')}, the reference search)"
            if key == "a100" else
            f"a fresh serverless {g.name} container per candidate, Triton JIT inside it (the "
            f"paper's setup, {docs_url('concepts/paper.md')}, on another GPU)")
        sources["gpu.usd_per_hour"] = (f"{catalog.MODAL_PRICING}: {g.name} "
                                       f"${g.modal_usd_per_hour:.2f}/h, per-second billing")
        sources["capacities.gpus"] = "assumption: at most 16 containers at once"
        if key == "a100":
            sources["keep_warm_s"] = ("the paper's setup: a fresh container, and a cold start, "
                                      f"for every evaluation ({docs_url('concepts/paper.md')})")
        else:
            keep_warm_s, why = _KEEP_WARM_S[options.get("provider") or "modal"]
            sources["keep_warm_s"] = f"the provider's default: {why}"
    else:
        compile_on, priors, n_gpus = "cpu", Priors(cold_start_s=0.0), 1
        sources["preset"] = (
            f"one reserved {g.name} billed for the whole wall-clock, idle included; a warm "
            "worker (no cold starts); Triton compiled ahead of time on 4 CPU workers")
        sources["gpu.usd_per_hour"] = (
            f"assumption: a reservation at Modal's {g.name} list price, "
            f"${g.modal_usd_per_hour:.2f}/h ({catalog.MODAL_PRICING})")
        sources["priors.cold_start_s"] = "assumption: a warm worker is kept, no cold starts"
        sources["keep_warm_s"] = "assumption: reserved workers stay warm, no cold starts"
        sources["capacities.gpus"] = "assumption: one reserved GPU"

    provider = options.get("provider")
    if provider is not None and billing != "serverless":
        raise SpecError(f"{preset}: provider applies to serverless presets only "
                        f"(valid: {', '.join(catalog.PROVIDERS)})")
    if provider == "runpod":
        gpu = dataclasses.replace(gpu, usd_per_hour=g.runpod_usd_per_s * 3600.0)
        sources["gpu.usd_per_hour"] = (
            f"{catalog.RUNPOD_PRICING}: {g.name} serverless ${g.runpod_usd_per_s:.5f}/s "
            f"(= ${g.runpod_usd_per_s * 3600:.2f}/h); chosen with provider=runpod")
    llm = {}
    for role in ("generator", "forecaster"):
        name = options.get(role)
        llm[role] = LLMS[name or DEFAULT_LLM]
        sources[role] = _llm_source(name or DEFAULT_LLM, role, chosen=name is not None)
    caps = Capacities(generator=16, forecaster=16, compile_workers=4, gpus=n_gpus)
    if options.get("gpus") is not None:
        caps = dataclasses.replace(caps, gpus=options["gpus"])
        sources["capacities.gpus"] = f"set by the cost spec (gpus={options['gpus']})"
    if options.get("keep_warm") is not None:
        if billing != "serverless":
            raise SpecError(f"{preset}: keep_warm applies to serverless presets only "
                            "(reserved GPUs stay warm)")
        keep_warm_s = float(options["keep_warm"])
        sources["keep_warm_s"] = f"set by the cost spec (keep_warm={keep_warm_s:g})"
    given = {p.name: options[p.name] for p in SPEC_PARAMS if options.get(p.name) is not None}
    return PresetCostModel(
        name=format_spec(preset, given), billing=billing, compile_on=compile_on, gpu=gpu,
        cpu=CpuSpec(catalog.CPU_USD_PER_CORE_HOUR, catalog.CPU_W_PER_CORE),
        generator=llm["generator"], forecaster=llm["forecaster"], priors=priors,
        capacities=caps, keep_warm_s=keep_warm_s, sources=sources,
    )


# The two reference setups first (the paper's, and a reserved GPU), then the rest.
_ORDER = [("serverless", "a100"), ("reserved", "h100")] + [
    (b, k) for b in ("serverless", "reserved") for k in GPUS
    if (b, k) not in (("serverless", "a100"), ("reserved", "h100"))]
PRESETS = Registry("gfsim.cost_models", "cost model",
                   {f"{b}-{k}": functools.partial(_build, b, k) for b, k in _ORDER},
                   check=lambda name, factory: _plugin_factory(name, factory))


def _plugin_factory(name, factory) -> str:
    if not callable(factory):
        raise PluginError(f"cost model plug-in {factory!r}: not callable (a plug-in cost model "
                          "is a function of no arguments returning a PresetCostModel)")
    return name


def register_cost_model(name: str, factory, *, replace: bool = False):
    """Make ``factory`` (a function of no arguments returning a ``PresetCostModel``) a cost
    model that specs name ``name``: ``load_cost_model(name)``, ``--cost name``. Returns it."""
    PRESETS.register(factory, name, replace=replace)
    return factory
_SECTIONS = {"gpu": GpuSpec, "cpu": CpuSpec, "generator": LlmSpec, "forecaster": LlmSpec,
             "priors": Priors, "capacities": Capacities}
_TOML_OPTIONS = {"provider": "provider", "forecaster_llm": "forecaster",
                 "generator_llm": "generator"}


def _override(obj, table: dict, where: str):
    valid = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for key, value in table.items():
        if key not in valid:
            raise GfsimError(f"{where}: unknown key {key!r}; valid: {', '.join(valid)}")
        current = getattr(obj, key)
        if isinstance(current, (int, float)) and not isinstance(current, bool):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise GfsimError(f"{where}.{key}: expected a number >= 0, got {value!r}")
            if isinstance(current, float):
                value = float(value)
        changes[key] = value
    return dataclasses.replace(obj, **changes)


def _unknown_preset(name: str) -> SpecError:
    return SpecError(f"unknown cost preset {name!r}; valid: {', '.join(PRESETS)}, or a .toml file")


def load_cost_model(spec: str | PresetCostModel | None) -> PresetCostModel:
    """A cost model from a preset, a preset with overrides, or a TOML file (see the module
    docstring; ``gfsim costs`` lists presets, keys and every figure's source).

    Args:
        spec: ``PRESET`` (``"serverless-a100"``), ``PRESET:key=value,...``
            (``"reserved-h100:gpus=2"``), the path of a ``.toml`` file, a plug-in's name
            (``register_cost_model``, the ``gfsim.cost_models`` entry point), or a cost model
            (returned as it is); None: the default.

    Returns:
        The cost model: prices, powers, capacities and priors, each with its source in
        ``sources``.

    Examples:
        >>> from gfsim.cost_models import load_cost_model
        >>> m = load_cost_model("reserved-h100:gpus=2")
        >>> m.name, m.capacities.gpus
        ('reserved-h100:gpus=2', 2)
    """
    if isinstance(spec, PresetCostModel):
        return spec
    spec = str(spec or "serverless-a100").strip()
    if spec.endswith(".toml"):
        return _load_toml(spec)
    name, pairs = parse_spec(spec)
    if name not in PRESETS:
        raise _unknown_preset(name)
    if not PRESETS.builtin(name):
        return _plugin_model(name, pairs)
    return PRESETS[name](**bind_params(name, SPEC_PARAMS, pairs))


def _plugin_model(name: str, pairs) -> PresetCostModel:
    """A plug-in's cost model (``register_cost_model``): its factory called with nothing."""
    if pairs:
        raise SpecError(f"cost model {name!r} is a plug-in's, which takes no keys; got "
                        f"{', '.join(k for k, _ in pairs)}")
    model = PRESETS[name]()
    if not isinstance(model, PresetCostModel):
        raise PluginError(f"cost model plug-in {name!r}: its factory returned "
                          f"{type(model).__name__}, not a PresetCostModel")
    return model


def _load_toml(spec: str) -> PresetCostModel:
    from gfsim.core.settings_file import read_settings

    # A settings file's limits: a regular file of at most 1 MiB, bounded nesting and keys.
    path = Path(spec)
    data = read_settings(path)
    base = data.pop("base", "serverless-a100")
    if not isinstance(base, str):
        raise GfsimError(f"{spec}: base must be a preset name, got {base!r}")
    base_name, pairs = parse_spec(base)
    if base_name not in PRESETS or not PRESETS.builtin(base_name):
        raise GfsimError(f"{spec}: base {base!r} is not a preset; valid: "
                         f"{', '.join(n for n in PRESETS if PRESETS.builtin(n))}")
    options = bind_params(f"{spec}: base", SPEC_PARAMS, pairs)
    for key, param in _TOML_OPTIONS.items():
        if key in data:
            raw = data.pop(key)
            allowed = next(p.kind for p in SPEC_PARAMS if p.name == param)
            if raw not in allowed:
                raise SpecError(f"{spec}: {key} = {raw!r} is not one of: {', '.join(allowed)}")
            options[param] = raw
    try:
        model = PRESETS[base_name](**options)
    except SpecError as exc:
        raise SpecError(f"{spec}: {exc}") from None
    changes: dict = {"name": data.pop("name", f"{model.name}+{path.name}")}
    for key in ("billing", "compile_on"):
        if key in data:
            changes[key] = data.pop(key)
    if "keep_warm_s" in data:
        value = data.pop("keep_warm_s")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise GfsimError(f"{spec}: keep_warm_s: expected a number >= 0, got {value!r}")
        changes["keep_warm_s"] = float(value)
    sources = dict(model.sources)
    for section, value in data.items():
        if section not in _SECTIONS:
            valid = ", ".join(["base", "name", "billing", "compile_on", "keep_warm_s",
                               *_TOML_OPTIONS,
                               *_SECTIONS])
            raise GfsimError(f"{spec}: unknown key {section!r}; valid: {valid}")
        if not isinstance(value, dict):
            raise GfsimError(f"{spec}: [{section}] must be a table")
        changes[section] = _override(getattr(model, section), value, f"{spec}: [{section}]")
        for key in value:
            sources[f"{section}.{key}"] = f"set in {path} (user-supplied)"
    if "keep_warm_s" in changes:
        sources["keep_warm_s"] = f"set in {path} (user-supplied)"
    sources["override"] = f"values overridden by {path}"
    return dataclasses.replace(model, sources=sources, **changes)
