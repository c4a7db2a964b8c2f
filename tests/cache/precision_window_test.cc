// The precision window (cache.h, PrecisionWindow) against two simple
// references, after every step of a sequence of appends, decodes,
// truncations, forks, clones, clears and prefix adoptions, in both layouts:
//   - which positions it holds: a set of positions moved by the documented
//     rules (WindowModel), independent of the ring the cache keeps;
//   - the rows: a held position reads back as the bf16 rounding of its
//     input, every other one exactly as a cache without the window (a twin
//     fed the same steps) decodes it;
//   - attention: AttendMulti / AttendDecode / AttendDecodeBatch through the
//     windowed view equal AttendReference over those effective rows within
//     float rounding, on every SIMD target, with and without threads
//     (outputs, lse, per-row probabilities, kv-head probabilities).
// Then bad input: float formats, oversized windows, dead heads and KeepRows
// are refused and change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/codec.h"
#include "kvcache/thread_pool.h"
#include "hwy_targets.h"

namespace kvcache {
namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 64, kQHeads = 4;

Geometry Geo(uint32_t block) {
  auto g = Geometry::Create({kLayers, kHeads, kDim, block});
  EXPECT_TRUE(g.ok());
  return *g;
}

// Which positions the window holds, by the rules of cache.h: sinks held
// while appended in order, the last recent + slack appended positions kept,
// the last `recent` positions of the sequence among those attended.
class WindowModel {
 public:
  explicit WindowModel(PrecisionWindow w) : w_(w) {}
  void Append(uint32_t n0, uint32_t T) {
    const uint32_t n1 = n0 + T, ring = w_.recent + w_.slack;
    for (uint32_t p = n0; p < n1; ++p) {
      if (p < w_.sinks) {
        if (sinks_ == p) sinks_ = p + 1;
      } else if (ring > 0) {
        kept_.insert(p);
      }
    }
    for (auto it = kept_.begin(); it != kept_.end();) {
      it = n1 > *it + ring ? kept_.erase(it) : std::next(it);
    }
    n_ = n1;
  }
  void Truncate(uint32_t n) {
    kept_.erase(kept_.lower_bound(n), kept_.end());
    sinks_ = std::min(sinks_, n);
    n_ = n;
  }
  void Reset(uint32_t n) {
    kept_.clear();
    sinks_ = 0;
    n_ = n;
  }
  // Read from the window by a query at position q (default: the last).
  bool held(uint32_t p, uint32_t q) const {
    return p < sinks_ || (kept_.count(p) > 0 && p + w_.recent > q);
  }
  bool held(uint32_t p) const { return held(p, n_ - 1); }
  size_t size() const {
    size_t k = 0;
    for (uint32_t p = 0; p < n_; ++p) k += held(p);
    return k;
  }

 private:
  PrecisionWindow w_;
  uint32_t sinks_ = 0, n_ = 0;
  std::set<uint32_t> kept_;
};

// A cache with the window, its twin without, the model and every input row.
struct Subject {
  SequenceCache cache, twin;
  WindowModel model;
  std::vector<float> k, v;  // [n][n_layers][n_kv_heads][head_dim] as appended, per position
};

float Bf16(float x) {
  static const RowCodec codec = *RowCodec::Create(Format::kBF16, 1, Side::kKey);
  uint8_t b[2];
  EXPECT_TRUE(codec.Encode({&x, 1}, b).ok());
  float y = 0;
  EXPECT_TRUE(codec.Decode(b, {&y, 1}).ok());
  return y;
}

// T tokens of input [n_layers][T][H][D] (the cache's Append layout), with
// per-channel offsets so that calibrated formats fit a mean.
void MakeTokens(std::mt19937& rng, uint32_t T, std::vector<float>* k, std::vector<float>* v) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  k->resize(size_t{kLayers} * T * kHeads * kDim);
  v->resize(k->size());
  for (size_t i = 0; i < k->size(); ++i) {
    (*k)[i] = nd(rng) + 0.5f * static_cast<float>(i % kDim % 7);
    (*v)[i] = nd(rng);
  }
}

size_t At(uint32_t p, uint32_t l, uint32_t h) {
  return ((size_t{p} * kLayers + l) * kHeads + h) * kDim;
}

