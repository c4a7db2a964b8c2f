// Window blocks (hybrid.h): a bounded group of sink-free window layers with
// one window and a slack of whole blocks compacts, in the paged layout, by
// releasing the blocks that slid out of the window
// (SequenceCache::DropLeadingBlocks). Its rows, positions, calibration and
// attention outputs equal the contiguous layout's (which moves rows) bit
// for bit at every length: single tokens, chunks up to L + 1, appends one
// layer at a time (attention read right after each layer's append, as a
// forward pass does), drafts committed and aborted, truncation, forks and
// clones; the group holds exactly the blocks its window covers. A sequence
// whose blocks were named and released can be adopted by a fresh sequence
// (HybridSequence::AdoptPrefix), which then continues exactly as one that
// appended the prefix itself.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "hybrid/test_util.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::Take;
using testing_hybrid::TokenRows;

constexpr uint32_t kLayers = 4, kH = 2, kD = 32, kQHeads = 4, kBlock = 16, kW = 64, kL = 15;
constexpr FormatPair kFormats{Format::kTurbo4, Format::kQ8_0};

std::shared_ptr<const HybridModel> Model(uint32_t slack, uint32_t sinks = 0,
                                         bool with_linear = false, uint32_t window = kW) {
  auto geo = Geometry::Create(
      {.n_layers = kLayers, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
  EXPECT_TRUE(geo.ok());
  std::vector<LayerSpec> specs = {LayerSpec::Full(), LayerSpec::Window(sinks, window),
                                  LayerSpec::Window(sinks, window), LayerSpec::Window(sinks, window)};
  if (with_linear) specs[2] = LayerSpec::Linear(LinearRule::kPlain);
  auto m = HybridModel::Create(*geo, kFormats, std::move(specs),
                               {.window_slack_tokens = slack, .window_lookback_tokens = kL});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// k or v of tokens [from, from + n) of `stream` for one layer.
std::vector<float> LayerRows(uint64_t stream, uint32_t layer, uint32_t from, uint32_t n,
                             int side) {
  std::vector<float> out;
  for (uint32_t p = from; p < from + n; ++p) {
    const auto r = TokenRows(stream, layer, p, side, kH * kD);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

Status AppendAll(HybridSequence& s, uint64_t stream, uint32_t from, uint32_t n) {
  std::vector<float> k, v;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const auto kl = LayerRows(stream, l, from, n, 0), vl = LayerRows(stream, l, from, n, 1);
    k.insert(k.end(), kl.begin(), kl.end());
    v.insert(v.end(), vl.begin(), vl.end());
  }
  return s.Append(k, v);
}

// Attention of the last n_queries positions of one layer, as bits.
std::vector<float> AttendBits(const HybridSequence& s, uint32_t layer, uint32_t n_queries) {
  std::mt19937 rng(77u + layer * 13u + s.num_tokens(layer) * 3u + n_queries);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(size_t{n_queries} * kQHeads * kD);
  for (float& x : q) x = dist(rng);
  std::vector<float> out(q.size()), lse(size_t{n_queries} * kQHeads);
  const Status st = s.Attend(layer, n_queries, q, {.n_q_heads = kQHeads}, {.out = out, .lse = lse, .probs = {}, .kv_probs = {}});
  EXPECT_TRUE(st.ok()) << st.ToString();
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Paged and contiguous hold the same thing and attend the same, bit for bit.
void ExpectSame(const HybridSequence& paged, const HybridSequence& ref, uint32_t n_queries,
                const char* where) {
  SCOPED_TRACE(::testing::Message() << where << " at length " << ref.num_tokens());
  ASSERT_TRUE(paged.CheckInvariants().ok()) << paged.CheckInvariants().ToString();
  ASSERT_TRUE(ref.CheckInvariants().ok()) << ref.CheckInvariants().ToString();
  ASSERT_TRUE(Take(paged) == Take(ref));
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (paged.model().kind(l) == LayerKind::kLinear) continue;
    for (uint32_t h = 0; h < kH; ++h) ASSERT_EQ(*paged.HeadKeys(l, h), *ref.HeadKeys(l, h));
    ASSERT_TRUE(SameBits(AttendBits(paged, l, n_queries), AttendBits(ref, l, n_queries)));
  }
  EXPECT_FALSE(paged.window_compaction_pending());
}

// The bounded group of a sequence alone on its pool holds exactly the
// blocks its window covers.
void ExpectWindowBlocks(const HybridSequence& s, const BlockPool& pool) {
  const uint32_t n = s.num_tokens();
  const uint32_t want = (n - s.model().WindowKeepFrom(n) + kBlock - 1) / kBlock;
  EXPECT_EQ(pool.num_used_blocks(), want) << "at length " << n;
  EXPECT_EQ(s.group_cache(HybridModel::kBoundedGroup)->block_table().size(), want);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

struct Pair {
  std::shared_ptr<const HybridModel> model;
  std::vector<std::shared_ptr<BlockPool>> pools;
  HybridSequence paged, ref;
};

Pair MakePair(uint32_t slack, uint32_t window = kW) {
  auto model = Model(slack, 0, false, window);
  auto pools = model->CreatePools(std::vector<uint32_t>{64, 64});
  EXPECT_TRUE(pools.ok());
  auto paged = HybridSequence::CreatePaged(model, *pools);
  auto ref = HybridSequence::CreateContiguous(model);
  EXPECT_TRUE(paged.ok() && ref.ok());
  return {model, *pools, std::move(*paged), std::move(*ref)};
}

TEST(HybridWindowBlocks, ModelSaysWhenBlocksApply) {
  EXPECT_TRUE(Model(16)->window_blocks_aligned());
  EXPECT_TRUE(Model(32)->window_blocks_aligned());
  EXPECT_TRUE(Model(0)->window_blocks_aligned());  // slack = block size
  EXPECT_FALSE(Model(8)->window_blocks_aligned());
  EXPECT_FALSE(Model(24)->window_blocks_aligned());
  EXPECT_FALSE(Model(16, /*sinks=*/4)->window_blocks_aligned());
  EXPECT_TRUE(Model(16, 0, /*with_linear=*/true)->window_blocks_aligned());
  auto geo = Geometry::Create({.n_layers = 3, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
  ASSERT_TRUE(geo.ok());
  auto mixed = HybridModel::Create(
      *geo, kFormats, {LayerSpec::Full(), LayerSpec::Window(0, 64), LayerSpec::Window(0, 32)});
  ASSERT_TRUE(mixed.ok());
  EXPECT_FALSE((*mixed)->window_blocks_aligned());
  EXPECT_EQ((*mixed)->WindowKeepFrom(1000), 0u);
  auto full_only = HybridModel::Create(*geo, kFormats, {LayerSpec::Full(), LayerSpec::Full(), LayerSpec::Full()});
  ASSERT_TRUE(full_only.ok());
  EXPECT_FALSE((*full_only)->window_blocks_aligned());
  // lo(n) = G * floor((n - W - L) / G) once n > W + L.
  const auto m = Model(32);
  EXPECT_EQ(m->WindowKeepFrom(79), 0u);
  EXPECT_EQ(m->WindowKeepFrom(80), 0u);
  EXPECT_EQ(m->WindowKeepFrom(110), 0u);
  EXPECT_EQ(m->WindowKeepFrom(111), 32u);
  EXPECT_EQ(m->WindowKeepFrom(142), 32u);
  EXPECT_EQ(m->WindowKeepFrom(143), 64u);
  EXPECT_EQ(m->WindowKeepFrom(400), 320u);
}

TEST(HybridWindowBlocks, SingleTokensMatchContiguous) {
  for (uint32_t slack : {16u, 32u}) {
    SCOPED_TRACE(slack);
    Pair p = MakePair(slack);
    const SequenceCache& group = *p.paged.group_cache(HybridModel::kBoundedGroup);
    for (uint32_t n = 0; n < 400; ++n) {
      const std::vector<uint32_t> before(group.block_table().begin(), group.block_table().end());
      ASSERT_TRUE(AppendAll(p.paged, 1, n, 1).ok());
      ASSERT_TRUE(AppendAll(p.ref, 1, n, 1).ok());
      // No row moved: the blocks that stayed are the same blocks.
      const uint32_t dropped = (p.model->WindowKeepFrom(n + 1) - p.model->WindowKeepFrom(n)) / kBlock;
      ASSERT_GT(group.block_table().size(), 0u);
      if (!before.empty()) {
        ASSERT_EQ(group.block_table()[0], before[dropped]);
      }
      ExpectSame(p.paged, p.ref, 1, "single");
      ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(HybridWindowBlocks, ChunksMatchContiguous) {
  for (uint32_t slack : {16u, 32u}) {
    SCOPED_TRACE(slack);
    Pair p = MakePair(slack);
    uint32_t n = 0;
    for (uint32_t i = 0; n < 400; ++i) {
      const uint32_t chunk = 1 + (i * 7) % (kL + 1);  // 1 .. L + 1
      ASSERT_TRUE(AppendAll(p.paged, 2, n, chunk).ok());
      ASSERT_TRUE(AppendAll(p.ref, 2, n, chunk).ok());
      n += chunk;
      ExpectSame(p.paged, p.ref, chunk, "chunk");
      ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
      if (HasFatalFailure()) return;
    }
  }
}

// A forward pass appends one layer and attends it before the next layer:
// the window layers before the group's last keep their older rows until
// it is appended, which attention does not read.
// Window 64 keeps every row in one of attention's 512-row segments; window
// 512 does not, and the rows a layer ahead of its group still holds would
// shift the segments if attention read them.
class HybridWindowBlocksLayers : public ::testing::TestWithParam<uint32_t> {};

TEST_P(HybridWindowBlocksLayers, LayerByLayerAttentionMatchesContiguous) {
  const uint32_t window = GetParam();
  Pair p = MakePair(16, window);
  uint32_t n = 0;
  for (uint32_t i = 0; n < window + 250; ++i) {
    const uint32_t chunk = i % 5 == 0 ? 1 + (i % (kL + 1)) : 1;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (HybridSequence* s : {&p.paged, &p.ref}) {
        ASSERT_TRUE(s->AppendLayer(l, {.k = LayerRows(3, l, n, chunk, 0),
                                       .v = LayerRows(3, l, n, chunk, 1)})
                        .ok());
      }
      ASSERT_TRUE(p.paged.CheckInvariants().ok()) << p.paged.CheckInvariants().ToString();
      ASSERT_TRUE(SameBits(AttendBits(p.paged, l, chunk), AttendBits(p.ref, l, chunk)))
          << "layer " << l << " at length " << n + chunk;
      if (l == 1 && i % 11 == 3) {
        // A contiguous clone of the uneven state compacts like the contiguous layout.
        auto clone = p.paged.Clone();
        ASSERT_TRUE(clone.ok());
        ASSERT_TRUE(clone->CheckInvariants().ok()) << clone->CheckInvariants().ToString();
        ASSERT_TRUE(Take(*clone) == Take(p.ref));
      }
    }
    n += chunk;
    ExpectSame(p.paged, p.ref, chunk, "layer by layer");
    ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, HybridWindowBlocksLayers, ::testing::Values(64u, 512u));

TEST(HybridWindowBlocks, DraftsTruncateForksMatchContiguous) {
  for (uint32_t slack : {16u, 32u}) {
    SCOPED_TRACE(slack);
    Pair p = MakePair(slack);
    uint32_t n = 0;
    for (uint32_t i = 0; n < 360; ++i) {
      const uint32_t step = 1 + i % 3;
      ASSERT_TRUE(AppendAll(p.paged, 4, n, step).ok());
      ASSERT_TRUE(AppendAll(p.ref, 4, n, step).ok());
      n += step;
      if (i % 4 == 1) {
        // A draft of up to 8 tokens; commit some (the kept ones are the
        // stream's next tokens), or abort.
        const uint32_t drafted = 1 + i % 8, accepted = i % 8 == 5 ? 0 : (i * 3) % (drafted + 1);
        for (HybridSequence* s : {&p.paged, &p.ref}) {
          ASSERT_TRUE(s->BeginDraft().ok());
          ASSERT_TRUE(AppendAll(*s, 4, n, drafted).ok());
          ASSERT_TRUE(s->CheckInvariants().ok());
        }
        ExpectSame(p.paged, p.ref, 1, "in draft");
        for (HybridSequence* s : {&p.paged, &p.ref}) {
          ASSERT_TRUE((accepted == 0 && i % 8 == 5 ? s->Abort() : s->Commit(accepted)).ok());
        }
        n += accepted;
        ExpectSame(p.paged, p.ref, 1, "after draft");
        ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
      }
      if (i % 9 == 4) {
        // Truncation by a few tokens, where the window allows it (both
        // layouts answer alike).
        const uint32_t to = n - std::min<uint32_t>(n - 1, 1 + i % 5);
        const Status a = p.paged.Truncate(to), b = p.ref.Truncate(to);
        ASSERT_EQ(a.code(), b.code()) << a.ToString() << " / " << b.ToString();
        if (a.ok()) n = to;
        ExpectSame(p.paged, p.ref, 1, "truncate");
        ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
      }
      if (i % 13 == 6) {
        // Forks go their own way; each matches the contiguous copy.
        auto fp = p.paged.Fork();
        auto fr = p.ref.Fork();
        ASSERT_TRUE(fp.ok() && fr.ok());
        uint32_t m = n;
        for (uint32_t j = 0; j < 40; ++j) {
          ASSERT_TRUE(AppendAll(*fp, 9, m, 1 + j % 2).ok());
          ASSERT_TRUE(AppendAll(*fr, 9, m, 1 + j % 2).ok());
          m += 1 + j % 2;
          ExpectSame(*fp, *fr, 1, "fork");
        }
        ExpectSame(p.paged, p.ref, 1, "parent of a fork");
        fp->Release();
        ExpectWindowBlocks(p.paged, *p.pools[HybridModel::kBoundedGroup]);
      }
      ExpectSame(p.paged, p.ref, step, "step");
      if (HasFatalFailure()) return;
    }
  }
}

// A appends P tokens, names its blocks and is released; B adopts them and
// continues exactly as A' (A made again and never released).
TEST(HybridWindowBlocks, AdoptedPrefixContinuesAsItsSource) {
  const auto model = Model(16);
  auto pools = model->CreatePools(std::vector<uint32_t>{64, 64});
  ASSERT_TRUE(pools.ok());
  const BlockPool& full_pool = *(*pools)[HybridModel::kFullGroup];
  const BlockPool& window_pool = *(*pools)[HybridModel::kBoundedGroup];
  for (uint32_t P : {48u, 160u, 208u}) {
    SCOPED_TRACE(P);
    const uint32_t keep_from = model->WindowKeepFrom(P);
    auto a = HybridSequence::CreatePaged(model, *pools);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(AppendAll(*a, 6, 0, P).ok());
    const SequenceCache& af = *a->group_cache(HybridModel::kFullGroup);
    const SequenceCache& aw = *a->group_cache(HybridModel::kBoundedGroup);
    const std::vector<uint32_t> full_blocks(af.block_table().begin(), af.block_table().end());
    const std::vector<uint32_t> window_blocks(aw.block_table().begin(), aw.block_table().end());
    ASSERT_EQ(full_blocks.size(), P / kBlock);
    ASSERT_EQ(window_blocks.size(), (P - keep_from) / kBlock);
    // The same made-up hash chain names block j of either group.
    auto hash = [&](uint32_t j) { return 9000 + 1000 * uint64_t{P} + j; };
    for (uint32_t j = 0; j < full_blocks.size(); ++j) {
      EXPECT_EQ(*a->BlockFirstPosition(HybridModel::kFullGroup, j), j * kBlock);
      ASSERT_TRUE(a->SetBlockHash(HybridModel::kFullGroup, j, hash(j)).ok());
    }
    for (uint32_t j = 0; j < window_blocks.size(); ++j) {
      const uint32_t first = *a->BlockFirstPosition(HybridModel::kBoundedGroup, j);
      EXPECT_EQ(first, keep_from + j * kBlock);
      ASSERT_TRUE(a->SetBlockHash(HybridModel::kBoundedGroup, j, hash(first / kBlock)).ok());
    }
    const auto full_cal = af.calibration(), window_cal = aw.calibration();
    a->Release();
    EXPECT_EQ(window_pool.num_used_blocks(), 0u);

    auto b = HybridSequence::CreatePaged(model, *pools);
    ASSERT_TRUE(b.ok());
    for (uint32_t j = 0; j < full_blocks.size(); ++j) {
      ASSERT_TRUE((*pools)[0]->RetainCached(full_blocks[j], hash(j)));
    }
    for (uint32_t j = 0; j < window_blocks.size(); ++j) {
      ASSERT_TRUE((*pools)[1]->RetainCached(window_blocks[j], hash(keep_from / kBlock + j)));
    }
    const PoolStats fs = full_pool.stats(), ws = window_pool.stats();
    // Wrong window block counts: nothing changes, the references stay ours.
    for (size_t bad : {window_blocks.size() - 1, window_blocks.size() + 1}) {
      std::vector<uint32_t> w(window_blocks);
      w.resize(bad, window_blocks[0]);
      EXPECT_EQ(b->AdoptPrefix(full_blocks, full_cal, w, window_cal).code(),
                StatusCode::kInvalidArgument);
      EXPECT_EQ(b->num_tokens(), 0u);
      EXPECT_EQ(full_pool.stats().used_blocks, fs.used_blocks);
      EXPECT_EQ(window_pool.stats().used_blocks, ws.used_blocks);
    }
    // A calibration of the wrong size, and a block nobody holds.
    auto bad_cal = std::make_shared<Calibration>();
    bad_cal->transforms.resize(3);
    EXPECT_EQ(b->AdoptPrefix(full_blocks, full_cal, window_blocks, bad_cal).code(),
              StatusCode::kInvalidArgument);
    std::vector<uint32_t> unheld(window_blocks);
    for (uint32_t id = 0; id < window_pool.num_blocks(); ++id) {
      if (window_pool.refcount(id) == 0) {
        unheld.back() = id;
        break;
      }
    }
    EXPECT_EQ(b->AdoptPrefix(full_blocks, full_cal, unheld, window_cal).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(b->num_tokens(), 0u);
    EXPECT_TRUE(b->group_cache(HybridModel::kFullGroup)->block_table().empty());
    EXPECT_TRUE(b->group_cache(HybridModel::kBoundedGroup)->block_table().empty());
    EXPECT_EQ(window_pool.stats().used_blocks, ws.used_blocks);
    EXPECT_EQ(full_pool.stats().used_blocks, fs.used_blocks);

    ASSERT_TRUE(b->AdoptPrefix(full_blocks, full_cal, window_blocks, window_cal).ok());
    EXPECT_EQ(b->num_tokens(), P);
    ASSERT_TRUE(b->CheckInvariants().ok()) << b->CheckInvariants().ToString();
    // Not empty any more.
    EXPECT_EQ(b->AdoptPrefix(full_blocks, full_cal, window_blocks, window_cal).code(),
              StatusCode::kFailedPrecondition);

    auto a2 = HybridSequence::CreatePaged(model, *pools);
    ASSERT_TRUE(a2.ok());
    ASSERT_TRUE(AppendAll(*a2, 6, 0, P).ok());
    ExpectSame(*b, *a2, 1, "adopted");
    uint32_t n = P;
    for (uint32_t i = 0; n < P + 150; ++i) {
      const uint32_t chunk = 1 + (i * 5) % (kL + 1);
      ASSERT_TRUE(AppendAll(*b, 7, n, chunk).ok());
      ASSERT_TRUE(AppendAll(*a2, 7, n, chunk).ok());
      n += chunk;
      ExpectSame(*b, *a2, chunk, "after adoption");
      if (HasFatalFailure()) return;
    }
    b->Release();
    a2->Release();
    EXPECT_TRUE(full_pool.CheckInvariants().ok());
    EXPECT_TRUE(window_pool.CheckInvariants().ok());
  }
}

TEST(HybridWindowBlocks, AdoptionRefusals) {
  const auto sinks = Model(16, /*sinks=*/4);
  auto pools = sinks->CreatePools(std::vector<uint32_t>{8, 8});
  ASSERT_TRUE(pools.ok());
  auto s = HybridSequence::CreatePaged(sinks, *pools);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->AdoptPrefix({}, nullptr, {}, nullptr).code(), StatusCode::kFailedPrecondition);
  const auto aligned = Model(16);
  auto c = HybridSequence::CreateContiguous(aligned);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->AdoptPrefix({}, nullptr, {}, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->SetBlockHash(HybridModel::kFullGroup, 0, 1).code(), StatusCode::kFailedPrecondition);
  const auto linear = Model(16, 0, /*with_linear=*/true);
  auto lpools = linear->CreatePools(std::vector<uint32_t>{8, 8});
  ASSERT_TRUE(lpools.ok());
  auto l = HybridSequence::CreatePaged(linear, *lpools);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->AdoptPrefix({}, nullptr, {}, nullptr).code(), StatusCode::kFailedPrecondition);
  // Naming: bad groups, drafts.
  auto apools = aligned->CreatePools(std::vector<uint32_t>{8, 8});
  ASSERT_TRUE(apools.ok());
  auto p = HybridSequence::CreatePaged(aligned, *apools);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(AppendAll(*p, 8, 0, 20).ok());
  EXPECT_EQ(p->SetBlockHash(2, 0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->BlockFirstPosition(-1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->BlockFirstPosition(HybridModel::kBoundedGroup, 1).status().code(),
            StatusCode::kFailedPrecondition);  // partial
  ASSERT_TRUE(p->BeginDraft().ok());
  EXPECT_EQ(p->SetBlockHash(HybridModel::kFullGroup, 0, 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->Abort().ok());
  EXPECT_TRUE(p->SetBlockHash(HybridModel::kFullGroup, 0, 1).ok());
}

}  // namespace
}  // namespace kvcache
