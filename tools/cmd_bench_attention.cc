// `kvcache bench attention`: decode-attention step time per format pair and
// layout, as a fraction of the machine's streaming read bandwidth measured
// in the same run with the same thread count.
//
// One sequence: 32 q heads, 8 kv heads, head_dim 128, --context tokens.
// Batched: --batch-seqs sequences of --batch-context tokens, one call.
// Each timed step is preceded by a cache flush (a 64 MiB read) so that K/V
// come from memory, as they do in a real model with many layers.
//
// Two floors are measured beside each case, to show what limits it:
//   pattern_read: the same K/V bytes read in the kernels' order and split
//     (block-table pieces per head), with no arithmetic: the memory floor of
//     the layout (ReadLikeAttention).
//   compute: the kernel on a cache-resident context of kWarmContext tokens
//     (no flush), per stored row, times the case's rows: the arithmetic
//     floor with memory out of the way.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attention/bench_support.h"
#include "kvcache/attention.h"
#include "kvcache/simd.h"
#include "kvcache/thread_pool.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

using attention_internal::ReadBandwidthProbe;
using attention_internal::ReadLikeAttention;
using attention_internal::SyntheticKv;
using attention_internal::SyntheticKvOptions;

struct BenchOptions {
  bool json = false;
  uint32_t context = 32768;
  uint32_t threads = 2;
  // Short by default; the full table: --formats
  // bf16:bf16,f16:f16,fp8_e4m3:fp8_e4m3,q8:q8,q8_0:q8_0,turbo4:turbo4,turbo3:turbo3,turbo2:turbo2
  std::string formats = "bf16:bf16,turbo4:turbo4";
  std::string layout = "paged";
  uint32_t repeats = 5;
  uint32_t batch_seqs = 64;
  uint32_t batch_context = 2048;
  size_t bandwidth_mib = 256;
  bool small_pages = false;  // storage without the transparent-huge-page advice
  uint32_t block_size = 16;  // paged layout: tokens per pool block
};

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr size_t kFlushBytes = size_t{64} << 20;
constexpr uint32_t kWarmContext = 1024;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes of stored K and V rows a decode step over v reads.
size_t KvBytes(const LayerKvView& v) {
  size_t n = 0;
  for (uint32_t h = 0; h < v.n_kv_heads; ++h) {
    n += size_t{v.rows(h)} * (v.k.row_bytes + v.v.row_bytes);
  }
  return n;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int RunBench(const BenchOptions& o) {
  std::vector<FormatPair> pairs;
  for (const std::string& f : Split(o.formats, ',')) {
    auto p = ParseFormatPair(f);
    if (!p.ok()) {
      fmt::print(stderr, "kvcache bench attention: {}\n", p.status().ToString());
      return 2;
    }
    pairs.push_back(*p);
  }
  std::vector<bool> layouts;  // paged?
  if (o.layout == "paged") {
    layouts = {true};
  } else if (o.layout == "contiguous") {
    layouts = {false};
  } else if (o.layout == "both") {
    layouts = {false, true};
  } else {
    fmt::print(stderr, "kvcache bench attention: --layout must be contiguous, paged or both\n");
    return 2;
  }
  if (o.repeats == 0 || o.threads == 0 || o.context == 0 || o.block_size == 0) {
    fmt::print(stderr,
               "kvcache bench attention: --repeats, --threads, --context and --block-size must be "
               "> 0\n");
    return 2;
  }
  ThreadPool pool(o.threads);
  ReadBandwidthProbe probe(std::max(o.bandwidth_mib, size_t{64}) << 20);
  probe.MeasureOnce(&pool);  // warm up (page faults)
  // Medians of wall-clock and CPU-time bandwidth.
  auto bandwidth = [&](double* cpu_bw) {
    std::vector<double> bw, cbw;
    for (uint32_t i = 0; i < std::max(3u, o.repeats); ++i) {
      double c = 0;
      bw.push_back(probe.MeasureOnce(&pool, &c));
      cbw.push_back(c);
    }
    *cpu_bw = Median(cbw);
    return Median(bw);
  };
  using attention_internal::ProcessCpuSeconds;
  const std::string simd = SimdTarget();
  nlohmann::json results = nlohmann::json::array();

  auto emit = [&](nlohmann::json j) {
    if (o.json) {
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:<20} {:<10} {:>6} {:>5} {:>3} {:>10.1f} {:>9.1f} {:>8.2f} {:>8.2f} {:>6.3f} {:>10.1f} {:>8.2f} {:>8.3f} {:>10.1f} {:>10.1f} {:>6.3f}\n",
                 j["k_format"].get<std::string>() + ":" + j["v_format"].get<std::string>(),
                 j["layout"].get<std::string>(), j["context_tokens"].get<uint32_t>(),
                 j["sequences"].get<uint32_t>(), j["threads"].get<uint32_t>(),
                 j["step_us"].get<double>(), j["kv_bytes"].get<double>() / 1048576.0,
                 j["effective_gb_per_s"].get<double>(), j["read_bandwidth_gb_per_s"].get<double>(),
                 j["bandwidth_fraction"].get<double>(), j["step_cpu_us"].get<double>(),
                 j["read_bandwidth_cpu_gb_per_s"].get<double>(),
                 j["bandwidth_fraction_cpu"].get<double>(), j["pattern_read_cpu_us"].get<double>(),
                 j["compute_cpu_us"].get<double>(), j["pattern_fraction_cpu"].get<double>());
    }
    std::fflush(stdout);
  };
  if (!o.json) {
    fmt::print("SIMD target {}, {} threads, {} q heads / {} kv heads / head_dim {}\n", simd,
               o.threads, kQHeads, kKvHeads, kHeadDim);
    fmt::print("{:<20} {:<10} {:>6} {:>5} {:>3} {:>10} {:>9} {:>8} {:>8} {:>6} {:>10} {:>8} {:>8} {:>10} {:>10} {:>6}\n",
               "k:v", "layout", "ctx", "seqs", "thr", "step_us", "kv_MiB", "eff_GB/s", "read_GB/s",
               "frac", "cpu_us", "cpuGB/s", "cpu_frac", "pat_cpu_us", "cmp_cpu_us", "pat_fr");
  }

  // The pattern-read floor: medians over repeats, each after a flush.
  auto pattern_read = [&](const std::vector<LayerKvView>& views, double* cpu_us) {
    std::vector<double> wall, cpu;
    for (uint32_t r = 0; r < o.repeats; ++r) {
      probe.Flush(kFlushBytes);
      double c = 0;
      wall.push_back(ReadLikeAttention(views, &pool, &c));
      cpu.push_back(c);
    }
    *cpu_us = Median(cpu) * 1e6;
    return Median(wall) * 1e6;
  };
  // The compute floor per stored row (all kv heads), CPU seconds / threads,
  // from repeated steps over a cache-resident kWarmContext-token sequence.
  auto compute_per_row = [&](SyntheticKvOptions so, const AttentionOptions& ao) -> double {
    so.num_tokens = kWarmContext;
    so.seed = 7;
    auto kv = SyntheticKv::Create(so);
    if (!kv.ok()) return 0.0;
    std::vector<float> q(kQHeads * kHeadDim), out(q.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    AttentionOutput outs;
    outs.out = out;
    std::vector<double> cpu;
    for (uint32_t r = 0; r < 4 * o.repeats + 3; ++r) {
      const double c0 = ProcessCpuSeconds();
      if (!AttendDecode((*kv)->view(), q, ao, outs).ok()) return 0.0;
      if (r >= 3) cpu.push_back((ProcessCpuSeconds() - c0) / o.threads);
    }
    return Median(cpu) / kWarmContext;
  };

  for (FormatPair fp : pairs) {
    for (bool paged : layouts) {
      // One sequence.
      SyntheticKvOptions so;
      so.formats = fp;
      so.n_kv_heads = kKvHeads;
      so.head_dim = kHeadDim;
      so.num_tokens = o.context;
      so.paged = paged;
      so.block_size = o.block_size;
      so.huge_pages = !o.small_pages;
      auto kv = SyntheticKv::Create(so);
      if (!kv.ok()) {
        fmt::print(stderr, "kvcache bench attention: {}: {}\n", FormatPairName(fp),
                   kv.status().ToString());
        return 1;
      }
      std::vector<float> q(kQHeads * kHeadDim, 0.01f), out(q.size());
      for (size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
      AttentionOptions ao;
      ao.n_q_heads = kQHeads;
      ao.pool = &pool;
      AttentionOutput outs;
      outs.out = out;
      nlohmann::json j;
      j["k_format"] = FormatName(fp.k);
      j["v_format"] = FormatName(fp.v);
      j["layout"] = paged ? "paged" : "contiguous";
      j["block_size"] = paged ? o.block_size : 0;  // 0: contiguous
      j["threads"] = o.threads;
      j["simd_target"] = simd;
      // Times `step` (after a flush each), then fills the case's figures
      // into j: wall and CPU time (process CPU seconds / threads, steadier
      // when other jobs share the cores) against the read bandwidth, and
      // the pattern-read and compute floors. False if a step failed.
      auto measure = [&](const char* name, uint32_t context, uint32_t sequences,
                         const std::vector<LayerKvView>& views, double per_row,
                         auto&& step_fn) -> bool {
        std::vector<double> steps, cpu_steps;
        for (uint32_t r = 0; r < o.repeats + 1; ++r) {
          probe.Flush(kFlushBytes);
          const double c0 = ProcessCpuSeconds();
          const auto t0 = std::chrono::steady_clock::now();
          const Status st = step_fn();
          const auto t1 = std::chrono::steady_clock::now();
          const double c1 = ProcessCpuSeconds();
          if (!st.ok()) {
            fmt::print(stderr, "kvcache bench attention: {}\n", st.ToString());
            return false;
          }
          if (r > 0) {
            steps.push_back(std::chrono::duration<double>(t1 - t0).count());
            cpu_steps.push_back((c1 - c0) / o.threads);
          }
        }
        double cpu_bw = 0;
        const double bw = bandwidth(&cpu_bw);
        const double step = Median(steps), cpu_step = Median(cpu_steps);
        double bytes = 0;
        for (const LayerKvView& v : views) bytes += static_cast<double>(KvBytes(v));
        j["case"] = name;
        j["context_tokens"] = context;
        j["sequences"] = sequences;
        j["step_us"] = step * 1e6;
        j["kv_bytes"] = bytes;
        j["effective_gb_per_s"] = bytes / step / 1e9;
        j["read_bandwidth_gb_per_s"] = bw;
        j["bandwidth_fraction"] = bytes / step / 1e9 / bw;
        j["step_cpu_us"] = cpu_step * 1e6;
        j["read_bandwidth_cpu_gb_per_s"] = cpu_bw;
        j["bandwidth_fraction_cpu"] = bytes / cpu_step / 1e9 / cpu_bw;
        double pat_cpu_us = 0;
        j["pattern_read_us"] = pattern_read(views, &pat_cpu_us);
        j["pattern_read_cpu_us"] = pat_cpu_us;
        j["pattern_fraction_cpu"] = pat_cpu_us / (cpu_step * 1e6);
        j["compute_cpu_us"] = per_row * context * sequences * 1e6;
        emit(j);
        return true;
      };
      const double per_row = compute_per_row(so, ao);
      if (!measure("single", o.context, 1, {(*kv)->view()}, per_row,
                   [&] { return AttendDecode((*kv)->view(), q, ao, outs); })) {
        return 1;
      }
      kv = Status::Internal("released");  // free before the batch case

      if (o.batch_seqs == 0) continue;
      // Batched decode.
      std::vector<std::unique_ptr<SyntheticKv>> seqs;
      std::vector<LayerKvView> views;
      for (uint32_t s = 0; s < o.batch_seqs; ++s) {
        so.num_tokens = o.batch_context;
        so.seed = 100 + s;
        auto sk = SyntheticKv::Create(so);
        if (!sk.ok()) {
          fmt::print(stderr, "kvcache bench attention: {}\n", sk.status().ToString());
          return 1;
        }
        views.push_back((*sk)->view());
        seqs.push_back(std::move(*sk));
      }
      std::vector<float> bq(size_t{o.batch_seqs} * kQHeads * kHeadDim), bout(bq.size());
      for (size_t i = 0; i < bq.size(); ++i) bq[i] = 0.01f * static_cast<float>(i % 89) - 0.4f;
      if (!measure("batched", o.batch_context, o.batch_seqs, views, per_row,
                   [&] { return AttendDecodeBatch(views, bq, ao, bout); })) {
        return 1;
      }
    }
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    "bench attention",
    "Decode attention step time vs the machine's read bandwidth, per format pair",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<BenchOptions>();
      app->add_flag("--json", o->json, "One JSON object per case");
      app->add_flag("--small-pages", o->small_pages,
                    "K/V storage without the transparent huge page advice (4 KiB pages)");
      app->add_option("--context", o->context, "Context tokens of the single sequence")
          ->capture_default_str();
      app->add_option("--threads", o->threads, "Threads (kernel and bandwidth probe)")
          ->capture_default_str();
      app->add_option("--formats", o->formats, "Comma-separated K:V format pairs")
          ->capture_default_str();
      app->add_option("--layout", o->layout, "contiguous, paged or both")->capture_default_str();
      app->add_option("--block-size", o->block_size, "Tokens per pool block (paged layout)")
          ->capture_default_str();
      app->add_option("--repeats", o->repeats, "Timed steps per case (median)")
          ->capture_default_str();
      app->add_option("--batch-seqs", o->batch_seqs, "Sequences in the batched case (0: skip)")
          ->capture_default_str();
      app->add_option("--batch-context", o->batch_context, "Context tokens per batched sequence")
          ->capture_default_str();
      app->add_option("--bandwidth-mib", o->bandwidth_mib, "Bandwidth probe buffer (MiB)")
          ->capture_default_str();
      return [o] { return RunBench(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