void Append(Subject& s, std::mt19937& rng, uint32_t T) {
  std::vector<float> k, v;
  MakeTokens(rng, T, &k, &v);
  const uint32_t n0 = s.cache.num_tokens();
  ASSERT_TRUE(s.cache.Append(k, v).ok());
  ASSERT_TRUE(s.twin.Append(k, v).ok());
  s.model.Append(n0, T);
  s.k.resize(At(n0 + T, 0, 0));
  s.v.resize(s.k.size());
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t h = 0; h < kHeads; ++h)
        for (uint32_t i = 0; i < kDim; ++i) {
          const size_t src = ((size_t{l} * T + t) * kHeads + h) * kDim + i;
          s.k[At(n0 + t, l, h) + i] = k[src];
          s.v[At(n0 + t, l, h) + i] = v[src];
        }
}

void Truncate(Subject& s, uint32_t n) {
  ASSERT_TRUE(s.cache.Truncate(n).ok());
  ASSERT_TRUE(s.twin.Truncate(n).ok());
  s.model.Truncate(n);
  s.k.resize(At(n, 0, 0));
  s.v.resize(s.k.size());
}

// The rows a query at position q must see for (layer, head, side):
// [q + 1][D] (default: the last position's, all [n][D]).
std::vector<float> Effective(const Subject& s, uint32_t l, uint32_t h, int side,
                             uint32_t q = UINT32_MAX) {
  if (q == UINT32_MAX) q = s.cache.num_tokens() - 1;
  auto cold = side == 0 ? s.twin.HeadKeys(l, h) : s.twin.HeadValues(l, h);
  EXPECT_TRUE(cold.ok());
  std::vector<float> rows(cold->begin(), cold->begin() + size_t{q + 1} * kDim);
  const std::vector<float>& in = side == 0 ? s.k : s.v;
  for (uint32_t p = 0; p <= q; ++p) {
    if (!s.model.held(p, q)) continue;
    for (uint32_t i = 0; i < kDim; ++i) rows[size_t{p} * kDim + i] = Bf16(in[At(p, l, h) + i]);
  }
  return rows;
}

void CheckRows(const Subject& s) {
  ASSERT_TRUE(s.cache.CheckInvariants().ok()) << s.cache.CheckInvariants().ToString();
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      for (int side = 0; side < 2; ++side) {
        auto got = side == 0 ? s.cache.HeadKeys(l, h) : s.cache.HeadValues(l, h);
        ASSERT_TRUE(got.ok());
        ASSERT_EQ(*got, Effective(s, l, h, side)) << "layer " << l << " head " << h << " side "
                                                  << side;
      }
    }
  }
}

struct Diffs {
  double out = 0, lse = 0, probs = 0;
};

void Accumulate(Diffs& d, const std::vector<float>& got, const std::vector<float>& want,
                double Diffs::*field) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    d.*field = std::max(d.*field, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
}

