// `kvcache bench attention --passes` (cmd_bench_attention_passes.h).
//
// Cases: every format pair x layout x SIMD target x thread count, each at
// two sizes: "memory" (--context tokens, a 64 MiB flush read before every
// step, as in bench attention) and "cache" (--cache-context tokens, the
// step repeated with no flush: the arithmetic with memory out of the way).
// 32 q heads, 8 kv heads, head_dim 128, one sequence, the default key paths.
//
// Each round times, per case, one profiled step (AttendMultiProfiled: the
// production kernels with two clock reads around each pass of each task),
// one plain step (AttendMulti: what the step costs unprofiled; the two
// should agree) and, for the memory cases, the pattern read
// (ReadLikeAttention: the same K/V bytes in the kernels' order and thread
// split, no arithmetic). The profiled and the plain step swap order every
// round. Every figure is the median over the rounds (round 0, the warm-up,
// is not kept).
//
// Per pass (k: K pass with scores and running max; exp; v: V pass with its
// segment folds; other: setup, final folds, outputs):
//   <pass>_cycles_per_row: TSC ticks in that pass, summed over the threads,
//     per stored row (a row = one kv head's key and value of one token):
//     the core time a row costs, whatever the thread count.
//   <pass>_ns_per_row: the same from thread CPU time (excludes time the
//     thread was descheduled; on a shared machine the ticks include it).
//   core_ghz: the core clock, from a chain of dependent adds timed by
//     thread CPU time (CoreHzEstimate), median over the rounds: ns_per_row x
//     core_ghz is core cycles per row, the unit of an instruction count.
//   read_cycles_per_row: a row's K and V bytes at the streaming read
//     bandwidth (ReadBandwidthProbe, 256 MiB, the same pool; CPU time, as
//     read_bandwidth_cpu_gb_per_s), in TSC ticks of core time: the
//     denominator of bench attention's bandwidth_fraction_cpu.
//   pattern_cycles_per_row: the pattern read's CPU time over all threads
//     in TSC ticks per row; k_/v_pattern_cycles_per_row split it by the K
//     and V bytes: the memory floor of each pass.
#include "tools/cmd_bench_attention_passes.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "kvcache/attention.h"
#include "kvcache/attention_profile.h"
#include "kvcache/simd.h"
#include "kvcache/thread_pool.h"
#include "tools/bench_util.h"
#include "tools/support/bench_support.h"

