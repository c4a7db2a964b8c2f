// AttendDecodeHead, one kv head's query group: against the multi-head call
// (bit for bit in f32, the slice of the same head), against a plain f32
// reference over the head's own stored rows, over dead heads, evicted
// positions and a precision window, with importance fed back per stored
// position; and its errors, which write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

constexpr uint32_t kHeads = 3, kGroup = 2, kQHeads = kHeads * kGroup;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A one-layer cache of `tokens` positions (paged or contiguous), appended in
// chunks, head 1 dead at every third position when `dead`.
struct Fixture {
  Geometry geometry;
  std::shared_ptr<BlockPool> pool;
  SequenceCache seq;
};

Result<Fixture> MakeCache(FormatPair formats, CacheLayout layout, uint32_t tokens, bool dead,
                          uint32_t head_dim = 64, PrecisionWindow window = {}) {
  KV_ASSIGN_OR_RETURN(Geometry g, Geometry::Create({.n_layers = 1, .n_kv_heads = kHeads,
                                                    .head_dim = head_dim, .block_size = 16}));
  std::shared_ptr<BlockPool> pool;
  Result<SequenceCache> seq = Status::Internal("unset");
  if (layout == CacheLayout::kPaged) {
    KV_ASSIGN_OR_RETURN(pool, BlockPool::Create(g, formats, {.num_blocks = 64}));
    seq = SequenceCache::CreatePaged(pool, {.window = window});
  } else {
    seq = SequenceCache::CreateContiguous(g, formats, {.window = window});
  }
  if (!seq.ok()) return seq.status();
  const size_t row = size_t{kHeads} * head_dim;
  for (uint32_t t = 0; t < tokens;) {
    const uint32_t n = std::min<uint32_t>(5, tokens - t);
    const std::vector<float> k = Random(n * row, 100 + t), v = Random(n * row, 200 + t);
    AppendOptions options;
    std::vector<uint8_t> alive = {1, static_cast<uint8_t>(dead && t % 3 == 0 ? 0 : 1), 1};
    if (dead) options.alive = alive;
    KV_RETURN_IF_ERROR(seq->Append(k, v, options));
    t += n;
  }
  return Fixture{g, std::move(pool), std::move(*seq)};
}

struct HeadOut {
  std::vector<float> out, lse, probs, kv_probs;
};

// AttendDecodeHead with buffers sized to the head's rows (compact) or to
// num_tokens (padded).
Result<HeadOut> AttendHead(const LayerKvView& view, uint32_t h, std::span<const float> q,
                           const AttentionOptions& options, bool padded) {
  const uint32_t d = view.head_dim, n = padded ? view.num_tokens : view.rows(h);
  HeadOut o{std::vector<float>(kGroup * d), std::vector<float>(kGroup),
            std::vector<float>(kGroup * n), std::vector<float>(n)};
  KV_RETURN_IF_ERROR(AttendDecodeHead(view, h, q.subspan(size_t{h} * kGroup * d, kGroup * d),
                                      options, {o.out, o.lse, o.probs, o.kv_probs}));
  return o;
}

