// Attention kernels against AttendReference: bit-exact for f32 on every
// SIMD target, thread count and layout; within tolerance for lossy formats
// (against the reference over their own decoded rows); and input errors.
#include "kvcache/attention.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention/plan.h"
#include "attention/reference.h"
#include "attention/test_views.h"
#include "format/format_internal.h"
#include "kvcache/thread_pool.h"
#include "hwy_targets.h"

namespace kvcache {
namespace {

using testing::ForEachHwyTarget;

using testing::Layout;
using testing::RandomVector;
using testing::TestView;
using testing::ViewSpec;

struct Outputs {
  std::vector<float> out, lse, probs, kv_probs;
  AttentionOutput spans() {
    return {out, lse, probs, kv_probs};
  }
};

Outputs MakeOutputs(const LayerKvView& v, uint32_t n_q_heads, uint32_t n_queries, bool extras) {
  Outputs o;
  const size_t qd = size_t{n_queries} * n_q_heads;
  o.out.assign(qd * v.head_dim, std::nanf(""));
  if (extras) {
    o.lse.assign(qd, std::nanf(""));
    o.probs.assign(qd * v.num_tokens, std::nanf(""));
    o.kv_probs.assign(size_t{v.n_kv_heads} * v.num_tokens, std::nanf(""));
  }
  return o;
}

bool BitsEqual(const std::vector<float>& a, const std::vector<float>& b, std::string* where) {
  if (a.size() != b.size()) {
    *where = "size";
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      *where = "index " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " +
               std::to_string(b[i]);
      return false;
    }
  }
  return true;
}

// Every output of `got` bit for bit that of `want`.
void ExpectSameBits(const Outputs& got, const Outputs& want) {
  std::string where;
  EXPECT_TRUE(BitsEqual(got.out, want.out, &where)) << "out " << where;
  EXPECT_TRUE(BitsEqual(got.lse, want.lse, &where)) << "lse " << where;
  EXPECT_TRUE(BitsEqual(got.probs, want.probs, &where)) << "probs " << where;
  EXPECT_TRUE(BitsEqual(got.kv_probs, want.kv_probs, &where)) << "kv_probs " << where;
}

TEST(AttentionExp, VectorMatchesScalarBitForBit) {
  std::vector<float> x;
  for (float v = -90.0f; v <= 0.0f; v += 0.0137f) x.push_back(v);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(-0.0f);
  x.push_back(0.0f);
  x.push_back(-87.0f);
  x.push_back(-86.99999f);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = attention_internal::Exp(x[i]);
  ForEachHwyTarget([&] {
    std::vector<float> got = x;
    attention_internal::ExpBufferForTest(got.data(), got.size());
    std::string where;
    EXPECT_TRUE(BitsEqual(got, want, &where)) << where;
  });
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < -87.0f) {
      EXPECT_EQ(want[i], 0.0f);
    } else {
      const double e = std::exp(static_cast<double>(x[i]));
      EXPECT_NEAR(want[i], e, e * 4e-7) << x[i];
    }
  }
}

TEST(AttentionFp8, KernelDecodeEqualsFormatOnEveryCode) {
  // Every E4M3 code (subnormals, both zeros, the largest normals) decodes to
  // the format's value bit for bit on every target. 0x7F and 0xFF are NaN in
  // the format and never written by the encoder; the kernels may give any
  // value there.
  std::vector<uint8_t> codes(256);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
  ForEachHwyTarget([&] {
    std::vector<float> got(codes.size(), -1.0f);
    attention_internal::E4M3DecodeForTest(codes.data(), codes.size(), got.data());
    for (size_t i = 0; i < codes.size(); ++i) {
      if ((i & 0x7F) == 0x7F) continue;
      const float want = format_internal::E4M3ToFloat(codes[i]);
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
          << "code " << i << ": " << got[i] << " vs " << want;
    }
  });
}

struct Case {
  ViewSpec spec;
  uint32_t n_q_heads;
  uint32_t n_queries = 1;
  uint32_t window = 0, n_sink = 0;
};

std::vector<Case> ExactCases() {
  std::vector<Case> cases;
  auto add = [&](ViewSpec s, uint32_t nq, uint32_t t = 1, uint32_t w = 0, uint32_t sink = 0) {
    cases.push_back({s, nq, t, w, sink});
  };
  ViewSpec s;
  add(s, 2);                             // MHA, paged
  s.layout = Layout::kContiguous;
  add(s, 8);                             // GQA 4, contiguous
  s.layout = Layout::kPerHead;
  add(s, 6);                             // GQA 3, per-head buffers
  s = {};
  s.n_kv_heads = 1;
  s.head_dim = 40;                       // tail block
  s.num_tokens = 1500;                   // 3 segments, split across threads
  add(s, 8);                             // MQA
  add(s, 8, 4);                          // multi-token causal
  add(s, 3, 2, 700, 4);                  // window + sinks
  s.num_tokens = 2600;                   // 6 segments: a split chunk of 2 (2 threads)
  add(s, 8, 3);                          // several query blocks over a chunk's segments
  s = {};
  s.n_kv_heads = 4;
  s.head_dim = 8;
  s.num_tokens = 100;
  s.head_rows = {100, 0, 37, 100};       // a dead head, a short one
  s.evict_every = 5;                     // non-trivial positions
  add(s, 8);
  add(s, 4, 3, 30, 2);
  s = {};
  s.head_dim = 128;
  s.num_tokens = 600;
  s.block_size = 7;
  add(s, 16, 2);
  return cases;
}

void RunExactCase(const Case& c, ThreadPool* pool) {
  auto tv = TestView::Make(c.spec);
  ASSERT_TRUE(tv.ok()) << tv.status().ToString();
  const LayerKvView& view = (*tv)->view();
  const auto q = RandomVector(size_t{c.n_queries} * c.n_q_heads * view.head_dim, 7);
  AttentionOptions o;
  o.n_q_heads = c.n_q_heads;
  o.window = c.window;
  o.n_sink = c.n_sink;
  Outputs want = MakeOutputs(view, c.n_q_heads, c.n_queries, true);
  const auto heads = (*tv)->reference_heads();
  ASSERT_TRUE(AttendReference(heads, view.head_dim, view.num_tokens, c.n_queries, q, o,
                              want.spans())
                  .ok());
  o.pool = pool;
  ForEachHwyTarget([&] {
    Outputs got = MakeOutputs(view, c.n_q_heads, c.n_queries, true);
    const Status st = c.n_queries == 1 ? AttendDecode(view, q, o, got.spans())
                                       : AttendMulti(view, c.n_queries, q, o, got.spans());
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectSameBits(got, want);
  });
}

