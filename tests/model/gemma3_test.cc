// The gemma3 family on a small random model (tests/model/gemma3_gguf.h):
// the loader's config and bad input, the sliding-window KV backends against
// a plain masked attention written here (off by one in either direction
// fails), and the decoder's exactness proofs on the hybrid cache: cached
// decoding equals a whole-text pass, chunked prefill equals token by token,
// paged equals contiguous, batches change no bit, and the scalar reference
// agrees to float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gemma3_gguf.h"
#include "kv_logits.h"
#include "model/arch/gemma3.h"
#include "model/tensor/activations.h"
#include "model/decoder/decoder.h"
#include "model/decoder/gguf_model.h"
#include "model/kv/cache_kv.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_factory.h"
#include "model/kv/naive_kv.h"

namespace kvcache::model {
namespace {

using testing::TinyGemma3;
using testing::TinyGemma3Gguf;

Result<Model> LoadTiny(const TinyGemma3& m = {}, const GgufLoadOptions& o = {}) {
  KV_ASSIGN_OR_RETURN(auto file, GgufFile::FromBytes(TinyGemma3Gguf(m), "tiny-gemma3.gguf"));
  return ModelFromGguf(std::shared_ptr<const GgufFile>(std::move(file)), o);
}

std::vector<int32_t> Tokens(size_t n, uint32_t vocab, uint64_t seed = 3) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(Gemma3, LoadsItsConfigAndLayers) {
  auto m = LoadTiny();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.family, ModelFamily::kGemma3);
  EXPECT_EQ(c.head_dim(), 32u);
  EXPECT_EQ(c.q_dim(), 128u);
  EXPECT_EQ(c.kv_dim(), 32u);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.sliding_window, 8u);
  EXPECT_EQ(m->layer(0).q_norm.size(), 32u);
  EXPECT_EQ(m->layer(0).post_ffn_norm.size(), 64u);
  EXPECT_EQ(m->classifier().data, m->embedding().data);  // tied
  Decoder d(*m);
  const AttentionShape shape = d.attention_shape();
  ASSERT_EQ(shape.windows.size(), 6u);
  for (uint32_t l = 0; l < 6; ++l) EXPECT_EQ(shape.window(l), l == 5 ? 0u : 8u) << l;
  auto arch = MakeArchitecture(*m);
  EXPECT_EQ(arch->Layer(0).rope.base, 10000.0f);
  EXPECT_EQ(arch->Layer(5).rope.base, 1e6f);
  EXPECT_EQ(arch->Layer(0).rope.pairs, RopePairs::kHalves);
  EXPECT_NE(c.ToString().find("gemma3"), std::string::npos);
}

TEST(Gemma3, RefusesBadInputNamingIt) {
  TinyGemma3 other;
  other.architecture = "mamba";
  auto m = LoadTiny(other);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("mamba"), std::string::npos) << m.status().ToString();
  TinyGemma3 wide;
  wide.window = 2000;  // larger than the context of 1536
  m = LoadTiny(wide);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("window"), std::string::npos) << m.status().ToString();
  GgufLoadOptions longer;
  longer.max_seq_len = 1537;
  m = LoadTiny({}, longer);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("1537"), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("1536"), std::string::npos) << m.status().ToString();
  // A capacity below the window is fine (the window then covers every position).
  GgufLoadOptions shorter;
  shorter.max_seq_len = 4;
  EXPECT_TRUE(LoadTiny({}, shorter).ok());
  // A backend made without the model's windows is refused by the decoder.
  auto ok = LoadTiny();
  ASSERT_TRUE(ok.ok());
  Decoder d(*ok);
  AttentionShape plain = d.attention_shape();
  plain.windows.clear();
  auto kv = CreateKvBackend(plain, {});
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits(d.config().vocab_size);
  const int32_t token = 5;
  const Status s = d.Forward(std::span<const int32_t>(&token, 1), **kv, logits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("window"), std::string::npos) << s.ToString();
  EXPECT_EQ((*kv)->num_tokens(), 0u);
  // A plain CacheKv cannot bound a window layer and says so.
  CacheKvOptions co;
  EXPECT_EQ(CacheKv::Create(d.attention_shape(), co).status().code(), StatusCode::kInvalidArgument);
}

TEST(Gemma3, GeluIsTheTanhApproximation) {
  EXPECT_FLOAT_EQ(GeluTanhScalar(0.0f), 0.0f);
  EXPECT_NEAR(GeluTanhScalar(1.0f), 0.841192f, 1e-5f);
  EXPECT_NEAR(GeluTanhScalar(-2.0f), -0.0454023f, 1e-5f);
}

