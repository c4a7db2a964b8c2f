// A precision window's sink rows travel with an adopted prefix (cache.h,
// WindowSinks): a sequence that adopts blocks covering the sinks with the
// WindowSinks of the sequence that computed them holds the very same bf16
// rows, so HeadKeys / HeadValues and attention read exactly what the
// computing sequence reads; a window they do not fit (other sinks, other
// formats, a prefix shorter than the sinks) adopts the blocks alone, as
// without them; sinks of the wrong size or geometry are refused and change
// nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"

namespace kvcache {
namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 64, kQHeads = 4, kBlock = 8;
constexpr FormatPair kTurbo4{Format::kTurbo4, Format::kTurbo4};

std::shared_ptr<BlockPool> Pool(FormatPair f = kTurbo4, uint32_t blocks = 32) {
  BlockPoolOptions o;
  o.num_blocks = blocks;
  o.huge_pages = false;
  return BlockPool::Create(Geometry::Create({kLayers, kHeads, kDim, kBlock}).value(), f, o).value();
}

// n positions of random rows for every layer: [n_layers][n][kv heads][head_dim].
struct Rows {
  std::vector<float> k, v;
};
Rows RandomRows(std::mt19937& rng, uint32_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Rows r;
  r.k.resize(size_t{kLayers} * n * kHeads * kDim);
  r.v.resize(r.k.size());
  for (float& x : r.k) x = nd(rng);
  for (float& x : r.v) x = nd(rng);
  return r;
}

// The computing sequence: `n` positions appended, its full blocks named.
SequenceCache Computed(const std::shared_ptr<BlockPool>& pool, PrecisionWindow w, const Rows& rows,
                       uint32_t n) {
  SequenceCache s = SequenceCache::CreatePaged(pool, {.window = w}).value();
  EXPECT_TRUE(s.Append(rows.k, rows.v).ok());
  EXPECT_EQ(s.num_tokens(), n);
  for (uint32_t b = 0; b < n / kBlock; ++b) EXPECT_TRUE(s.SetBlockHash(b, 1000 + b).ok());
  return s;
}

// An empty sequence with window `w` adopting the first `n_blocks` of `from`'s
// blocks (the caller's references taken here), with `sinks`.
Result<SequenceCache> Adopted(const SequenceCache& from, PrecisionWindow w, size_t n_blocks,
                              std::shared_ptr<const WindowSinks> sinks) {
  KV_ASSIGN_OR_RETURN(SequenceCache s, SequenceCache::CreatePaged(from.pool(), {.window = w}));
  const std::vector<uint32_t> blocks(from.block_table().begin(),
                                     from.block_table().begin() + static_cast<ptrdiff_t>(n_blocks));
  KV_RETURN_IF_ERROR(from.pool()->Retain(blocks));
  Status st = s.AdoptPrefix(blocks, from.calibration(), std::move(sinks));
  if (!st.ok()) {
    (void)from.pool()->Release(blocks);
    return st;
  }
  return s;
}

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

// Decoded rows of positions [0, n) of every layer, head and side.
void ExpectSameRows(const SequenceCache& a, const SequenceCache& b, uint32_t n) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      EXPECT_TRUE(SameFloats(a.HeadKeys(l, h).value(), b.HeadKeys(l, h).value(), size_t{n} * kDim))
          << "layer " << l << " head " << h;
      EXPECT_TRUE(SameFloats(a.HeadValues(l, h).value(), b.HeadValues(l, h).value(), size_t{n} * kDim))
          << "layer " << l << " head " << h;
    }
  }
}

