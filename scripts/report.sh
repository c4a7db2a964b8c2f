#!/usr/bin/env bash
# ./run.sh report [--full]: measures on this machine and draws the charts.
#
# Runs the CLI's benchmarks and evaluations (short by default; --full for the
# README's 32k-context settings, Gemma's 8k quality run, its decode and
# prefill to depth 32k and its pass key at 4k with 20 keys a depth), keeps their JSON under docs/img/data/, and
# turns it into charts under docs/img/ with `python -m kvcache.plot` (the pass
# key's chart with the rows kept under docs/data/passkey/, which take hours).
# REQUIRES: the release build (run.sh builds it) and the project's Python
# environment on PATH (run.sh sets it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
K=build/release/tools/kvcache
DATA=docs/img/data
mkdir -p "$DATA"
full=0
[ "${1:-}" = "--full" ] && full=1
if [ $full -eq 1 ]; then ctx=32768; repeats=7; ppl_tokens=4096; else ctx=8192; repeats=3; ppl_tokens=1024; fi
formats=bf16:bf16,f16:f16,fp8_e4m3:fp8_e4m3,q8:q8,q8_0:q8_0,q4_0:q4_0,turbo4:turbo4,turbo3:turbo3,turbo2:turbo2,turbo4i:turbo4i,turbo3i:turbo3i,turbo2i:turbo2i

echo "report: bench attention (context $ctx, $repeats rounds)" >&2
"$K" bench attention --json --context "$ctx" --threads 2 --layout both --batch-seqs 0 \
  --repeats "$repeats" --formats "$formats" > "$DATA/bench_attention.jsonl"
if "$K" bench --help 2>/dev/null | grep -qw encode; then
  echo "report: bench encode" >&2
  targets=$("$K" info --json | python -c "import json, sys; print(','.join(json.load(sys.stdin)['simd_targets']))")
  "$K" bench encode --json --simd-targets "$targets" > "$DATA/bench_encode.jsonl"
fi
echo "report: eval (synthetic gaussian rows)" >&2
"$K" eval --json > "$DATA/eval.jsonl"
MODEL="${KVCACHE_MODEL_DIR:-$HOME/.cache/kvcache/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$MODEL" ]; then
  # Every format, the integer-level ones, and the precision windows at the
  # bit budgets of docs/smollm2.md (4 sinks and 120 or 112 recent rows).
  echo "report: perplexity on SmolLM2 ($ppl_tokens tokens of GPL-3, every format and window)" >&2
  ppl() {
    "$K" perplexity --model "$MODEL" --text-file /usr/share/common-licenses/GPL-3 \
      --max-tokens "$ppl_tokens" --chunk 64 --threads 2 --json "$@"
  }
  ppl --formats f16,bf16,q8_0,q8,turbo8,fp8_e4m3,turbo4,q4_0,turbo3,turbo2,turbo4i,turbo3i,turbo2i,q8_0:q4_0,q8_0:turbo4,bf16:turbo3,turbo4+s4+r120,turbo3+s4+r120,turbo2+s4+r112,q8_0+s4+r112,turbo4i+s4+r120,turbo3i+s4+r120,turbo2i+s4+r112,turbo4:turbo3+s4+r120 \
    > "$DATA/perplexity.json"
  # Eviction budgets (the chart's second series): a quarter of the text kept.
  keep=$((ppl_tokens / 4))
  echo "report: perplexity under eviction (StreamingLLM and H2O, $keep of $ppl_tokens positions)" >&2
  ppl --formats bf16,turbo4 --eviction "streaming:4,$((keep - 4))" > "$DATA/perplexity_streaming.json"
  ppl --formats bf16,turbo4 --eviction "h2o:$keep,$((keep / 4))" > "$DATA/perplexity_h2o.json"
else
  echo "report: $MODEL is absent (scripts/fetch_model.sh): no perplexity chart" >&2