TEST(AttendDecodeHead, F32IsTheMultiHeadSliceBitForBit) {
  ThreadPool threads(2);
  for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
    for (bool dead : {false, true}) {
      for (uint32_t tokens : {1u, 37u, 600u}) {
        auto c = MakeCache({Format::kF32, Format::kF32}, layout, tokens, dead);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        auto view = c->seq.View(0);
        ASSERT_TRUE(view.ok());
        const uint32_t d = view->head_dim, n = view->num_tokens;
        const std::vector<float> q = Random(kQHeads * d, 7 + tokens);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &threads}) {
          const AttentionOptions options{.n_q_heads = kQHeads, .pool = pool};
          std::vector<float> out(kQHeads * d), lse(kQHeads), probs(kQHeads * n),
              kv_probs(kHeads * n);
          ASSERT_TRUE(AttendDecode(*view, q, options, {out, lse, probs, kv_probs}).ok());
          for (uint32_t h = 0; h < kHeads; ++h) {
            const std::string where = "layout " + std::to_string(int(layout)) + " dead " +
                                      std::to_string(dead) + " tokens " +
                                      std::to_string(tokens) + " head " + std::to_string(h);
            const uint32_t rows = view->rows(h);
            auto padded = AttendHead(*view, h, q, options, true);
            auto compact = AttendHead(*view, h, q, options, false);
            ASSERT_TRUE(padded.ok() && compact.ok()) << where;
            const size_t qo = size_t{h} * kGroup;
            EXPECT_TRUE(SameBits(padded->out, std::span(out).subspan(qo * d, kGroup * d))) << where;
            EXPECT_TRUE(SameBits(padded->lse, std::span(lse).subspan(qo, kGroup))) << where;
            EXPECT_TRUE(SameBits(padded->probs, std::span(probs).subspan(qo * n, kGroup * n)))
                << where;
            EXPECT_TRUE(SameBits(padded->kv_probs, std::span(kv_probs).subspan(size_t{h} * n, n)))
                << where;
            EXPECT_TRUE(SameBits(compact->out, padded->out)) << where;
            EXPECT_TRUE(SameBits(compact->lse, padded->lse)) << where;
            for (uint32_t g = 0; g < kGroup; ++g) {
              EXPECT_TRUE(SameBits(std::span(compact->probs).subspan(size_t{g} * rows, rows),
                                   std::span(padded->probs).subspan(size_t{g} * n, rows)))
                  << where;
            }
            EXPECT_TRUE(SameBits(compact->kv_probs, std::span(padded->kv_probs).first(rows)))
                << where;
          }
        }
      }
    }
  }
}

// A plain reference written here: softmax over the head's stored rows (all
// visible to the last position), in double.
TEST(AttendDecodeHead, MatchesPlainAttentionOverTheHeadsRows) {
  auto c = MakeCache({Format::kF32, Format::kF32}, CacheLayout::kPaged, 123, true);
  ASSERT_TRUE(c.ok());
  auto view = c->seq.View(0);
  ASSERT_TRUE(view.ok());
  const uint32_t d = view->head_dim;
  const std::vector<float> q = Random(kQHeads * d, 99);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (uint32_t h = 0; h < kHeads; ++h) {
    auto got = AttendHead(*view, h, q, {.n_q_heads = kQHeads}, false);
    ASSERT_TRUE(got.ok());
    auto keys = c->seq.HeadKeys(0, h), values = c->seq.HeadValues(0, h);
    ASSERT_TRUE(keys.ok() && values.ok());
    const uint32_t rows = c->seq.head_len(0, h);
    ASSERT_EQ(got->kv_probs.size(), rows);
    if (h == 1) {
      EXPECT_LT(rows, view->num_tokens) << "head 1 is dead at some positions";
    }
    std::vector<double> kv(rows, 0.0);
    for (uint32_t g = 0; g < kGroup; ++g) {
      const float* qg = q.data() + (size_t{h} * kGroup + g) * d;
      std::vector<double> s(rows);
      double m = -INFINITY;
      for (uint32_t r = 0; r < rows; ++r) {
        double dot = 0;
        for (uint32_t i = 0; i < d; ++i) dot += double{qg[i]} * (*keys)[size_t{r} * d + i];
        s[r] = dot * scale;
        m = std::max(m, s[r]);
      }
      double l = 0;
      for (double& e : s) l += (e = std::exp(e - m));
      for (uint32_t i = 0; i < d; ++i) {
        double o = 0;
        for (uint32_t r = 0; r < rows; ++r) o += s[r] / l * (*values)[size_t{r} * d + i];
        EXPECT_NEAR(got->out[g * d + i], o, 1e-5) << "head " << h << " q " << g << " dim " << i;
      }
      EXPECT_NEAR(got->lse[g], m + std::log(l), 1e-5);
      for (uint32_t r = 0; r < rows; ++r) {
        EXPECT_NEAR(got->probs[size_t{g} * rows + r], s[r] / l, 1e-6);
        kv[r] += s[r] / l;
      }
    }
    for (uint32_t r = 0; r < rows; ++r) EXPECT_NEAR(got->kv_probs[r], kv[r], 1e-6);
  }
}