TEST(AttentionF32, BitExactSingleThread) {
  for (const Case& c : ExactCases()) RunExactCase(c, nullptr);
}

TEST(AttentionF32, BitExactWithPools) {
  ThreadPool two(2), three(3);
  for (const Case& c : ExactCases()) {
    RunExactCase(c, &two);
    RunExactCase(c, &three);
  }
}

TEST(AttentionF32, ProbabilitiesSumToOneAndMatchOutput) {
  ViewSpec s;
  s.num_tokens = 50;
  auto tv = TestView::Make(s);
  ASSERT_TRUE(tv.ok());
  const LayerKvView& view = (*tv)->view();
  const auto q = RandomVector(4 * view.head_dim, 3);
  AttentionOptions o;
  o.n_q_heads = 4;
  Outputs got = MakeOutputs(view, 4, 1, true);
  ASSERT_TRUE(AttendDecode(view, q, o, got.spans()).ok());
  for (uint32_t j = 0; j < 4; ++j) {
    double sum = 0;
    for (uint32_t r = 0; r < view.num_tokens; ++r) sum += got.probs[j * view.num_tokens + r];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  for (uint32_t h = 0; h < 2; ++h) {
    double sum = 0;
    for (uint32_t r = 0; r < view.num_tokens; ++r) sum += got.kv_probs[h * view.num_tokens + r];
    EXPECT_NEAR(sum, 2.0, 1e-5);  // two q heads per kv head
  }
}

// Lossy formats: the kernel against the reference over decoded rows.
struct Tolerance {
  double out;  // max |diff| / max|out|
  double lse;
};

// The integer K paths round each prepared query q' (the query times the key
// column scales) once per call (docs/attention.md, "Integer K paths"):
//  * q8, q8_0 and q4_0 keys (default): to int16 steps of max|q'| / 32767,
//    so a score moves by at most delta = scale * max|q'| / 65534 * sum_i |k'_i|;
//  * q8_0 and q4_0 keys with int8_query_keys (x86 SIMD targets; the int16
//    path elsewhere, whose bound is smaller): to int8 steps
//    qs_b = max_{i in b}|q'_i| / 127 per 32-value block b, so a score moves
//    by at most delta = scale * sum_b qs_b / 2 * sum_{i in b} |k'_i|,
// k' the stored values (k - mean) / col_scale. Returns the largest delta
// over the case's queries and rows (0 for other formats).
//  * turbo4i, turbo3i and turbo2i keys (x86 SIMD targets): to int8 steps
//    qs = max|q'| / 127 of the whole rotated query q' (turbo4i: int16 steps
//    where head_dim is not a multiple of the int8 path's chunk, whose bound
//    is smaller; turbo3i/2i: the float path there), so a score moves by at
//    most delta = scale * qs / 2 * sum_i |k'_i|, k' the stored values
//    (rotated k - mean).
double TurboIntScoreBound(const TestView& tv, std::span<const float> q, uint32_t n_q_heads,
                         uint32_t n_queries) {
  const LayerKvView& view = tv.view();
  const uint32_t d = view.head_dim, group = n_q_heads / view.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto heads = tv.reference_heads();
  double delta = 0;
  std::vector<float> x(d);
  for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
    const RowTransform* t = view.k.transforms ? &view.k.transforms[h] : nullptr;
    double k_l1 = 0;
    for (size_t r = 0; r < heads[h].keys.size() / d; ++r) {
      for (uint32_t i = 0; i < d; ++i) {
        x[i] = heads[h].keys[r * d + i] - (t && !t->mean.empty() ? t->mean[i] : 0.0f);
      }
      view.k.codec->Rotate(x.data());
      double sum = 0;
      for (float v : x) sum += std::fabs(double{v});
      k_l1 = std::max(k_l1, sum);
    }
    for (uint32_t t_i = 0; t_i < n_queries; ++t_i) {
      for (uint32_t g = 0; g < group; ++g) {
        const float* qv = q.data() + (static_cast<size_t>(t_i) * n_q_heads + h * group + g) * d;
        x.assign(qv, qv + d);
        view.k.codec->Rotate(x.data());
        double qmax = 0;
        for (float v : x) qmax = std::max(qmax, std::fabs(double{v}));
        // 1e-6 relative: the rotation's own float rounding of q' and k'.
        delta = std::max(delta, scale * qmax / 254.0 * k_l1 * (1 + 1e-6));
      }
    }
  }
  return delta;
}

double IntKeyScoreBound(const TestView& tv, std::span<const float> q, uint32_t n_q_heads,
                        uint32_t n_queries, bool int8) {
  const LayerKvView& view = tv.view();
  const Format kf = view.k.format;
  const bool ggml = kf == Format::kQ8_0 || kf == Format::kQ4_0;
  if (kf == Format::kTurbo4I || kf == Format::kTurbo3I || kf == Format::kTurbo2I) {
    return TurboIntScoreBound(tv, q, n_q_heads, n_queries);
  }
  if (kf != Format::kQ8 && !ggml) return 0.0;
  const uint32_t d = view.head_dim, group = n_q_heads / view.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto heads = tv.reference_heads();
  double delta = 0;
  for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
    const RowTransform* t = view.k.transforms ? &view.k.transforms[h] : nullptr;
    auto col = [&](uint32_t i) { return t && !t->col_scale.empty() ? t->col_scale[i] : 1.0f; };
    auto mean = [&](uint32_t i) { return t && !t->mean.empty() ? t->mean[i] : 0.0f; };
    const size_t rows = heads[h].keys.size() / d;
    std::vector<double> kabs(rows * d);
    double k_l1 = 0;
    for (size_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (uint32_t i = 0; i < d; ++i) {
        kabs[r * d + i] = std::fabs((heads[h].keys[r * d + i] - mean(i)) / col(i));
        sum += kabs[r * d + i];
      }
      k_l1 = std::max(k_l1, sum);
    }
    for (uint32_t t_i = 0; t_i < n_queries; ++t_i) {
      for (uint32_t g = 0; g < group; ++g) {
        const float* qv = q.data() + (static_cast<size_t>(t_i) * n_q_heads + h * group + g) * d;
        std::vector<double> qp(d);
        double qmax = 0;
        for (uint32_t i = 0; i < d; ++i) {
          qp[i] = std::fabs(double{qv[i]} * col(i));
          qmax = std::max(qmax, qp[i]);
        }
        const double d16 = scale * qmax / 65534.0 * k_l1;
        if (!ggml || !int8) {
          delta = std::max(delta, d16);
          continue;
        }
        std::vector<double> qs(d / 32, 0.0);
        for (uint32_t i = 0; i < d; ++i) qs[i / 32] = std::max(qs[i / 32], qp[i] / 127.0);
        for (size_t r = 0; r < rows; ++r) {
          double bound = 0;
          for (uint32_t i = 0; i < d; ++i) bound += qs[i / 32] / 2 * kabs[r * d + i];
          delta = std::max(delta, std::max(d16, scale * bound));
        }
      }
    }
  }
  return delta;
}

