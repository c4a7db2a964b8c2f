// Batch invariance of Decoder::ForwardBatch on SmolLM2-135M: a schedule of
// mixed steps (several decodes, chunked prefills of different lengths that
// cross block boundaries, a sequence that joins late and a forked one) run
// batched gives every sequence exactly -- memcmp -- the logits the same
// sequences get run alone through Forward with the same chunks, at 1 and 2
// threads (the alone reference at 1), for f32, bf16, q8_0 and turbo4 on the
// paged layout, each world on its own pool.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"
#include "model/decoder/decoder.h"
#include "model/kv/cache_kv.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::model {
namespace {

using testing::Gpl3Tokens;
using testing::SmolLm2;

// One sequence's part in a step: `take` tokens of its stream; a negative
// take forks the sequence `-take - 1` before the step runs (no tokens).
struct Part {
  int seq;
  int take;
  bool all_logits;
};
constexpr int kFork = -1;  // Part{child, kFork - parent, false}

// Sequences 0..4; 4 is forked from 0 before step 3.
const std::vector<std::vector<Part>> kSchedule = {
    {{0, 13, false}, {1, 7, true}, {2, 1, false}},
    {{0, 1, false}, {1, 6, false}, {2, 1, true}},
    {{0, 1, true}, {1, 1, false}, {2, 1, false}, {3, 9, true}},
    {{4, kFork - 0, false}, {0, 1, false}, {1, 1, false}, {2, 5, false}, {3, 1, false}, {4, 2, true}},
    {{0, 1, false}, {1, 1, false}, {2, 1, false}, {3, 4, false}, {4, 1, false}},
    {{4, 1, false}, {2, 1, false}, {0, 3, true}},
};
constexpr int kSeqs = 5;

struct World {
  std::shared_ptr<BlockPool> pool;
  std::map<int, std::unique_ptr<KvBackend>> kv;
  std::map<int, size_t> fed;                  // tokens of its stream run so far
  std::map<int, std::vector<float>> logits;  // every row it got, in order
};

std::unique_ptr<KvBackend> NewKv(const Decoder& d, const World& w, FormatPair formats) {
  CacheKvOptions o;
  o.formats = formats;
  o.layout = CacheLayout::kPaged;
  o.block_size = 16;
  o.pool = w.pool;
  auto kv = CacheKv::Create(d.attention_shape(), o);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  return kv.ok() ? std::unique_ptr<KvBackend>(std::move(*kv)) : nullptr;
}

// Runs the schedule; batched: one ForwardBatch per step, else one Forward per part.
World RunSchedule(const LoadedModel& m, FormatPair formats, uint32_t threads, bool batched,
          const std::vector<std::vector<int32_t>>& streams) {
  Decoder d(m.model(), threads);
  const AttentionShape s = d.attention_shape();
  const uint32_t vocab = d.config().vocab_size;
  World w;
  auto g = Geometry::Create({s.n_layers, s.n_kv_heads, s.head_dim, 16});
  EXPECT_TRUE(g.ok());
  BlockPoolOptions po;
  po.num_blocks = 64;
  auto pool = BlockPool::Create(*g, formats, po);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  if (!pool.ok()) return w;
  w.pool = *pool;
  for (const std::vector<Part>& step : kSchedule) {
    std::vector<BatchItem> items;
    std::vector<int> owners;
    size_t rows = 0;
    for (const Part& p : step) {
      if (p.take < 0) {
        auto child = w.kv.at(kFork - p.take)->Fork();
        EXPECT_TRUE(child.ok()) << child.status().ToString();
        w.kv[p.seq] = std::move(*child);
        w.fed[p.seq] = w.fed[kFork - p.take];
        continue;
      }
      if (!w.kv.count(p.seq)) w.kv[p.seq] = NewKv(d, w, formats);
      const std::vector<int32_t>& stream = streams[p.seq];
      BatchItem item{std::span<const int32_t>(stream).subspan(w.fed[p.seq], p.take), w.kv[p.seq].get(),
                     p.all_logits};
      w.fed[p.seq] += p.take;
      items.push_back(item);
      owners.push_back(p.seq);
      rows += p.all_logits ? p.take : 1;
    }
    std::vector<float> out(rows * vocab);
    size_t at = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t r = items[i].all_logits ? items[i].tokens.size() : 1;
      std::span<float> mine = std::span<float>(out).subspan(at * vocab, r * vocab);
      if (!batched) {
        Status st = d.Forward(items[i].tokens, *items[i].kv, mine);
        EXPECT_TRUE(st.ok()) << st.ToString();
      }
      at += r;
    }
    if (batched) {
      Status st = d.ForwardBatch(items, out);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    at = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t r = items[i].all_logits ? items[i].tokens.size() : 1;
      auto& dst = w.logits[owners[i]];
      dst.insert(dst.end(), out.begin() + at * vocab, out.begin() + (at + r) * vocab);
      at += r;
    }
  }
  return w;
}

