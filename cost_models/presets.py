"""Concrete cost model and its presets. Every figure names its source or says 'assumption'.

A preset describes one deployment: the GPU and how it is billed, where compilation runs, the
LLM endpoints for generation and forecasting, how many of each resource exist, and the priors
used for usage a log did not record. ``load_cost_model`` takes a preset name or a TOML file
that starts from a preset and overrides any value.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gfsim.cost_models.base import CostModel
from gfsim.cost_models.usage import ZERO_COST, Cost, Usage
from gfsim.errors import GfsimError

__all__ = [
    "GpuSpec",
    "CpuSpec",
    "LlmSpec",
    "Priors",
    "Capacities",
    "PresetCostModel",
    "PRESETS",
    "load_cost_model",
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
    sources: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.billing not in ("serverless", "reserved"):
            raise GfsimError(f"billing must be serverless or reserved, got {self.billing!r}")
        if self.compile_on not in ("cpu", "gpu_host"):
            raise GfsimError(f"compile_on must be cpu or gpu_host, got {self.compile_on!r}")

    # -- pricing --------------------------------------------------------------------------
    def _gpu(self, seconds: float, watts: float, energy_j: float | None) -> tuple[float, float]:
        usd = seconds * self.gpu.usd_per_hour / _HOUR
        joules = energy_j if energy_j is not None else seconds * watts
        return usd, joules

    @staticmethod
    def _llm(spec: LlmSpec, u: Usage) -> tuple[float, float]:
        usd = (u.input_tokens * spec.usd_per_m_input + u.output_tokens * spec.usd_per_m_output) / (
            _MILLION
        )
        joules = u.input_tokens * spec.j_per_input_token + u.output_tokens * spec.j_per_output_token
        return usd, joules

    def cost(self, usage: Usage) -> Cost:
        stage, s = usage.stage, usage.seconds
        if stage == "generation":
            usd, joules = self._llm(self.generator, usage)
        elif stage == "forecasting":
            usd, joules = self._llm(self.forecaster, usage)
        elif stage == "cold_start":
            usd, joules = self._gpu(s, self.gpu.idle_w_no_context, usage.energy_j)
        elif stage == "compilation":
            if self.compile_on == "gpu_host":
                # The reference JIT-compiles inside the GPU container: billed as GPU time.
                usd, joules = self._gpu(s, self.gpu.idle_w_context, usage.energy_j)
            else:
                usd = s * self.cpu.usd_per_core_hour / _HOUR
                joules = usage.energy_j if usage.energy_j is not None else s * self.cpu.w_per_core
        elif stage in ("check", "timing"):
            usd, joules = self._gpu(s, self.gpu.active_w, usage.energy_j)
        else:  # idle is priced by idle(), never booked per candidate
            raise ValueError(f"stage {stage!r} is not priced per usage; use idle()")
        return Cost(s, usd, joules, usd if usage.imputed else 0.0)

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


# -- presets ----------------------------------------------------------------------------
_ASSUMED_IDLE = (
    "assumption: idle draw scaled from this project's H200 probe (81 W without a CUDA context, "
    "121-125 W with one, on a 700 W board) by board power"
)
_ASSUMED_ACTIVE = (
    "assumption: 60% of board power while checking and timing (H200 probe: 692 W GEMM, 479 W "
    "memory-bound, 180 W launch-bound)"
)
_LLM_ENERGY = (
    "estimate: ~0.8 J per output token (gpt-oss on one H100, public benchmarks); input tokens "
    "assumed 10x cheaper (prefill)"
)
_GEMINI3_FLASH = LlmSpec("gemini-3-flash", 0.50, 3.00, 0.08, 0.8)
_MODAL_CPU = CpuSpec(usd_per_core_hour=0.0472, w_per_core=10.0)
_COMMON_SOURCES = {
    "cpu.usd_per_core_hour": "modal.com/pricing, 2026 ($0.0472 per physical core-hour)",
    "cpu.w_per_core": "assumption: 10 W per busy core",
    "generator": "assumption: the mutator is billed like Gemini 3 Flash, $0.50/$3.00 per 1M "
    "tokens in/out (provider page, 2026)",
    "forecaster": "Gemini 3 Flash $0.50/$3.00 per 1M tokens in/out (provider page, 2026)",
    "*.j_per_*_token": _LLM_ENERGY,
    "priors.gen_*_tokens": "assumption: mutation tokens are never logged; taken of the same order "
    "as a forecast (~3.8k in, ~8.8k out, eval-set-predictions rows)",
    "priors.generation_s": "assumption: as long as a typical forecast (~41 s, Gemini 3 Flash)",
    "priors.forecast_*": "eval-set-predictions rows: ~3.8k in, ~8.8k out tokens, ~41 s",
    "priors.compile_s": "H200 probe: Triton JIT 0.3-1.7 s per new kernel",
    "priors.check_s": "assumption: 2 s of correctness calls per candidate",
    "priors.timing_s": "assumption: 5 s of CUDA-event timing of candidate and reference",
    "priors.cold_start_s": "assumption: 30 s per fresh serverless container",
}


def _serverless_a100() -> PresetCostModel:
    return PresetCostModel(
        name="serverless-a100",
        billing="serverless",
        compile_on="gpu_host",
        gpu=GpuSpec("A100-80GB", usd_per_hour=2.50, board_w=400.0, idle_w_context=70.0,
                    idle_w_no_context=46.0, active_w=240.0),
        cpu=_MODAL_CPU,
        generator=_GEMINI3_FLASH,
        forecaster=_GEMINI3_FLASH,
        capacities=Capacities(generator=16, forecaster=16, compile_workers=4, gpus=16),
        sources={
            **_COMMON_SOURCES,
            "preset": "the paper's setup: a fresh serverless A100-80GB container per candidate, "
            "Triton JIT inside it (REFERENCE.md section 4)",
            "gpu.usd_per_hour": "modal.com/pricing, 2026: A100-80GB $2.50/h, per-second billing",
            "gpu.board_w": "vendor spec: A100-SXM 400 W",
            "gpu.idle_w_*": _ASSUMED_IDLE,
            "gpu.active_w": _ASSUMED_ACTIVE,
            "capacities.gpus": "assumption: at most 16 containers at once",
        },
    )


def _reserved_h100() -> PresetCostModel:
    return PresetCostModel(
        name="reserved-h100",
        billing="reserved",
        compile_on="cpu",
        gpu=GpuSpec("H100", usd_per_hour=3.95, board_w=700.0, idle_w_context=123.0,
                    idle_w_no_context=81.0, active_w=420.0),
        cpu=_MODAL_CPU,
        generator=_GEMINI3_FLASH,
        forecaster=_GEMINI3_FLASH,
        priors=Priors(cold_start_s=0.0),
        capacities=Capacities(generator=16, forecaster=16, compile_workers=4, gpus=1),
        sources={
            **_COMMON_SOURCES,
            "preset": "one reserved H100 billed for the whole wall-clock, idle included; a warm "
            "worker (no cold starts); Triton compiled ahead of time on 4 CPU workers",
            "gpu.usd_per_hour": "assumption: a reservation at Modal's H100 list price, $3.95/h "
            "(modal.com/pricing, 2026)",
            "gpu.board_w": "vendor spec: H100-SXM 700 W",
            "gpu.idle_w_*": "assumption: the H200 probe's figures (same 700 W board): 123 W with "
            "a CUDA context, 81 W without",
            "gpu.active_w": _ASSUMED_ACTIVE,
        },
    )


PRESETS = {"serverless-a100": _serverless_a100, "reserved-h100": _reserved_h100}
_SECTIONS = {"gpu": GpuSpec, "cpu": CpuSpec, "generator": LlmSpec, "forecaster": LlmSpec,
             "priors": Priors, "capacities": Capacities}


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


def load_cost_model(spec: str | None) -> PresetCostModel:
    """A preset name, or a TOML file with ``base = "PRESET"`` and tables overriding any value."""
    spec = spec or "serverless-a100"
    if spec in PRESETS:
        return PRESETS[spec]()
    path = Path(spec)
    if path.suffix != ".toml":
        raise GfsimError(f"unknown cost preset {spec!r}; valid: {', '.join(PRESETS)}, or a .toml file")
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GfsimError(f"{spec}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GfsimError(f"{spec}: not valid TOML ({exc})") from None
    base = data.pop("base", "serverless-a100")
    if base not in PRESETS:
        raise GfsimError(f"{spec}: base {base!r} is not a preset; valid: {', '.join(PRESETS)}")
    model = PRESETS[base]()
    changes: dict = {"name": data.pop("name", f"{base}+{path.name}")}
    for key in ("billing", "compile_on"):
        if key in data:
            changes[key] = data.pop(key)
    for section, value in data.items():
        if section not in _SECTIONS:
            valid = ", ".join(["base", "name", "billing", "compile_on", *_SECTIONS])
            raise GfsimError(f"{spec}: unknown key {section!r}; valid: {valid}")
        if not isinstance(value, dict):
            raise GfsimError(f"{spec}: [{section}] must be a table")
        changes[section] = _override(getattr(model, section), value, f"{spec}: [{section}]")
    sources = dict(model.sources)
    sources["override"] = f"values overridden by {path}"
    return dataclasses.replace(model, sources=sources, **changes)
