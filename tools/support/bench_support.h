// Support for attention benchmarks (`kvcache bench attention` and
// bench/attention_bench.cc): synthetic K/V storage behind a LayerKvView, and
// a streaming read-bandwidth probe to compare kernels against.
//
// Thread safety: objects are not shared between threads while mutated;
// Measure* calls use the given pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/format.h"
#include "kvcache/kv_view.h"
#include "kvcache/status.h"
#include "kvcache/thread_pool.h"

namespace kvcache::attention_internal {

struct SyntheticKvOptions {
  FormatPair formats;
  uint32_t n_kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t num_tokens = 2048;
  bool paged = true;          // block_size 16 pool blocks behind a shuffled table
  uint32_t block_size = 16;
  uint32_t distinct_rows = 512;  // rows actually encoded; storage repeats them
  uint64_t seed = 1;
  // Advise transparent huge pages for the storage (as a block pool should
  // be allocated): a paged walk then costs no TLB miss per block.
  bool huge_pages = true;
};

// Zero-filled anonymous memory, optionally advised to use transparent huge
// pages (2 MiB aligned). Move-only.
class PoolBytes {
 public:
  PoolBytes() = default;
  ~PoolBytes();
  PoolBytes(const PoolBytes&) = delete;
  PoolBytes& operator=(const PoolBytes&) = delete;
  Status Allocate(size_t bytes, bool huge_pages);
  uint8_t* data() const { return data_; }

 private:
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
};

// Owns K/V storage for one sequence of one layer, filled with encoded
// random rows, and the view over it.
class SyntheticKv {
 public:
  static Result<std::unique_ptr<SyntheticKv>> Create(const SyntheticKvOptions& options);
  const LayerKvView& view() const { return view_; }
  // Bytes of stored K and V rows a decode step reads.
  size_t kv_bytes() const { return kv_bytes_; }

 private:
  SyntheticKv() = default;
  LayerKvView view_;
  std::unique_ptr<RowCodec> k_codec_, v_codec_;
  std::vector<uint32_t> table_;
  PoolBytes k_, v_;  // [pool blocks][heads][block][row] or [heads][tokens][row]
  size_t kv_bytes_ = 0;
};

// A buffer far larger than the last-level cache, read by every thread of a
// pool: the machine's streaming read bandwidth.
// CPU seconds used by the whole process so far (all threads).
double ProcessCpuSeconds();

// Reads exactly the K and V rows that decode attention over `views` reads,
// in the kernels' order (per task, one (sequence, kv head) job or a group
// of consecutive kv heads walked chunk by chunk, plan.h HeadsPerTask: its K
// rows, then its V rows, one block-table piece after another), with the
// tasks split over the pool the way the kernels split whole jobs, and no
// arithmetic: the memory floor of that access pattern. Returns wall
// seconds; *cpu_seconds (if non-null) gets process CPU seconds / threads.
double ReadLikeAttention(const std::vector<LayerKvView>& views, ThreadPool* pool,
                         double* cpu_seconds = nullptr);

// The rate of ReadTsc (plan.h: rdtsc on x86, steady-clock nanoseconds
// elsewhere, where this is 1e9) in ticks per second, measured once against
// the steady clock over ~50 ms (first call). The per-pass ticks of
// RunPlanProfiled are ReadTsc ticks.
double TscHz();

// The core clock this thread ran at, estimated from a chain of dependent
// integer adds (one per cycle on every x86 core) timed by thread CPU time
// over ~20 ms: under a hypervisor or with boost the core clock differs from
// the TSC rate. 0 where not x86.
double CoreHzEstimate();

class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t bytes);
  // One timed read of the whole buffer split over the pool; GB/s (1e9)
  // by wall time, and by process CPU time / threads in *cpu_gb_per_s (a
  // steadier figure on a machine shared with other jobs).
  double MeasureOnce(ThreadPool* pool, double* cpu_gb_per_s = nullptr);
  // Reads `bytes` of the buffer to push other data out of the caches.
  void Flush(size_t bytes);

 private:
  std::vector<uint64_t> data_;
};

}  // namespace kvcache::attention_internal
