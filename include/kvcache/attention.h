// Attention over one layer's stored K/V (a LayerKvView), on the CPU.
//
// Queries. q head j (0 <= j < n_q_heads) reads kv head j / group, where
// group = n_q_heads / n_kv_heads (MHA: group 1; GQA: group > 1; MQA: one kv
// head). A query block of T tokens holds the LAST T positions of the
// sequence (already appended to the cache): query t sits at position
// p_t = view.num_tokens - T + t. Decode is T = 1.
//
// Visibility. Stored row r of kv head h (original position
// P = view.position(h, r)) is visible to query t iff P <= p_t (causal) and,
// with a sliding window W > 0, P > p_t - W or P < n_sink (attention sinks).
// A query that sees no row (a dead head, say) gets output 0 and lse -inf.
//
// Math, per (query, q head): s_r = scale * <q, k_r> over visible rows;
// m = max s_r; e_r = exp(s_r - m); l = sum e_r; out = (sum e_r v_r) / l;
// probs_r = e_r / l; lse = m + log(l). Per-head RowTransforms of the view are
// honoured exactly: a key mean adds <q, mean> to every score (so probabilities
// and lse are those of the original keys), q8 key column scales multiply the
// query, a value mean is added once to the output. Rotated (turbo) formats
// rotate the query once per head and inverse-rotate the output once.
//
// Exactness. For an f32:f32 view without transforms the result is bit-for-bit
// equal to AttendReference over the same rows, for every thread count, chunk
// split, layout and SIMD target: both follow the summation order documented
// in src/attention/reference.h (fixed 16-lane dot products, fixed 512-row
// segments for sums over rows, no fused multiply-add, one exp implementation).
// Every other format pair matches AttendReference over its own decoded rows
// (RowCodec::Decode) within the tolerances in docs/attention.md: float
// rounding, plus, for int8 keys (q8, q8_0) on SIMD targets, the query's
// rounding to int16 (a score moves by at most
// scale * max|q'| / 65534 * sum |k'|). The quantization error itself is the
// format's, not ours.
//
// Dequantization is fused into the q.k products and the V accumulation; no
// K or V row is expanded to an f32 buffer. SIMD kernels are chosen once per
// call by Highway runtime dispatch.
//
// Thread safety: the functions are reentrant; views are read only. Calls
// that share a ThreadPool are serialized by the pool.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/kv_view.h"
#include "kvcache/status.h"
#include "kvcache/thread_pool.h"

