"""The forecasting prompt, its tool, and how an answer is read (docs/concepts/paper.md).

Structure follows the reference forecaster (read for understanding in the authors' public code;
the wording here is gfsim's own): a system message that defines the speedup and the 8 bins (the
paper's prompt convention, right-closed intervals), asks for a distribution concentrated on one or
two neighbouring bins, lists what to reason about and how to answer; then a user message with the
task, the reference kernel, the candidate kernel and, when known, a hardware table.

``tool`` mode answers through one named tool, ``submit_kernel_runtime_estimate``, with the
predicted bin, one probability per bin (8 flat fields, no nested schema, as the reference does
for strict validators) and a short reasoning. Reading follows the reference: the first call of
that tool (else the first call, reported as an unexpected tool); every field required;
probabilities in [0, 1]; the bin in 1..8; the 8 values renormalised by their sum, which is kept
as ``raw_probability_sum``; an all-zero answer is a parse failure; the declared bin is kept as
given even when it is not the most likely one. ``logprobs`` mode shows the same bins with one
label each and asks for just the label.
"""

from __future__ import annotations

import json
import math

from gfsim.core.errors import GfsimError
from gfsim.forecasts.bins import N_BINS

__all__ = ["SYSTEM", "TOOL", "TOOL_NAME", "PROB_FIELDS", "BINS", "HARDWARE", "TRANSPORTS",
           "ARGUMENTS_REGEX", "tool_messages", "label_messages", "hardware_rows", "tool_request",
           "read_tool_answer", "renormalise", "fit_prompt", "PromptTooLong", "cut_text",
           "PROMPT_TEMPLATE_BYTES"]

# What a forecast prompt holds besides the candidate's code, the reference and the task's
# description, in UTF-8 bytes, at most: its instructions, bin table, hardware rows and answer
# format (about 2.6 KB; tests/test_dollar_cap.py holds both prompts to it). A dollar cap
# reserves a forecast's prompt with it.
PROMPT_TEMPLATE_BYTES = 4096

# (name, range as the prompt states it, plain words); edges are the paper's (docs/concepts/paper.md)
BINS = (
    ("SEVERE_SLOWDOWN", "S <= 0.25", "at least 4x slower"),
    ("SIGNIFICANT_SLOWDOWN", "0.25 < S <= 0.5", "2x to 4x slower"),
    ("MODERATE_SLOWDOWN", "0.5 < S <= 0.71", "about 1.4x to 2x slower"),
    ("MINOR_SLOWDOWN", "0.71 < S <= 1.0", "a little slower, or the same"),
    ("MINOR_SPEEDUP", "1.0 < S <= 1.41", "a little faster"),
    ("SIGNIFICANT_SPEEDUP", "1.41 < S <= 2.0", "about 1.4x to 2x faster"),
    ("HIGH_SPEEDUP", "2.0 < S <= 4.0", "2x to 4x faster"),
    ("EXTREME_SPEEDUP", "S > 4.0", "more than 4x faster"),
)
PROB_FIELDS = tuple(f"p_{name.lower()}" for name, _, _ in BINS)
TOOL_NAME = "submit_kernel_runtime_estimate"

_FACTORS = (
    "the work each kernel does (algorithm, FLOPs)",
    "how it reads and writes memory (coalescing, reuse, number of passes)",
    "arithmetic intensity: is it bound by memory bandwidth or by compute",
    "divergent control flow within a warp",
    "occupancy: registers, shared memory, warps per block",
    "how much parallelism the launch grid exposes",
    "synchronisation and atomics",
    "launch overhead and the number of kernels launched",
    "vendor libraries (cuBLAS, cuDNN) against hand-written code",
    "numeric precision and tensor-core use",
)


def _bin_table(labels=None) -> str:
    head = "| Bin | Name | Speedup range | Meaning |" + (" Label |" if labels else "")
    rule = "|---|---|---|---|" + ("---|" if labels else "")
    rows = [f"| {b} | {name} | {rng} | {words} |" + (f" {labels[b - 1]} |" if labels else "")
            for b, (name, rng, words) in enumerate(BINS, start=1)]
    return "\n".join([head, rule, *rows])