void RunLossyCase(FormatPair fp, const ViewSpec& base, uint32_t n_q_heads, uint32_t n_queries,
                  ThreadPool* pool, bool calibrate, uint32_t window = 0, uint32_t n_sink = 0,
                  int key_path = 0 /* 0: default, 1: float_query_keys, 2: int8_query_keys */) {
  ViewSpec s = base;
  s.formats = fp;
  s.calibrate = calibrate;
  s.key_mean = calibrate;
  auto tv = TestView::Make(s);
  ASSERT_TRUE(tv.ok()) << FormatPairName(fp) << ": " << tv.status().ToString();
  const LayerKvView& view = (*tv)->view();
  const auto q = RandomVector(size_t{n_queries} * n_q_heads * view.head_dim, 11);
  AttentionOptions o;
  o.n_q_heads = n_q_heads;
  o.window = window;
  o.n_sink = n_sink;
  o.float_query_keys = key_path == 1;
  o.int8_query_keys = key_path == 2;
  Outputs want = MakeOutputs(view, n_q_heads, n_queries, true);
  ASSERT_TRUE(AttendReference((*tv)->reference_heads(), view.head_dim, view.num_tokens,
                              n_queries, q, o, want.spans())
                  .ok());
  o.pool = pool;
  double out_scale = 0;
  for (float x : want.out) out_scale = std::max(out_scale, std::fabs(static_cast<double>(x)));
  // Scores within delta: probabilities within a factor e^(+-2 delta), so
  // |dp| <= (e^(2 delta) - 1) p, |d out| <= (e^(2 delta) - 1) max|v|,
  // |d lse| <= delta.
  const double delta =
      key_path == 1 ? 0.0 : IntKeyScoreBound(**tv, q, n_q_heads, n_queries, key_path == 2);
  const double pf = std::expm1(2.0 * delta);
  double v_max = 0;
  for (const ReferenceHead& rh : (*tv)->reference_heads()) {
    for (float x : rh.values) v_max = std::max(v_max, std::fabs(static_cast<double>(x)));
  }
  ForEachHwyTarget([&] {
    Outputs got = MakeOutputs(view, n_q_heads, n_queries, true);
    const Status st = AttendMulti(view, n_queries, q, o, got.spans());
    ASSERT_TRUE(st.ok()) << st.ToString();
    double max_out = 0, max_lse = 0, max_p = 0;
    for (size_t i = 0; i < want.out.size(); ++i) {
      max_out = std::max(max_out, std::fabs(static_cast<double>(got.out[i]) - want.out[i]));
    }
    for (size_t i = 0; i < want.lse.size(); ++i) {
      max_lse = std::max(max_lse, std::fabs(static_cast<double>(got.lse[i]) - want.lse[i]));
    }
    for (size_t i = 0; i < want.probs.size(); ++i) {
      max_p = std::max(max_p, std::fabs(static_cast<double>(got.probs[i]) - want.probs[i]));
    }
    // Float rounding (the rows are the same), plus the int8-key query
    // rounding bound: documented in docs/attention.md.
    EXPECT_LE(max_out, 2e-5 * std::max(1.0, out_scale) + pf * v_max) << FormatPairName(fp);
    EXPECT_LE(max_lse, 2e-5 + delta) << FormatPairName(fp);
    EXPECT_LE(max_p, 2e-6 + pf) << FormatPairName(fp);
  });
}

TEST(AttentionErrors, NonFiniteQueryIsAClearError) {
  // A NaN or infinite query value would make its head's scores unorderable
  // (and the int8-key path would round it to an integer): every call names
  // it and writes nothing.
  for (Format k : {Format::kF32, Format::kQ8, Format::kQ8_0, Format::kBF16}) {
    ViewSpec s;
    s.n_kv_heads = 2;
    s.head_dim = 64;
    s.num_tokens = 40;
    s.formats = {k, Format::kF32};
    auto tv = TestView::Make(s);
    ASSERT_TRUE(tv.ok()) << tv.status().ToString();
    const LayerKvView& view = (*tv)->view();
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      auto q = RandomVector(2 * 4 * 64, 3);  // two tokens (or sequences) x 4 q heads
      const size_t at = 64 * 4 + 2 * 64 + 5;  // token 1, q head 2, dim 5
      q[at] = bad;
      AttentionOptions o;
      o.n_q_heads = 4;
      std::vector<float> out(q.size(), 7.0f), lse(8, 7.0f);
      AttentionOutput ao;
      ao.out = out;
      ao.lse = lse;
      auto expect_error = [&](const Status& st, const char* call) {
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << call << ": " << st.ToString();
        EXPECT_NE(st.message().find("query value"), std::string::npos)
            << call << ": " << st.message();
        for (float x : out) ASSERT_EQ(x, 7.0f) << call << " wrote output";
        for (float x : lse) ASSERT_EQ(x, 7.0f) << call << " wrote lse";
      };
      const Status multi = AttendMulti(view, 2, q, o, ao);
      expect_error(multi, "AttendMulti");
      EXPECT_NE(multi.message().find("query token 1, q head 2, dim 5"), std::string::npos)
          << multi.message();
      AttentionOutput ao1;
      ao1.out = std::span<float>(out).first(4 * 64);
      expect_error(AttendDecode(view, std::span<const float>(q).subspan(4 * 64), o, ao1),
                   "AttendDecode");
      const LayerKvView views[2] = {view, view};
      expect_error(AttendDecodeBatch(views, q, o, out, lse), "AttendDecodeBatch");
      expect_error(AttendReference((*tv)->reference_heads(), view.head_dim, view.num_tokens, 2, q,
                                   o, ao),
                   "AttendReference");
    }
  }
}