// Every format and both layouts: the head's results are the multi-head
// call's slice (the same kernels over the same rows), close for lossy
// formats, and q8 keys stay close to the f32 answer.
TEST(AttendDecodeHead, EveryFormatMatchesTheMultiHeadSlice) {
  const uint32_t d = 64;
  for (Format f : kAllFormats) {
    for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
      const FormatPair formats{f, f};
      auto c = MakeCache(formats, layout, 70, false, d);
      ASSERT_TRUE(c.ok()) << FormatName(f) << ": " << c.status().ToString();
      auto view = c->seq.View(0);
      ASSERT_TRUE(view.ok());
      const uint32_t n = view->num_tokens;
      const std::vector<float> q = Random(kQHeads * d, 5);
      const AttentionOptions options{.n_q_heads = kQHeads};
      std::vector<float> out(kQHeads * d), probs(kQHeads * n);
      ASSERT_TRUE(AttendDecode(*view, q, options, {.out = out, .lse = {}, .probs = probs, .kv_probs = {}}).ok());
      for (uint32_t h = 0; h < kHeads; ++h) {
        auto got = AttendHead(*view, h, q, options, true);
        ASSERT_TRUE(got.ok()) << FormatName(f) << ": " << got.status().ToString();
        for (size_t i = 0; i < got->out.size(); ++i) {
          EXPECT_NEAR(got->out[i], out[h * kGroup * d + i], 1e-5)
              << FormatName(f) << " head " << h << " index " << i;
        }
        for (size_t i = 0; i < got->probs.size(); ++i) {
          EXPECT_NEAR(got->probs[i], probs[h * kGroup * n + i], 1e-6)
              << FormatName(f) << " head " << h << " index " << i;
        }
      }
    }
  }
  // q8 K/V against the f32 cache of the same rows.
  auto exact = MakeCache({Format::kF32, Format::kF32}, CacheLayout::kPaged, 70, false, d);
  auto q8 = MakeCache({Format::kQ8, Format::kQ8}, CacheLayout::kPaged, 70, false, d);
  ASSERT_TRUE(exact.ok() && q8.ok());
  auto ev = exact->seq.View(0), qv = q8->seq.View(0);
  ASSERT_TRUE(ev.ok() && qv.ok());
  const std::vector<float> q = Random(kQHeads * d, 11);
  for (uint32_t h = 0; h < kHeads; ++h) {
    auto a = AttendHead(*ev, h, q, {.n_q_heads = kQHeads}, false);
    auto b = AttendHead(*qv, h, q, {.n_q_heads = kQHeads}, false);
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t i = 0; i < a->out.size(); ++i) EXPECT_NEAR(a->out[i], b->out[i], 0.03) << i;
  }
}

// Evicted positions: after KeepRows the head's probabilities follow
// HeadPositions, and AccumulateImportance takes kv_probs as they come.
TEST(AttendDecodeHead, EvictedRowsInHeadPositionsOrderFeedImportance) {
  auto c = MakeCache({Format::kF32, Format::kF32}, CacheLayout::kPaged, 50, false);
  ASSERT_TRUE(c.ok());
  const std::vector<uint32_t> keep = {0, 3, 4, 10, 31, 49};
  ASSERT_TRUE(c->seq.KeepRows(0, 2, keep).ok());
  auto view = c->seq.View(0);
  ASSERT_TRUE(view.ok());
  const uint32_t d = view->head_dim;
  ASSERT_EQ(c->seq.HeadPositions(0, 2), keep);
  const std::vector<float> q = Random(kQHeads * d, 3);
  auto got = AttendHead(*view, 2, q, {.n_q_heads = kQHeads}, false);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->kv_probs.size(), keep.size());
  // The same as attending the kept rows alone (the head's keys and values,
  // in that order) with the multi-head call's head 2 slice.
  std::vector<float> out(kQHeads * d), probs(kQHeads * view->num_tokens);
  ASSERT_TRUE(AttendDecode(*view, q, {.n_q_heads = kQHeads}, {.out = out, .lse = {}, .probs = probs, .kv_probs = {}}).ok());
  for (uint32_t g = 0; g < kGroup; ++g) {
    for (uint32_t r = 0; r < keep.size(); ++r) {
      EXPECT_EQ(got->probs[g * keep.size() + r],
                probs[(size_t{2} * kGroup + g) * view->num_tokens + r]);
    }
  }
  double total = 0;
  for (float p : got->kv_probs) total += p;
  EXPECT_NEAR(total, kGroup, 1e-5);  // each query's probabilities sum to 1
  ASSERT_TRUE(c->seq.AccumulateImportance(0, 2, got->kv_probs).ok());
  const std::vector<float> importance = c->seq.HeadImportance(0, 2);
  ASSERT_EQ(importance.size(), keep.size());
  for (size_t r = 0; r < keep.size(); ++r) EXPECT_EQ(importance[r], got->kv_probs[r]);
}