def _system(answer: str, labels=None) -> str:
    factors = "\n".join(f"{i}. {f}" for i, f in enumerate(_FACTORS, start=1))
    return f"""You predict how fast a candidate GPU kernel runs compared with a reference kernel \
that computes the same thing, as if you were executing both on the given GPU. Reason about both \
kernels step by step before you answer.

## Speedup
S = runtime of the reference / runtime of the candidate. S > 1: the candidate is faster; \
S < 1: slower; S = 1: equally fast.

## Bins
Each range excludes its lower edge and includes its upper edge.

{_bin_table(labels)}

## What to reason about
{factors}

Judge the candidate relative to the reference: hand-written kernels seldom beat a vendor \
library on its home ground, while fusing several operations into one pass can win a lot.

## Answer
{answer}"""


SYSTEM = _system(
    "Give a probability in [0, 1] for each of the 8 bins; together they sum to 1. Put most of "
    "the mass on one bin or two neighbouring bins, and all of it on one bin only when the "
    f"analysis leaves no doubt. Then call the tool `{TOOL_NAME}` exactly once, with "
    "`predicted_bin` (1-8), the eight probabilities `" + "`, `".join(PROB_FIELDS) + "` and "
    "`reasoning` (one to three sentences). Do not answer in plain text and call no other tool.")

TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Submit the speedup forecast for the candidate kernel, once, after "
                       "reasoning about both kernels.",
        "parameters": {
            "type": "object",
            "properties": {
                "predicted_bin": {"type": "integer", "enum": list(range(1, 9)),
                                  "description": "The most likely speedup bin, 1-8."},
                **{f: {"type": "number", "minimum": 0, "maximum": 1,
                       "description": f"P({rng})"}
                   for f, (_, rng, _) in zip(PROB_FIELDS, BINS)},
                "reasoning": {"type": "string", "minLength": 1,
                              "description": "One to three sentences."},
            },
            "required": ["predicted_bin", *PROB_FIELDS, "reasoning"],
            "additionalProperties": False,
        },
    },
}

# Device facts for the hardware table, from vendor specifications; a log header or a live run
# (torch.cuda.get_device_properties) can give its own. Rows a device lacks are left out.
HARDWARE = {
    "NVIDIA A100-SXM4-80GB": {"compute_capability": "8.0", "memory_gb": 80.0,
                              "multiprocessors": 108, "max_threads_per_sm": 2048,
                              "clock_ghz": 1.41, "memory_clock_ghz": 1.512,
                              "memory_bus_bits": 5120},
    "NVIDIA H100 80GB HBM3": {"compute_capability": "9.0", "memory_gb": 80.0,
                              "multiprocessors": 132, "max_threads_per_sm": 2048,
                              "memory_bus_bits": 5120},
    "NVIDIA H200": {"compute_capability": "9.0", "memory_gb": 141.0, "multiprocessors": 132,
                    "max_threads_per_sm": 2048, "memory_bus_bits": 6144},
}
_ALIASES = {"A100-80GB": "NVIDIA A100-SXM4-80GB", "H100": "NVIDIA H100 80GB HBM3",
            "H200": "NVIDIA H200"}
_ROWS = (("Device", "device_name", "{}"), ("Compute capability", "compute_capability", "{}"),
         ("Global memory", "memory_gb", "{:.1f} GB"), ("Multiprocessors", "multiprocessors", "{}"),
         ("Max threads per SM", "max_threads_per_sm", "{}"), ("Clock", "clock_ghz", "{:.2f} GHz"),
         ("Memory clock", "memory_clock_ghz", "{:.2f} GHz"),
         ("Memory bus width", "memory_bus_bits", "{} bits"))