// Two kv heads of head_dim 64, `tokens` positions: the small view the
// every-format sweeps below run on.
ViewSpec SmallSweepView(uint32_t tokens) {
  ViewSpec s;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.num_tokens = tokens;
  return s;
}

TEST(AttentionLossy, EveryFormatPairMatchesDecodedReference) {
  const ViewSpec s = SmallSweepView(70);
  for (Format k : kAllFormats) {
    for (Format v : kAllFormats) {
      if (k == Format::kF32 && v == Format::kF32) continue;
      RunLossyCase({k, v}, s, 8, 1, nullptr, false);
    }
  }
}

// GQA groups the kernels take as one block of 3 (SmolLM2's 9 q / 3 kv
// heads) and as 4 + 3, plus a group of 5 (4 + 1), one token and a verify
// pass of 2, every format on both sides, every target.
TEST(AttentionLossy, GroupsOfThreeFiveAndSeven) {
  const ViewSpec s = SmallSweepView(90);
  for (Format f : kAllFormats) {
    for (uint32_t group : {3u, 5u, 7u}) {
      SCOPED_TRACE(std::string(FormatName(f)) + " group " + std::to_string(group));
      RunLossyCase({f, f}, s, group * s.n_kv_heads, 1, nullptr, false);
      RunLossyCase({f, f}, s, group * s.n_kv_heads, 2, nullptr, false);
    }
  }
}

TEST(AttentionLossy, TransformsMultiTokenAndThreads) {
  ViewSpec s;
  s.n_kv_heads = 1;
  s.head_dim = 128;
  s.num_tokens = 1100;
  ThreadPool pool(2);
  for (Format f : kAllFormats) {
    RunLossyCase({f, f}, s, 4, 3, &pool, true);
  }
  // Odd head_dim (tail blocks) for the formats that take it.
  s.head_dim = 24;
  s.num_tokens = 90;
  for (Format f : {Format::kF16, Format::kBF16, Format::kFp8E4M3, Format::kQ8}) {
    RunLossyCase({f, f}, s, 2, 2, nullptr, true);
  }
}

// The V pass takes a tile of up to 16 rows at a time: tiles cut short by a
// block, a segment or the end, rows masked by a window, sinks, evicted
// positions or the causal mask of a multi-token block, uneven and tiny
// heads, one to three threads, for the scaled value formats (row scale,
// block scales, group scales).
TEST(AttentionLossy, ValuesOnMaskedAndShortTiles) {
  ThreadPool two(2), three(3);
  for (Format v : {Format::kQ8_0, Format::kQ8, Format::kQ4_0, Format::kTurbo3}) {
    ViewSpec s;
    s.n_kv_heads = 4;
    s.head_dim = 64;
    s.num_tokens = 1300;
    s.head_rows = {1300, 17, 1025, 600};
    s.block_size = 7;
    s.evict_every = 9;
    RunLossyCase({Format::kF16, v}, s, 8, 1, nullptr, false, 200, 5);
    RunLossyCase({Format::kQ8, v}, s, 8, 3, &two, true, 0, 0);
    s.block_size = 16;
    s.evict_every = 0;
    s.head_dim = 96;
    RunLossyCase({Format::kBF16, v}, s, 12, 5, &three, false, 333, 0);
    RunLossyCase({Format::kF32, v}, s, 4, 1, &two, true, 0, 0);
  }
}

// The f32-query path of the quantized keys (float_query_keys) is the
// float kernel: within float rounding of the decoded reference, no
// query-rounding allowance.
TEST(AttentionIntKeys, FloatQueryPathMatchesDecodedReference) {
  ViewSpec s;
  s.n_kv_heads = 2;
  s.head_dim = 128;
  s.num_tokens = 300;
  ThreadPool two(2);
  for (Format k : {Format::kQ8, Format::kQ8_0, Format::kQ4_0}) {
    for (Format v : {Format::kF16, Format::kQ8_0, Format::kQ4_0}) {
      RunLossyCase({k, v}, s, 8, 1, nullptr, false, 0, 0, 1);
      RunLossyCase({k, v}, s, 4, 2, &two, true, 0, 0, 1);
    }
  }
}

// int8_query_keys: within its (per 32-value block) query-rounding bound of
// the decoded reference, with transforms, windows, masked tiles, threads.
TEST(AttentionIntKeys, Int8QueryPathWithinItsBound) {
  ViewSpec s;
  s.n_kv_heads = 2;
  s.head_dim = 128;
  s.num_tokens = 300;
  ThreadPool two(2);
  for (Format k : {Format::kQ8_0, Format::kQ4_0}) {
    for (Format v : {Format::kF16, Format::kQ8_0, Format::kQ4_0}) {
      RunLossyCase({k, v}, s, 8, 1, nullptr, false, 0, 0, 2);
      RunLossyCase({k, v}, s, 4, 2, &two, true, 0, 0, 2);
      RunLossyCase({k, v}, s, 4, 3, &two, false, 100, 3, 2);
    }
  }
}

