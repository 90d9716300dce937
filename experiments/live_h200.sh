#!/usr/bin/env bash
# The shipped live log replay_logs/data/h200-live-v1.jsonl.gz: a live PUCT search over the whole
# task suite on one H200, in two sessions (the second resumes the first), with gfsim's
# TritonMeasurer and what-if forecasts (no LLM weights are reachable on that machine).
#   usage: experiments/live_h200.sh OUT_DIR MINUTES [--resume]
# Run from a directory where gfsim is installed (pip install --no-deps .); the session stops at
# a step boundary after MINUTES, and a rerun with --resume continues it.
set -euo pipefail
OUT=${1:?usage: live_h200.sh OUT_DIR MINUTES [--resume]}; MINUTES=${2:?minutes}; shift 2
gfsim live --tasks softmax,layernorm,matmul,cross_entropy,fp8_quant \
  --search paper-standard --policy all --forecaster paper:gemini3-flash \
  --measurer triton --protocol gfsim --energy-window 0 --seed 0 \
  --max-minutes "$MINUTES" --out "$OUT/h200-live-v1.jsonl.gz" --json "$@"