// Attention through the windowed view against the reference over the
// effective rows each query sees, for the last T positions of every layer.
void CheckAttention(const Subject& s, std::mt19937& rng, uint32_t T, ThreadPool* pool) {
  const uint32_t n = s.cache.num_tokens();
  T = std::min(T, n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t per_q = size_t{kQHeads} * kDim;
  std::vector<float> q(T * per_q);
  for (float& x : q) x = nd(rng);
  for (uint32_t l = 0; l < kLayers; ++l) {
    auto view = s.cache.View(l);
    ASSERT_TRUE(view.ok());
    ASSERT_NE(view->hot, nullptr);
    AttentionOptions o;
    o.n_q_heads = kQHeads;
    o.float_query_keys = true;  // no query rounding: float rounding only
    // The reference, one query at a time over the rows that query sees.
    std::vector<float> wout(T * per_q), wlse(T * kQHeads), wprobs(size_t{T} * kQHeads * n, 0.0f),
        wkvp(size_t{kHeads} * n, 0.0f);
    for (uint32_t t = 0; t < T; ++t) {
      const uint32_t qpos = n - T + t;
      std::vector<std::vector<float>> keys(kHeads), values(kHeads);
      std::vector<ReferenceHead> heads(kHeads);
      for (uint32_t h = 0; h < kHeads; ++h) {
        keys[h] = Effective(s, l, h, 0, qpos);
        values[h] = Effective(s, l, h, 1, qpos);
        heads[h] = {keys[h], values[h], {}};
      }
      std::vector<float> p1(size_t{kQHeads} * (qpos + 1)), kv1(size_t{kHeads} * (qpos + 1));
      ASSERT_TRUE(AttendReference(heads, kDim, qpos + 1, 1,
                                  std::span<const float>(q).subspan(t * per_q, per_q), o,
                                  {std::span<float>(wout).subspan(t * per_q, per_q),
                                   std::span<float>(wlse).subspan(t * kQHeads, kQHeads), p1, kv1})
                      .ok());
      for (uint32_t j = 0; j < kQHeads; ++j) {
        for (uint32_t p = 0; p <= qpos; ++p) {
          wprobs[(size_t{t} * kQHeads + j) * n + p] = p1[size_t{j} * (qpos + 1) + p];
        }
      }
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t p = 0; p <= qpos; ++p) wkvp[size_t{h} * n + p] += kv1[size_t{h} * (qpos + 1) + p];
      }
    }
    std::vector<float> out(wout.size()), lse(wlse.size()), probs(wprobs.size()), kvp(wkvp.size());
    o.pool = pool;
    testing::ForEachHwyTarget([&] {
      const Status st = AttendMulti(*view, T, q, o, {out, lse, probs, kvp});
      ASSERT_TRUE(st.ok()) << st.ToString();
      Diffs d;
      Accumulate(d, out, wout, &Diffs::out);
      Accumulate(d, lse, wlse, &Diffs::lse);
      Accumulate(d, probs, wprobs, &Diffs::probs);
      Accumulate(d, kvp, wkvp, &Diffs::probs);
      EXPECT_LE(d.out, 2e-5) << "layer " << l << " T " << T << " n " << n;
      EXPECT_LE(d.lse, 2e-5);
      EXPECT_LE(d.probs, 2e-5);
    });
  }
}

void CheckAll(const Subject& s, std::mt19937& rng, ThreadPool* pool) {
  CheckRows(s);
  CheckAttention(s, rng, 1, pool);
  CheckAttention(s, rng, 5, pool);
}

Subject Make(const Geometry& g, FormatPair f, PrecisionWindow w, bool paged,
             std::shared_ptr<BlockPool>* pool) {
  if (!paged) {
    auto a = SequenceCache::CreateContiguous(g, f, {.window = w});
    auto b = SequenceCache::CreateContiguous(g, f);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return {std::move(*a), std::move(*b), WindowModel(w), {}, {}};
  }
  auto p = BlockPool::Create(g, f, {.num_blocks = 64});
  EXPECT_TRUE(p.ok());
  *pool = *p;
  auto a = SequenceCache::CreatePaged(*pool, {.window = w});
  auto b = SequenceCache::CreatePaged(*pool);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return {std::move(*a), std::move(*b), WindowModel(w), {}, {}};
}

class PrecisionWindowTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(PrecisionWindowTest, HoldsTheDocumentedRowsAndAttendsAsTheReference) {
  const auto [paged, which] = GetParam();
  const FormatPair formats[] = {{Format::kTurbo4, Format::kTurbo4},
                                {Format::kQ8_0, Format::kQ4_0},
                                {Format::kTurbo2, Format::kBF16},
                                {Format::kTurbo4I, Format::kTurbo4I},
                                {Format::kTurbo3I, Format::kTurbo3I},
                                {Format::kTurbo2I, Format::kTurbo2I},
                                {Format::kTurbo2I, Format::kBF16}};
  const FormatPair f = formats[which];
  const PrecisionWindow w{.sinks = 4, .recent = 24, .slack = 4};
  const Geometry g = Geo(8);
  std::shared_ptr<BlockPool> pool;
  Subject s = Make(g, f, w, paged, &pool);
  ThreadPool threads(2);
  std::mt19937 rng(1234 + which);
  Append(s, rng, 3);  // shorter than the sinks
  CheckAll(s, rng, nullptr);
  Append(s, rng, 10);
  CheckAll(s, rng, &threads);
  for (int i = 0; i < 20; ++i) Append(s, rng, 1);  // decode past the window
  EXPECT_EQ(s.model.size(), 4u + 24u);
  EXPECT_EQ(s.cache.used_bytes(), s.twin.used_bytes() + size_t{kLayers} * kHeads * 2 * 32 *
                                                            RowBytes(Format::kBF16, kDim));
  CheckAll(s, rng, &threads);
  Append(s, rng, 40);  // a chunk longer than the ring
  CheckAll(s, rng, nullptr);
  {  // a speculative reject within the slack restores the window exactly
    std::vector<std::vector<float>> before;
    for (uint32_t l = 0; l < kLayers; ++l) before.push_back(*s.cache.HeadKeys(l, 1));
    const uint32_t n = s.cache.num_tokens();
    Append(s, rng, 4);
    Truncate(s, n);
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(*s.cache.HeadKeys(l, 1), before[l]);
  }
  CheckAll(s, rng, &threads);
  Truncate(s, s.cache.num_tokens() - 3);
  CheckAll(s, rng, &threads);
  Append(s, rng, 2);
  CheckAll(s, rng, nullptr);
  Truncate(s, 20);  // back past the window: the rows that left it stay cold
  CheckAll(s, rng, nullptr);
  Truncate(s, 2);  // into the sinks
  CheckAll(s, rng, nullptr);
  Append(s, rng, 30);
  CheckAll(s, rng, &threads);

