// `kvcache bench encode`: the write path per format and SIMD target.
//
// One row per (format, target):
//   encode_gb_per_s   RowCodec::Encode (keys side: rotation included for the
//                     turbo formats) of --rows rows of head_dim 128, f32
//                     input bytes per second, one thread; the rows stay in L2
//   decode_gb_per_s   RowCodec::Decode of the same rows, f32 output bytes/s
//   append_token_us   SequenceCache::Append of one token to every layer of a
//                     Llama-3-8B geometry (32 layers, 8 kv heads, head_dim
//                     128), K and V both in the format, paged pool, block 16
//                     (append_layout says so); --append-tokens tokens per run,
//                     then the cache is cleared (not timed). The token is the
//                     same one each time (it stays in cache, as a token just
//                     computed would); the stored bytes go to fresh slots.
//   encode_token_us   what the bare encode of one token's f32 K and V (256
//                     KiB) takes at encode_gb_per_s; append_vs_encode is
//                     append_token_us / encode_token_us
//
// Every (format, target) is measured once per round, the rounds interleaved
// (kvcache::UseSimdTarget before each measurement), and each figure is the
// median over the rounds after a warm-up round. Times are thread CPU time
// (CLOCK_THREAD_CPUTIME_ID, as Google Benchmark's rates): on a shared machine
// they leave out the time the thread waited for a core. Short by default (all
// formats, one target: a few seconds); --long for 4x the work per figure and
// 3x the rounds.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/codec.h"
#include "kvcache/pool.h"
#include "kvcache/simd.h"
#include "tools/bench_util.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

struct BenchEncodeOptions {
  bool json = false;
  bool long_run = false;
  std::string formats;                    // empty: every format
  std::vector<std::string> simd_targets;  // empty: the current one
  uint32_t rows = 512;                    // 256 KiB of f32 at head_dim 128
  uint32_t append_tokens = 32;
  uint32_t rounds = 5;
};

constexpr uint32_t kLayers = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// One (format, target) case and its samples.
struct Case {
  Format format;
  std::string target;
  RowCodec codec;
  std::vector<uint8_t> bytes;
  std::vector<float> decoded;
  std::shared_ptr<BlockPool> pool;
  SequenceCache cache;
  uint32_t encode_iters = 1, decode_iters = 1;
  std::vector<double> enc, dec, app;  // seconds per call / per token
};

Result<nlohmann::json> Run(const BenchEncodeOptions& o) {
  std::vector<Format> formats;
  if (o.formats.empty()) {
    formats.assign(kAllFormats.begin(), kAllFormats.end());
  } else {
    std::stringstream ss(o.formats);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      KV_ASSIGN_OR_RETURN(Format f, ParseFormat(item));
      formats.push_back(f);
    }
  }
  if (formats.empty() || o.rows == 0 || o.append_tokens == 0 || o.rounds == 0) {
    return Status::InvalidArgument("--formats must name a format; --rows, --append-tokens and --rounds must be > 0");
  }
  const std::string start_target = SimdTarget();
  std::vector<std::string> targets = o.simd_targets;
  if (targets.empty()) targets.push_back(start_target);
  for (std::string& t : targets) {
    if (Status st = UseSimdTarget(t); !st.ok()) {
      (void)UseSimdTarget(start_target);
      return Status::InvalidArgument("--simd-targets: " + st.message());
    }
    t = SimdTarget();
  }
  (void)UseSimdTarget(start_target);
  struct RestoreTarget {
    std::string name;
    ~RestoreTarget() { (void)UseSimdTarget(name); }
  } restore{start_target};

  const uint32_t scale = o.long_run ? 4 : 1;
  const uint32_t rounds = o.rounds * (o.long_run ? 3 : 1);
  const uint32_t append_tokens = o.append_tokens * scale;
  KV_ASSIGN_OR_RETURN(Geometry geo, Geometry::Create({kLayers, kKvHeads, kHeadDim, kBlock}));
  const size_t per_token = size_t{kLayers} * kKvHeads * kHeadDim;
  const std::vector<float> rows = Gaussian(size_t{o.rows} * kHeadDim, 1);
  // The appended token (K and V, 256 KiB of f32): one, appended again and
  // again, so that it stays in cache as a freshly computed token would.
  const std::vector<float> tok_k = Gaussian(per_token, 2);
  const std::vector<float> tok_v = Gaussian(per_token, 3);

  std::vector<Case> cases;
  for (Format f : formats) {
    KV_RETURN_IF_ERROR(CheckHeadDim(f, kHeadDim));
    for (const std::string& t : targets) {
      KV_ASSIGN_OR_RETURN(RowCodec codec, RowCodec::Create(f, kHeadDim, Side::kKey));
      const uint32_t blocks = (append_tokens + kBlock - 1) / kBlock + 2;
      KV_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool,
                          BlockPool::Create(geo, {f, f}, {.num_blocks = blocks}));
      KV_ASSIGN_OR_RETURN(SequenceCache cache, SequenceCache::CreatePaged(pool));
      Case c{f, t, std::move(codec), {}, {}, std::move(pool), std::move(cache), 1, 1, {}, {}, {}};
      c.bytes.resize(size_t{o.rows} * c.codec.row_bytes());
      c.decoded.resize(rows.size());
      cases.push_back(std::move(c));
    }
  }

  // Work per encode/decode sample: about 2 ms (x scale) of calls, sized in
  // the warm-up round.
  const double target_s = 2e-3 * scale;
  for (uint32_t r = 0; r <= rounds; ++r) {
    for (Case& c : cases) {
      (void)UseSimdTarget(c.target);  // validated above
      double t0 = ThreadCpuSeconds();
      for (uint32_t i = 0; i < c.encode_iters; ++i) KV_RETURN_IF_ERROR(c.codec.Encode(rows, c.bytes));
      double t1 = ThreadCpuSeconds();
      const double enc = (t1 - t0) / c.encode_iters;
      t0 = ThreadCpuSeconds();
      for (uint32_t i = 0; i < c.decode_iters; ++i) KV_RETURN_IF_ERROR(c.codec.Decode(c.bytes, c.decoded));
      t1 = ThreadCpuSeconds();
      const double dec = (t1 - t0) / c.decode_iters;
      t0 = ThreadCpuSeconds();
      for (uint32_t t = 0; t < append_tokens; ++t) {
        KV_RETURN_IF_ERROR(c.cache.Append(tok_k, tok_v));
      }
      t1 = ThreadCpuSeconds();
      const double app = (t1 - t0) / append_tokens;
      KV_RETURN_IF_ERROR(c.cache.Clear());
      if (r == 0) {
        c.encode_iters = static_cast<uint32_t>(std::clamp(target_s / std::max(enc, 1e-9), 1.0, 1e6));
        c.decode_iters = static_cast<uint32_t>(std::clamp(target_s / std::max(dec, 1e-9), 1.0, 1e6));
        continue;
      }
      c.enc.push_back(enc);
      c.dec.push_back(dec);
      c.app.push_back(app);
    }
  }

  nlohmann::json out = nlohmann::json::array();
  const double in_bytes = static_cast<double>(rows.size()) * sizeof(float);
  const double token_f32_bytes = 2.0 * static_cast<double>(per_token) * sizeof(float);
  for (const Case& c : cases) {
    nlohmann::json j;
    j["format"] = FormatName(c.format);
    j["simd_target"] = c.target;
    j["encode_gb_per_s"] = in_bytes / Median(c.enc) / 1e9;
    j["decode_gb_per_s"] = in_bytes / Median(c.dec) / 1e9;
    j["append_token_us"] = Median(c.app) * 1e6;
    j["encode_token_us"] = token_f32_bytes / j["encode_gb_per_s"].get<double>() / 1e3;
    j["append_vs_encode"] = j["append_token_us"].get<double>() / j["encode_token_us"].get<double>();
    j["append_layout"] = "paged/16";
    j["append_geometry"] = geo.ToString();
    j["rows"] = o.rows;
    j["head_dim"] = kHeadDim;
    j["rounds"] = rounds;
    j["timing"] = "thread_cpu";
    out.push_back(std::move(j));
  }
  return out;
}

