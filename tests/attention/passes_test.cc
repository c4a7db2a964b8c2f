// The profiled run (AttendMultiProfiled, kvcache/attention_profile.h; plan.h
// RunPlanProfiled, used by `kvcache bench attention --passes`) against the
// normal one (AttendMulti): the same outputs bit for bit, so the per-pass
// profile times the production kernels. Every SIMD target this CPU runs,
// every format pair of the profile table (k:v the same, plus mixed pairs
// and the exact f32 path), contiguous and paged storage, and the three
// thread splits of kernels.cc: whole jobs on the calling thread, whole jobs
// on a pool (grouped heads for paged 2-byte formats), and jobs split into
// chunks (fewer jobs than twice the threads). Also: the profile counts
// every stored row once, its ticks add up, and it accumulates.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/attention_profile.h"
#include "kvcache/thread_pool.h"
#include "hwy_targets.h"
#include "tools/support/bench_support.h"

namespace kvcache {
namespace {

using testing::ForEachHwyTarget;

using attention_internal::SyntheticKv;
using attention_internal::SyntheticKvOptions;

struct Outputs {
  std::vector<float> out, lse, probs, kv_probs;
  Outputs(const LayerKvView& v, uint32_t n_q_heads, uint32_t n_queries) {
    const size_t qd = size_t{n_queries} * n_q_heads;
    out.assign(qd * v.head_dim, std::nanf(""));
    lse.assign(qd, std::nanf(""));
    probs.assign(qd * v.num_tokens, std::nanf(""));
    kv_probs.assign(size_t{v.n_kv_heads} * v.num_tokens, std::nanf(""));
  }
  AttentionOutput spans() { return {out, lse, probs, kv_probs}; }
};

// Index of the first float whose bits differ, or -1.
long FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i);
  }
  return -1;
}

std::unique_ptr<SyntheticKv> MakeKv(FormatPair fp, uint32_t n_kv_heads, uint32_t tokens,
                                    bool paged) {
  SyntheticKvOptions o;
  o.formats = fp;
  o.n_kv_heads = n_kv_heads;
  o.head_dim = 128;
  o.num_tokens = tokens;
  o.paged = paged;
  o.block_size = 16;
  o.distinct_rows = 97;
  o.seed = 3;
  o.huge_pages = false;
  auto kv = SyntheticKv::Create(o);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  return kv.ok() ? std::move(*kv) : nullptr;
}

std::vector<float> Queries(size_t n, uint32_t seed) {
  std::vector<float> q(n);
  uint32_t x = seed;
  for (float& v : q) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x >> 8) % 2001) / 1000.0f;  // [-2, 2]
  }
  return q;
}

struct Split {
  const char* name;
  uint32_t n_kv_heads, threads;  // threads 0: no pool
};
// Whole jobs serially; whole jobs on 2 threads (8 jobs >= 2 x 2); split
// jobs (1 job < 2 x 2 threads: flash-decoding chunks of whole segments).
constexpr Split kSplits[] = {{"serial", 8, 0}, {"whole", 8, 2}, {"split", 1, 2}};

