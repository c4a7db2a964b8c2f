// `kvcache bench pool`: timings of the pool and cache operations engines do
// per token or per request.
//
//   alloc_release_ns  Allocate(1) + Release(1) of one block, uncontended
//   append_token_ns   SequenceCache::Append of one token to every layer (paged)
//   fork_32k_us       Fork of a 32k-token paged sequence (refcount bumps only)
//   truncate_32k_us   Truncate(0) of a 32k-token paged sequence held alone
//                     (every block goes back to the pool)
//
// Each is the median over --repeats runs, timed in thread CPU time
// (CLOCK_THREAD_CPUTIME_ID): the development machine is shared, and CPU time
// leaves out the time the thread waited for a core. The same medians in wall
// time are printed as wall_* for comparison. The 32k-token sequences adopt
// blocks straight from the pool (AdoptPrefix), so their K/V bytes are never
// touched: fork and truncate cost does not depend on them. Default geometry:
// Llama-3-8B (32 layers, 8 kv heads, head_dim 128, block 16), f32 K/V.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "kvcache/simd.h"
#include "tools/bench_util.h"
#include "tools/command.h"
#include "tools/json_result.h"

namespace kvcache::tools {
namespace {

struct BenchPoolOptions : BenchCacheOptions {
  BenchPoolOptions() { kv_format = "f32"; }
  uint32_t context = 32768;
  int repeats = 11;
};

// A point in time on both clocks.
struct Stamp {
  double cpu = 0, wall = 0;
  static Stamp Now() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    Stamp s;
    s.cpu = static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    s.wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return s;
  }
};
// Collects runs of one measurement; `scale` converts seconds per op to the unit.
struct Runs {
  std::vector<double> cpu, wall;
  void Add(const Stamp& a, const Stamp& b, double ops, double scale) {
    cpu.push_back((b.cpu - a.cpu) / ops * scale);
    wall.push_back((b.wall - a.wall) / ops * scale);
  }
};
Result<nlohmann::json> RunBench(const BenchPoolOptions& o) {
  KV_ASSIGN_OR_RETURN(Geometry geo,
                      Geometry::Create({o.layers, o.kv_heads, o.head_dim, o.block_size}));
  KV_ASSIGN_OR_RETURN(FormatPair formats, ParseFormatPair(o.kv_format));
  if (o.repeats < 1 || o.context < o.block_size) {
    return Status::InvalidArgument("bench pool: --repeats >= 1 and --context >= block size");
  }
  const uint32_t ctx_blocks = (o.context + o.block_size - 1) / o.block_size;
  const uint32_t append_cycle = 256;  // tokens appended before the cache is cleared
  const uint32_t num_blocks = 2 * ctx_blocks + append_cycle / o.block_size + 8;
  KV_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool,
                      BlockPool::Create(geo, formats, {.num_blocks = num_blocks}));
  nlohmann::json out;

  // alloc + release of one block.
  {
    Runs runs;
    const int n = 20000;  // short runs: most fit in one scheduler slice
    for (int r = 0; r < 5 * o.repeats; ++r) {
      uint32_t b = 0;
      const Stamp t0 = Stamp::Now();
      for (int i = 0; i < n; ++i) {
        if (!pool->Allocate({&b, 1}).ok() || !pool->Release({&b, 1}).ok()) {
          return Status::Internal("bench pool: alloc/release failed");
        }
      }
      runs.Add(t0, Stamp::Now(), n, 1e9);
    }
    out["alloc_release_ns"] = UpperMedian(runs.cpu);
    out["wall_alloc_release_ns"] = UpperMedian(runs.wall);
  }