// The integer-query path under the current target against `want` (the
// reference over the query as that path rounds it): outputs, log-sum-exps
// and probabilities within float rounding; and not bit-equal to the
// f32-query path, so the integer path is the one that ran.
void ExpectIntPathNearReference(const LayerKvView& view, const std::vector<float>& q,
                                const AttentionOptions& o, uint32_t nq, const Outputs& want,
                                double out_scale) {
  Outputs got = MakeOutputs(view, nq, 1, true);
  ASSERT_TRUE(AttendDecode(view, q, o, got.spans()).ok());
  double max_out = 0, max_lse = 0, max_p = 0;
  for (size_t i = 0; i < want.out.size(); ++i) {
    max_out = std::max(max_out, std::fabs(double{got.out[i]} - want.out[i]));
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    max_lse = std::max(max_lse, std::fabs(double{got.lse[i]} - want.lse[i]));
  }
  for (size_t i = 0; i < want.probs.size(); ++i) {
    max_p = std::max(max_p, std::fabs(double{got.probs[i]} - want.probs[i]));
  }
  EXPECT_LE(max_out, 2e-5 * std::max(1.0, out_scale));
  EXPECT_LE(max_lse, 2e-5);
  EXPECT_LE(max_p, 2e-6);
  AttentionOptions of = o;
  of.float_query_keys = true;
  Outputs flt = MakeOutputs(view, nq, 1, true);
  ASSERT_TRUE(AttendDecode(view, q, of, flt.spans()).ok());
  std::string where;
  EXPECT_FALSE(BitsEqual(got.lse, flt.lse, &where)) << "the integer path did not run";
}

// The int8 K path of q8_0 and q4_0 keys equals attention with the query
// rounded as the path rounds it (per 32-value block, int8 steps of
// max|q_b| / 127, round to nearest) over the decoded rows, within float
// rounding: the path adds no error beyond its documented query rounding.
// On the targets that take it (x86 SIMD); it must also differ from the
// f32-query path there (the path ran). 1 to 4 queries per K row.
TEST(AttentionIntKeys, Int8PathEqualsReferenceWithRoundedQuery) {
  for (Format k : {Format::kQ8_0, Format::kQ4_0}) {
    for (uint32_t group : {1u, 2u, 3u, 4u}) {
      ViewSpec s;
      s.formats = {k, Format::kF16};
      s.n_kv_heads = 2;
      s.head_dim = group == 2 ? 64 : 128;
      s.num_tokens = 700;
      s.block_size = 16;
      auto tv = TestView::Make(s);
      ASSERT_TRUE(tv.ok()) << tv.status().ToString();
      const LayerKvView& view = (*tv)->view();
      const uint32_t d = view.head_dim, nq = group * view.n_kv_heads;
      auto q = RandomVector(size_t{nq} * d, 23);
      q[5] = 7.5f;  // an outlier in one block
      std::vector<float> qr(q.size());
      for (size_t b = 0; b < q.size() / 32; ++b) {
        float amax = 0;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(q[32 * b + i]));
        const float inv = 127.0f / amax, qs = amax / 127.0f;
        for (size_t i = 0; i < 32; ++i) {
          const float c = std::clamp(std::nearbyint(q[32 * b + i] * inv), -127.0f, 127.0f);
          qr[32 * b + i] = qs * c;
        }
      }
      AttentionOptions o;
      o.n_q_heads = nq;
      o.int8_query_keys = true;
      Outputs want = MakeOutputs(view, nq, 1, true);
      ASSERT_TRUE(AttendReference((*tv)->reference_heads(), d, view.num_tokens, 1, qr, o,
                                  want.spans())
                      .ok());
      double out_scale = 0;
      for (float x : want.out) out_scale = std::max(out_scale, std::fabs(double{x}));
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        // The int8 path runs on the x86 SIMD targets only (kpass-inl.h's
        // KVCACHE_ATTN_X86_SIMD); elsewhere another path runs.
        if (!HWY_ARCH_X86 || target > HWY_SSE4) continue;
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + std::string(FormatName(k)) + " group " +
                     std::to_string(group));
        ExpectIntPathNearReference(view, q, o, nq, want, out_scale);
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

// Integer-level turbo keys: the integer K path equals attention with the
// query rounded as the path rounds it (the rotated query, int8 steps of
// max|q'| / 127, round to nearest) over the decoded rows, within float
// rounding, on every x86 SIMD target; it differs from the f32-query path
// (the path ran). The levels are int8 / 128, so the integer products are
// exact. 1 to 4 queries per K row; values the same format or f16.
void CheckIntKeysEqualRoundedQuery(Format kf, uint32_t d, uint32_t group) {
  ViewSpec s;
  s.formats = {kf, group == 2 ? Format::kF16 : kf};
  s.n_kv_heads = 2;
  s.head_dim = d;
  s.num_tokens = 700;
  s.block_size = 16;
  auto tv = TestView::Make(s);
  ASSERT_TRUE(tv.ok()) << tv.status().ToString();
  const LayerKvView& view = (*tv)->view();
  const uint32_t nq = group * view.n_kv_heads;
  auto q = RandomVector(size_t{nq} * d, 29);
  q[5] = 6.5f;  // an outlier
  std::vector<float> qr(q.size());
  for (uint32_t i = 0; i < nq; ++i) {
    std::vector<float> x(q.begin() + i * d, q.begin() + (i + 1) * d);
    view.k.codec->Rotate(x.data());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float inv = 127.0f / amax, qs = amax / 127.0f;
    for (float& v : x) v = qs * std::clamp(std::nearbyint(v * inv), -127.0f, 127.0f);
    view.k.codec->InverseRotate(x.data());
    std::copy(x.begin(), x.end(), qr.begin() + i * d);
  }
  AttentionOptions o;
  o.n_q_heads = nq;
  Outputs want = MakeOutputs(view, nq, 1, true);
  ASSERT_TRUE(AttendReference((*tv)->reference_heads(), d, view.num_tokens, 1, qr, o,
                              want.spans())
                  .ok());
  double out_scale = 0;
  for (float x : want.out) out_scale = std::max(out_scale, std::fabs(double{x}));
  int ran = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!HWY_ARCH_X86 || target > HWY_SSE4) continue;
    hwy::SetSupportedTargetsForTest(target);
    ++ran;
    SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + std::string(FormatName(kf)) +
                 " d " + std::to_string(d) + " group " + std::to_string(group));
    ExpectIntPathNearReference(view, q, o, nq, want, out_scale);
  }
  hwy::SetSupportedTargetsForTest(0);
  if (HWY_ARCH_X86) {
    EXPECT_GT(ran, 0);
  }
}

TEST(AttentionIntKeys, Turbo4IEqualsReferenceWithRoundedQuery) {
  for (uint32_t d : {128u, 256u}) {
    for (uint32_t group : {1u, 2u, 3u, 4u}) CheckIntKeysEqualRoundedQuery(Format::kTurbo4I, d, group);
  }
}

