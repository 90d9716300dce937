#!/usr/bin/env bash
# The real selective-surrogate run (docs/experiments/live-threshold.md): for each seed, a live
# measure-all search (`--policy all`) and a live threshold search (`--policy threshold:0.7`) over
# the same tasks and seeds, both with the learned cost-model forecaster (it forecasts every
# candidate in both runs; only the threshold run acts on it) and candidates from the wide
# mutation operator.
#   usage: experiments/live_threshold_h200.sh DIR SECONDS [SEEDS] [STEPS] [-- extra gfsim live args]
# Runs the jobs all:SEED, threshold:SEED in turn until SECONDS have passed, each run stopping at
# a step boundary before the deadline; a second call with the same DIR resumes the unfinished
# run (--resume: nothing recorded is done again) and goes on with the next. A finished run leaves
# DIR/NAME-seedN.done. Run from a directory where gfsim is installed.
set -uo pipefail
DIR=${1:?usage: live_threshold_h200.sh DIR SECONDS [SEEDS] [STEPS] [-- args]}
BUDGET=${2:?seconds}
SEEDS=${3:-0,1}
STEPS=${4:-6}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
TASKS=${TASKS:-softmax,layernorm,fp8_quant}
# A run stops at the first step boundary after --max-minutes; a step of every task takes up to
# about 90 s on the H200 (3 tasks x 8 candidates x ~3.3 s), so that much is kept in hand.
MARGIN=${MARGIN:-100}
mkdir -p "$DIR"
deadline=$((SECONDS + BUDGET))
for seed in ${SEEDS//,/ }; do
  for policy in all threshold:0.7; do
    name=${policy%%:*}
    tag=$name-seed$seed
    log=$DIR/live-costmodel-$tag.jsonl.gz
    [ -e "$DIR/$tag.done" ] && continue
    left=$((deadline - SECONDS - MARGIN))
    if [ "$left" -lt 45 ]; then
      echo "== $tag: not started, $((deadline - SECONDS)) s left"; exit 0
    fi
    resume=()
    [ -e "$log" ] && resume=(--resume)
    echo "== $tag: up to $left s ${resume[*]}"
    gfsim live --tasks "$TASKS" --source mutate-wide --forecaster costmodel \
      --policy "$policy" --steps "$STEPS" --energy-window 0 --seed "$seed" \
      --max-minutes "$(python3 -c "print(round($left / 60, 2))")" --out "$log" --json \
      "${resume[@]}" "$@" > "$DIR/$tag.json" 2> "$DIR/$tag.err"
    rc=$?
    python3 - "$DIR/$tag.json" "$rc" <<'PY' && touch "$DIR/$tag.done"
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except Exception as exc:  # the run failed before its summary: say so, do not mark it done
    print(f"   exit {sys.argv[2]}: no summary ({exc})"); sys.exit(1)
for r in s["searches"]:
    print(f"   {r['search_id']}: {r['steps']} steps, {r['candidates']} candidates, "
          f"{r['gpu_evals']} measured, best {r['best_speedup']:.3f}x, "
          f"GPU busy {r['live_gpu_busy_s']:.0f} s")
print(f"   session {s['session']}: {s['session_s']:.0f} s, stopped: {s['stopped']}")
sys.exit(0 if s["stopped"] is None else 1)
PY
    tail -3 "$DIR/$tag.err" | grep -v FP_FUSION
  done
done
echo "== all done"
