// `kvcache bench attention`: decode-attention step time per format pair and
// layout, as a fraction of the machine's streaming read bandwidth measured
// in the same run with the same thread count.
//
// One sequence: 32 q heads, 8 kv heads, head_dim 128 (--q-heads, --kv-heads,
// --head-dim: another geometry, e.g. Gemma 3 270M's 4 / 1 / 256), --context tokens.
// Batched: --batch-seqs sequences of --batch-context tokens, one call.
// Each timed step is preceded by a cache flush (a 64 MiB read) so that K/V
// come from memory, as they do in a real model with many layers.
//
// --simd-targets A,B,... times every case once per target (kvcache::
// UseSimdTarget before each step; the cases share their K/V), in the same
// rounds; every row names its simd_target. Default: the target dispatch
// chooses (or the global --simd-target).
//
// --key-paths int,int8,float times every case with the integer K paths of
// the quantized keys (q8, q8_0, q4_0; int16 query, the default), the int8
// query of q8_0/q4_0 (AttentionOptions::int8_query_keys) and the f32 query
// (AttentionOptions::float_query_keys), in the same rounds; every row
// names its key_path.
//
// Every case is built first and then timed in interleaved rounds (one step
// of each case per round, each followed by a bandwidth sample and a pattern
// read), so that the ratios between cases (paged vs contiguous, turbo vs
// bf16, block 16 vs 64) come from the same stretch of time: on a shared
// machine whose speed moves by 10-30% over a minute, timing one case after
// another would put that drift into the ratios.
//
// Two floors are measured beside each case, to show what limits it:
//   pattern_read: the same K/V bytes read in the kernels' order and split
//     (block-table pieces per head), with no arithmetic: the memory floor of
//     the layout (ReadLikeAttention).
//   compute: the kernel on a cache-resident context of kWarmContext tokens
//     (no flush), per stored row, times the case's rows: the arithmetic
//     floor with memory out of the way.
//
// --passes: the time of each pass per stored row instead (K, exp, V, the
// rest; TSC cycles and CPU ns), in memory and in cache, for every thread
// count of --pass-threads, beside the pattern read split by K and V bytes:
// cmd_bench_attention_passes.cc.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/simd.h"
#include "kvcache/thread_pool.h"
#include "tools/bench_util.h"
#include "tools/cmd_bench_attention_passes.h"
#include "tools/command.h"
#include "tools/support/bench_support.h"

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
  std::vector<uint32_t> block_sizes = {16};  // paged layout: tokens per pool block
  std::vector<std::string> simd_targets;      // empty: the current one
  std::vector<std::string> key_paths = {"int"};  // int, int8, float (AttentionOptions)
  bool passes = false;                 // per-pass profile (cmd_bench_attention_passes.cc)
  std::vector<uint32_t> pass_threads;  // --passes thread counts; empty: --threads
  uint32_t cache_context = 1024;       // --passes in-cache case
  // The attention geometry (default: kQHeads / kKvHeads / kHeadDim, Llama-3-8B;
  // Gemma 3 270M: --q-heads 4 --kv-heads 1 --head-dim 256).
  uint32_t q_heads = kQHeads, kv_heads = kKvHeads, head_dim = kHeadDim;
};

constexpr uint32_t kWarmContext = 1024;