// turbo3i and turbo2i: head_dim 64 (SmolLM2; 16-byte chunks), 128 (32-byte
// chunks on AVX2 and AVX3), 192 (16-byte chunks, 3 per row), 256 (64-byte
// chunks on AVX3).
TEST(AttentionIntKeys, Turbo3IAndTurbo2IEqualReferenceWithRoundedQuery) {
  for (Format kf : {Format::kTurbo3I, Format::kTurbo2I}) {
    for (uint32_t d : {64u, 128u, 192u, 256u}) {
      for (uint32_t group : {1u, 2u, 3u, 4u}) CheckIntKeysEqualRoundedQuery(kf, d, group);
    }
  }
}

// turbo3i and turbo2i keys where head_dim / 4 is not a multiple of 16 bytes
// (48, 80, 96): the float path, bit for bit the f32-query option's result,
// on every target.
TEST(AttentionIntKeys, Turbo3IAndTurbo2IFallBackToTheFloatPath) {
  for (Format kf : {Format::kTurbo3I, Format::kTurbo2I}) {
    for (uint32_t d : {48u, 80u, 96u}) {
      ViewSpec s;
      s.formats = {kf, kf};
      s.n_kv_heads = 2;
      s.head_dim = d;
      s.num_tokens = 300;
      auto tv = TestView::Make(s);
      ASSERT_TRUE(tv.ok()) << tv.status().ToString();
      const LayerKvView& view = (*tv)->view();
      const auto q = RandomVector(size_t{6} * d, 31);
      AttentionOptions o;
      o.n_q_heads = 6;
      AttentionOptions of = o;
      of.float_query_keys = true;
      ForEachHwyTarget([&] {
        SCOPED_TRACE(std::string(FormatName(kf)) + " d " + std::to_string(d));
        Outputs got = MakeOutputs(view, 6, 1, true), flt = MakeOutputs(view, 6, 1, true);
        ASSERT_TRUE(AttendDecode(view, q, o, got.spans()).ok());
        ASSERT_TRUE(AttendDecode(view, q, of, flt.spans()).ok());
        std::string where;
        EXPECT_TRUE(BitsEqual(got.out, flt.out, &where)) << where;
        EXPECT_TRUE(BitsEqual(got.lse, flt.lse, &where)) << where;
      });
    }
  }
}

// turbo4i keys within the integer paths' bound (IntKeyScoreBound) of the
// decoded reference on every target, with a key mean, windows, masked
// tiles, several query tokens and threads; head_dim 64 and 96 take the
// int16 path on AVX-512 (not a multiple of its 128-value chunk) and 96 the
// float path wherever it is not a multiple of the chunk.
TEST(AttentionIntKeys, Turbo4IWithinItsBound) {
  ThreadPool two(2);
  for (uint32_t d : {64u, 96u, 128u}) {
    ViewSpec s;
    s.n_kv_heads = 2;
    s.head_dim = d;
    s.num_tokens = 300;
    s.block_size = 16;
    for (Format v : {Format::kTurbo4I, Format::kBF16, Format::kQ8_0}) {
      RunLossyCase({Format::kTurbo4I, v}, s, 8, 1, nullptr, false);
      RunLossyCase({Format::kTurbo4I, v}, s, 4, 2, &two, true);
      RunLossyCase({Format::kTurbo4I, v}, s, 4, 3, &two, false, 100, 3);
      RunLossyCase({Format::kTurbo4I, v}, s, 8, 1, nullptr, false, 0, 0, 1);  // f32 query
    }
  }
}

// turbo3i and turbo2i keys within the integer path's bound of the decoded
// reference on every target, with a key mean, windows, masked tiles, several
// query tokens and threads; head_dim 96 takes the float path.
TEST(AttentionIntKeys, Turbo3IAndTurbo2IWithinTheirBound) {
  ThreadPool two(2);
  for (Format kf : {Format::kTurbo3I, Format::kTurbo2I}) {
    for (uint32_t d : {64u, 96u, 128u}) {
      ViewSpec s;
      s.n_kv_heads = 2;
      s.head_dim = d;
      s.num_tokens = 300;
      s.block_size = 16;
      for (Format v : {kf, Format::kBF16, Format::kTurbo4I}) {
        SCOPED_TRACE(std::string(FormatName(kf)) + ":" + std::string(FormatName(v)) + " d " +
                     std::to_string(d));
        RunLossyCase({kf, v}, s, 8, 1, nullptr, false);
        RunLossyCase({kf, v}, s, 4, 2, &two, true);
        RunLossyCase({kf, v}, s, 4, 3, &two, false, 100, 3);
        RunLossyCase({kf, v}, s, 6, 1, nullptr, false);  // groups of 3
        RunLossyCase({kf, v}, s, 8, 1, nullptr, false, 0, 0, 1);  // f32 query
      }
    }
  }
}

TEST(AttentionBatch, EqualsPerSequenceDecode) {
  ThreadPool pool(2);
  std::vector<std::unique_ptr<TestView>> tvs;
  std::vector<LayerKvView> views;
  const FormatPair pairs[] = {{Format::kF32, Format::kF32},
                              {Format::kBF16, Format::kTurbo4},
                              {Format::kQ8_0, Format::kQ4_0}};
  for (uint32_t i = 0; i < 6; ++i) {
    ViewSpec s;
    s.n_kv_heads = 2;
    s.head_dim = 64;
    s.num_tokens = 10 + 300 * i;
    s.formats = pairs[i % 3];
    s.layout = i % 2 ? Layout::kPaged : Layout::kContiguous;
    s.seed = 100 + i;
    auto tv = TestView::Make(s);
    ASSERT_TRUE(tv.ok()) << tv.status().ToString();
    views.push_back((*tv)->view());
    tvs.push_back(std::move(*tv));
  }
  const uint32_t nq = 4, d = 64;
  const auto q = RandomVector(views.size() * nq * d, 5);
  AttentionOptions o;
  o.n_q_heads = nq;
  std::vector<float> want(q.size()), want_lse(views.size() * nq);
  for (size_t s = 0; s < views.size(); ++s) {
    AttentionOutput out;
    out.out = std::span<float>(want).subspan(s * nq * d, nq * d);
    out.lse = std::span<float>(want_lse).subspan(s * nq, nq);
    ASSERT_TRUE(AttendDecode(views[s], std::span<const float>(q).subspan(s * nq * d, nq * d), o, out).ok());
  }
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    o.pool = p;
    std::vector<float> got(q.size()), got_lse(views.size() * nq);
    ASSERT_TRUE(AttendDecodeBatch(views, q, o, got, got_lse).ok());
    std::string where;
    EXPECT_TRUE(BitsEqual(got, want, &where)) << where;
    EXPECT_TRUE(BitsEqual(got_lse, want_lse, &where)) << where;
  }
}