TEST(SmolLm2BatchInvariance, MixedStepsEqualSequencesAloneBitForBit) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> text = Gpl3Tokens(*m, 200);
  ASSERT_EQ(text.size(), 200u);
  // Sequence 4 is a fork of 0: its stream continues 0's after the fork point
  // with other tokens.
  std::vector<std::vector<int32_t>> streams(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    streams[i].assign(text.begin() + 30 * i, text.begin() + 30 * i + 30);
  }
  streams[4] = streams[0];
  std::copy(text.begin() + 150, text.begin() + 160, streams[4].begin() + 15);
  // (the int8- and bf16-input products too: each token's inputs are rounded
  // alone, and the bf16 tiles compute each output element alone)
  const LoadedModel* int8 = SmolLm2(MatMulInputs::kInt8);
  ASSERT_NE(int8, nullptr);
  const LoadedModel* bf16 = SmolLm2(MatMulInputs::kBf16);
  ASSERT_NE(bf16, nullptr);
  struct Case {
    const LoadedModel* model;
    const char* formats;
  };
  for (const Case& c : {Case{m, "f32"}, Case{m, "bf16"}, Case{m, "q8_0"}, Case{m, "turbo4"},
                        Case{int8, "f32"}, Case{int8, "turbo4"}, Case{bf16, "bf16"}, Case{bf16, "turbo4"}}) {
    SCOPED_TRACE(std::string(c.formats) + (c.model == int8 ? " int8 inputs" : c.model == bf16 ? " bf16 inputs" : ""));
    auto formats = ParseFormatPair(c.formats);
    ASSERT_TRUE(formats.ok());
    const World alone = RunSchedule(*c.model, *formats, 1, false, streams);
    for (uint32_t threads : {1u, 2u}) {
      SCOPED_TRACE(threads);
      const World batch = RunSchedule(*c.model, *formats, threads, true, streams);
      for (int seq = 0; seq < kSeqs; ++seq) {
        const std::vector<float>& a = alone.logits.at(seq);
        const std::vector<float>& b = batch.logits.at(seq);
        ASSERT_EQ(a.size(), b.size()) << "sequence " << seq;
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "sequence " << seq;
        EXPECT_EQ(alone.kv.at(seq)->num_tokens(), batch.kv.at(seq)->num_tokens());
      }
    }
  }
}

// Forward is the one-item batch, and a failing batch changes no item.
TEST(SmolLm2BatchInvariance, BadBatchesChangeNothing) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  Decoder d(m->model(), 1);
  const uint32_t vocab = d.config().vocab_size;
  World w;
  auto g = Geometry::Create({d.config().n_layers, d.config().n_kv_heads, d.config().head_dim(), 16});
  ASSERT_TRUE(g.ok());
  BlockPoolOptions po;
  po.num_blocks = 8;
  auto pool = BlockPool::Create(*g, FormatPair{}, po);
  ASSERT_TRUE(pool.ok());
  w.pool = *pool;
  auto a = NewKv(d, w, FormatPair{});
  auto b = NewKv(d, w, FormatPair{});
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  std::vector<float> logits(2 * vocab);
  BatchItem ia{std::span<const int32_t>(toks).first(3), a.get(), false};
  BatchItem ib{toks, b.get(), false};
  ASSERT_TRUE(d.ForwardBatch(std::vector<BatchItem>{ia}, std::span<float>(logits).first(vocab)).ok());
  ASSERT_EQ(a->num_tokens(), 3u);
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(vocab)};
  struct Case {
    std::vector<BatchItem> items;
    size_t floats;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {{}, 0, StatusCode::kInvalidArgument},
      {{ia, ib}, vocab, StatusCode::kInvalidArgument},                          // logits size
      {{ia, BatchItem{toks, a.get(), false}}, 2 * vocab, StatusCode::kInvalidArgument},  // shared kv
      {{ia, BatchItem{toks, nullptr, false}}, 2 * vocab, StatusCode::kInvalidArgument},
      {{ia, BatchItem{{}, b.get(), false}}, 2 * vocab, StatusCode::kInvalidArgument},
      {{ia, BatchItem{bad, b.get(), false}}, 2 * vocab, StatusCode::kInvalidArgument},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<float> out(cases[i].floats);
    EXPECT_EQ(d.ForwardBatch(cases[i].items, out).code(), cases[i].code) << "case " << i;
    EXPECT_EQ(a->num_tokens(), 3u) << "case " << i;
    EXPECT_EQ(b->num_tokens(), 0u) << "case " << i;
  }
  // Past the pool: 8 blocks of 16 cannot take 3 + 130 tokens; both roll back.
  std::vector<int32_t> many(130, 7);
  std::vector<float> out(2 * vocab);
  Status s = d.ForwardBatch(std::vector<BatchItem>{ia, BatchItem{many, b.get(), false}}, out);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(a->num_tokens(), 3u);
  EXPECT_EQ(b->num_tokens(), 0u);
}

}  // namespace
}  // namespace kvcache::model