// Plain attention of one query head over positions [first, pos] of one kv
// head's rows, in double.
void MaskedReference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                     uint32_t hd, uint32_t pos, uint32_t first, float* out) {
  std::vector<double> s(pos + 1 - first);
  double mx = -1e300;
  for (uint32_t p = first; p <= pos; ++p) {
    double dot = 0;
    for (uint32_t i = 0; i < hd; ++i) dot += double{q[i]} * k[size_t{p} * hd + i];
    s[p - first] = dot / std::sqrt(static_cast<double>(hd));
    mx = std::max(mx, s[p - first]);
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (uint32_t i = 0; i < hd; ++i) {
    double acc = 0;
    for (uint32_t p = first; p <= pos; ++p) acc += s[p - first] / sum * v[size_t{p} * hd + i];
    out[i] = static_cast<float>(acc);
  }
}

// One window layer (W = 8) and one full layer, 2 q heads on 1 kv head of 16:
// every position's output equals masked attention over exactly the last W
// positions, for the naive and hybrid backends in both layouts, fed token by
// token and in chunks of 3.
TEST(SlidingWindow, EveryPositionSeesExactlyItsLastWPositions) {
  constexpr uint32_t kW = 8, kHd = 16, kN = 40;
  AttentionShape shape{2, 2, 1, kHd, 64, {kW, 0}};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> k(kN * kHd), v(kN * kHd), q(kN * 2 * kHd);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = 2.0f * nd(rng);
  struct Case {
    const char* name;
    KvBackendOptions options;
  };
  std::vector<Case> cases(3);
  cases[0] = {"naive", {}};
  cases[0].options.kind = BackendKind::kNaive;
  cases[1] = {"hybrid contiguous", {}};
  cases[2] = {"hybrid paged", {}};
  cases[2].options.layout = CacheLayout::kPaged;
  cases[2].options.block_size = 4;
  for (const Case& c : cases) {
    for (uint32_t chunk : {1u, 3u}) {
      KvBackendOptions o = c.options;
      o.max_chunk_tokens = chunk;
      auto kv = CreateKvBackend(shape, o);
      ASSERT_TRUE(kv.ok()) << c.name << ": " << kv.status().ToString();
      EXPECT_EQ((*kv)->window(0), kW);
      EXPECT_EQ((*kv)->window(1), 0u);
      std::vector<float> out(kN * 2 * kHd), ref(kHd), off_by_one(kHd);
      for (uint32_t t0 = 0; t0 < kN; t0 += chunk) {
        const uint32_t n = std::min(chunk, kN - t0);
        ASSERT_TRUE((*kv)->Extend(n).ok());
        for (uint32_t l = 0; l < 2; ++l) {
          std::span<const float> ks(k.data() + size_t{t0} * kHd, size_t{n} * kHd);
          std::span<const float> vs(v.data() + size_t{t0} * kHd, size_t{n} * kHd);
          ASSERT_TRUE((*kv)->Store(l, ks, vs).ok());
          std::vector<float> o_l(size_t{n} * 2 * kHd);
          ASSERT_TRUE((*kv)->Attend(l, std::span<const float>(q.data() + size_t{t0} * 2 * kHd, o_l.size()), o_l).ok())
              << c.name;
          if (l == 0) std::copy(o_l.begin(), o_l.end(), out.begin() + size_t{t0} * 2 * kHd);
        }
      }
      // The largest difference to the exact window, and to windows one
      // position shorter and longer (which must show somewhere).
      float worst = 0, shorter = 0, longer = 0;
      for (uint32_t pos = 0; pos < kN; ++pos) {
        for (uint32_t h = 0; h < 2; ++h) {
          std::vector<float> qh(q.begin() + (size_t{pos} * 2 + h) * kHd, q.begin() + (size_t{pos} * 2 + h + 1) * kHd);
          const uint32_t first = pos + 1 > kW ? pos + 1 - kW : 0;
          MaskedReference(qh, k, v, kHd, pos, first, ref.data());
          float diff = 0;
          for (uint32_t i = 0; i < kHd; ++i) {
            diff = std::max(diff, std::fabs(ref[i] - out[(size_t{pos} * 2 + h) * kHd + i]));
          }
          worst = std::max(worst, diff);
          // Windows of W - 1 and W + 1 give other outputs once they differ.
          if (pos >= kW) {
            for (float* off : {&longer, &shorter}) {
              MaskedReference(qh, k, v, kHd, pos, off == &longer ? first - 1 : first + 1, off_by_one.data());
              for (uint32_t i = 0; i < kHd; ++i) {
                *off = std::max(*off, std::fabs(off_by_one[i] - out[(size_t{pos} * 2 + h) * kHd + i]));
              }
            }
          }
        }
      }
      EXPECT_LT(worst, 2e-5f) << c.name << " chunk " << chunk;
      EXPECT_GT(shorter, 1e-2f) << c.name << " chunk " << chunk;
      EXPECT_GT(longer, 1e-2f) << c.name << " chunk " << chunk;
    }
  }
}

// A window layer's blocks go back to its pool as the window moves; the
// full layer's pool keeps every position.
TEST(SlidingWindow, PagedWindowGroupHoldsOnlyItsWindow) {
  constexpr uint32_t kW = 8, kHd = 16, kB = 4, kN = 60;
  AttentionShape shape{2, 1, 1, kHd, 64, {kW, 0}};
  HybridKvOptions o;
  o.layout = CacheLayout::kPaged;
  o.block_size = kB;
  o.max_chunk_tokens = 1;
  o.window_slack_tokens = kB;
  auto kv = HybridKv::Create(shape, o);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  std::vector<float> row(kHd, 0.5f), out(kHd);
  for (uint32_t t = 0; t < kN; ++t) {
    ASSERT_TRUE((*kv)->Extend(1).ok());
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_TRUE((*kv)->Store(l, row, row).ok());
      ASSERT_TRUE((*kv)->Attend(l, row, out).ok());
    }
  }
  const HybridSequence& seq = (*kv)->sequence();
  ASSERT_NE(seq.group_cache(HybridModel::kBoundedGroup), nullptr);
  // Window 8 + slack (the block size) - 1 positions at most: 3 or 4 blocks.
  EXPECT_LE(seq.head_len(0, 0), kW + kB - 1);
  EXPECT_GE(seq.head_len(0, 0), kW);
  EXPECT_EQ(seq.head_len(1, 0), kN);
  EXPECT_TRUE(seq.CheckInvariants().ok());
}

