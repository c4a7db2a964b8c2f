// Where the time of an attention call goes, pass by pass: AttendMulti run
// with two clock reads around each pass of each task the kernels split the
// call into (none per row), for benchmarks (`kvcache bench attention
// --passes`).
//
// The passes, each over every stored row of every kv head once:
//   k:     the K pass: key decode, dot products, scores, the running max,
//          the prefetch stream over the keys
//   exp:   exp(s - max) over every score
//   v:     the V pass: value decode and accumulation, the per-segment
//          partial sums and their fold
//   other: per-task scratch setup, the fold across chunks of a split head,
//          and the outputs (normalization, value transforms)
//
// Thread safety: as AttendMulti; *profile is written only by the calling
// thread, after the call's tasks have finished.
//
// Also how the kernels split a call into tasks, for a read that walks the
// K/V bytes in the kernels' pattern (the benches' pattern-read floor).
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/attention.h"
#include "kvcache/kv_view.h"
#include "kvcache/status.h"

namespace kvcache {

// Time spent in one pass, summed over the threads that ran it.
struct AttentionPassTime {
  // The CPU's time-stamp counter: rdtsc ticks on x86 (a constant rate that
  // the caller measures against a clock if it wants seconds), steady-clock
  // nanoseconds elsewhere. Includes time the thread was descheduled.
  uint64_t ticks = 0;
  // Thread CPU time (CLOCK_THREAD_CPUTIME_ID) in nanoseconds.
  uint64_t cpu_ns = 0;
};

struct AttentionPassProfile {
  AttentionPassTime k, exp, v, other;
  uint64_t rows = 0;  // stored rows of every kv head attended over
};

// AttendMulti with the same checks, kernels, thread split, walk and
// summation order, so every output is AttendMulti's bit for bit; the time of
// each pass and the rows walked are added to *profile (what it holds is kept,
// so a profile can sum several calls). InvalidArgument if profile is null;
// every other error is AttendMulti's.
Status AttendMultiProfiled(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                           const AttentionOptions& options, const AttentionOutput& output,
                           AttentionPassProfile* profile);

// Consecutive kv heads of view v per task when n_jobs whole (sequence, kv
// head) jobs run on `threads` threads: 1, or a group the task walks
// AttentionGroupChunkRows() rows at a time, head after head inside a chunk.
uint32_t AttentionHeadsPerTask(const LayerKvView& v, size_t n_jobs, uint32_t threads);
uint32_t AttentionGroupChunkRows();

}  // namespace kvcache
