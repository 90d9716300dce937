"""What ``gfsim costs`` shows: the cost presets and LLM endpoints with their sources, or every
figure of one cost model with its source."""

from __future__ import annotations

__all__ = ["costs", "SPEC_HELP"]

SPEC_HELP = ("PRESET, PRESET:key=value,... (keys: provider=modal|runpod for serverless presets, "
             "forecaster=LLM, generator=LLM, gpus=N) or a TOML file")


def costs(spec: str | None = None) -> dict:
    """The catalog (``spec`` None: every preset, plug-ins' marked, the LLM endpoints, the CPU,
    the spec grammar) or one cost model's every figure with its source.

    Examples:
        >>> import gfsim
        >>> out = gfsim.costs("reserved-h100:gpus=2")
        >>> out["name"], out["capacities"]["gpus"]
        ('reserved-h100:gpus=2', 2)
    """
    if spec is None:
        return _catalog()
    from gfsim.cost_models import figures, load_cost_model

    model = load_cost_model(spec)
    return {"spec": spec, **model.describe(), "figures": figures(model)}


def _catalog() -> dict:
    """The presets (plug-ins' marked), the LLM endpoints, the CPU and the spec grammar."""
    from gfsim.cost_models import LLMS, PRESETS, SPEC_PARAMS, catalog, load_cost_model
    from gfsim.cost_models.presets import DEFAULT_LLM

    presets = []
    for name in PRESETS:
        m = load_cost_model(name)
        g = next((f for f in catalog.GPUS.values() if f.name == m.gpu.name), None)
        presets.append({
            "name": name, "billing": m.billing, "gpu": m.gpu.name,
            "usd_per_hour": m.gpu.usd_per_hour,
            "runpod_usd_per_hour": (round(g.runpod_usd_per_s * 3600, 6)
                                    if m.billing == "serverless" and g is not None else None),
            "board_w": m.gpu.board_w, "compile_on": m.compile_on,
            "gpus": m.capacities.gpus,
            "price_source": m.sources.get("gpu.usd_per_hour", "not given by the plug-in"),
            "plugin": not PRESETS.builtin(name),
        })
    llms = [{"name": name, "kind": catalog.LLMS[name].kind, "label": catalog.LLMS[name].label,
             "usd_per_m_input": s.usd_per_m_input, "usd_per_m_output": s.usd_per_m_output,
             "j_per_input_token": s.j_per_input_token,
             "j_per_output_token": s.j_per_output_token, "source": catalog.LLMS[name].source,
             "energy_source": catalog.SOURCES["llm_energy"]}
            for name, s in LLMS.items()]
    return {
        "presets": presets,
        "llms": llms,
        "cpu": {"usd_per_core_hour": catalog.CPU_USD_PER_CORE_HOUR,
                "w_per_core": catalog.CPU_W_PER_CORE,
                "source": catalog.SOURCES["cpu.usd_per_core_hour"]},
        "spec": SPEC_HELP,
        "spec_keys": {p.name: (list(p.kind) if isinstance(p.kind, tuple) else p.kind.__name__)
                      for p in SPEC_PARAMS},
        "default_llm": DEFAULT_LLM,
    }