class Gemma3Decoder : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadTiny();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::make_unique<Model>(std::move(m).value());
  }
  std::unique_ptr<Model> model_;
};

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(Gemma3Decoder, CachedDecodingChunksPagedAndBatchesAreExact) {
  Decoder d(*model_);
  const auto tokens = Tokens(70, d.config().vocab_size);  // many windows of 8
  KvBackendOptions contiguous;
  contiguous.max_chunk_tokens = 70;
  const std::vector<float> one = testing::KvLogits(d, contiguous, tokens, 1);
  ASSERT_FALSE(one.empty());
  // The whole text in one pass (a full recomputation of every position).
  const std::vector<float> whole = testing::KvLogits(d, contiguous, tokens, 70);
  EXPECT_EQ(one, whole);
  for (uint32_t chunk : {5u, 16u}) {
    EXPECT_EQ(testing::KvLogits(d, contiguous, tokens, chunk), one) << "chunk " << chunk;
  }
  KvBackendOptions paged = contiguous;
  paged.layout = CacheLayout::kPaged;
  paged.block_size = 4;
  EXPECT_EQ(testing::KvLogits(d, paged, tokens, 1), one);
  EXPECT_EQ(testing::KvLogits(d, paged, tokens, 7), one);
  // The scalar reference (masking every row) agrees to float rounding.
  KvBackendOptions naive;
  naive.kind = BackendKind::kNaive;
  EXPECT_LT(MaxDiff(testing::KvLogits(d, naive, tokens, 1), one), 1e-3f);
  // Batch invariance: two sequences in one pass, each as if alone, and
  // with two threads.
  Decoder d2(*model_, 2);
  auto a = CreateKvBackend(d.attention_shape(), paged);
  auto b = CreateKvBackend(d.attention_shape(), paged);
  ASSERT_TRUE(a.ok() && b.ok());
  const uint32_t vocab = d.config().vocab_size;
  const auto other = Tokens(30, vocab, 9);
  std::vector<float> logits(2 * vocab);
  for (size_t i = 0; i < other.size(); ++i) {
    const BatchItem items[2] = {{std::span<const int32_t>(tokens).subspan(i, 1), a->get(), false},
                                {std::span<const int32_t>(other).subspan(i, 1), b->get(), false}};
    ASSERT_TRUE(d2.ForwardBatch(items, logits).ok()) << i;
    ASSERT_EQ(0, std::memcmp(logits.data(), one.data() + i * vocab, vocab * sizeof(float))) << "position " << i;
  }
}

// Past the window slack (512 rows) the window heads drop their oldest rows
// while the text goes on: chunked prefill, token by token and both layouts
// still give the same bits, because the first stored position stays a
// multiple of attention's 512-row segments.
TEST_F(Gemma3Decoder, ChunkingStaysExactWhileWindowsDropRows) {
  Decoder d(*model_);
  const auto tokens = Tokens(1300, d.config().vocab_size);
  KvBackendOptions contiguous;
  contiguous.max_chunk_tokens = 16;
  const std::vector<float> one = testing::KvLogits(d, contiguous, tokens, 1);
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(testing::KvLogits(d, contiguous, tokens, 16), one);
  KvBackendOptions paged = contiguous;
  paged.layout = CacheLayout::kPaged;
  paged.block_size = 16;
  EXPECT_EQ(testing::KvLogits(d, paged, tokens, 5), one);
  // A slack of one block saves memory; its chunks then sum their windows in
  // other segments (not exact), but stay within float rounding.
  KvBackendOptions small = paged;
  small.window_slack_tokens = 16;
  const std::vector<float> tight = testing::KvLogits(d, small, tokens, 5);
  EXPECT_LT(MaxDiff(tight, one), 1e-4f);
}