def hardware_rows(hardware: dict) -> list[tuple[str, str]]:
    """(property, value) rows for the prompt: the given fields over the built-in facts."""
    if not hardware:
        return []
    name = hardware.get("device_name")
    facts = dict(HARDWARE.get(_ALIASES.get(name, name), {}))
    facts.update({k: v for k, v in hardware.items() if v is not None})
    rows = []
    for label, key, fmt in _ROWS:
        if key in facts:
            try:
                rows.append((label, fmt.format(facts[key])))
            except (TypeError, ValueError):
                rows.append((label, str(facts[key])))
    return rows


def _user(request, tail: str, fraction: float = 1.0) -> str:
    parts = [f"# Task: {request.task or 'kernel'}",
             "Predict the speedup of the candidate kernel over the reference kernel.",
             "## Reference kernel", _code(request.reference_code, fraction),
             "## Candidate kernel", _code(request.candidate_code, fraction)]
    rows = hardware_rows(request.hardware)
    if rows:
        parts += ["## Hardware", "| Property | Value |\n|---|---|\n"
                  + "\n".join(f"| {k} | {v} |" for k, v in rows)]
    parts.append(tail)
    return "\n\n".join(parts)


def _code(code: str, fraction: float) -> str:
    return f"```python\n{cut_text(code, fraction)}\n```"


def cut_text(text: str, fraction: float) -> str:
    """The first ``fraction`` of ``text``, ending with a note of how much was cut."""
    if fraction >= 1.0:
        return text
    keep = max(0, int(len(text) * fraction))
    return text[:keep] + f"\n[... {len(text) - keep} characters cut to fit the context]"


def tool_messages(request, fraction: float = 1.0, system_fraction: float = 1.0,
                  user_fraction: float = 1.0) -> list[dict]:
    """The ``tool``-mode conversation. To fit a small context, ``fraction`` < 1 keeps that share
    of each code block, ``system_fraction`` and ``user_fraction`` that share of each message."""
    tail = f"Answer with exactly one call of `{TOOL_NAME}`."
    return [{"role": "system", "content": cut_text(SYSTEM, system_fraction)},
            {"role": "user", "content": cut_text(_user(request, tail, fraction), user_fraction)}]


def label_messages(request, labels, fraction: float = 1.0, system_fraction: float = 1.0,
                   user_fraction: float = 1.0) -> list[dict]:
    """The ``logprobs``-mode conversation: the same bins, one label each, label-only answer."""
    system = _system("Answer with the label of the most likely bin and nothing else: one of "
                     + ", ".join(labels) + ".", labels)
    tail = "Answer with one label: " + ", ".join(labels) + "."
    return [{"role": "system", "content": cut_text(system, system_fraction)},
            {"role": "user", "content": cut_text(_user(request, tail, fraction), user_fraction)}]


_NUMBER = r"(0(\.[0-9]{1,4})?|1(\.0{1,4})?)"
# The tool's arguments as one compact line: a constraint for servers that cannot force a named
# tool call (vLLM without --tool-call-parser) and for tiny test models, which pad JSON with
# whitespace until they run out of tokens.
ARGUMENTS_REGEX = (r'\{"predicted_bin": [1-8], '
                   + ", ".join(f'"{f}": {_NUMBER}' for f in PROB_FIELDS)
                   + r', "reasoning": "[A-Za-z0-9 ,.;:()-]{1,120}"\}')
TRANSPORTS = ("tools", "json", "regex")