namespace kvcache {

struct AttentionOptions {
  // Query heads: a positive multiple of view.n_kv_heads. Required.
  uint32_t n_q_heads = 0;
  // Softmax scale; 0 means 1 / sqrt(head_dim).
  float scale = 0.0f;
  // Sliding window in positions; 0 means none. Must be <= view.num_tokens.
  uint32_t window = 0;
  // With a window: positions < n_sink stay visible (attention sinks).
  uint32_t n_sink = 0;
  // Workers to split (sequence, kv head, context chunk) work over; nullptr
  // runs on the calling thread.
  ThreadPool* pool = nullptr;
  // Quantized keys (q8, q8_0, q4_0) are scored by default with an integer
  // dot product against the query rounded to int16 once per K pass (a
  // chunk of rows)
  // (docs/attention.md, "Integer K paths", for the bound on the scores);
  // float_query_keys scores them against the f32 query instead (decoded
  // keys, FMAs), for comparison, and wins over int8_query_keys. Other
  // formats ignore both flags.
  bool float_query_keys = false;
  // q8_0 and q4_0 keys (x86 SIMD targets): the query rounded to int8 per
  // 32-value block instead (u8 x i8 byte multiply-adds; vpdpbusd on
  // AVX3_DL, compiled only with -DKVCACHE_HWY_AVX3_DL=ON). Its score bound is
  // up to ~258x the int16 path's (65534 / 254) and it was not faster on AVX2
  // (docs/attention.md); kept to measure on machines with VNNI.
  bool int8_query_keys = false;
};

// Every call returns InvalidArgument, writing nothing, for a query with a
// NaN or infinite value (it would make that head's scores unorderable), as
// for a buffer of the wrong size or out-of-range options.

// Where results go. `out` is required; the others are optional (empty span
// = not wanted) and, when given, must have exactly the documented size.
struct AttentionOutput {
  std::span<float> out;  // [n_queries][n_q_heads][head_dim]
  std::span<float> lse;  // [n_queries][n_q_heads] log-sum-exp of the scores
  // [n_queries][n_q_heads][view.num_tokens]: entry r is the probability of
  // stored row r of that q head's kv head; 0 for rows past rows(h) or masked.
  std::span<float> probs;
  // [n_kv_heads][view.num_tokens]: probabilities summed over the q heads of
  // each kv head and over all queries: the attention mass a cache adds to
  // its importance counters (row-indexed like probs; the first
  // view.rows(h) entries of head h are what SequenceCache::
  // AccumulateImportance takes for that head).
  std::span<float> kv_probs;
};

// One query token (the last position). q: [n_q_heads][head_dim].
Status AttendDecode(const LayerKvView& view, std::span<const float> q,
                    const AttentionOptions& options, const AttentionOutput& output);

// T = n_queries tokens at the last T positions, causal inside the block
// (speculative verification, chunked prefill). q: [n_queries][n_q_heads][head_dim].
// REQUIRES n_queries <= view.num_tokens.
Status AttendMulti(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                   const AttentionOptions& options, const AttentionOutput& output);

// One kv head's query group, decode: the group = n_q_heads / n_kv_heads q
// heads that read kv head `kv_head` (an engine that keeps or evicts per head
// calls this). q: [group][head_dim]; out: [group][head_dim]; lse: empty or
// [group]. probs: empty, [group][view.rows(kv_head)] (the head's stored
// positions, in the order SequenceCache::HeadPositions gives: a dead head
// has none, evicted positions are gone) or [group][view.num_tokens] (the
// same, padded with zeros, so one buffer fits every head). kv_probs: empty,
// [view.rows(kv_head)] or [view.num_tokens]: the group's probabilities
// summed, exactly what SequenceCache::AccumulateImportance takes for the
// head. The results are those of the same head in AttendDecode (for f32 K/V
// bit for bit). OutOfRange for kv_head >= view.n_kv_heads; InvalidArgument
// for a query of the wrong length, an empty view or any other bad size, as
// AttendDecode; nothing is written on error.
Status AttendDecodeHead(const LayerKvView& view, uint32_t kv_head, std::span<const float> q,
                        const AttentionOptions& options, const AttentionOutput& output);

// Decode for many sequences of one layer at once (same n_kv_heads and
// head_dim; formats and layouts may differ). Work is split over (sequence,
// kv head) pairs, and long contexts over chunks, on options.pool.
// q: [n_seqs][n_q_heads][head_dim]; out: [n_seqs][n_q_heads][head_dim];
// lse: empty or [n_seqs][n_q_heads].
Status AttendDecodeBatch(std::span<const LayerKvView> views, std::span<const float> q,
                         const AttentionOptions& options, std::span<float> out,
                         std::span<float> lse = {});

// The plain reference: attention over f32 slices, one per kv head, in the
// summation order that defines the exact f32 result (see above). Same
// visibility rules and outputs as AttendMulti.
struct ReferenceHead {
  std::span<const float> keys;         // [rows][head_dim]
  std::span<const float> values;       // [rows][head_dim]
  std::span<const uint32_t> positions; // [rows] original positions; empty = 0..rows-1
};
Status AttendReference(std::span<const ReferenceHead> heads, uint32_t head_dim,
                       uint32_t num_tokens, uint32_t n_queries, std::span<const float> q,
                       const AttentionOptions& options, const AttentionOutput& output);

}  // namespace kvcache