TEST(AttendDecodeHead, PrecisionWindowViewIsTheMultiHeadSlice) {
  for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
    auto c = MakeCache({Format::kTurbo4, Format::kTurbo4}, layout, 90, false, 64,
                       {.sinks = 4, .recent = 16});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto view = c->seq.View(0);
    ASSERT_TRUE(view.ok());
    ASSERT_NE(view->hot, nullptr);
    const uint32_t d = view->head_dim, n = view->num_tokens;
    const std::vector<float> q = Random(kQHeads * d, 17);
    std::vector<float> out(kQHeads * d), probs(kQHeads * n);
    ASSERT_TRUE(AttendDecode(*view, q, {.n_q_heads = kQHeads}, {.out = out, .lse = {}, .probs = probs, .kv_probs = {}}).ok());
    for (uint32_t h = 0; h < kHeads; ++h) {
      auto got = AttendHead(*view, h, q, {.n_q_heads = kQHeads}, true);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(SameBits(got->out, std::span(out).subspan(size_t{h} * kGroup * d, kGroup * d)));
      EXPECT_TRUE(
          SameBits(got->probs, std::span(probs).subspan(size_t{h} * kGroup * n, kGroup * n)));
    }
  }
}

// Errors: a clear code, and no output written.
TEST(AttendDecodeHead, BadInputIsAnErrorThatWritesNothing) {
  auto c = MakeCache({Format::kF32, Format::kF32}, CacheLayout::kPaged, 20, false);
  ASSERT_TRUE(c.ok());
  auto view = c->seq.View(0);
  ASSERT_TRUE(view.ok());
  const uint32_t d = view->head_dim, n = view->num_tokens;
  const std::vector<float> q = Random(kGroup * d, 1);
  const AttentionOptions options{.n_q_heads = kQHeads};
  const float sentinel = -12345.0f;
  std::vector<float> out(kGroup * d, sentinel), lse(kGroup, sentinel), probs(kGroup * n, sentinel),
      kv_probs(n, sentinel);
  const AttentionOutput output{out, lse, probs, kv_probs};
  auto untouched = [&] {
    for (const auto* v : {&out, &lse, &probs, &kv_probs}) {
      for (float x : *v) {
        if (x != sentinel) return false;
      }
    }
    return true;
  };
  Status s = AttendDecodeHead(*view, kHeads, q, options, output);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_TRUE(untouched());
  s = AttendDecodeHead(*view, 1, std::span(q).first(kGroup * d - 1), options, output);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  std::vector<float> nan_q = q;
  nan_q[5] = std::nanf("");
  s = AttendDecodeHead(*view, 1, nan_q, options, output);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  LayerKvView empty = *view;
  empty.num_tokens = 0;
  s = AttendDecodeHead(empty, 0, q, options, output);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  s = AttendDecodeHead(*view, 0, q, {.n_q_heads = kQHeads + 1}, output);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  std::vector<float> short_probs(kGroup * n - 1, sentinel);
  s = AttendDecodeHead(*view, 0, q, options, {out, lse, short_probs, kv_probs});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  EXPECT_EQ(short_probs, std::vector<float>(kGroup * n - 1, sentinel));
  std::vector<float> short_out(kGroup * d - 1, sentinel);
  s = AttendDecodeHead(*view, 0, q, options, {short_out, lse, probs, kv_probs});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(untouched());
  EXPECT_EQ(short_out, std::vector<float>(kGroup * d - 1, sentinel));
  // And the same buffers work once the input is right.
  EXPECT_TRUE(AttendDecodeHead(*view, 0, q, options, output).ok());
  EXPECT_FALSE(untouched());
}

}  // namespace
}  // namespace kvcache