const bool kRegistered = RegisterOptionsCommand<BenchEncodeOptions>(
    "bench encode", "Encode, decode and one-token append speed per format and SIMD target",
    [](CLI::App* app, BenchEncodeOptions& o) {
      app->add_flag("--json", o.json, "One JSON object per (format, target)");
      app->add_flag("--long", o.long_run, "4x the work per figure and 3x the rounds");
      app->add_option("--formats", o.formats, "Comma-separated formats (default: all)");
      app->add_option("--simd-targets", o.simd_targets,
                      "SIMD targets, comma-separated (default: the dispatched one; `kvcache "
                      "info` lists them)")
          ->delimiter(',');
      app->add_option("--rows", o.rows, "Rows of head_dim 128 per encode/decode call")
          ->capture_default_str();
      app->add_option("--append-tokens", o.append_tokens, "Tokens appended per append run")
          ->capture_default_str();
      app->add_option("--rounds", o.rounds, "Interleaved rounds (median)")->capture_default_str();
    },
    [](const BenchEncodeOptions& o) {
      auto r = Run(o);
      if (!r.ok()) {
        fmt::print(stderr, "kvcache bench encode: {}\n", r.status().ToString());
        return 2;
      }
      if (o.json) {
        for (const auto& j : *r) fmt::print("{}\n", j.dump());
        return 0;
      }
      fmt::print("{:<10} {:<8} {:>10} {:>10} {:>12} {:>12} {:>8}\n", "format", "target", "enc_GB/s",
                 "dec_GB/s", "append_us", "enc_tok_us", "app/enc");
      for (const auto& j : *r) {
        fmt::print("{:<10} {:<8} {:>10.2f} {:>10.2f} {:>12.1f} {:>12.1f} {:>8.2f}\n",
                   j["format"].get<std::string>(), j["simd_target"].get<std::string>(),
                   j["encode_gb_per_s"].get<double>(), j["decode_gb_per_s"].get<double>(),
                   j["append_token_us"].get<double>(), j["encode_token_us"].get<double>(),
                   j["append_vs_encode"].get<double>());
      }
      fmt::print("append: one token, {} layers x {} kv heads x head_dim {}, K and V in the "
                 "format, paged pool (block {}); thread CPU time, medians\n",
                 kLayers, kKvHeads, kHeadDim, kBlock);
      return 0;
    });

}  // namespace
}  // namespace kvcache::tools