  // A fork holds the same rows; what either appends later is its own.
  auto child = s.cache.Fork();
  ASSERT_TRUE(child.ok());
  auto child_twin = s.twin.Fork();
  ASSERT_TRUE(child_twin.ok());
  EXPECT_EQ(child->precision_window(), w);
  Subject c{std::move(*child), std::move(*child_twin), s.model, s.k, s.v};
  Append(c, rng, 7);
  CheckAll(c, rng, nullptr);
  CheckAll(s, rng, nullptr);
  auto clone = s.cache.Clone();
  ASSERT_TRUE(clone.ok());
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(*clone->HeadKeys(l, 1), *s.cache.HeadKeys(l, 1));
    EXPECT_EQ(*clone->HeadValues(l, 0), *s.cache.HeadValues(l, 0));
  }

  // Clear starts over with sinks again.
  ASSERT_TRUE(s.cache.Clear().ok());
  ASSERT_TRUE(s.twin.Clear().ok());
  s.model.Reset(0);
  Truncate(s, 0);
  Append(s, rng, 9);
  CheckAll(s, rng, &threads);
  EXPECT_GT(s.cache.allocated_bytes(), s.twin.allocated_bytes());
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndFormats, PrecisionWindowTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2, 3, 4, 5, 6)));

// The batched decode folds each sequence's window: equal to AttendDecode
// of each sequence alone, bit for bit, beside a sequence without a window.
TEST(PrecisionWindowBatch, DecodeBatchEqualsEachAlone) {
  const Geometry g = Geo(16);
  const FormatPair f{Format::kTurbo4, Format::kTurbo4};
  std::mt19937 rng(7);
  std::shared_ptr<BlockPool> pool;
  Subject a = Make(g, f, {.sinks = 4, .recent = 32}, true, &pool);
  Subject b = Make(g, f, {.sinks = 0, .recent = 16}, false, &pool);
  Append(a, rng, 50);
  Append(b, rng, 70);
  ThreadPool threads(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(3 * size_t{kQHeads} * kDim);
  for (float& x : q) x = nd(rng);
  const size_t per = size_t{kQHeads} * kDim;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const LayerKvView views[3] = {*a.cache.View(l), *a.twin.View(l), *b.cache.View(l)};
    AttentionOptions o;
    o.n_q_heads = kQHeads;
    o.pool = &threads;
    std::vector<float> out(3 * per), lse(3 * kQHeads);
    ASSERT_TRUE(AttendDecodeBatch(views, q, o, out, lse).ok());
    for (int s = 0; s < 3; ++s) {
      std::vector<float> one(per), one_lse(kQHeads);
      ASSERT_TRUE(AttendDecode(views[s], std::span<const float>(q).subspan(s * per, per), o,
                               {one, one_lse, {}, {}})
                      .ok());
      EXPECT_EQ(std::vector<float>(out.begin() + s * per, out.begin() + (s + 1) * per), one);
      EXPECT_EQ(std::vector<float>(lse.begin() + s * kQHeads, lse.begin() + (s + 1) * kQHeads),
                one_lse);
    }
  }
}