fi
GEMMA="${KVCACHE_MODEL_DIR:-$HOME/.cache/kvcache/models}/gemma-3-270m-q4_k_m.gguf"
if [ -f "$GEMMA" ]; then
  # docs/gemma3.md: quality against the f32 cache over the second half of the
  # text, decode and prefill against depth, bytes per 32k sequence. The 32k
  # quality tables take hours here: docs/gemma3.md gives their commands.
  if [ $full -eq 1 ]; then g_tokens=8192; depths="16 4096 16384 32256"; else g_tokens=2048; depths="16 4096"; fi
  python scripts/long_text.py > "$DATA/gemma_text.txt"
  echo "report: perplexity on Gemma 3 270M ($g_tokens tokens of the Python reference, scored from $((g_tokens / 2)))" >&2
  "$K" perplexity --model "$GEMMA" --text-file "$DATA/gemma_text.txt" --max-tokens "$g_tokens" --chunk 256 \
    --layout paged --score-from $((g_tokens / 2)) --threads 2 --json \
    --formats "bf16;q8_0;q4_0;turbo4;turbo4i;turbo3i;turbo2i;turbo4+s4+r120;global=turbo4+s4+r120,local=q8_0;global=turbo3i+s4+r120,local=q8_0" \
    > "$DATA/gemma_perplexity.json"
  echo "report: Gemma decode and prefill (512 tokens) at depths $depths" >&2
  for c in $depths; do
    for m in auto int8; do
      "$K" bench step --model "$GEMMA" --kv-formats bf16 --streams 1 --context "$c" --shared 0 --matmul "$m" \
        --threads 2 --steps 8 --prefill 512 --json | python -c "import json, sys; print(json.dumps(json.load(sys.stdin)))"
    done
  done > "$DATA/gemma_step.jsonl"
  # llama.cpp's llama-bench as the yardstick, when LLAMA_BENCH names one.
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "report: llama-bench on the same file ($LLAMA_BENCH)" >&2
    "$LLAMA_BENCH" -m "$GEMMA" -p 512 -n 32 -d "$(echo "$depths" | sed 's/^16 /0 /; s/ /,/g')" -t 2 -r 2 -o json \
      > "$DATA/gemma_llama_bench.json"
  fi
  # The pass key: every cache kept whole, then StreamingLLM and H2O on the
  # global layers at half the cache (docs/gemma3.md, Retrieval).
  if [ $full -eq 1 ]; then pk_ctx=4096; pk_trials=20; else pk_ctx=2048; pk_trials=5; fi
  half=$((pk_ctx / 2))
  echo "report: Gemma pass key ($pk_ctx tokens, $pk_trials keys per depth)" >&2
  for spec in "f32||paged" "turbo4||paged" "global=turbo4+s4+r120,local=q8_0||paged" \
              "f32|streaming:4,$((half - 4))|contiguous" "f32|h2o:$half,$((half / 8))|contiguous"; do
    f=${spec%%|*}; rest=${spec#*|}; ev=${rest%%|*}; lay=${rest#*|}
    "$K" passkey --model "$GEMMA" --context "$pk_ctx" --trials "$pk_trials" --matmul bf16 --threads 2 \
      --kv-format "$f" --layout "$lay" ${ev:+--eviction "$ev"} --json \
      | python -c "import json, sys; print(json.dumps(json.load(sys.stdin)))"
  done > "$DATA/gemma_passkey.jsonl"
  echo "report: Gemma bytes per 32k sequence per format" >&2
  for f in bf16 q8_0 q4_0 turbo4 turbo3i turbo2i "global=turbo4+s4+r120,local=q8_0" "global=turbo3i+s4+r120,local=q8_0"; do
    "$K" info --model "$GEMMA" --context 32768 --kv-format "$f" --json | python -c "import json, sys; print(json.dumps(json.load(sys.stdin)))"
  done > "$DATA/gemma_memory.jsonl"
else
  echo "report: $GEMMA is absent (scripts/fetch_model.sh gemma3): no Gemma charts" >&2
fi
echo "report: simulate (chat, 1 GiB pool, Llama-3-8B geometry)" >&2
"$K" simulate --json --kv-format bf16 --kv-format fp8_e4m3 --kv-format q8_0 \
  --kv-format turbo4 --kv-format turbo3 --kv-format turbo2 > "$DATA/simulate.json"
PYTHONPATH="$ROOT/build/release/python${PYTHONPATH:+:$PYTHONPATH}" python -m kvcache.plot \
  docs/data/passkey/cut-anywhere/earlier.jsonl docs/data/passkey/cut-anywhere/pk*.json \
  $(ls docs/data/passkey/pk*.json 2>/dev/null) "$DATA"/*.json* --out docs/img