namespace kvcache::tools {
namespace {

using attention_internal::ProcessCpuSeconds;
using attention_internal::SyntheticKv;
using attention_internal::SyntheticKvOptions;

constexpr size_t kProbeBytes = size_t{256} << 20;  // as bench attention's default
constexpr const char* kPassNames[4] = {"k", "exp", "v", "other"};

struct Samples {
  std::array<std::vector<double>, 4> ticks, cpu_ns;  // per pass, whole step
  std::vector<double> step, step_cpu, plain, plain_cpu, pattern_cpu;
};

struct Case {
  FormatPair fp;
  uint32_t block_size = 0;  // 0: contiguous
  bool in_cache = false;
  uint32_t context = 0;
  std::string target;
  size_t pool = 0;  // index into the pools
  std::shared_ptr<SyntheticKv> kv;  // shared by the targets and thread counts
  std::vector<float> q, out;
  Samples s;
};

}  // namespace

int RunAttentionPasses(const PassesOptions& o) {
  const std::string start_target = SimdTarget();
  struct RestoreTarget {
    std::string name;
    ~RestoreTarget() { (void)UseSimdTarget(name); }
  } restore{start_target};
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (uint32_t t : o.threads) pools.push_back(std::make_unique<ThreadPool>(t));
  // Flushes the caches (its first kFlushBytes) and measures the streaming
  // read bandwidth (all of it), the denominator of the bandwidth targets.
  attention_internal::ReadBandwidthProbe flusher(kProbeBytes);
  for (auto& p : pools) flusher.MeasureOnce(p.get());  // page faults
  const double tsc_hz = attention_internal::TscHz();

  std::vector<Case> cases;
  for (const FormatPair& fp : o.pairs) {
    for (uint32_t bs : o.layouts) {
      for (bool in_cache : {false, true}) {
        SyntheticKvOptions so = BenchKvOptions(fp, bs, o.small_pages);
        so.n_kv_heads = o.kv_heads;
        so.head_dim = o.head_dim;
        so.num_tokens = in_cache ? o.cache_context : o.context;
        so.seed = in_cache ? 7 : 1;
        auto kv = SyntheticKv::Create(so);
        if (!kv.ok()) {
          fmt::print(stderr, "kvcache bench attention --passes: {}: {}\n", FormatPairName(fp),
                     kv.status().ToString());
          return 1;
        }
        std::shared_ptr<SyntheticKv> shared(std::move(*kv));
        for (const std::string& t : o.targets) {
          for (size_t pi = 0; pi < pools.size(); ++pi) {
            Case c;
            c.fp = fp;
            c.block_size = bs;
            c.in_cache = in_cache;
            c.context = so.num_tokens;
            c.target = t;
            c.pool = pi;
            c.kv = shared;
            c.q.resize(size_t{o.q_heads} * o.head_dim);
            c.out.resize(c.q.size());
            FillBenchQuery(&c.q, 97);
            cases.push_back(std::move(c));
          }
        }
      }
    }
  }

  std::vector<double> core_hz;
  std::vector<std::vector<double>> read_cpu_gbps(pools.size());  // per pool, per round
  for (uint32_t r = 0; r < o.repeats + 1; ++r) {
    core_hz.push_back(attention_internal::CoreHzEstimate());
    for (size_t pi = 0; pi < pools.size(); ++pi) {
      double cpu_gbps = 0;
      flusher.MeasureOnce(pools[pi].get(), &cpu_gbps);
      if (r > 0) read_cpu_gbps[pi].push_back(cpu_gbps);
    }
    for (Case& c : cases) {
      (void)UseSimdTarget(c.target);  // validated by the caller
      AttentionOptions ao;
      ao.n_q_heads = o.q_heads;
      ao.pool = pools[c.pool].get();
      const uint32_t threads = pools[c.pool]->num_threads();
      AttentionOutput outs;
      outs.out = c.out;
      const LayerKvView& view = c.kv->view();
      Status st;
      auto note = [&](const Status& x) {
        if (st.ok()) st = x;
      };
      auto profiled = [&] {
        if (!c.in_cache) flusher.Flush(kFlushBytes);
        AttentionPassProfile prof;
        const double c0 = ProcessCpuSeconds();
        const auto t0 = std::chrono::steady_clock::now();
        note(AttendMultiProfiled(view, 1, c.q, ao, outs, &prof));
        const auto t1 = std::chrono::steady_clock::now();
        const double c1 = ProcessCpuSeconds();
        if (r == 0) return;
        const AttentionPassTime* pt[4] = {&prof.k, &prof.exp, &prof.v, &prof.other};
        for (int p = 0; p < 4; ++p) {
          c.s.ticks[p].push_back(static_cast<double>(pt[p]->ticks));
          c.s.cpu_ns[p].push_back(static_cast<double>(pt[p]->cpu_ns));
        }
        c.s.step.push_back(std::chrono::duration<double>(t1 - t0).count());
        c.s.step_cpu.push_back((c1 - c0) / threads);
      };
      auto plain = [&] {
        if (!c.in_cache) flusher.Flush(kFlushBytes);
        const double c0 = ProcessCpuSeconds();
        const auto t0 = std::chrono::steady_clock::now();
        note(AttendMulti(view, 1, c.q, ao, outs));
        const auto t1 = std::chrono::steady_clock::now();
        const double c1 = ProcessCpuSeconds();
        if (r == 0) return;
        c.s.plain.push_back(std::chrono::duration<double>(t1 - t0).count());
        c.s.plain_cpu.push_back((c1 - c0) / threads);
      };
      if (c.in_cache) note(AttendMulti(view, 1, c.q, ao, outs));  // bring K/V in
      if (r % 2 == 0) {
        profiled();
        plain();
      } else {
        plain();
        profiled();
      }
      if (!st.ok()) {
        fmt::print(stderr, "kvcache bench attention --passes: {}\n", st.ToString());
        return 1;
      }
      if (!c.in_cache && r > 0) {
        flusher.Flush(kFlushBytes);
        double pc = 0;
        attention_internal::ReadLikeAttention({view}, ao.pool, &pc);
        c.s.pattern_cpu.push_back(pc * threads);
      }
    }
  }

  const double core_ghz = Median(core_hz) / 1e9;
  if (!o.json) {
    fmt::print(
        "bench attention --passes: {} q heads / {} kv heads / head_dim {}, TSC {:.4f} GHz, core "
        "~{:.2f} GHz (dependent adds); cycles = TSC ticks per stored row, summed over threads; "
        "ns = thread CPU ns per row; medians of {} rounds\n",
        o.q_heads, o.kv_heads, o.head_dim, tsc_hz / 1e9, core_ghz, o.repeats);
    fmt::print("{:<16} {:<10} {:>3} {:<6} {:<6} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>6} "
               "{:>6} {:>6} | {:>7} {:>7} {:>7} {:>7} | {:>9} {:>9}\n",
               "k:v", "layout/bs", "thr", "target", "where", "ctx", "K", "exp", "V", "other",
               "total", "K_ns", "exp_ns", "V_ns", "patK", "patV", "pat", "read", "step_us",
               "plain_us");
  }
  for (const Case& c : cases) {
    const LayerKvView& view = c.kv->view();
    const double rows = static_cast<double>(c.context) * view.n_kv_heads;
    const double kb = view.k.row_bytes, vb = view.v.row_bytes;
    nlohmann::json j;
    j["k_format"] = FormatName(c.fp.k);
    j["v_format"] = FormatName(c.fp.v);
    j["layout"] = c.block_size != 0 ? "paged" : "contiguous";
    j["block_size"] = c.block_size;
    j["threads"] = pools[c.pool]->num_threads();
    j["simd_target"] = c.target;
    j["where"] = c.in_cache ? "cache" : "memory";
    j["context_tokens"] = c.context;
    j["q_heads"] = o.q_heads;
    j["kv_heads"] = o.kv_heads;
    j["head_dim"] = o.head_dim;
    j["rows"] = rows;
    j["tsc_ghz"] = tsc_hz / 1e9;
    j["core_ghz"] = core_ghz;
    double total = 0;
    for (int p = 0; p < 4; ++p) {
      const double cyc = Median(c.s.ticks[p]) / rows;
      total += cyc;
      j[fmt::format("{}_cycles_per_row", kPassNames[p])] = cyc;
      j[fmt::format("{}_ns_per_row", kPassNames[p])] = Median(c.s.cpu_ns[p]) / rows;
    }
    j["total_cycles_per_row"] = total;
    j["step_us"] = Median(c.s.step) * 1e6;
    j["step_cpu_us"] = Median(c.s.step_cpu) * 1e6;
    j["plain_step_us"] = Median(c.s.plain) * 1e6;
    j["plain_step_cpu_us"] = Median(c.s.plain_cpu) * 1e6;
    j["k_row_bytes"] = view.k.row_bytes;
    j["v_row_bytes"] = view.v.row_bytes;
    // The streaming read of the case's bytes at the probe's rate, as core
    // time summed over the threads (the probe's rate is bytes per CPU
    // second / threads).
    const double read_gbps = Median(read_cpu_gbps[c.pool]);
    j["read_bandwidth_cpu_gb_per_s"] = read_gbps;
    j["read_cycles_per_row"] = (kb + vb) * pools[c.pool]->num_threads() / read_gbps * tsc_hz / 1e9;
    if (!c.in_cache) {
      const double pat = Median(c.s.pattern_cpu) * tsc_hz / rows;
      j["pattern_cycles_per_row"] = pat;
      j["k_pattern_cycles_per_row"] = pat * kb / (kb + vb);
      j["v_pattern_cycles_per_row"] = pat * vb / (kb + vb);
    }
    if (o.json) {
      fmt::print("{}\n", j.dump());
    } else {
      auto num = [&](const char* key) {
        return j.contains(key) ? fmt::format("{:.1f}", j[key].get<double>()) : std::string("-");
      };
      fmt::print("{:<16} {:<10} {:>3} {:<6} {:<6} {:>6} | {:>7} {:>7} {:>7} {:>7} {:>7} | {:>6} "
                 "{:>6} {:>6} | {:>7} {:>7} {:>7} {:>7} | {:>9.1f} {:>9.1f}\n",
                 FormatPairName(c.fp),
                 c.block_size != 0 ? fmt::format("paged/{}", c.block_size) : "contiguous",
                 pools[c.pool]->num_threads(), c.target, c.in_cache ? "cache" : "memory",
                 c.context, num("k_cycles_per_row"), num("exp_cycles_per_row"),
                 num("v_cycles_per_row"), num("other_cycles_per_row"),
                 num("total_cycles_per_row"), num("k_ns_per_row"), num("exp_ns_per_row"),
                 num("v_ns_per_row"), num("k_pattern_cycles_per_row"),
                 num("v_pattern_cycles_per_row"), num("pattern_cycles_per_row"),
                 num("read_cycles_per_row"),
                 j["step_us"].get<double>(), j["plain_step_us"].get<double>());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace kvcache::tools