// Adopted prefix blocks are the pool's rows alone: the window holds only
// what is appended after them (no sinks), and attention still sees every
// position once.
TEST(PrecisionWindowPrefix, AdoptedBlocksAreColdAndLaterRowsHeld) {
  const Geometry g = Geo(8);
  const FormatPair f{Format::kTurbo3, Format::kTurbo3};
  const PrecisionWindow w{.sinks = 4, .recent = 16};
  std::mt19937 rng(11);
  std::shared_ptr<BlockPool> pool;
  Subject s = Make(g, f, w, true, &pool);
  Append(s, rng, 16);
  ASSERT_TRUE(s.cache.SetBlockHash(0, 41).ok());
  ASSERT_TRUE(s.cache.SetBlockHash(1, 42).ok());
  ASSERT_TRUE(s.twin.SetBlockHash(0, 51).ok());
  ASSERT_TRUE(s.twin.SetBlockHash(1, 52).ok());
  const std::vector<uint32_t> blocks(s.cache.block_table().begin(), s.cache.block_table().end());
  const std::vector<uint32_t> twin_blocks(s.twin.block_table().begin(),
                                          s.twin.block_table().end());
  auto cal = s.cache.calibration();
  auto twin_cal = s.twin.calibration();
  auto adopted = SequenceCache::CreatePaged(pool, {.window = w});
  auto adopted_twin = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(adopted.ok() && adopted_twin.ok());
  ASSERT_TRUE(pool->Retain(blocks).ok());
  ASSERT_TRUE(pool->Retain(twin_blocks).ok());
  ASSERT_TRUE(adopted->AdoptPrefix(blocks, cal).ok());
  ASSERT_TRUE(adopted_twin->AdoptPrefix(twin_blocks, twin_cal).ok());
  Subject t{std::move(*adopted), std::move(*adopted_twin), WindowModel(w), s.k, s.v};
  t.model.Reset(16);
  CheckAll(t, rng, nullptr);  // nothing held: the view is the blocks alone
  Append(t, rng, 5);
  CheckAll(t, rng, nullptr);
  Append(t, rng, 30);
  CheckAll(t, rng, nullptr);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Bad input: clear errors, nothing created or changed.
TEST(PrecisionWindowErrors, RefusedAndNothingChanges) {
  const Geometry g = Geo(8);
  const FormatPair turbo{Format::kTurbo4, Format::kTurbo4};
  EXPECT_EQ(SequenceCache::CreateContiguous(g, {Format::kF16, Format::kBF16},
                                            {.window = {.sinks = 4, .recent = 8}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SequenceCache::CreateContiguous(g, turbo, {.window = {.sinks = 5000, .recent = 8}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SequenceCache::CreateContiguous(g, turbo, {.window = {.sinks = 4, .slack = 2}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  auto pool = BlockPool::Create(g, turbo, {.num_blocks = 8});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(SequenceCache::CreatePaged(*pool, {.window = {.sinks = 0, .recent = 1u << 20}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->num_free_blocks(), 8u);

  auto c = SequenceCache::CreatePaged(*pool, {.window = {.sinks = 2, .recent = 8}});
  ASSERT_TRUE(c.ok());
  std::mt19937 rng(3);
  std::vector<float> k, v;
  MakeTokens(rng, 4, &k, &v);
  ASSERT_TRUE(c->Append(k, v).ok());
  const auto keys_before = *c->HeadKeys(1, 1);
  const uint8_t alive[kHeads] = {1, 0};
  EXPECT_EQ(c->Append(k, v, {.alive = alive}).code(), StatusCode::kFailedPrecondition);
  const uint32_t rows[] = {0, 2};
  EXPECT_EQ(c->KeepRows(0, 0, rows).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->num_tokens(), 4u);
  EXPECT_EQ(*c->HeadKeys(1, 1), keys_before);
  EXPECT_TRUE(c->CheckInvariants().ok());
  // A view whose window has another shape is refused by attention.
  auto view = c->View(0);
  ASSERT_TRUE(view.ok());
  LayerKvView hot = *view->hot;
  hot.num_tokens = 3;
  LayerKvView bad = *view;
  bad.hot = &hot;
  std::vector<float> q(size_t{kQHeads} * kDim, 0.5f), out(q.size());
  AttentionOptions o;
  o.n_q_heads = kQHeads;
  EXPECT_EQ(AttendDecode(bad, q, o, {out, {}, {}, {}}).code(), StatusCode::kInvalidArgument);
  c->Release();
  EXPECT_EQ((*pool)->num_free_blocks(), 8u);
  EXPECT_EQ(c->allocated_bytes(), 0u);
}

}  // namespace
}  // namespace kvcache