  // append of one token to every layer.
  {
    KV_ASSIGN_OR_RETURN(SequenceCache cache, SequenceCache::CreatePaged(pool));
    const size_t per_token = size_t{geo.n_layers()} * geo.kv_dim();
    std::vector<float> k(per_token), v(per_token);
    for (size_t i = 0; i < per_token; ++i) {
      k[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
      v[i] = static_cast<float>((i * 53) % 97) / 48.0f - 1.0f;
    }
    // Warm the pages once.
    for (uint32_t t = 0; t < append_cycle; ++t) KV_RETURN_IF_ERROR(cache.Append(k, v));
    KV_RETURN_IF_ERROR(cache.Clear());
    Runs runs;
    for (int r = 0; r < o.repeats; ++r) {
      const Stamp t0 = Stamp::Now();
      for (uint32_t t = 0; t < append_cycle; ++t) KV_RETURN_IF_ERROR(cache.Append(k, v));
      runs.Add(t0, Stamp::Now(), append_cycle, 1e9);
      KV_RETURN_IF_ERROR(cache.Clear());
    }
    out["append_token_ns"] = UpperMedian(runs.cpu);
    out["wall_append_token_ns"] = UpperMedian(runs.wall);
    out["append_token_bytes"] = cache.geometry().n_layers() * geo.n_kv_heads() *
                                (RowBytes(formats.k, geo.head_dim()) + RowBytes(formats.v, geo.head_dim()));
  }

  // fork and truncate of a long sequence.
  {
    Runs fork_runs, trunc_runs;
    for (int r = 0; r < o.repeats; ++r) {
      KV_ASSIGN_OR_RETURN(SequenceCache seq, SequenceCache::CreatePaged(pool));
      std::vector<uint32_t> blocks(ctx_blocks);
      KV_RETURN_IF_ERROR(pool->Allocate(blocks));
      KV_RETURN_IF_ERROR(seq.AdoptPrefix(blocks, nullptr));
      const Stamp t0 = Stamp::Now();
      KV_ASSIGN_OR_RETURN(SequenceCache child, seq.Fork());
      fork_runs.Add(t0, Stamp::Now(), 1, 1e6);
      child.Release();
      // Held alone again: truncate gives every block back.
      const Stamp t2 = Stamp::Now();
      KV_RETURN_IF_ERROR(seq.Truncate(0));
      trunc_runs.Add(t2, Stamp::Now(), 1, 1e6);
    }
    out["fork_32k_us"] = UpperMedian(fork_runs.cpu);
    out["truncate_32k_us"] = UpperMedian(trunc_runs.cpu);
    out["wall_fork_32k_us"] = UpperMedian(fork_runs.wall);
    out["wall_truncate_32k_us"] = UpperMedian(trunc_runs.wall);
  }
  KV_RETURN_IF_ERROR(pool->CheckInvariants());
  out["context_tokens"] = o.context;
  out["geometry"] = geo.ToString();
  out["kv_format"] = FormatPairName(formats);
  out["repeats"] = o.repeats;
  out["simd_target"] = SimdTarget();
  return out;
}

// The text of a result.
void PrintText(const BenchPoolOptions& o, const nlohmann::json& j) {
  fmt::print("geometry {}  kv {}  simd {}\n", j["geometry"].get<std::string>(),
             j["kv_format"].get<std::string>(), j["simd_target"].get<std::string>());
  fmt::print("{:<18} {:>12}\n", "alloc+release", fmt::format("{:.1f} ns", j["alloc_release_ns"].get<double>()));
  fmt::print("{:<18} {:>12}\n", "append 1 token", fmt::format("{:.0f} ns", j["append_token_ns"].get<double>()));
  fmt::print("{:<18} {:>12}\n", fmt::format("fork {}", o.context), fmt::format("{:.1f} us", j["fork_32k_us"].get<double>()));
  fmt::print("{:<18} {:>12}\n", fmt::format("truncate {}", o.context), fmt::format("{:.1f} us", j["truncate_32k_us"].get<double>()));
}

const bool kRegistered = RegisterOptionsCommand<BenchPoolOptions>(
    "bench pool", "Pool and cache operation timings (alloc, append, fork, truncate)",
    [](CLI::App* app, BenchPoolOptions& o) {
      AddBenchCacheFlags(app, o);
      app->add_option("--context", o.context, "Tokens of the fork/truncate sequence")
          ->capture_default_str();
      app->add_option("--repeats", o.repeats, "Runs per measurement (median)")
          ->capture_default_str();
    },
    JsonResultRunner<BenchPoolOptions>("bench pool", RunBench, PrintText));

}  // namespace
}  // namespace kvcache::tools
