// Model-based randomized test of SequenceCache + BlockPool.
//
// Thousands of random operations (append, chunked append, per-layer append,
// advance, truncate, fork, clone, clear, release, reserve, importance,
// destroy) run on a few sequences that share a pool small enough to run out,
// against a trivially correct model built on std::vector<float>. After every
// step the decoded contents, lengths, positions, importance, refcounts and
// pool counts must match the model exactly. Lossy formats are compared with
// the model's own encode-decode through RowCodec (calibrated the same way),
// so the comparison stays exact; formats whose codec is not implemented yet
// are skipped.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/codec.h"
#include "kvcache/pool.h"

namespace kvcache {
namespace {

struct MHead {
  std::vector<float> k, v;        // [rows][D] expected decoded rows
  std::vector<uint32_t> pos;      // [rows]
  std::vector<float> imp;         // [rows]
  RowTransform tk, tv;
  uint32_t rows() const { return static_cast<uint32_t>(pos.size()); }
};
struct MLayer {
  uint32_t num_tokens = 0;
  std::vector<MHead> heads;
  std::vector<float> pos_imp;  // [num_tokens]
};
struct MSeq {
  bool paged = false;
  CapacityPolicy policy = CapacityPolicy::kGrow;
  uint32_t plan = 0;
  std::vector<MLayer> layers;
  std::vector<int> table;  // model block ids
};

struct Case {
  GeometryOptions geometry;
  FormatPair formats;
};

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("L{}H{}D{}B{}_{}_{}", c.geometry.n_layers, c.geometry.n_kv_heads,
                     c.geometry.head_dim, c.geometry.block_size, FormatName(c.formats.k),
                     FormatName(c.formats.v));
}

class CacheModelTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    for (Format f : {c.formats.k, c.formats.v}) {
      if (!CheckHeadDim(f, c.geometry.head_dim).ok()) GTEST_SKIP() << "head_dim unsupported";
    }
    auto g = Geometry::Create(c.geometry);
    ASSERT_TRUE(g.ok());
    geo_ = std::make_unique<Geometry>(*g);
    auto kc = RowCodec::Create(c.formats.k, geo_->head_dim(), Side::kKey);
    auto vc = RowCodec::Create(c.formats.v, geo_->head_dim(), Side::kValue);
    ASSERT_TRUE(kc.ok() && vc.ok());
    codec_[0] = std::make_unique<RowCodec>(*kc);
    codec_[1] = std::make_unique<RowCodec>(*vc);
    // Skip formats whose codec does not work yet.
    std::vector<float> row(geo_->head_dim(), 0.5f);
    for (int s = 0; s < 2; ++s) {
      std::vector<uint8_t> enc(codec_[s]->row_bytes());
      Status st = codec_[s]->Encode(row, enc);
      if (st.code() == StatusCode::kUnimplemented) GTEST_SKIP() << st.ToString();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    kPoolBlocks = geo_->block_size() >= 8 ? 6 : 12;
    auto pool = BlockPool::Create(*geo_, c.formats, {.num_blocks = kPoolBlocks});
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = *pool;
  }

  uint32_t kPoolBlocks = 12;  // set per geometry in SetUp: small enough to run out
  static constexpr size_t kMaxSeqs = 6;

  uint32_t L() const { return geo_->n_layers(); }
  uint32_t H() const { return geo_->n_kv_heads(); }
  uint32_t D() const { return geo_->head_dim(); }
  uint32_t B() const { return geo_->block_size(); }

  MSeq NewModel(bool paged, CapacityPolicy policy, uint32_t plan) const {
    MSeq m;
    m.paged = paged;
    m.policy = policy;
    m.plan = plan;
    m.layers.resize(L());
    for (MLayer& l : m.layers) l.heads.resize(H());
    return m;
  }

