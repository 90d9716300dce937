"""The concrete cost model: a GPU, CPU compile workers and two LLM endpoints, each priced from
figures that name their source (see ``presets`` and ``catalog``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field

import numpy as np

from gfsim.core.errors import GfsimError
from gfsim.cost_models.base import CostModel
from gfsim.cost_models.usage import ZERO_COST, Cost, Usage

__all__ = [
    "GpuSpec",
    "CpuSpec",
    "LlmSpec",
    "Priors",
    "Capacities",
    "PresetCostModel",
    "figures",
    "source_of",
    "with_prices",
]

_HOUR = 3600.0
_MILLION = 1e6


@dataclass(frozen=True)
class GpuSpec:
    name: str
    usd_per_hour: float
    board_w: float
    idle_w_context: float  # idle with a CUDA context held (a warm worker)
    idle_w_no_context: float  # idle without one (a container starting)
    active_w: float  # average draw while checking and timing candidates


@dataclass(frozen=True)
class CpuSpec:
    usd_per_core_hour: float
    w_per_core: float


@dataclass(frozen=True)
class LlmSpec:
    name: str
    usd_per_m_input: float
    usd_per_m_output: float
    j_per_input_token: float
    j_per_output_token: float


@dataclass(frozen=True)
class Priors:
    """Usage assumed where a log is silent; anything priced from these counts as imputed USD."""

    gen_input_tokens: float = 4000.0
    gen_output_tokens: float = 8000.0
    generation_s: float = 41.0
    forecast_s: float = 41.0
    forecast_input_tokens: float = 3800.0
    forecast_output_tokens: float = 8800.0
    compile_s: float = 1.0
    check_s: float = 2.0
    timing_s: float = 5.0
    cold_start_s: float = 30.0


@dataclass(frozen=True)
class Capacities:
    """How many of each resource the simulated deployment has (concurrent slots)."""

    generator: int = 16
    forecaster: int = 16
    compile_workers: int = 4
    gpus: int = 1

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GfsimError(f"capacity {f.name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class PresetCostModel(CostModel):
    name: str
    billing: str  # "serverless" | "reserved"
    compile_on: str  # "cpu" | "gpu_host"
    gpu: GpuSpec
    cpu: CpuSpec
    generator: LlmSpec
    forecaster: LlmSpec
    priors: Priors = Priors()
    capacities: Capacities = Capacities()
    # The instance policy of serverless billing: seconds a GPU container stays warm after its
    # last evaluation (0: a fresh container, and its cold start, for every evaluation).
    # Reserved billing keeps its workers warm: no cold starts. See ``instance_policy``.
    keep_warm_s: float = 0.0
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.billing not in ("serverless", "reserved"):
            raise GfsimError(f"billing must be serverless or reserved, got {self.billing!r}")
        if self.compile_on not in ("cpu", "gpu_host"):
            raise GfsimError(f"compile_on must be cpu or gpu_host, got {self.compile_on!r}")
        k = self.keep_warm_s
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not k >= 0:
            raise GfsimError(f"keep_warm_s must be a number of seconds >= 0, got {k!r}")

    def instance_policy(self) -> str:
        """When an evaluation pays a cold start under this model, in one sentence."""
        if self.billing != "serverless":
            return ("reserved GPUs stay warm: no cold starts (a cold start the log recorded "
                    "is not charged either)")
        if self.keep_warm_s <= 0:
            return (f"a fresh serverless container for every evaluation (keep_warm_s = 0): "
                    f"each pays a cold start, the log's where it recorded one, else the "
                    f"{self.priors.cold_start_s:g} s prior")
        return (f"a serverless container stays warm {self.keep_warm_s:g} s after its last "
                f"evaluation: an evaluation pays a cold start only where no container of its "
                f"search is warm on the log's schedule (up to {self.capacities.gpus} "
                f"containers; the log's cold start where it recorded one, else the "
                f"{self.priors.cold_start_s:g} s prior)")

    # -- pricing --------------------------------------------------------------------------
    def rates(self, stage: str) -> tuple[float, float, float, float, float, float]:
        """Linear prices of a stage: USD per second, per input token, per output token, and
        watts, joules per input token, joules per output token."""
        if stage in ("generation", "forecasting"):
            llm = self.generator if stage == "generation" else self.forecaster
            return (0.0, llm.usd_per_m_input / _MILLION, llm.usd_per_m_output / _MILLION,
                    0.0, llm.j_per_input_token, llm.j_per_output_token)
        gpu_usd = self.gpu.usd_per_hour / _HOUR
        if stage == "cold_start":
            return (gpu_usd, 0.0, 0.0, self.gpu.idle_w_no_context, 0.0, 0.0)
        if stage == "compilation":
            if self.compile_on == "gpu_host":
                # The reference JIT-compiles inside the GPU container: billed as GPU time.
                return (gpu_usd, 0.0, 0.0, self.gpu.idle_w_context, 0.0, 0.0)
            return (self.cpu.usd_per_core_hour / _HOUR, 0.0, 0.0, self.cpu.w_per_core, 0.0, 0.0)
        if stage in ("check", "timing"):
            return (gpu_usd, 0.0, 0.0, self.gpu.active_w, 0.0, 0.0)
        # idle is priced by idle(), never booked per candidate
        raise ValueError(f"stage {stage!r} is not priced per usage; use idle()")

    def cost(self, usage: Usage) -> Cost:
        a, b, c, w, ji, jo = self.rates(usage.stage)
        s, tin, tout = usage.seconds, usage.input_tokens, usage.output_tokens
        usd = s * a + tin * b + tout * c
        joules = usage.energy_j if usage.energy_j is not None else s * w + tin * ji + tout * jo
        return Cost(s, usd, joules, usd if usage.imputed else 0.0)

    def price_many(self, stage, seconds, input_tokens=None, output_tokens=None, energy_j=None,
                   imputed=None):
        """Vectorised ``cost``: the same formula on arrays."""
        a, b, c, w, ji, jo = self.rates(stage)
        s = np.asarray(seconds, dtype=float)
        tin = np.zeros_like(s) if input_tokens is None else np.asarray(input_tokens, float)
        tout = np.zeros_like(s) if output_tokens is None else np.asarray(output_tokens, float)
        usd = s * a + tin * b + tout * c
        joules = s * w + tin * ji + tout * jo
        if energy_j is not None:
            e = np.asarray(energy_j, dtype=float)
            joules = np.where(np.isnan(e), joules, e)
        imp = np.zeros(len(s), bool) if imputed is None else np.asarray(imputed, dtype=bool)
        return usd, joules, np.where(imp, usd, 0.0)

    def idle(self, idle_gpu_s: float) -> Cost:
        if self.billing == "serverless" or idle_gpu_s <= 0:
            return ZERO_COST  # serverless scales to zero: unused GPUs are neither paid nor powered
        usd = idle_gpu_s * self.gpu.usd_per_hour / _HOUR
        return Cost(idle_gpu_s, usd, idle_gpu_s * self.gpu.idle_w_context, 0.0)

    def describe(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("sources")
        out["sources"] = dict(self.sources)
        return out


def with_prices(model: PresetCostModel, *, gpu: float = 1.0,
                forecaster: float = 1.0) -> PresetCostModel:
    """``model`` with its GPU-hour price (checking, timing, cold starts, and compiling on a GPU
    host) times ``gpu`` and its forecaster's token prices times ``forecaster``; watts, seconds
    and every other price as they were. Its name says so."""
    if gpu <= 0 or forecaster <= 0:
        raise GfsimError(f"price factors must be > 0, got gpu={gpu!r}, forecaster={forecaster!r}")
    if gpu == 1.0 and forecaster == 1.0:
        return model
    fc = model.forecaster
    return dataclasses.replace(
        model, name=f"{model.name} (GPU price x{gpu:g}, forecast price x{forecaster:g})",
        gpu=dataclasses.replace(model.gpu, usd_per_hour=model.gpu.usd_per_hour * gpu),
        forecaster=dataclasses.replace(fc, usd_per_m_input=fc.usd_per_m_input * forecaster,
                                       usd_per_m_output=fc.usd_per_m_output * forecaster))


def source_of(sources: dict, key: str) -> str | None:
    """The source of figure ``key`` (e.g. ``gpu.idle_w_context``): an exact entry, else the
    most specific wildcard entry (``gpu.idle_w_*``), else the entry of its section
    (``generator``), else the preset's own description."""
    if key in sources:
        return sources[key]
    matches = [p for p in sources if "*" in p and fnmatch.fnmatchcase(key, p)]
    if matches:
        return sources[max(matches, key=lambda p: len(p.replace("*", "")))]
    section = key.partition(".")[0]
    if "." in key and section in sources:
        return sources[section]
    return sources.get("preset")


def figures(model: PresetCostModel) -> list[dict]:
    """Every figure of ``describe()`` flattened to ``{"key", "value", "source"}`` rows."""
    rows = []
    for key, value in model.describe().items():
        if key == "sources":
            continue
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            full = key if sub is None else f"{key}.{sub}"
            rows.append({"key": full, "value": v, "source": source_of(model.sources, full)})
    return rows