// AttendDecode of one query per layer: output and lse bit for bit.
void ExpectSameAttention(const SequenceCache& a, const SequenceCache& b, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(size_t{kQHeads} * kDim);
  for (float& x : q) x = nd(rng);
  AttentionOptions o;
  o.n_q_heads = kQHeads;
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> out_a(q.size()), out_b(q.size()), lse_a(kQHeads), lse_b(kQHeads);
    ASSERT_TRUE(AttendDecode(a.View(l).value(), q, o, {out_a, lse_a, {}, {}}).ok());
    ASSERT_TRUE(AttendDecode(b.View(l).value(), q, o, {out_b, lse_b, {}, {}}).ok());
    EXPECT_EQ(out_a, out_b) << "layer " << l;
    EXPECT_EQ(lse_a, lse_b) << "layer " << l;
  }
}

// The same n random rows appended to both: then the first `same` rows and
// the attention over them still agree.
void AppendToBothAndCompare(SequenceCache& a, SequenceCache& b, std::mt19937& rng, uint32_t n, uint32_t same) {
  const Rows next = RandomRows(rng, n);
  ASSERT_TRUE(a.Append(next.k, next.v).ok());
  ASSERT_TRUE(b.Append(next.k, next.v).ok());
  ASSERT_TRUE(b.CheckInvariants().ok());
  ExpectSameRows(a, b, same);
  ExpectSameAttention(a, b, rng);
}

TEST(WindowSinks, ComputedSequenceExportsItsSinksOnceComplete) {
  auto pool = Pool();
  std::mt19937 rng(3);
  const PrecisionWindow w{.sinks = 4, .recent = 8};
  SequenceCache s = SequenceCache::CreatePaged(pool, {.window = w}).value();
  EXPECT_EQ(s.window_sinks(), nullptr);  // nothing appended yet
  const Rows first = RandomRows(rng, 3);
  ASSERT_TRUE(s.Append(first.k, first.v).ok());
  EXPECT_EQ(s.window_sinks(), nullptr);  // 3 of 4 sinks
  const Rows more = RandomRows(rng, 9);
  ASSERT_TRUE(s.Append(more.k, more.v).ok());
  auto sinks = s.window_sinks();
  ASSERT_NE(sinks, nullptr);
  EXPECT_EQ(sinks->sinks, 4u);
  EXPECT_EQ(sinks->n_layers, kLayers);
  EXPECT_EQ(sinks->n_kv_heads, kHeads);
  EXPECT_EQ(sinks->head_dim, kDim);
  EXPECT_EQ(sinks->formats, kTurbo4);
  EXPECT_TRUE(sinks->Check().ok());
  EXPECT_EQ(sinks->rows.size(), size_t{kLayers} * 2 * kHeads * 4 * RowBytes(Format::kBF16, kDim));
  EXPECT_EQ(sinks->block(kBlock), 0u);
  // The rows are the bf16 rounding of what was appended: decoding them
  // gives what HeadKeys reads for the sinks.
  const RowCodec bf16 = RowCodec::Create(Format::kBF16, kDim, Side::kKey).value();
  const size_t rb = RowBytes(Format::kBF16, kDim);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      const std::vector<float> keys = s.HeadKeys(l, h).value();
      for (uint32_t p = 0; p < 4; ++p) {
        std::vector<float> row(kDim);
        const size_t at = ((size_t{l} * 2 + 0) * kHeads + h) * 4 + p;
        ASSERT_TRUE(bf16.Decode({sinks->rows.data() + at * rb, rb}, row).ok());
        EXPECT_TRUE(std::memcmp(row.data(), keys.data() + size_t{p} * kDim, kDim * 4) == 0);
      }
    }
  }
  // Without a window, or with recent positions only, there are none.
  SequenceCache plain = SequenceCache::CreatePaged(pool).value();
  ASSERT_TRUE(plain.Append(more.k, more.v).ok());
  EXPECT_EQ(plain.window_sinks(), nullptr);
  SequenceCache recent_only = SequenceCache::CreatePaged(pool, {.window = {.recent = 8}}).value();
  ASSERT_TRUE(recent_only.Append(more.k, more.v).ok());
  EXPECT_EQ(recent_only.window_sinks(), nullptr);
}