void ExpectSameAsPlain(FormatPair fp, bool paged, const Split& sp, uint32_t n_queries,
                       uint32_t window) {
  SCOPED_TRACE(FormatPairName(fp) + (paged ? " paged " : " contiguous ") + sp.name +
               " queries " + std::to_string(n_queries) + " window " + std::to_string(window));
  // 1100 tokens: three 512-row segments, the last one partial.
  const uint32_t tokens = 1100;
  auto kv = MakeKv(fp, sp.n_kv_heads, tokens, paged);
  ASSERT_NE(kv, nullptr);
  const LayerKvView& view = kv->view();
  std::unique_ptr<ThreadPool> pool;
  if (sp.threads != 0) pool = std::make_unique<ThreadPool>(sp.threads);
  AttentionOptions ao;
  ao.n_q_heads = 4 * sp.n_kv_heads;
  ao.pool = pool.get();
  ao.window = window;
  ao.n_sink = window != 0 ? 3 : 0;
  const std::vector<float> q = Queries(size_t{n_queries} * ao.n_q_heads * 128, 11);
  Outputs plain(view, ao.n_q_heads, n_queries), profiled(view, ao.n_q_heads, n_queries);
  ASSERT_TRUE(AttendMulti(view, n_queries, q, ao, plain.spans()).ok());
  AttentionPassProfile prof;
  ASSERT_TRUE(AttendMultiProfiled(view, n_queries, q, ao, profiled.spans(), &prof).ok());
  EXPECT_EQ(FirstDifference(plain.out, profiled.out), -1);
  EXPECT_EQ(FirstDifference(plain.lse, profiled.lse), -1);
  EXPECT_EQ(FirstDifference(plain.probs, profiled.probs), -1);
  EXPECT_EQ(FirstDifference(plain.kv_probs, profiled.kv_probs), -1);
  EXPECT_FALSE(std::isnan(profiled.out[0]));
  EXPECT_EQ(prof.rows, uint64_t{tokens} * sp.n_kv_heads);
  // The time-stamp counter moves forward across every pass that ran rows.
  EXPECT_GT(prof.k.ticks, 0u);
  EXPECT_GT(prof.v.ticks, 0u);
  EXPECT_GT(prof.exp.ticks, 0u);
}

TEST(PassesTest, ProfiledRunEqualsPlainRunForEveryFormatSplitAndTarget) {
  const Format formats[] = {Format::kBF16,   Format::kF16,    Format::kFp8E4M3,
                            Format::kQ8,     Format::kQ8_0,   Format::kQ4_0,
                            Format::kTurbo4, Format::kTurbo3, Format::kTurbo2,
                            Format::kTurbo8, Format::kF32};
  ForEachHwyTarget([&] {
    for (Format f : formats) {
      for (bool paged : {false, true}) {
        for (const Split& sp : kSplits) ExpectSameAsPlain({f, f}, paged, sp, 1, 0);
      }
    }
  });
}

TEST(PassesTest, ProfiledRunEqualsPlainRunWithMaskingAndMixedPairs) {
  ForEachHwyTarget([&] {
    for (FormatPair fp : {FormatPair{Format::kBF16, Format::kTurbo4},
                          FormatPair{Format::kQ8_0, Format::kF16},
                          FormatPair{Format::kTurbo3, Format::kQ4_0}}) {
      for (const Split& sp : kSplits) {
        // Several query tokens (a causal mask inside the last rows) and a
        // window with sinks: the passes' masked loops.
        ExpectSameAsPlain(fp, true, sp, 3, 0);
        ExpectSameAsPlain(fp, false, sp, 2, 300);
      }
    }
  });
}

TEST(PassesTest, ProfileAccumulatesAndANullProfileIsRejected) {
  auto kv = MakeKv({Format::kBF16, Format::kBF16}, 8, 600, true);
  ASSERT_NE(kv, nullptr);
  const LayerKvView& view = kv->view();
  AttentionOptions ao;
  ao.n_q_heads = 32;
  const std::vector<float> q = Queries(32 * 128, 5);
  Outputs a(view, 32, 1);
  AttentionPassProfile prof;
  ASSERT_TRUE(AttendMultiProfiled(view, 1, q, ao, a.spans(), &prof).ok());
  const AttentionPassProfile once = prof;
  ASSERT_TRUE(AttendMultiProfiled(view, 1, q, ao, a.spans(), &prof).ok());
  EXPECT_EQ(prof.rows, 2 * once.rows);
  EXPECT_GT(prof.k.ticks, once.k.ticks);
  EXPECT_GT(prof.v.ticks, once.v.ticks);
  EXPECT_GE(prof.other.ticks, once.other.ticks);

  Outputs untouched(view, 32, 1);
  const Status st = AttendMultiProfiled(view, 1, q, ao, untouched.spans(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::isnan(untouched.out[0]));
  // Bad input is the same error as AttendMulti's, nothing written.
  std::vector<float> short_q(q.begin(), q.end() - 1);
  EXPECT_EQ(AttendMultiProfiled(view, 1, short_q, ao, untouched.spans(), &prof).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::isnan(untouched.out[0]));
  EXPECT_EQ(prof.rows, 2 * once.rows);
}

}  // namespace
}  // namespace kvcache