// A view of kv head h of v alone.
LayerKvView OneHeadView(const LayerKvView& v, uint32_t h) {
  LayerKvView s = v;
  s.n_kv_heads = 1;
  if (v.head_len) s.head_len = v.head_len + h;
  if (v.positions) s.positions = v.positions + h;
  for (KvSideView* side : {&s.k, &s.v}) {
    if (side->head_base) {
      side->head_base += h;
    } else {
      side->base += static_cast<size_t>(h) * side->head_stride;
    }
    if (side->transforms) side->transforms += h;
  }
  return s;
}

// Per-head windows (plan.h AttendHeadWindows, what a hybrid layer with
// window and full heads calls): each kv head's outputs are those of that
// head attended alone with its own window, bit for bit, on any pool.
TEST(AttentionHead, PerHeadWindowsEqualEachHeadAloneWithItsWindow) {
  ViewSpec s;
  s.n_kv_heads = 3;
  s.num_tokens = 77;
  s.evict_every = 9;
  s.formats = {Format::kBF16, Format::kQ8_0};
  auto tv = TestView::Make(s);
  ASSERT_TRUE(tv.ok()) << tv.status().ToString();
  const LayerKvView& view = (*tv)->view();
  const uint32_t nq = 6, group = 2, d = view.head_dim, n = view.num_tokens, T = 3;
  const auto q = RandomVector(T * nq * d, 9);
  const std::vector<attention_internal::HeadWindow> windows = {{0, 0}, {20, 2}, {5, 0}};
  ThreadPool pool(3);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    AttentionOptions o;
    o.n_q_heads = nq;
    o.pool = p;
    Outputs full = MakeOutputs(view, nq, T, true);
    ASSERT_TRUE(attention_internal::AttendHeadWindows(view, T, q, o, windows, full.spans()).ok());
    for (uint32_t h = 0; h < 3; ++h) {
      const LayerKvView one = OneHeadView(view, h);
      AttentionOptions oh = o;
      oh.n_q_heads = group;
      oh.window = windows[h].window;
      oh.n_sink = windows[h].n_sink;
      std::vector<float> qh;
      for (uint32_t t = 0; t < T; ++t) {
        qh.insert(qh.end(), q.begin() + (t * nq + h * group) * d,
                  q.begin() + (t * nq + h * group + group) * d);
      }
      Outputs alone = MakeOutputs(one, group, T, true);
      ASSERT_TRUE(AttendMulti(one, T, qh, oh, alone.spans()).ok());
      for (uint32_t t = 0; t < T; ++t) {
        auto slice = [](const std::vector<float>& v, size_t at, size_t len) {
          return std::vector<float>(v.begin() + at, v.begin() + at + len);
        };
        const size_t at = t * nq + h * group;
        std::string where;
        EXPECT_TRUE(BitsEqual(slice(alone.out, t * group * d, group * d),
                              slice(full.out, at * d, group * d), &where))
            << where;
        EXPECT_TRUE(BitsEqual(slice(alone.lse, t * group, group), slice(full.lse, at, group),
                              &where))
            << where;
        EXPECT_TRUE(BitsEqual(slice(alone.probs, t * group * n, group * n),
                              slice(full.probs, at * n, group * n), &where))
            << where;
      }
      std::string where;
      EXPECT_TRUE(BitsEqual(alone.kv_probs,
                            std::vector<float>(full.kv_probs.begin() + h * n,
                                               full.kv_probs.begin() + (h + 1) * n),
                            &where))
          << where;
    }
  }
  // One window per kv head, each inside the cache.
  AttentionOptions o;
  o.n_q_heads = nq;
  Outputs out = MakeOutputs(view, nq, T, false);
  const std::vector<attention_internal::HeadWindow> two = {{0, 0}, {5, 0}};
  EXPECT_EQ(attention_internal::AttendHeadWindows(view, T, q, o, two, out.spans()).code(),
            StatusCode::kInvalidArgument);
  const std::vector<attention_internal::HeadWindow> wide = {{0, 0}, {n + 1, 0}, {5, 0}};
  EXPECT_EQ(attention_internal::AttendHeadWindows(view, T, q, o, wide, out.spans()).code(),
            StatusCode::kInvalidArgument);
}

// A paged view of 2- or 4-byte formats is walked a group of kv heads at a
// time (plan.h WalkHeadsGrouped); per-head buffers of the same rows are
// walked head by head. Both give the same bits: uneven and empty heads,
// evicted positions, windows and sinks, several query tokens, any pool.
TEST(AttentionGrouped, GroupedWalkEqualsHeadByHead) {
  const std::vector<uint32_t> rows = {700, 0, 300, 129, 700, 513, 1, 650};
  struct Variant {
    FormatPair formats;
    uint32_t block_size, n_queries, window, n_sink, evict_every;
  };
  const Variant variants[] = {
      {{Format::kBF16, Format::kBF16}, 16, 1, 0, 0, 0},
      {{Format::kF16, Format::kBF16}, 7, 1, 0, 0, 9},
      {{Format::kBF16, Format::kF16}, 16, 3, 0, 0, 0},
      {{Format::kF32, Format::kF32}, 32, 2, 300, 3, 5},
  };
  ThreadPool two(2), three(3);
  for (const Variant& var : variants) {
    ViewSpec s;
    s.n_kv_heads = 8;
    s.head_dim = 64;
    s.num_tokens = 700;
    s.head_rows = rows;
    s.formats = var.formats;
    s.block_size = var.block_size;
    s.evict_every = var.evict_every;
    auto paged = TestView::Make(s);
    ASSERT_TRUE(paged.ok()) << paged.status().ToString();
    ASSERT_TRUE(attention_internal::WalkHeadsGrouped((*paged)->view()));
    s.layout = Layout::kPerHead;
    auto per_head = TestView::Make(s);
    ASSERT_TRUE(per_head.ok()) << per_head.status().ToString();
    ASSERT_FALSE(attention_internal::WalkHeadsGrouped((*per_head)->view()));
    const uint32_t nq = 16;
    const auto q = RandomVector(size_t{var.n_queries} * nq * s.head_dim, 11);
    AttentionOptions o;
    o.n_q_heads = nq;
    o.window = var.window;
    o.n_sink = var.n_sink;
    auto run = [&](const LayerKvView& view, ThreadPool* pool) {
      Outputs got = MakeOutputs(view, nq, var.n_queries, true);
      o.pool = pool;
      const Status st = var.n_queries == 1 ? AttendDecode(view, q, o, got.spans())
                                           : AttendMulti(view, var.n_queries, q, o, got.spans());
      EXPECT_TRUE(st.ok()) << st.ToString();
      return got;
    };
    ForEachHwyTarget([&] {
      const Outputs want = run((*per_head)->view(), nullptr);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
        const Outputs got = run((*paged)->view(), pool);
        ExpectSameBits(got, want);
      }
    });
  }
}