def tool_request(transport: str) -> dict:
    """The request fields that make the model answer with the tool's arguments: a forced call
    of the named tool (``tools``), or the arguments as the message itself, constrained by vLLM's
    structured outputs to the tool's JSON schema (``json``) or to one compact line (``regex``)."""
    if transport == "tools":
        return {"tools": [TOOL],
                "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}
    if transport == "json":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": TOOL_NAME, "schema": TOOL["function"]["parameters"]}}}
    if transport == "regex":
        return {"structured_outputs": {"regex": ARGUMENTS_REGEX}}
    raise ValueError(transport)


def read_tool_answer(body: dict, out, transport: str = "tools") -> None:
    """Fill ``out`` (a Forecast) from a chat-completions answer, or mark a parse failure. With
    the ``json`` and ``regex`` transports the message content holds the tool's arguments."""
    out.parse_failed, out.parse_error = False, None

    def fail(msg: str) -> None:
        out.parse_failed, out.parse_error = True, msg
        out.probs, out.raw_probability_sum, out.predicted_bin = [0.0] * 8, None, None

    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        return fail("no choices in the answer")
    calls = message.get("tool_calls") or []
    if transport != "tools":
        calls = [{"function": {"name": TOOL_NAME, "arguments": message.get("content")}}]
    if not calls:
        content = str(message.get("content") or "")[:200]
        return fail(f"no tool call (finish_reason {choice.get('finish_reason')!r}; content "
                    f"{content!r})")
    named = [c for c in calls if (c.get("function") or {}).get("name") == TOOL_NAME]
    call = (named or calls)[0].get("function") or {}
    if not named:
        return fail(f"unexpected tool {call.get('name')!r}")
    try:
        args = json.loads(call.get("arguments") or "")
    except (TypeError, ValueError) as exc:
        return fail(f"tool arguments are not JSON ({exc}; finish_reason "
                    f"{choice.get('finish_reason')!r})")
    if not isinstance(args, dict):
        return fail("tool arguments are not an object")
    missing = [f for f in ("predicted_bin", *PROB_FIELDS, "reasoning") if f not in args]
    if missing:
        return fail(f"missing field(s): {', '.join(missing)}")
    b = args["predicted_bin"]
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 8:
        return fail(f"predicted_bin {b!r} is not an integer in 1..8")
    values = [args[f] for f in PROB_FIELDS]
    for f, v in zip(PROB_FIELDS, values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            return fail(f"{f} = {v!r} is not a probability in [0, 1]")
    reasoning = args["reasoning"]
    if not isinstance(reasoning, str) or not reasoning.strip():
        return fail("empty reasoning")
    probs, total, err = renormalise(values)
    if err is not None:
        return fail(err)
    out.probs, out.raw_probability_sum, out.predicted_bin = probs, total, b
    out.reasoning = reasoning


class PromptTooLong(GfsimError):
    """No cut of the prompt fits the token limit (the caller says whose prompt it was)."""


def fit_prompt(build, count, limit: int | None):
    """``build(code_share, system_share, user_share)`` -> messages; ``count(messages)`` -> prompt
    tokens. Until the prompt fits ``limit``, the code blocks are cut first, then the system
    message, then the user message (only a context far smaller than the prompt needs the last
    two, as with the tiny test model). Returns (messages, whether anything was cut)."""
    shares = [1.0, 1.0, 1.0]
    messages = build(*shares)
    if limit is None:
        return messages, False
    for _ in range(60):
        n = count(messages)
        if n <= limit:
            return messages, shares != [1.0, 1.0, 1.0]
        k = next((j for j, v in enumerate(shares) if v > 0.02), None)
        if k is None:
            break
        shares[k] *= 0.95 * limit / n
        if shares[k] <= 0.02:
            shares[k] = 0.0
        messages = build(*shares)
    raise PromptTooLong(f"the prompt does not fit in {limit} tokens")


def renormalise(values) -> tuple[list[float], float, str | None]:
    """8 non-negative numbers -> (probabilities summing to 1, raw sum, parse error or None).
    Negative, missing or non-finite values are parse failures, as is an all-zero answer."""
    if values is None or len(values) != N_BINS:
        return [0.0] * N_BINS, 0.0, f"expected {N_BINS} probabilities"
    try:
        p = [float(v) for v in values]
    except (TypeError, ValueError):
        return [0.0] * N_BINS, 0.0, "a probability is not a number"
    if any(not math.isfinite(v) or v < 0 for v in p):
        return [0.0] * N_BINS, 0.0, "a probability is negative or not finite"
    total = math.fsum(p)
    if total <= 0:
        return [0.0] * N_BINS, 0.0, "all probabilities are zero"
    return [v / total for v in p], total, None