  // --- model block accounting ---
  int NewBlock() {
    refs_.push_back(1);
    return static_cast<int>(refs_.size()) - 1;
  }
  uint32_t ModelUsed() const {
    uint32_t n = 0;
    for (int r : refs_) n += r > 0;
    return n;
  }
  void DropTable(MSeq& m, size_t keep) {
    while (m.table.size() > keep) {
      --refs_[m.table.back()];
      m.table.pop_back();
    }
  }
  static uint32_t MaxRows(const MSeq& m) {
    uint32_t r = 0;
    for (const MLayer& l : m.layers)
      for (const MHead& h : l.heads) r = std::max(r, h.rows());
    return r;
  }
  uint32_t PoolAvailable() const {
    return kPoolBlocks - ModelUsed() - pool_->num_reserved_blocks();
  }

  // Expected decoded rows for `rows` ([n][D]) stored with transform t.
  std::vector<float> RoundTrip(int side, const std::vector<float>& rows, const RowTransform& t) {
    const RowTransform* tp = t.empty() ? nullptr : &t;
    std::vector<uint8_t> enc(rows.size() / D() * codec_[side]->row_bytes());
    EXPECT_TRUE(codec_[side]->Encode(rows, enc, tp).ok());
    std::vector<float> out(rows.size());
    EXPECT_TRUE(codec_[side]->Decode(enc, out, tp).ok());
    return out;
  }

  // The model's append. k, v: [nl][T][H][D] or empty (zeros); alive [H] or empty.
  // Returns the status the real cache must return.
  StatusCode ModelAppend(MSeq& m, const SequenceCache& real, uint32_t l0, uint32_t nl,
                         const std::vector<float>& k, const std::vector<float>& v, uint32_t T,
                         const std::vector<uint8_t>& alive, bool poisoned) {
    auto is_alive = [&](uint32_t h) { return alive.empty() || alive[h]; };
    if (!m.paged && m.policy == CapacityPolicy::kFixed) {
      for (uint32_t li = 0; li < nl; ++li)
        for (uint32_t h = 0; h < H(); ++h)
          if (is_alive(h) && m.layers[l0 + li].heads[h].rows() + T > m.plan)
            return StatusCode::kCapacityExceeded;
    }
    std::vector<int> cow;
    uint32_t n_new = 0;
    if (m.paged) {
      uint32_t new_max = MaxRows(m);
      std::vector<uint8_t> touched(m.table.size(), 0);
      for (uint32_t li = 0; li < nl; ++li) {
        for (uint32_t h = 0; h < H(); ++h) {
          if (!is_alive(h)) continue;
          const uint32_t a = m.layers[l0 + li].heads[h].rows(), b = a + T;
          new_max = std::max(new_max, b);
          for (uint32_t i = a / B(); i < std::min<size_t>(m.table.size(), (b + B() - 1) / B()); ++i)
            touched[i] = 1;
        }
      }
      for (size_t i = 0; i < m.table.size(); ++i)
        if (touched[i] && refs_[m.table[i]] > 1) cow.push_back(static_cast<int>(i));
      const uint32_t want = (new_max + B() - 1) / B();
      n_new = want > m.table.size() ? want - static_cast<uint32_t>(m.table.size()) : 0;
      const uint32_t needed = n_new + static_cast<uint32_t>(cow.size());
      const uint32_t from_res = std::min(needed, real.reserved_blocks());
      if (needed - from_res > PoolAvailable()) return StatusCode::kPoolExhausted;
      if (poisoned) return StatusCode::kInvalidArgument;
      for (int i : cow) {
        --refs_[m.table[i]];
        m.table[i] = NewBlock();
      }
      for (uint32_t j = 0; j < n_new; ++j) m.table.push_back(NewBlock());
    }
    if (poisoned) return StatusCode::kInvalidArgument;
    const size_t kv_dim = size_t{H()} * D();
    for (uint32_t li = 0; li < nl; ++li) {
      MLayer& ml = m.layers[l0 + li];
      for (uint32_t h = 0; h < H(); ++h) {
        if (!is_alive(h)) continue;
        MHead& mh = ml.heads[h];
        for (int side = 0; side < 2; ++side) {
          std::vector<float> rows(size_t{T} * D(), 0.0f);
          const std::vector<float>& src = side == 0 ? k : v;
          if (!src.empty()) {
            for (uint32_t t = 0; t < T; ++t)
              std::copy_n(src.data() + (size_t{li} * T + t) * kv_dim + size_t{h} * D(), D(),
                          rows.data() + size_t{t} * D());
          }
          RowTransform& tf = side == 0 ? mh.tk : mh.tv;
          if (mh.rows() == 0) tf = codec_[side]->Calibrate(rows);
          std::vector<float> dec = RoundTrip(side, rows, tf);
          std::vector<float>& dst = side == 0 ? mh.k : mh.v;
          dst.insert(dst.end(), dec.begin(), dec.end());
        }
        for (uint32_t t = 0; t < T; ++t) {
          mh.pos.push_back(ml.num_tokens + t);
          mh.imp.push_back(0.0f);
        }
      }
      ml.num_tokens += T;
      ml.pos_imp.resize(ml.num_tokens, 0.0f);
    }
    return StatusCode::kOk;
  }