// Sinks only: every other position is read in the format by both, so the
// adopter reads exactly the computing sequence's rows, now and after the
// same appends.
TEST(WindowSinks, AdoptedSinksReadAndAttendAsTheComputingSequence) {
  for (const FormatPair f : {kTurbo4, FormatPair{Format::kQ4_0, Format::kQ8_0}}) {
    SCOPED_TRACE(FormatPairName(f));
    auto pool = Pool(f);
    std::mt19937 rng(5);
    const PrecisionWindow w{.sinks = 4};
    const Rows rows = RandomRows(rng, 24);
    SequenceCache a = Computed(pool, w, rows, 24);
    auto sinks = a.window_sinks();
    ASSERT_NE(sinks, nullptr);
    SequenceCache b = Adopted(a, w, 3, sinks).value();
    ASSERT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants().ToString();
    // The same bf16 rows, held as the computing sequence holds them.
    auto back = b.window_sinks();
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->rows, sinks->rows);
    ExpectSameRows(a, b, 24);
    ExpectSameAttention(a, b, rng);
    // Without the sinks the adopted sinks are read in the format: other rows.
    SequenceCache c = Adopted(a, w, 3, nullptr).value();
    EXPECT_EQ(c.window_sinks(), nullptr);
    EXPECT_FALSE(SameFloats(a.HeadKeys(0, 0).value(), c.HeadKeys(0, 0).value(), 4 * kDim));
    // The same appends to both: still the same reads.
    ASSERT_NO_FATAL_FAILURE(AppendToBothAndCompare(a, b, rng, 5, 29));
    EXPECT_TRUE(pool->CheckInvariants().ok());
  }
}

// With recent positions, the recent ones inside adopted blocks are read in
// the format by the adopter (only the sinks travel); once the sequence's
// recent positions all lie past the adopted prefix, both read the same rows.
TEST(WindowSinks, WithRecentPositionsBothReadTheSameOncePastThePrefix) {
  auto pool = Pool();
  std::mt19937 rng(9);
  const PrecisionWindow w{.sinks = 4, .recent = 8, .slack = 2};
  const Rows rows = RandomRows(rng, 16);
  SequenceCache a = Computed(pool, w, rows, 16);
  SequenceCache b = Adopted(a, w, 2, a.window_sinks()).value();
  // Right after the adoption the adopter reads positions [8, 16) in the
  // format, the computing sequence in bf16; the sinks agree.
  ExpectSameRows(a, b, 4);
  EXPECT_FALSE(SameFloats(a.HeadKeys(0, 0).value(), b.HeadKeys(0, 0).value(), 16 * kDim));
  ASSERT_NO_FATAL_FAILURE(AppendToBothAndCompare(a, b, rng, 10, 26));
}