// Where a head's rows sit never changes a bit: a contiguous view (one
// long run), a paged one of 1-row blocks (every row its own run) and one
// of 6-row blocks give the same outputs for every format (the integer K
// paths and, with float_query_keys, the float ones), at head_dim 64 and at
// one with a tail block, for one and several query tokens, on every target.
TEST(AttentionLayouts, EveryFormatGivesTheSameBitsInEveryLayout) {
  for (Format f : kAllFormats) {
    for (uint32_t head_dim : {64u, 24u}) {
      ViewSpec s;
      s.n_kv_heads = 2;
      s.head_dim = head_dim;
      s.num_tokens = 83;
      s.formats = {f, f};
      s.layout = Layout::kContiguous;
      auto whole = TestView::Make(s);
      if (!whole.ok()) continue;  // a format without a tail block at head_dim 24
      SCOPED_TRACE(std::string(FormatName(f)) + " head_dim " + std::to_string(head_dim));
      s.layout = Layout::kPaged;
      s.block_size = 1;
      auto single = TestView::Make(s);
      s.block_size = 6;
      auto sixes = TestView::Make(s);
      ASSERT_TRUE(single.ok() && sixes.ok());
      const uint32_t nq = 8;
      for (uint32_t tokens : {1u, 5u}) {
        const auto q = RandomVector(size_t{tokens} * nq * head_dim, 17);
        for (bool float_keys : {false, true}) {
          AttentionOptions o;
          o.n_q_heads = nq;
          o.float_query_keys = float_keys;
          auto run = [&](const LayerKvView& view) {
            Outputs got = MakeOutputs(view, nq, tokens, true);
            const Status st = tokens == 1 ? AttendDecode(view, q, o, got.spans())
                                          : AttendMulti(view, tokens, q, o, got.spans());
            EXPECT_TRUE(st.ok()) << st.ToString();
            return got;
          };
          ForEachHwyTarget([&] {
            const Outputs want = run((*single)->view());
            ExpectSameBits(run((*sixes)->view()), want);
            ExpectSameBits(run((*whole)->view()), want);
          });
        }
      }
    }
  }
}

TEST(AttentionErrors, BadInputIsAClearStatus) {
  ViewSpec s;
  auto tv = TestView::Make(s);
  ASSERT_TRUE(tv.ok());
  const LayerKvView& view = (*tv)->view();
  const uint32_t d = view.head_dim;
  std::vector<float> q(4 * d, 0.5f), out(4 * d);
  AttentionOptions o;
  o.n_q_heads = 4;
  AttentionOutput ao;
  ao.out = out;
  EXPECT_TRUE(AttendDecode(view, q, o, ao).ok());

  const std::vector<float> out_before = out;
  auto expect_invalid = [&](const Status& st, const char* what) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.ToString();
    EXPECT_FALSE(st.message().empty());
    EXPECT_EQ(out, out_before) << what << " wrote output";
  };
  std::vector<float> short_q(4 * d - 1);
  expect_invalid(AttendDecode(view, short_q, o, ao), "query size");
  AttentionOptions bad = o;
  bad.n_q_heads = 3;
  expect_invalid(AttendDecode(view, q, bad, ao), "n_q_heads not a multiple");
  bad.n_q_heads = 0;
  expect_invalid(AttendDecode(view, q, bad, ao), "n_q_heads 0");
  bad = o;
  bad.window = view.num_tokens + 1;
  expect_invalid(AttendDecode(view, q, bad, ao), "window > cache");
  bad = o;
  bad.scale = std::nanf("");
  expect_invalid(AttendDecode(view, q, bad, ao), "nan scale");
  LayerKvView empty = view;
  empty.num_tokens = 0;
  expect_invalid(AttendDecode(empty, q, o, ao), "empty view");
  LayerKvView released = view;
  released.k.base = nullptr;
  expect_invalid(AttendDecode(released, q, o, ao), "null storage");
  LayerKvView wrong_rows = view;
  wrong_rows.k.row_bytes += 1;
  expect_invalid(AttendDecode(wrong_rows, q, o, ao), "row bytes");
  std::vector<float> small_probs(3);
  AttentionOutput ap = ao;
  ap.probs = small_probs;
  expect_invalid(AttendDecode(view, q, o, ap), "probs size");
  expect_invalid(AttendMulti(view, view.num_tokens + 1, q, o, ao), "too many queries");
  std::vector<LayerKvView> none;
  EXPECT_EQ(AttendDecodeBatch(none, q, o, out).code(), StatusCode::kInvalidArgument);
}

TEST(ThreadPool, RunsEveryTaskOnceAndNests) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3u);
  for (uint32_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](uint32_t t, uint32_t thread) {
      EXPECT_LT(thread, 3u);
      hits[t].fetch_add(1);
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  std::atomic<int> inner{0};
  pool.ParallelFor(4, [&](uint32_t, uint32_t) {
    pool.ParallelFor(5, [&](uint32_t, uint32_t) { inner.fetch_add(1); });
  });
  EXPECT_EQ(inner.load(), 20);
  ThreadPool single(0);
  EXPECT_EQ(single.num_threads(), 1u);
}

}  // namespace
}  // namespace kvcache