  void ModelTruncate(MSeq& m, uint32_t n) {
    for (MLayer& ml : m.layers) {
      if (ml.num_tokens <= n) continue;
      for (MHead& mh : ml.heads) {
        const uint32_t keep = static_cast<uint32_t>(
            std::lower_bound(mh.pos.begin(), mh.pos.end(), n) - mh.pos.begin());
        mh.pos.resize(keep);
        mh.imp.resize(keep);
        mh.k.resize(size_t{keep} * D());
        mh.v.resize(size_t{keep} * D());
        if (keep == 0) mh.tk = mh.tv = RowTransform{};
      }
      ml.num_tokens = n;
      ml.pos_imp.resize(n);
    }
    if (m.paged) DropTable(m, (MaxRows(m) + B() - 1) / B());
  }

  static uint32_t NumTokens(const MSeq& m) {
    uint32_t n = 0;
    for (const MLayer& l : m.layers) n = std::max(n, l.num_tokens);
    return n;
  }

  void Verify(const MSeq& m, const SequenceCache& real, const std::string& where) {
    ASSERT_FALSE(real.released()) << where;
    ASSERT_TRUE(real.CheckInvariants().ok()) << where << ": " << real.CheckInvariants().ToString();
    ASSERT_EQ(real.num_tokens(), NumTokens(m)) << where;
    for (uint32_t l = 0; l < L(); ++l) {
      const MLayer& ml = m.layers[l];
      ASSERT_EQ(real.num_tokens(l), ml.num_tokens) << where << " layer " << l;
      ASSERT_EQ(real.Importance(l), ml.pos_imp) << where << " layer " << l;
      for (uint32_t h = 0; h < H(); ++h) {
        const MHead& mh = ml.heads[h];
        ASSERT_EQ(real.head_len(l, h), mh.rows()) << where << " l" << l << " h" << h;
        ASSERT_EQ(real.HeadPositions(l, h), mh.pos) << where;
        ASSERT_EQ(real.HeadImportance(l, h), mh.imp) << where;
        auto k = real.HeadKeys(l, h);
        auto v = real.HeadValues(l, h);
        ASSERT_TRUE(k.ok() && v.ok()) << where;
        ASSERT_EQ(*k, mh.k) << where << " keys l" << l << " h" << h;
        ASSERT_EQ(*v, mh.v) << where << " values l" << l << " h" << h;
        // The view addresses the same bytes HeadKeys decoded.
        auto view = real.View(l);
        ASSERT_TRUE(view.ok());
        ASSERT_EQ(view->rows(h), mh.rows());
        if (mh.rows() > 0) {
          const uint32_t r = mh.rows() - 1;
          std::vector<float> row(D());
          const RowTransform* tf =
              view->k.transforms && !view->k.transforms[h].empty() ? &view->k.transforms[h] : nullptr;
          ASSERT_TRUE(view->k.codec
                          ->Decode({view->row_ptr(view->k, h, r), view->k.row_bytes}, row, tf)
                          .ok());
          ASSERT_TRUE(std::equal(row.begin(), row.end(), mh.k.begin() + size_t{r} * D()))
              << where << " view row";
          ASSERT_EQ(view->position(h, r), mh.pos[r]);
        }
      }
    }
    if (m.paged) {
      auto table = real.block_table();
      ASSERT_EQ(table.size(), m.table.size()) << where;
      for (size_t i = 0; i < table.size(); ++i) {
        ASSERT_EQ(pool_->refcount(table[i]), static_cast<uint32_t>(refs_[m.table[i]]))
            << where << " block " << i;
      }
      ASSERT_EQ(real.context_lens().size(), 1u);
      ASSERT_EQ(real.context_lens()[0], NumTokens(m));
      ASSERT_EQ(real.allocated_bytes(), m.table.size() * pool_->block_bytes());
    } else {
      ASSERT_TRUE(real.block_table().empty());
    }
  }

