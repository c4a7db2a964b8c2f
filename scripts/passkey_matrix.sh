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
#   scripts/passkey_matrix.sh 32752/q8_0 ...  these cells: CONTEXT/FORMAT[/EVICTION[/LAYOUT[/DEPTHS]]]
#
# DEPTHS (e.g. 0.5,0.75) measures some depths only, into a file of its own
# (pk16k_bf16_d50_75.json): a row in pieces that each fit a sitting.
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

# The cells, cheapest first: every cache at 4k and 8k, then 16k and 32k
# (32k runs at 32,752 tokens so that 16 answer tokens fit the 32,768 of the
# model). bf16 at 16k and 32k, and H2O at 32k, are measured in pieces of
# depths (cells of their own, so JOBS runs them side by side). StreamingLLM
# and H2O keep half the cache on the global layers (contiguous layout, f32
# values). turbo2i stops at 8k: on the earlier prompts it found none of 120
# keys at 4k and 8k where the f32 cache found all 120, and a longer context
# does not make a key easier to find.
MIX="global=turbo4+s4+r120,local=q8_0"
MATRIX=()
for ctx in 4096 8192 16384 32752; do
  half=$(( ctx / 2 ))
  [ "$ctx" -le 8192 ] && MATRIX+=("$ctx/bf16")
  [ "$ctx" -eq 16384 ] && MATRIX+=("$ctx/bf16///0.25" "$ctx/bf16///0.5,0.75")
  [ "$ctx" -eq 32752 ] && MATRIX+=("$ctx/bf16///0.75" "$ctx/bf16///0.25,0.5")
  for f in f32 q8_0 q4_0 turbo4 turbo4i turbo3i "$MIX"; do MATRIX+=("$ctx/$f"); done
  [ "$ctx" -le 8192 ] && MATRIX+=("$ctx/turbo2i")
  recent=$(( ctx <= 4096 ? 256 : 512 ))
  h2o="$ctx/f32/h2o:$half,$recent/contiguous"
  MATRIX+=("$ctx/f32/streaming:4,$(( half - 4 ))/contiguous")
  if [ "$ctx" -eq 32752 ]; then MATRIX+=("$h2o/0.25" "$h2o/0.5,0.75"); else MATRIX+=("$h2o"); fi
done
CELLS=("$@")
[ ${#CELLS[@]} -gt 0 ] || CELLS=("${MATRIX[@]}")

# pk<context in k>_<format>[_<policy>][_d<depths in %>].json, as the documents already there.
name_of() {
  local ctx="$1" fmt="$2" ev="$3" depths="$4"
  local k=$(( (ctx + 1023) / 1024 ))k
  local n="pk${k}_$(echo "$fmt" | tr '=,' '--')"
  [ -n "$ev" ] && n="${n}_${ev%%:*}"
  [ -n "$depths" ] && n="${n}_d$(echo "$depths" | tr ',' '\n' | awk '{printf "%s%d", (NR > 1 ? "_" : ""), $1 * 100 + 0.5}')"
  echo "$n"
}

# A document is complete unless it says otherwise: one without the field
# is a finished run's --json output, from before --out existed.
complete() {
  [ -s "$1" ] && python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("complete", True) else 1)' "$1" 2>/dev/null
}

run_cell() {
  local ctx fmt ev layout depths
  IFS=/ read -r ctx fmt ev layout depths <<< "$1"
  local name; name=$(name_of "$ctx" "$fmt" "$ev" "$depths")
  local doc="$OUT/$name.json"
  if complete "$doc"; then echo "passkey_matrix: $name: complete"; return 0; fi
  local args=(passkey --model "$MODEL" --context "$ctx" --trials "$TRIALS" --matmul bf16 --threads "$THREADS"
              --kv-format "$fmt" --out "$doc")
  [ -n "${TOKENIZER:-}" ] && args+=(--tokenizer "$TOKENIZER")
  [ -n "$ev" ] && args+=(--eviction "$ev")
  [ -n "${layout:-}" ] && args+=(--layout "$layout")
  [ -n "${depths:-}" ] && args+=(--depths "$depths")
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