// Sinks that do not fit the window are not taken: the blocks are adopted and
// read as without them.
TEST(WindowSinks, SinksThatDoNotFitTheWindowAreLeftOut) {
  auto pool = Pool();
  std::mt19937 rng(13);
  const Rows rows = RandomRows(rng, 24);
  SequenceCache a = Computed(pool, {.sinks = 4}, rows, 24);
  auto sinks = a.window_sinks();
  ASSERT_NE(sinks, nullptr);
  auto expect_as_without = [&](PrecisionWindow w, size_t n_blocks, std::shared_ptr<const WindowSinks> s) {
    SequenceCache with = Adopted(a, w, n_blocks, s).value();
    SequenceCache without = Adopted(a, w, n_blocks, nullptr).value();
    EXPECT_EQ(with.window_sinks(), nullptr);
    ExpectSameRows(with, without, static_cast<uint32_t>(n_blocks * kBlock));
    ExpectSameAttention(with, without, rng);
    EXPECT_TRUE(with.CheckInvariants().ok());
  };
  expect_as_without({.sinks = 2}, 3, sinks);   // another S
  expect_as_without({.sinks = 8}, 3, sinks);
  expect_as_without({.recent = 8}, 3, sinks);  // no sinks at all
  auto other_formats = std::make_shared<WindowSinks>(*sinks);
  other_formats->formats = {Format::kTurbo3, Format::kTurbo3};
  expect_as_without({.sinks = 4}, 3, other_formats);
  // A cache without a window ignores them.
  {
    SequenceCache plain = SequenceCache::CreatePaged(pool).value();
    std::vector<uint32_t> blocks(a.block_table().begin(), a.block_table().end());
    ASSERT_TRUE(pool->Retain(blocks).ok());
    EXPECT_TRUE(plain.AdoptPrefix(blocks, a.calibration(), sinks).ok());
    EXPECT_EQ(plain.num_tokens(), 24u);
  }
  // A prefix shorter than the sinks: 12 sinks, one block of 8 adopted.
  SequenceCache long_sinks = Computed(pool, {.sinks = 12}, rows, 24);
  auto twelve = long_sinks.window_sinks();
  ASSERT_NE(twelve, nullptr);
  EXPECT_EQ(twelve->block(kBlock), 1u);
  {
    SequenceCache short_prefix = Adopted(long_sinks, {.sinks = 12}, 1, twelve).value();
    EXPECT_EQ(short_prefix.window_sinks(), nullptr);
    EXPECT_TRUE(short_prefix.CheckInvariants().ok());
    SequenceCache covering = Adopted(long_sinks, {.sinks = 12}, 2, twelve).value();
    ASSERT_NE(covering.window_sinks(), nullptr);
    ExpectSameRows(long_sinks, covering, 16);
  }
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Sinks of the wrong size or geometry: InvalidArgument, nothing adopted, the
// caller keeps its references.
TEST(WindowSinks, BadSinksAreRefusedAndChangeNothing) {
  auto pool = Pool();
  std::mt19937 rng(17);
  const PrecisionWindow w{.sinks = 4};
  SequenceCache a = Computed(pool, w, RandomRows(rng, 16), 16);
  auto good = a.window_sinks();
  ASSERT_NE(good, nullptr);
  std::vector<std::shared_ptr<WindowSinks>> bad;
  for (int i = 0; i < 6; ++i) bad.push_back(std::make_shared<WindowSinks>(*good));
  bad[0]->rows.pop_back();
  bad[1]->rows.push_back(0);
  bad[2]->n_layers = kLayers + 1;   // rows sized for it: the geometry is wrong
  bad[2]->rows.resize(bad[2]->expected_bytes());
  bad[3]->head_dim = kDim / 2;
  bad[3]->rows.resize(bad[3]->expected_bytes());
  bad[4]->sinks = 0;
  bad[4]->rows.clear();
  bad[5]->sinks = PrecisionWindow::kMaxSinks + 1;
  const std::vector<uint32_t> blocks(a.block_table().begin(), a.block_table().end());
  const PoolStats before = pool->stats();
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(i);
    SequenceCache b = SequenceCache::CreatePaged(pool, {.window = w}).value();
    ASSERT_TRUE(pool->Retain(blocks).ok());
    const Status st = b.AdoptPrefix(blocks, a.calibration(), bad[i]);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_FALSE(st.message().empty());
    EXPECT_EQ(b.num_tokens(), 0u);
    EXPECT_TRUE(b.block_table().empty());
    for (uint32_t block : blocks) EXPECT_EQ(pool->refcount(block), 2u);  // a's and ours
    ASSERT_TRUE(pool->Release(blocks).ok());
    // The same sequence still adopts the good ones.
    ASSERT_TRUE(pool->Retain(blocks).ok());
    ASSERT_TRUE(b.AdoptPrefix(blocks, a.calibration(), good).ok());
    ASSERT_NE(b.window_sinks(), nullptr);
  }
  EXPECT_EQ(pool->stats().used_blocks, before.used_blocks);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvcache
