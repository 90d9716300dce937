"""The figures behind the presets, each with its source (docs/concepts/paper.md) or the word
"assumption"/"estimate". Plain tables: ``presets`` turns them into cost models.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GpuFigures",
    "LlmFigures",
    "GPUS",
    "LLMS",
    "PROVIDERS",
    "CPU_USD_PER_CORE_HOUR",
    "CPU_W_PER_CORE",
    "H200_IDLE_W_CONTEXT",
    "H200_IDLE_W_NO_CONTEXT",
    "ACTIVE_SHARE_OF_BOARD",
    "SELF_HOSTED_TOK_PER_S",
    "INPUT_TOKEN_DISCOUNT",
    "J_PER_OUTPUT_TOKEN",
    "SOURCES",
]

MODAL_PRICING = "modal.com/pricing, 2026"
RUNPOD_PRICING = "docs.runpod.io/serverless/pricing"
PROVIDERS = ("modal", "runpod")


@dataclass(frozen=True)
class GpuFigures:
    key: str  # the preset suffix: serverless-KEY, reserved-KEY
    name: str
    modal_usd_per_hour: float  # Modal, per-second billing
    runpod_usd_per_s: float  # RunPod serverless
    board_w: float
    board_spec: str  # what the vendor figure is for


# Vendor board power: A100-SXM 400 W, L40S 350 W, H100-SXM 700 W, H200 700 W, B200 ~1000 W.
GPUS: dict[str, GpuFigures] = {
    g.key: g
    for g in (
        GpuFigures("a100", "A100-80GB", 2.50, 0.00076, 400.0, "A100-SXM 400 W"),
        GpuFigures("l40s", "L40S", 1.95, 0.00053, 350.0, "L40S 350 W"),
        GpuFigures("h100", "H100", 3.95, 0.00116, 700.0, "H100-SXM 700 W"),
        GpuFigures("h200", "H200", 4.54, 0.00155, 700.0, "H200 700 W"),
        GpuFigures("b200", "B200", 6.25, 0.00240, 1000.0, "B200 ~1000 W"),
    )
}

# This project's H200 probe (NVML): 81 W idle without a CUDA context, 121-125 W with one.
H200_IDLE_W_CONTEXT = 123.0
H200_IDLE_W_NO_CONTEXT = 81.0
ACTIVE_SHARE_OF_BOARD = 0.6  # assumption, see SOURCES["active"]

CPU_USD_PER_CORE_HOUR = 0.0472  # modal.com/pricing, per physical core-hour
CPU_W_PER_CORE = 10.0  # assumption

J_PER_OUTPUT_TOKEN = 0.8  # estimate: gpt-oss on one H100, public benchmarks
INPUT_TOKEN_DISCOUNT = 10.0  # assumption: an input token costs a tenth of an output token
SELF_HOSTED_TOK_PER_S = 2765.0  # gpt-oss-20b output tokens/s on one H100, public benchmarks


@dataclass(frozen=True)
class LlmFigures:
    name: str
    label: str
    usd_per_m_input: float
    usd_per_m_output: float
    source: str  # where the price comes from
    kind: str  # "api" | "self-hosted"


def _self_hosted_gpt_oss_20b() -> LlmFigures:
    usd_per_hour = GPUS["h100"].modal_usd_per_hour
    out = usd_per_hour / (SELF_HOSTED_TOK_PER_S * 3600.0) * 1e6
    inp = out / INPUT_TOKEN_DISCOUNT
    source = (
        f"derived: one H100 at ${usd_per_hour:.2f}/h ({MODAL_PRICING}) serving "
        f"~{SELF_HOSTED_TOK_PER_S:,.0f} output tok/s (gpt-oss-20b, public benchmarks): "
        f"{usd_per_hour:.2f} / ({SELF_HOSTED_TOK_PER_S:,.0f} x 3600) x 1e6 = ${out:.4f} per 1M "
        f"output tokens; input assumed 10x cheaper (assumption) = ${inp:.4f} per 1M; "
        "assumption: the server is kept busy (an idle server costs more per token). Note: "
        "0.8 J/token at this rate would be ~2.2 kW, over the H100's 700 W board, so the two "
        "benchmark figures are not from one run and the energy estimate is on the high side"
    )
    return LlmFigures("self-hosted-gpt-oss-20b", "gpt-oss-20b self-hosted on one H100", inp, out,
                      source, "self-hosted")


LLMS: dict[str, LlmFigures] = {
    f.name: f
    for f in (
        LlmFigures("gemini-3-flash", "Gemini 3 Flash", 0.50, 3.00, "provider page, 2026", "api"),
        LlmFigures("gpt-oss-120b", "GPT-OSS-120B", 0.15, 0.60, "provider page, 2026", "api"),
        LlmFigures("gpt-oss-20b", "GPT-OSS-20B", 0.05, 0.20, "provider page, 2026", "api"),
        LlmFigures("deepseek-v4-flash", "DeepSeek V4-Flash", 0.14, 0.28, "provider page, 2026",
                   "api"),
        _self_hosted_gpt_oss_20b(),
    )
}

SOURCES = {
    "modal": MODAL_PRICING,
    "runpod": RUNPOD_PRICING,
    "idle_measured": "this project's H200 probe (NVML): 81 W idle without a CUDA context, "
    "121-125 W with one (123 W used)",
    "idle_scaled": "assumption: idle draw scaled from this project's H200 probe (81 W without a "
    "CUDA context, 121-125 W with one, on a 700 W board) by board power",
    "active": "assumption: 60% of board power while checking and timing (H200 probe: 692 W "
    "GEMM, 479 W memory-bound, 180 W launch-bound)",
    "llm_energy": "estimate: ~0.8 J per output token (gpt-oss on one H100, public benchmarks); "
    "input tokens assumed 10x cheaper (prefill)",
    "cpu.usd_per_core_hour": f"{MODAL_PRICING} ($0.0472 per physical core-hour)",
    "cpu.w_per_core": "assumption: 10 W per busy core",
}