TEST_F(Gemma3Decoder, PerGroupFormatsAndBadStrings) {
  Decoder d(*model_);
  auto o = ParseKvBackendOptions("global=q8_0+s2+r4,local=bf16", "paged", "cache", 4);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_TRUE(o->local_formats.has_value());
  EXPECT_EQ(o->local_formats->k, Format::kBF16);
  EXPECT_EQ(o->formats.k, Format::kQ8_0);
  EXPECT_EQ(o->window.recent, 4u);
  auto kv = CreateKvBackend(d.attention_shape(), *o);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  const auto tokens = Tokens(30, d.config().vocab_size);
  KvBackendOptions f32;
  f32.layout = CacheLayout::kPaged;
  const std::vector<float> exact = testing::KvLogits(d, f32, tokens, 1);
  const std::vector<float> mixed = testing::KvLogits(d, *o, tokens, 1);
  const float diff = MaxDiff(exact, mixed);
  EXPECT_GT(diff, 0.0f);  // the local layers really are bf16
  EXPECT_LT(diff, 0.1f);
  for (const char* bad : {"global=f32", "local=bf16", "global=f32,local=bf16,global=q8_0", "middle=f32,local=bf16",
                          "global=f32,local=bf16+r4", "global=nope,local=bf16"}) {
    auto r = ParseKvBackendOptions(bad, "paged", "cache", 16);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Local formats for a model without window layers are refused.
  AttentionShape full = d.attention_shape();
  full.windows.clear();
  EXPECT_EQ(CreateKvBackend(full, *o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvcache::model

namespace kvcache::model {
namespace {

// Gemma 3 270M's attention geometry (18 layers, 5 of 6 with a window of 512,
// 1 kv head of 256): after appending 3000 positions in chunks of 64, each
// group's pool holds what BlocksPerSequence (kvcache info --model) predicts,
// within one block, and BlocksAt says exactly what it holds at that length.
TEST(SlidingWindow, PoolUseMatchesThePrediction) {
  // 2622 = W + L + G - 1 + 3G: the window group at its largest.
  constexpr uint32_t kLayers = 18, kHd = 256, kN = 2622, kChunk = 64;
  AttentionShape shape{kLayers, 4, 1, kHd, 32768, {}};
  shape.windows.resize(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) shape.windows[l] = (l + 1) % 6 != 0 ? 512 : 0;
  HybridKvOptions o;
  o.formats = {Format::kBF16, Format::kBF16};
  o.bounded_formats = FormatPair{Format::kQ8_0, Format::kQ8_0};
  o.layout = CacheLayout::kPaged;
  o.max_chunk_tokens = kChunk;
  auto model = HybridKv::MakeModel(shape, o);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const uint32_t blocks[2] = {4096, 4096};
  auto pools = (*model)->CreatePools(blocks);
  ASSERT_TRUE(pools.ok()) << pools.status().ToString();
  o.pools = *pools;
  auto kv = HybridKv::Create(shape, o);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t{kChunk} * kHd), v(k.size()), q(size_t{kChunk} * 4 * kHd), out(q.size());
  for (uint32_t t0 = 0; t0 < kN; t0 += kChunk) {
    const uint32_t n = std::min(kChunk, kN - t0);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    ASSERT_TRUE((*kv)->Extend(n).ok());
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE((*kv)->Store(l, std::span<const float>(k).first(size_t{n} * kHd),
                               std::span<const float>(v).first(size_t{n} * kHd)).ok());
    }
  }
  for (int g = 0; g < 2; ++g) {
    const uint64_t predicted = HybridKv::BlocksPerSequence(**model, g, kN);
    const uint64_t used = (*pools)[g]->num_used_blocks();
    EXPECT_LE(used, predicted) << "group " << g;
    EXPECT_GE(used + 1, predicted) << "group " << g;
    EXPECT_EQ(used, HybridKv::BlocksAt(**model, g, kN)) << "group " << g;
  }
  EXPECT_EQ(HybridKv::BlocksPerSequence(**model, HybridModel::kBoundedGroup, kN), (512 + 63 + 511 + 15) / 16);
  EXPECT_EQ((*pools)[HybridModel::kFullGroup]->num_used_blocks(), (kN + 15) / 16);
}

}  // namespace
}  // namespace kvcache::model
