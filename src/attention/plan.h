// A validated attention call, flattened into per-(sequence, kv head) jobs for
// the SIMD kernels (kernels.cc). Built by attention.cc after every input has
// been checked, so the kernels trust it.
//
// A job is one kv head of one sequence and the nq query vectors that read it
// (T query tokens x group q heads, query-token major). Its queries are
// already prepared in the kernel's space: multiplied by key column scales,
// rotated for rotated key formats, zero-padded to PaddedDim(head_dim).
//
// Thread safety: a Plan is read-only while kernels run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attention/reference.h"
#include "format/traits.h"
#include "kvcache/attention.h"
#include "kvcache/attention_profile.h"
#include "kvcache/kv_view.h"

namespace kvcache::attention_internal {

struct QueryVec {
  const float* q = nullptr;  // [padded_dim] prepared query
  uint32_t qpos = 0;         // the query token's position
  float bias = 0.0f;         // added to every score (scale * <q, key mean>)
  float* out = nullptr;      // [head_dim]
  float* lse = nullptr;      // 1 float or nullptr
  float* probs = nullptr;    // [num_tokens] or nullptr
};

struct HeadJob {
  const LayerKvView* view = nullptr;
  uint32_t head = 0;
  uint32_t rows = 0;         // stored rows of this head
  bool exact = false;        // f32:f32 without transforms: reference order, no FMA
  bool has_bias = false;     // a key mean is present
  uint32_t first_query = 0;  // index into Plan::queries
  uint32_t nq = 0;
  float* kv_probs = nullptr;  // [num_tokens] or nullptr
  uint32_t window = 0;        // this head's sliding window (0 = none) and sinks
  uint32_t n_sink = 0;
};

struct Plan {
  uint32_t head_dim = 0;
  uint32_t padded_dim = 0;
  float scale = 1.0f;
  bool int_keys = true;    // the integer K paths (AttentionOptions::float_query_keys off)
  bool int8_keys = false;  // q8_0/q4_0: the int8-query path (AttentionOptions::int8_query_keys)
  ThreadPool* pool = nullptr;
  std::vector<HeadJob> jobs;
  std::vector<QueryVec> queries;
  std::vector<float> prepared_q;  // [queries.size()][padded_dim] from a 64-byte boundary
};

// Kernel value order. turbo4 and bf16 rows are consumed as "even values,
// then odd values" of each 16-value group (values 0,2,..,14 then 1,3,..,15:
// turbo4's low nibbles then high nibbles, bf16's low halves then high halves
// of 32-bit words), which saves a shuffle per vector; queries are permuted
// into that order before the kernels run and outputs back after (a tail
// group shorter than 16 stays in natural order). Other formats use natural
// order.
inline bool UsesNibbleOrder(Format f) { return format_internal::TraitsOf(f).nibble_order; }
inline void ToNibbleOrder(float* x, uint32_t head_dim) {
  float t[16];
  for (uint32_t g = 0; g + 16 <= head_dim; g += 16) {
    for (uint32_t i = 0; i < 8; ++i) {
      t[i] = x[g + 2 * i];
      t[8 + i] = x[g + 2 * i + 1];
    }
    for (uint32_t i = 0; i < 16; ++i) x[g + i] = t[i];
  }
}
inline void FromNibbleOrder(float* x, uint32_t head_dim) {
  float t[16];
  for (uint32_t g = 0; g + 16 <= head_dim; g += 16) {
    for (uint32_t i = 0; i < 8; ++i) {
      t[2 * i] = x[g + i];
      t[2 * i + 1] = x[g + 8 + i];
    }
    for (uint32_t i = 0; i < 16; ++i) x[g + i] = t[i];
  }
}

// Grouped walk (kernels.cc RunWhole): on a paged view whose K and V
// values are 2 or 4 bytes (f16, bf16, f32: the formats whose passes are
// bound by memory here), one thread takes up to kGroupHeads consecutive kv
// heads of a sequence and walks them kGroupChunkRows rows at a time, head
// after head inside a chunk, instead of one head after another. The heads'
// pieces of a block are adjacent in the pool, so they are read close
// together. Other formats are bound by arithmetic and gain nothing; a
// contiguous view reads slower grouped (4 streams per thread).
inline constexpr uint32_t kGroupHeads = 4;
inline constexpr uint32_t kGroupChunkRows = 128;
static_assert(kSegmentRows % kGroupChunkRows == 0 && kGroupChunkRows % 16 == 0,
              "a chunk is whole V tiles inside one segment");
inline bool WalkHeadsGrouped(const LayerKvView& v) {
  auto wide = [](Format f) { return f == Format::kF32 || f == Format::kF16 || f == Format::kBF16; };
  return v.k.head_base == nullptr && v.v.head_base == nullptr && v.block_size < v.num_tokens &&
         wide(v.k.format) && wide(v.v.format);
}
// Consecutive kv heads of view v per task when n_jobs whole jobs run on
// `threads` threads: 1 unless WalkHeadsGrouped(v), else kGroupHeads, halved
// while that would leave a thread without a task. The kernels and the
// bench's pattern read (bench_support.cc) split the work by this.
inline uint32_t HeadsPerTask(const LayerKvView& v, size_t n_jobs, uint32_t threads) {
  if (!WalkHeadsGrouped(v)) return 1;
  uint32_t g = kGroupHeads;
  while (g > 1 && n_jobs / g < threads) g /= 2;
  return g;
}

// Runs every job of the plan (one Highway dispatch).
void RunPlan(const Plan& plan);

// The CPU's time-stamp counter: rdtsc on x86 (constant rate, see
// docs/attention.md; bench_support.h TscHz measures it), steady-clock
// nanoseconds elsewhere.
inline uint64_t ReadTsc() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_ia32_rdtsc();  // GCC and clang; no intrinsics header here
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

// RunPlan with each pass timed into *profile (added to what it holds; the
// passes as kvcache/attention_profile.h names them): the same kernels,
// thread split, walk and order as RunPlan, so the outputs are the same bit
// for bit (tests/attention/passes_test.cc). Two clock reads (ReadTsc and
// the thread's CPU clock) per pass per task, none per row.
void RunPlanProfiled(const Plan& plan, AttentionPassProfile* profile);

// One kv head's sliding window: AttentionOptions::window and n_sink for
// that head alone.
struct HeadWindow {
  uint32_t window = 0;
  uint32_t n_sink = 0;
};

// AttendMulti (n_queries 1: AttendDecode) with kv head h attending with
// windows[h] instead of options.window / n_sink (which are ignored): one call
// for a layer whose heads keep different windows (hybrid.h). Each output
// equals that of attending kv head h alone with its window. InvalidArgument,
// writing nothing, unless windows has one entry per kv head of the view,
// each window <= view.num_tokens; every other check is AttendMulti's.
Status AttendHeadWindows(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                         const AttentionOptions& options, std::span<const HeadWindow> windows,
                         const AttentionOutput& output);

// The SIMD Exp of reference.h applied to x[n] in place (for tests).
void ExpBufferForTest(float* x, size_t n);

// The kernels' decode of E4M3 codes (fp8_e4m3, turbo8) into out[n], for
// tests; n a multiple of 16.
void E4M3DecodeForTest(const uint8_t* codes, size_t n, float* out);

// A stored row of `format` as the kernels' decoder consumes it, for tests:
// out[PaddedDim(head_dim)] in kernel order (UsesNibbleOrder), divided by
// the format's power-of-two value multiplier (256 for fp8_e4m3, else 1),
// the tail zero-padded. Rotated formats stay in the rotated space.
void DecodeRowForTest(Format format, const uint8_t* row, uint32_t head_dim, float* out);

}  // namespace kvcache::attention_internal
