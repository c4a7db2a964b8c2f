#!/usr/bin/env bash
# The pass-key matrix of docs/gemma3.md, measured cell by cell into
# docs/data/passkey/ (or $OUT): every cell whose document is not complete
# runs, and one stopped part-way (its file has "complete": false) goes on
# from its last trial (kvcache passkey --out/--resume). A 32k cell takes one
# to two hours here, so the matrix is measured across many sittings: run
# this, stop it when you must, run it again later, on this machine or
# another (commit the partial documents to carry them over).
#
#   scripts/passkey_matrix.sh                 every cell of the matrix below
#   scripts/passkey_matrix.sh 32752/q8_0 ...  these cells: CONTEXT/FORMAT[/EVICTION[/LAYOUT]]
#
# Environment: KVCACHE (the kvcache binary; default build/release/tools/kvcache),
# MODEL (default: scripts/fetch_model.sh gemma3), TOKENIZER (for a llama2.c
# model), OUT (default docs/data/passkey), JOBS (cells side by side, default
# 2), THREADS (each cell's threads, default 2 / JOBS, at least 1), TRIALS
# (keys per depth, default 20). The answers do not depend on THREADS, so a
# cell may be resumed with another. Progress: LOGS/NAME.log (default
# build/passkey-logs), one line a trial.
set -euo pipefail
cd "$(dirname "$0")/.."

KVCACHE="${KVCACHE:-build/release/tools/kvcache}"
MODEL="${MODEL:-$(scripts/fetch_model.sh gemma3)}"
OUT="${OUT:-docs/data/passkey}"
JOBS="${JOBS:-2}"
THREADS="${THREADS:-$(( 2 / JOBS > 0 ? 2 / JOBS : 1 ))}"
TRIALS="${TRIALS:-20}"
LOGS="${LOGS:-build/passkey-logs}"

# The cells still to measure, cheapest first within a context: 32k runs at
# 32,752 tokens so that 16 answer tokens fit the 32,768 of the model (f32
# and the per-group mix were run at 32,760 with 8: other prompts, 8 more
# tokens of filler, so they run again here to compare key for key);
# StreamingLLM and H2O keep half the cache on the global layers
# (contiguous layout, f32 values, as at the shorter contexts).
MATRIX=(
  16384/q8_0 16384/q4_0 16384/turbo4i 16384/turbo2i 8192/bf16 8192/turbo2i
  32752/bf16 32752/f32 32752/q8_0 "32752/global=turbo4+s4+r120,local=q8_0" 32752/turbo4 32752/q4_0
  32752/turbo4i 32752/turbo3i 32752/turbo2i
  32752/f32/streaming:4,16372/contiguous 32752/f32/h2o:16376,512/contiguous
)
CELLS=("$@")
[ ${#CELLS[@]} -gt 0 ] || CELLS=("${MATRIX[@]}")

# pk<context in k>_<format>[_<policy>].json, as the documents already there.
name_of() {
  local ctx="$1" fmt="$2" ev="$3"
  local k=$(( (ctx + 1023) / 1024 ))k
  local n="pk${k}_$(echo "$fmt" | tr '=,' '--')"
  [ -n "$ev" ] && n="${n}_${ev%%:*}"
  echo "$n"
}

# A document is complete unless it says otherwise: one without the field
# is a finished run's --json output, from before --out existed.
complete() {
  [ -s "$1" ] && python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("complete", True) else 1)' "$1" 2>/dev/null
}

run_cell() {
  local ctx fmt ev layout
  IFS=/ read -r ctx fmt ev layout <<< "$1"
  local name; name=$(name_of "$ctx" "$fmt" "$ev")
  local doc="$OUT/$name.json"
  if complete "$doc"; then echo "passkey_matrix: $name: complete"; return 0; fi
  local args=(passkey --model "$MODEL" --context "$ctx" --trials "$TRIALS" --matmul bf16 --threads "$THREADS"
              --kv-format "$fmt" --out "$doc")
  [ -n "${TOKENIZER:-}" ] && args+=(--tokenizer "$TOKENIZER")
  [ -n "$ev" ] && args+=(--eviction "$ev")
  [ -n "${layout:-}" ] && args+=(--layout "$layout")
  [ -s "$doc" ] && args+=(--resume)
  echo "passkey_matrix: $name: $(date -u +%H:%M:%S) start (${THREADS} thread(s))"
  if "$KVCACHE" "${args[@]}" > /dev/null 2>> "$LOGS/$name.log"; then
    echo "passkey_matrix: $name: $(date -u +%H:%M:%S) done"
  else
    echo "passkey_matrix: $name: failed, see $LOGS/$name.log" >&2
    return 1
  fi
}

mkdir -p "$OUT" "$LOGS"
status=0
for cell in "${CELLS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || status=1; done
  run_cell "$cell" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || status=1; done
exit $status