// Bytes of stored K and V rows a decode step over v reads.
size_t KvBytes(const LayerKvView& v) {
  size_t n = 0;
  for (uint32_t h = 0; h < v.n_kv_heads; ++h) {
    n += size_t{v.rows(h)} * (v.k.row_bytes + v.v.row_bytes);
  }
  return n;
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
  // Layouts as block sizes, 0 = contiguous.
  std::vector<uint32_t> layouts;
  const bool want_contiguous = o.layout == "contiguous" || o.layout == "both";
  const bool want_paged = o.layout == "paged" || o.layout == "both";
  if (want_contiguous) layouts.push_back(0);
  if (want_paged) layouts.insert(layouts.end(), o.block_sizes.begin(), o.block_sizes.end());
  if (!want_contiguous && !want_paged) {
    fmt::print(stderr, "kvcache bench attention: --layout must be contiguous, paged or both\n");
    return 2;
  }
  const bool bad_block = o.block_sizes.empty() ||
                         std::find(o.block_sizes.begin(), o.block_sizes.end(), 0u) != o.block_sizes.end();
  if (o.repeats == 0 || o.threads == 0 || o.context == 0 || bad_block) {
    fmt::print(stderr,
               "kvcache bench attention: --repeats, --threads, --context and --block-size must be "
               "> 0\n");
    return 2;
  }
  if (o.kv_heads == 0 || o.head_dim == 0 || o.q_heads == 0 || o.q_heads % o.kv_heads != 0) {
    fmt::print(stderr,
               "kvcache bench attention: --q-heads, --kv-heads and --head-dim must be > 0, and "
               "--q-heads a multiple of --kv-heads\n");
    return 2;
  }
  const uint32_t q_heads = o.q_heads, head_dim = o.head_dim;
  const std::string start_target = SimdTarget();
  std::vector<std::string> targets = o.simd_targets;
  if (targets.empty()) targets.push_back(start_target);
  for (std::string& t : targets) {
    if (const Status st = UseSimdTarget(t); !st.ok()) {
      fmt::print(stderr, "kvcache bench attention: --simd-targets: {}\n", st.ToString());
      (void)UseSimdTarget(start_target);
      return 2;
    }
    t = SimdTarget();  // canonical spelling
  }
  (void)UseSimdTarget(start_target);
  if (o.passes) {
    PassesOptions po;
    po.json = o.json;
    po.pairs = pairs;
    po.layouts = layouts;
    po.targets = targets;
    po.threads = o.pass_threads.empty() ? std::vector<uint32_t>{o.threads} : o.pass_threads;
    po.context = o.context;
    po.cache_context = o.cache_context;
    po.repeats = o.repeats;
    po.small_pages = o.small_pages;
    po.q_heads = o.q_heads;
    po.kv_heads = o.kv_heads;
    po.head_dim = o.head_dim;
    const bool zero_thread = std::find(po.threads.begin(), po.threads.end(), 0u) != po.threads.end();
    if (o.cache_context == 0 || zero_thread || o.key_paths != std::vector<std::string>{"int"}) {
      fmt::print(stderr,
                 "kvcache bench attention --passes: --cache-context and --pass-threads must be "
                 "> 0; --key-paths is not supported (default key paths only)\n");
      return 2;
    }
    return RunAttentionPasses(po);
  }
  std::vector<std::string> key_paths;
  for (const std::string& kp : o.key_paths) {
    if (kp != "int" && kp != "int8" && kp != "float") {
      fmt::print(stderr, "kvcache bench attention: --key-paths: '{}' is not int, int8 or float\n",
                 kp);
      return 2;
    }
    key_paths.push_back(kp);
  }
  if (key_paths.empty()) key_paths.push_back("int");
  // The timed variants: every target x every key path.
  struct Variant {
    std::string target;
    std::string key_path;
  };
  std::vector<Variant> variants;
  for (const std::string& t : targets) {
    for (const std::string& kp : key_paths) variants.push_back({t, kp});
  }
  auto with_path = [&](AttentionOptions x, const std::string& kp) {
    x.float_query_keys = kp == "float";
    x.int8_query_keys = kp == "int8";
    return x;
  };
  // Leaves dispatch as it found it, on every return below.
  struct RestoreTarget {
    std::string name;
    ~RestoreTarget() { (void)UseSimdTarget(name); }
  } restore{start_target};
  ThreadPool pool(o.threads);
  ReadBandwidthProbe probe(std::max(o.bandwidth_mib, size_t{64}) << 20);
  probe.MeasureOnce(&pool);  // warm up (page faults)
  using attention_internal::ProcessCpuSeconds;

  auto emit = [&](nlohmann::json j) {
    if (o.json) {
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:<20} {:<10} {:>6} {:>5} {:>3} {:>10.1f} {:>9.1f} {:>8.2f} {:>8.2f} {:>6.3f} {:>10.1f} {:>8.2f} {:>8.3f} {:>10.1f} {:>10.1f} {:>6.3f}\n",
                 j["k_format"].get<std::string>() + ":" + j["v_format"].get<std::string>() +
                     (j["key_path"] != "int" ? " " + j["key_path"].get<std::string>() : std::string()),
                 j["layout"].get<std::string>() +
                     (j["block_size"].get<uint32_t>() != 0
                          ? fmt::format("/{}", j["block_size"].get<uint32_t>())
                          : std::string()),
                 j["context_tokens"].get<uint32_t>(),
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
    fmt::print("SIMD targets {}, {} threads, {} q heads / {} kv heads / head_dim {}\n",
               fmt::join(targets, ","),
               o.threads, o.q_heads, o.kv_heads, o.head_dim);
    fmt::print("{:<20} {:<10} {:>6} {:>5} {:>3} {:>10} {:>9} {:>8} {:>8} {:>6} {:>10} {:>8} {:>8} {:>10} {:>10} {:>6}\n",
               "k:v", "layout/bs", "ctx", "seqs", "thr", "step_us", "kv_MiB", "eff_GB/s", "read_GB/s",
               "frac", "cpu_us", "cpuGB/s", "cpu_frac", "pat_cpu_us", "cmp_cpu_us", "pat_fr");
  }

  // The compute floor per stored row (all kv heads), CPU seconds / threads,
  // from repeated steps over a cache-resident kWarmContext-token sequence.
  auto compute_per_row = [&](SyntheticKvOptions so, const AttentionOptions& ao) -> double {
    so.num_tokens = kWarmContext;
    so.seed = 7;
    auto kv = SyntheticKv::Create(so);
    if (!kv.ok()) return 0.0;
    std::vector<float> q(size_t{q_heads} * head_dim), out(q.size());
    FillBenchQuery(&q, 97);
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

  // The cases, all built before any is timed.
  struct Case {
    const char* name;  // "single" or "batched"
    std::string target;
    std::string key_path;
    FormatPair fp;
    uint32_t block_size;  // 0: contiguous
    uint32_t context, sequences;
    double per_row;  // compute floor per stored row
    std::shared_ptr<std::vector<std::unique_ptr<SyntheticKv>>> kvs;  // shared across targets
    std::vector<LayerKvView> views;
    std::vector<float> q, out;
    std::vector<double> steps, cpu_steps, bw, cpu_bw, pat, pat_cpu;
  };
  AttentionOptions ao;
  ao.n_q_heads = q_heads;
  ao.pool = &pool;
  std::vector<Case> cases;
  for (FormatPair fp : pairs) {
    for (uint32_t bs : layouts) {
      SyntheticKvOptions so = BenchKvOptions(fp, bs, o.small_pages);
      so.n_kv_heads = o.kv_heads;
      so.head_dim = head_dim;
      std::vector<double> per_row(variants.size());
      for (size_t ti = 0; ti < variants.size(); ++ti) {
        (void)UseSimdTarget(variants[ti].target);
        per_row[ti] = compute_per_row(so, with_path(ao, variants[ti].key_path));
      }
      (void)UseSimdTarget(start_target);
      for (int batched = 0; batched < (o.batch_seqs > 0 ? 2 : 1); ++batched) {
        Case c{batched ? "batched" : "single", variants[0].target, variants[0].key_path, fp, bs,
               batched ? o.batch_context : o.context, batched ? o.batch_seqs : 1u, per_row[0],
               std::make_shared<std::vector<std::unique_ptr<SyntheticKv>>>(),
               {}, {}, {}, {}, {}, {}, {}, {}, {}};
        for (uint32_t s = 0; s < c.sequences; ++s) {
          so.num_tokens = c.context;
          so.seed = batched ? 100 + s : 1;
          auto kv = SyntheticKv::Create(so);
          if (!kv.ok()) {
            fmt::print(stderr, "kvcache bench attention: {}: {}\n", FormatPairName(fp),
                       kv.status().ToString());
            return 1;
          }
          c.views.push_back((*kv)->view());
          c.kvs->push_back(std::move(*kv));
        }
        c.q.resize(size_t{c.sequences} * q_heads * head_dim);
        c.out.resize(c.q.size());
        FillBenchQuery(&c.q, batched ? 89 : 97);
        cases.push_back(std::move(c));
        const size_t first = cases.size() - 1;
        for (size_t ti = 1; ti < variants.size(); ++ti) {
          Case other = cases[first];  // the same K/V, another target or key path
          other.target = variants[ti].target;
          other.key_path = variants[ti].key_path;
          other.per_row = per_row[ti];
          cases.push_back(std::move(other));
        }
      }
    }
  }
  // Rounds: round 0 warms up (page faults, first touches) and is not kept.
  for (uint32_t r = 0; r < o.repeats + 1; ++r) {
    for (Case& c : cases) {
      (void)UseSimdTarget(c.target);  // validated above
      const AttentionOptions co = with_path(ao, c.key_path);
      probe.Flush(kFlushBytes);
      const double c0 = ProcessCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      Status st;
      if (c.sequences == 1) {
        AttentionOutput outs;
        outs.out = c.out;
        st = AttendDecode(c.views[0], c.q, co, outs);
      } else {
        st = AttendDecodeBatch(c.views, c.q, co, c.out);
      }
      const auto t1 = std::chrono::steady_clock::now();
      const double c1 = ProcessCpuSeconds();
      if (!st.ok()) {
        fmt::print(stderr, "kvcache bench attention: {}\n", st.ToString());
        return 1;
      }
      if (r == 0) continue;
      c.steps.push_back(std::chrono::duration<double>(t1 - t0).count());
      c.cpu_steps.push_back((c1 - c0) / o.threads);
      double cbw = 0;
      c.bw.push_back(probe.MeasureOnce(&pool, &cbw));
      c.cpu_bw.push_back(cbw);
      probe.Flush(kFlushBytes);
      double pc = 0;
      c.pat.push_back(ReadLikeAttention(c.views, &pool, &pc));
      c.pat_cpu.push_back(pc);
    }
  }
  for (const Case& c : cases) {
    const double step = Median(c.steps), cpu_step = Median(c.cpu_steps);
    const double bw = Median(c.bw), cpu_bw = Median(c.cpu_bw);
    const double pat_cpu_us = Median(c.pat_cpu) * 1e6;
    double bytes = 0;
    for (const LayerKvView& v : c.views) bytes += static_cast<double>(KvBytes(v));
    nlohmann::json j;
    j["k_format"] = FormatName(c.fp.k);
    j["v_format"] = FormatName(c.fp.v);
    j["layout"] = c.block_size != 0 ? "paged" : "contiguous";
    j["block_size"] = c.block_size;
    j["threads"] = o.threads;
    j["simd_target"] = c.target;
    j["key_path"] = c.key_path;
    j["case"] = c.name;
    j["context_tokens"] = c.context;
    j["q_heads"] = o.q_heads;
    j["kv_heads"] = o.kv_heads;
    j["head_dim"] = o.head_dim;
    j["sequences"] = c.sequences;
    j["step_us"] = step * 1e6;
    j["kv_bytes"] = bytes;
    j["effective_gb_per_s"] = bytes / step / 1e9;
    j["read_bandwidth_gb_per_s"] = bw;
    j["bandwidth_fraction"] = bytes / step / 1e9 / bw;
    j["step_cpu_us"] = cpu_step * 1e6;
    j["read_bandwidth_cpu_gb_per_s"] = cpu_bw;
    j["bandwidth_fraction_cpu"] = bytes / cpu_step / 1e9 / cpu_bw;
    j["pattern_read_us"] = Median(c.pat) * 1e6;
    j["pattern_read_cpu_us"] = pat_cpu_us;
    j["pattern_fraction_cpu"] = pat_cpu_us / (cpu_step * 1e6);
    j["compute_cpu_us"] = c.per_row * c.context * c.sequences * 1e6;
    emit(j);
  }
  return 0;
}

const bool kRegistered = RegisterOptionsCommand<BenchOptions>(
    "bench attention",
    "Decode attention step time vs the machine's read bandwidth, per format pair",
    [](CLI::App* app, BenchOptions& o) {
      app->add_flag("--json", o.json, "One JSON object per case");
      app->add_flag("--small-pages", o.small_pages,
                    "K/V storage without the transparent huge page advice (4 KiB pages)");
      app->add_option("--context", o.context, "Context tokens of the single sequence")
          ->capture_default_str();
      app->add_option("--threads", o.threads, "Threads (kernel and bandwidth probe)")
          ->capture_default_str();
      app->add_option("--q-heads", o.q_heads, "Query heads (a multiple of --kv-heads)")
          ->capture_default_str();
      app->add_option("--kv-heads", o.kv_heads, "KV heads")->capture_default_str();
      app->add_option("--head-dim", o.head_dim, "Values per head")->capture_default_str();
      app->add_option("--formats", o.formats, "Comma-separated K:V format pairs")
          ->capture_default_str();
      app->add_option("--layout", o.layout, "contiguous, paged or both")->capture_default_str();
      app->add_option("--block-size", o.block_sizes,
                      "Tokens per pool block (paged layout); several, comma-separated, give one "
                      "paged case each")
          ->delimiter(',')
          ->capture_default_str();
      app->add_option("--repeats", o.repeats,
                      "Rounds: timed steps per case, interleaved across cases (median)")
          ->capture_default_str();
      app->add_option("--batch-seqs", o.batch_seqs, "Sequences in the batched case (0: skip)")
          ->capture_default_str();
      app->add_option("--batch-context", o.batch_context, "Context tokens per batched sequence")
          ->capture_default_str();
      app->add_option("--bandwidth-mib", o.bandwidth_mib, "Bandwidth probe buffer (MiB)")
          ->capture_default_str();
      app->add_option("--simd-targets", o.simd_targets,
                      "SIMD targets to time each case on, comma-separated (default: the "
                      "dispatched one; `kvcache info` lists them)")
          ->delimiter(',');
      app->add_option("--key-paths", o.key_paths,
                      "Quantized-key scoring to time each case with, comma-separated: int (int16 "
                      "query, default), int8 (q8_0/q4_0: int8 query per 32 values), float (f32 "
                      "query)")
          ->delimiter(',');
      app->add_flag("--passes", o.passes,
                    "Per-pass profile: K, exp, V and the rest per stored row (TSC cycles, CPU "
                    "ns), in memory (--context) and in cache (--cache-context), beside the "
                    "pattern-read floor");
      app->add_option("--pass-threads", o.pass_threads,
                      "--passes: thread counts, comma-separated, timed in the same rounds "
                      "(default: --threads)")
          ->delimiter(',');
      app->add_option("--cache-context", o.cache_context,
                      "--passes: context tokens of the in-cache case")
          ->capture_default_str();
    },
    RunBench);

}  // namespace
}  // namespace kvcache::tools