  std::unique_ptr<Geometry> geo_;
  std::unique_ptr<RowCodec> codec_[2];
  std::shared_ptr<BlockPool> pool_;
  std::vector<int> refs_;  // model block refcounts
};

TEST_P(CacheModelTest, RandomOperationsMatchModel) {
  std::mt19937 rng(0xC0FFEE ^ (GetParam().geometry.head_dim * 131 + GetParam().geometry.n_layers));
  auto uni = [&](uint32_t lo, uint32_t hi) {  // inclusive
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  std::uniform_real_distribution<float> val(-2.0f, 2.0f);

  std::vector<MSeq> models;
  std::vector<std::unique_ptr<SequenceCache>> reals;
  auto add_paged = [&]() {
    auto c = SequenceCache::CreatePaged(pool_);
    ASSERT_TRUE(c.ok());
    reals.push_back(std::make_unique<SequenceCache>(std::move(*c)));
    models.push_back(NewModel(true, CapacityPolicy::kGrow, 0));
  };
  auto add_contig = [&]() {
    ContiguousOptions o;
    o.capacity_tokens = uni(0, 1) ? uni(1, 24) : 0;
    o.policy = (o.capacity_tokens > 0 && uni(0, 1)) ? CapacityPolicy::kFixed : CapacityPolicy::kGrow;
    auto c = SequenceCache::CreateContiguous(*geo_, GetParam().formats, o);
    ASSERT_TRUE(c.ok());
    reals.push_back(std::make_unique<SequenceCache>(std::move(*c)));
    models.push_back(NewModel(false, o.policy, o.capacity_tokens));
  };
  add_paged();
  add_paged();
  add_contig();

  const int kSteps = 1500;
  int counts[16] = {};
  int exhausted = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (models.empty()) {
      add_paged();
      add_contig();
    }
    const size_t i = uni(0, static_cast<uint32_t>(models.size()) - 1);
    MSeq& m = models[i];
    SequenceCache& real = *reals[i];
    const uint32_t op = uni(0, 99);
    std::string where = fmt::format("step {} seq {} op {}", step, i, op);
    if (op < 30) {  // append: one token or a chunk, all layers or one layer
      const bool one_layer = uni(0, 3) == 0;
      const uint32_t T = uni(0, 2) ? 1 : uni(2, 2 * B() + 1);
      const uint32_t nl = one_layer ? 1 : L();
      const uint32_t l0 = one_layer ? uni(0, L() - 1) : 0;
      std::vector<float> k(size_t{nl} * T * H() * D()), v(k.size());
      for (float& x : k) x = val(rng);
      for (float& x : v) x = val(rng);
      std::vector<uint8_t> alive;
      if (uni(0, 3) == 0) {
        alive.resize(H());
        for (auto& a : alive) a = uni(0, 2) != 0;
      }
      bool poison = uni(0, 19) == 0;
      if (poison) {
        const uint32_t at = uni(0, static_cast<uint32_t>(k.size()) - 1);
        (uni(0, 1) ? k : v)[at] = NAN;
        poison = alive.empty() || alive[(at / D()) % H()];  // dead heads store nothing
      }
      // Reservation property: fully reserved appends within target never run out.
      bool must_fit = false;
      if (m.paged && real.reservation_target_tokens() > 0 && real.is_fully_reserved()) {
        must_fit = true;
        for (uint32_t li = 0; li < nl; ++li)
          for (uint32_t h = 0; h < H(); ++h)
            if ((alive.empty() || alive[h]) &&
                m.layers[l0 + li].heads[h].rows() + T > real.reservation_target_tokens())
              must_fit = false;
      }
      const StatusCode want = ModelAppend(m, real, l0, nl, k, v, T, alive, poison);
      AppendOptions opts{alive};
      Status got = one_layer ? real.AppendLayer(l0, k, v, opts) : real.Append(k, v, opts);
      ASSERT_EQ(got.code(), want) << where << ": " << got.ToString();
      if (must_fit) {
        ASSERT_NE(got.code(), StatusCode::kPoolExhausted) << where;
      }
      exhausted += got.IsPoolExhausted();
      ++counts[0];
    } else if (op < 36) {  // advance_len
      const uint32_t n = uni(1, B() + 2);
      const StatusCode want = ModelAppend(m, real, 0, L(), {}, {}, n, {}, false);
      ASSERT_EQ(real.AdvanceLen(n).code(), want) << where;
      ++counts[1];
    } else if (op < 50) {  // truncate (sometimes past the end)
      const uint32_t n = NumTokens(m);
      if (uni(0, 9) == 0) {
        ASSERT_EQ(real.Truncate(n + uni(1, 3)).code(), StatusCode::kOutOfRange) << where;
      } else {
        // Mostly a speculative reject of a few tokens, sometimes anywhere.
        const uint32_t to = uni(0, 3) == 0 ? uni(0, n) : n - std::min(n, uni(0, B() + 2));
        ModelTruncate(m, to);
        ASSERT_TRUE(real.Truncate(to).ok()) << where;
      }
      ++counts[2];
    } else if (op < 58 && models.size() < kMaxSeqs) {  // fork
      auto f = real.Fork();
      if (!m.paged) {
        ASSERT_TRUE(f.ok()) << where;
      } else if (real.reservation_target_tokens() == 0) {
        ASSERT_TRUE(f.ok()) << where << f.status().ToString();
      } else if (!f.ok()) {
        ASSERT_EQ(f.status().code(), StatusCode::kPoolExhausted) << where;
      }
      if (f.ok()) {
        MSeq child = m;
        for (int b : child.table) ++refs_[b];
        reals.push_back(std::make_unique<SequenceCache>(std::move(*f)));
        models.push_back(std::move(child));
      }
      ++counts[3];
    } else if (op < 64 && models.size() < kMaxSeqs) {  // clone
      const bool same = uni(0, 1);
      auto c = real.Clone({same ? CloneLayout::kSame : CloneLayout::kContiguous});
      MSeq copy = m;
      if (m.paged && same) {
        const bool fits = m.table.size() <= PoolAvailable();
        ASSERT_EQ(c.ok(), fits) << where << c.status().ToString();
        if (fits) {
          for (int& b : copy.table) b = NewBlock();
        }
      } else {
        ASSERT_TRUE(c.ok()) << where;
        if (m.paged) {
          copy.paged = false;
          copy.table.clear();
          copy.policy = CapacityPolicy::kGrow;
          copy.plan = 0;
        }
      }
      if (c.ok()) {
        ASSERT_TRUE(copy.paged == (c->layout() == CacheLayout::kPaged));
        reals.push_back(std::make_unique<SequenceCache>(std::move(*c)));
        models.push_back(std::move(copy));
      }
      ++counts[4];
    } else if (op < 68) {  // clear
      ModelTruncate(m, 0);
      for (MLayer& ml : m.layers) ml.pos_imp.clear();
      ASSERT_TRUE(real.Clear().ok()) << where;
      ++counts[5];
    } else if (op < 72) {  // release, then every mutation fails
      real.Release();
      real.Release();  // idempotent
      ASSERT_TRUE(real.released());
      std::vector<float> k(size_t{L()} * H() * D(), 1.0f);
      ASSERT_EQ(real.Append(k, k).code(), StatusCode::kFailedPrecondition);
      ASSERT_EQ(real.Truncate(0).code(), StatusCode::kFailedPrecondition);
      ASSERT_EQ(real.Fork().status().code(), StatusCode::kFailedPrecondition);
      ASSERT_EQ(real.View(0).status().code(), StatusCode::kFailedPrecondition);
      DropTable(m, 0);
      models.erase(models.begin() + i);
      reals.erase(reals.begin() + i);
      ++counts[6];
    } else if (op < 76) {  // destroy (destructor releases)
      DropTable(m, 0);
      models.erase(models.begin() + i);
      reals.erase(reals.begin() + i);
      ++counts[7];
    } else if (op < 84) {  // reserve
      if (m.paged) {
        const uint32_t target = uni(0, 3) == 0 ? 0 : NumTokens(m) + uni(0, 3 * B());
        const uint32_t before = pool_->num_reserved_blocks();
        Status s = real.Reserve(target);
        if (s.ok()) {
          ASSERT_TRUE(real.is_fully_reserved()) << where;
          ASSERT_EQ(real.reservation_target_tokens(), target);
        } else {
          ASSERT_EQ(s.code(), StatusCode::kPoolExhausted) << where;
          ASSERT_EQ(pool_->num_reserved_blocks(), before);
        }
      } else {
        ASSERT_TRUE(real.Reserve(uni(0, 50)).ok());
      }
      ++counts[8];
    } else if (op < 92) {  // importance
      const uint32_t l = uni(0, L() - 1), h = uni(0, H() - 1);
      MHead& mh = m.layers[l].heads[h];
      std::vector<float> probs(mh.rows());
      for (float& p : probs) p = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      for (size_t r = 0; r < probs.size(); ++r) {
        mh.imp[r] += probs[r];
        m.layers[l].pos_imp[mh.pos[r]] += probs[r];
      }
      ASSERT_TRUE(real.AccumulateImportance(l, h, probs).ok()) << where;
      probs.push_back(1.0f);
      ASSERT_EQ(real.AccumulateImportance(l, h, probs).code(), StatusCode::kInvalidArgument);
      ++counts[9];
    } else {  // bad input: wrong sizes, layer out of range
      std::vector<float> k(size_t{L()} * H() * D() + 1, 1.0f);
      ASSERT_EQ(real.Append(k, k).code(), StatusCode::kInvalidArgument) << where;
      ASSERT_EQ(real.AppendLayer(L(), std::span<const float>(k).first(H() * D()),
                                 std::span<const float>(k).first(H() * D()))
                    .code(),
                StatusCode::kOutOfRange);
      std::vector<uint8_t> bad_alive(H() + 1, 1);
      k.pop_back();
      ASSERT_EQ(real.Append(k, k, {bad_alive}).code(), StatusCode::kInvalidArgument);
      ++counts[10];
    }
    // Everything matches, every step.
    uint32_t reserved = 0;
    for (size_t j = 0; j < models.size(); ++j) {
      Verify(models[j], *reals[j], where + fmt::format(" verify seq {}", j));
      if (HasFatalFailure()) return;
      reserved += reals[j]->reserved_blocks();
    }
    PoolStats st = pool_->stats();
    ASSERT_EQ(st.used_blocks, ModelUsed()) << where;
    ASSERT_EQ(st.free_blocks, kPoolBlocks - ModelUsed()) << where;
    ASSERT_EQ(st.cached_blocks, 0u);
    ASSERT_EQ(st.reserved_blocks, reserved) << where;
    ASSERT_TRUE(pool_->CheckInvariants().ok()) << where;
  }
  reals.clear();
  EXPECT_EQ(pool_->num_free_blocks(), kPoolBlocks);
  EXPECT_EQ(pool_->num_reserved_blocks(), 0u);
  EXPECT_GT(exhausted, 0) << "the pool never ran out: make it smaller";
  RecordProperty("pool_exhausted", exhausted);
  for (int c = 0; c <= 10; ++c) EXPECT_GT(counts[c], 0) << "op " << c << " never ran";
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  const GeometryOptions geos[] = {
      {.n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_size = 4},
      {.n_layers = 3, .n_kv_heads = 1, .head_dim = 64, .block_size = 1},
      {.n_layers = 1, .n_kv_heads = 3, .head_dim = 32, .block_size = 8},
  };
  for (const GeometryOptions& g : geos) {
    for (Format f : kAllFormats) out.push_back({g, {f, f}});
    out.push_back({g, {Format::kBF16, Format::kTurbo4}});
    out.push_back({g, {Format::kQ8, Format::kF16}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CacheModelTest, testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace kvcache
