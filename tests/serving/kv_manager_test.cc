// The KV manager (engine/kv_manager.h) without a model: sequences without
// rows (the serving simulator's), reservations, forks and drafts, and the
// scheduler's prefix hold on it -- a request waits for a leader that will
// publish the prefix it needs, then adopts it; a leader that stands still
// (preempted, then starved) holds nobody for ever. After every test the
// pool is back at its baseline: nothing used or reserved.
#include "engine/kv_manager.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "engine/scheduler.h"

namespace kvcache::engine {
namespace {

constexpr uint32_t kB = 4;  // tokens per block

// One kv head of 16 per layer, f32, blocks of kB tokens.
model::AttentionShape Shape(uint32_t layers, uint32_t max_seq_len) {
  model::AttentionShape shape;
  shape.n_layers = layers;
  shape.n_heads = 1;
  shape.n_kv_heads = 1;
  shape.head_dim = 16;
  shape.max_seq_len = max_seq_len;
  return shape;
}

KvManagerOptions Options(uint32_t blocks) {
  KvManagerOptions o;
  o.formats = {Format::kF32, Format::kF32};
  o.block_size = kB;
  o.pool_blocks = blocks;
  return o;
}

std::unique_ptr<KvManager> NewManager(uint32_t blocks, bool rows = false) {
  KvManagerOptions o = Options(blocks);
  o.rows = rows;
  Result<std::unique_ptr<KvManager>> m = KvManager::Create(Shape(1, blocks * kB), nullptr, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

KvGroupMetrics Pool(const KvManager& m) { return m.Metrics().groups[0]; }

// Nothing in use or reserved: every block free or cached.
void ExpectBaseline(const KvManager& m) {
  const KvGroupMetrics g = Pool(m);
  EXPECT_EQ(g.blocks_used, 0u);
  EXPECT_EQ(g.blocks_reserved, 0u);
  EXPECT_EQ(g.blocks_free + g.blocks_cached, g.blocks_total);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

std::vector<TokenId> Tokens(std::initializer_list<std::pair<TokenId, uint32_t>> runs) {
  std::vector<TokenId> t;
  for (auto [value, n] : runs) t.insert(t.end(), n, value);
  return t;
}

TEST(KvManager, ChainHashesExtendBlockByBlock) {
  const std::vector<TokenId> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<BlockHash> h;
  ExtendChainHashes(t, kB, "tenant", 1, &h);
  ExtendChainHashes(t, kB, "tenant", 2, &h);
  ExtendChainHashes(t, kB, "tenant", 1, &h);  // already that long
  EXPECT_EQ(h, HashFullBlocks(t, kB, "tenant"));
}

TEST(KvManager, ForksShareThePromptCopyOnWrite) {
  std::unique_ptr<KvManager> m = NewManager(16);
  ASSERT_NE(m, nullptr);
  {
    const std::vector<TokenId> prompt = Tokens({{7, 6}});  // one full block and a partial one
    KvAdmitOptions a;
    a.reservation = KvReservation::kPrompt;
    a.samples = 3;
    std::unique_ptr<KvSequence> seq = m->Admit(prompt, a).value();
    EXPECT_FALSE(seq->has_rows());
    EXPECT_EQ(seq->reserved_blocks(), 2u + 2u);  // the prompt's blocks, one per extra sample
    ASSERT_TRUE(seq->Extend(6).ok());              // the prefill draws its two
    EXPECT_EQ(seq->reserved_blocks(), 2u);
    std::unique_ptr<KvSequence> f1 = m->Fork(*seq).value();
    std::unique_ptr<KvSequence> f2 = m->Fork(*seq).value();
    EXPECT_EQ(seq->reserved_blocks(), 0u);
    EXPECT_EQ(f1->reserved_blocks(), 1u);
    EXPECT_EQ(f2->num_tokens(), 6u);
    EXPECT_EQ(Pool(*m).blocks_used, 2u);
    // Each sample's next row copies the shared partial block first; the
    // last one to write finds it its own.
    ASSERT_TRUE(seq->Extend(1).ok());  // from the free blocks
    ASSERT_TRUE(f1->Extend(1).ok());   // from its share
    ASSERT_TRUE(f2->Extend(1).ok());   // no copy: its share stays reserved
    EXPECT_EQ(Pool(*m).blocks_used, 4u);
    EXPECT_EQ(f1->reserved_blocks(), 0u);
    EXPECT_EQ(f2->reserved_blocks(), 1u);
    EXPECT_EQ(Pool(*m).blocks_reserved, 1u);
    for (const KvSequence* s : {seq.get(), f1.get(), f2.get()}) EXPECT_TRUE(s->CheckBlocks().ok());
    // Without rows nothing is stored or attended.
    const std::vector<float> row(16);
    std::vector<float> out(16);
    EXPECT_EQ(f2->Store(0, row, row).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(f2->Attend(0, row, out).code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(m->CheckInvariants().ok());
  }
  ExpectBaseline(*m);
}

TEST(KvManager, WorstCaseDraftsGiveTheirBlocksBackToTheReservation) {
  std::unique_ptr<KvManager> m = NewManager(16);
  ASSERT_NE(m, nullptr);
  {
    KvAdmitOptions a;
    a.reservation = KvReservation::kWorstCase;
    a.max_new_tokens = 6;
    a.draft_tokens = 3;
    std::unique_ptr<KvSequence> seq = m->Admit(Tokens({{1, 5}}), a).value();
    EXPECT_EQ(seq->reserved_blocks(), 4u);  // (5 + 6 + 3) rows
    ASSERT_TRUE(seq->Extend(5).ok());
    ASSERT_TRUE(seq->Extend(1 + 3).ok());  // a decode and its drafts: 9 rows, 3 blocks
    EXPECT_EQ(seq->reserved_blocks(), 1u);
    ASSERT_TRUE(seq->Truncate(6).ok());  // two drafts rejected: the third block goes back
    EXPECT_EQ(seq->num_tokens(), 6u);
    EXPECT_EQ(seq->reserved_blocks(), 2u);
    EXPECT_EQ(Pool(*m).blocks_used, 2u);
    EXPECT_EQ(Pool(*m).blocks_reserved, 2u);
    EXPECT_EQ(seq->Truncate(7).code(), StatusCode::kOutOfRange);
  }
  ExpectBaseline(*m);
}

TEST(KvManager, ARefusedReservationHoldsNothingAndCountsItsLookup) {
  std::unique_ptr<KvManager> m = NewManager(6);
  ASSERT_NE(m, nullptr);
  const std::vector<TokenId> a = Tokens({{3, 9}});
  {
    std::unique_ptr<KvSequence> seq = m->Admit(a, KvAdmitOptions{}).value();
    ASSERT_TRUE(seq->Extend(9).ok());
    std::vector<BlockHash> hashes;
    EXPECT_EQ(m->Publish(*seq, a, &hashes).value(), 2u);
    EXPECT_EQ(hashes.size(), 2u);
  }
  EXPECT_EQ(Pool(*m).blocks_cached, 2u);  // published: cached when freed
  // The first 8 tokens are cached, the rest would need 5 more blocks of
  // the 4 left once the two are adopted.
  std::vector<TokenId> b = a;
  b.resize(28, 4);
  KvAdmitOptions prompt;
  prompt.reservation = KvReservation::kPrompt;
  KvAdmission found;
  Result<std::unique_ptr<KvSequence>> refused = m->Admit(b, prompt, &found);
  EXPECT_EQ(refused.status().code(), StatusCode::kPoolExhausted);
  ASSERT_FALSE(found.served.empty());
  EXPECT_EQ(found.served[0], 8u);
  EXPECT_EQ(Pool(*m).blocks_cached, 2u);  // given back, still cached
  EXPECT_EQ(m->Metrics().prefix_lookups, 2u);
  // Shorter, it fits and adopts them.
  b.resize(20);
  std::unique_ptr<KvSequence> seq = m->Admit(b, prompt).value();
  EXPECT_EQ(seq->cached_tokens(), 8u);
  EXPECT_EQ(seq->reserved_blocks(), 3u);
  seq.reset();
  ExpectBaseline(*m);
}

TEST(KvManager, ForksOfSequencesWithRowsArePagedCopies) {
  std::unique_ptr<KvManager> m = NewManager(16, /*rows=*/true);
  ASSERT_NE(m, nullptr);
  {
    const std::vector<int32_t> prompt(5, 2);
    std::unique_ptr<KvSequence> seq = m->Admit(prompt).value();
    EXPECT_TRUE(seq->has_rows());
    ASSERT_TRUE(seq->Extend(5).ok());
    const std::vector<float> rows(5 * 16, 0.5f);
    ASSERT_TRUE(seq->Store(0, rows, rows).ok());
    std::unique_ptr<KvSequence> fork = m->Fork(*seq).value();
    EXPECT_TRUE(fork->has_rows());
    EXPECT_EQ(fork->num_tokens(), 5u);
    // Only the engine's reservation takes rows.
    KvAdmitOptions a;
    a.reservation = KvReservation::kWorstCase;
    EXPECT_EQ(m->Admit(Tokens({{2, 5}}), a).status().code(), StatusCode::kInvalidArgument);
  }
  ExpectBaseline(*m);
}

// --- the scheduler's prefix hold on the KV manager -----------------------------

struct Req final : ScheduledRequest {
  Req(uint64_t id_, std::vector<int32_t> t) : tokens(std::move(t)) { id = id_; }
  size_t context_size() const override { return tokens.size(); }
  std::vector<int32_t> tokens;
  std::vector<BlockHash> hashes;  // the prompt's chain (HashPrompt), extended by Publish
  std::unique_ptr<KvSequence> kv;
};

Req& R(ScheduledRequest& r) { return static_cast<Req&>(r); }
const Req& R(const ScheduledRequest& r) { return static_cast<const Req&>(r); }

// The engine's use of the manager, without a model.
class ManagerKv final : public SchedulerKv {
 public:
  explicit ManagerKv(KvManager* m) : m_(m) {}
  bool Fits(const ScheduledRequest&) const override { return true; }
  bool CanAdmit(const ScheduledRequest& r) const override { return m_->CanAdmit(R(r).tokens); }
  Status Admit(ScheduledRequest& r, std::vector<std::unique_ptr<ScheduledRequest>>*) override {
    KV_ASSIGN_OR_RETURN(R(r).kv, m_->Admit(R(r).tokens));
    return Status::Ok();
  }
  uint64_t Computed(const ScheduledRequest& r) const override { return R(r).kv->num_tokens(); }
  bool WillPublishFor(const ScheduledRequest& leader, const ScheduledRequest& r) const override {
    return m_->WillPublishFor(*R(leader).kv, R(leader).hashes, R(r).tokens, R(r).hashes);
  }
  void Release(ScheduledRequest& r) override { R(r).kv.reset(); }

 private:
  KvManager* m_;
};

struct Serving {
  Serving(uint32_t blocks, const SchedulerOptions& o) : manager(NewManager(blocks)), kv(manager.get()), scheduler(o, &kv, &mu) {}
  Req* Submit(uint64_t id, std::vector<int32_t> tokens) {
    auto r = std::make_unique<Req>(id, std::move(tokens));
    r->hashes = manager->HashPrompt(r->tokens);
    Req* p = r.get();
    std::lock_guard<std::mutex> lock(mu);
    scheduler.EnqueueLocked(std::move(r));
    return p;
  }
  // One step: the planned rows computed, then published.
  void Step() {
    for (const BatchSlot& slot : scheduler.Plan()) {
      Req& r = R(*slot.request);
      ASSERT_TRUE(r.kv->Extend(slot.count).ok());
      ASSERT_TRUE(manager->Publish(*r.kv, r.tokens, &r.hashes).ok());
    }
  }
  void ReleaseAll() {
    for (auto& r : scheduler.running()) R(*r).kv.reset();
  }
  std::unique_ptr<KvManager> manager;
  ManagerKv kv;
  std::mutex mu;
  Scheduler scheduler;  // destroyed first: its requests hold the manager's sequences
};

// A shared prefix of three blocks; the leader's prompt goes on for a
// fourth block, the waiter's for half a block.
std::vector<int32_t> Prompt(int32_t tail, size_t tail_len) {
  std::vector<int32_t> t;
  for (int32_t i = 1; i <= 12; ++i) t.push_back(i);
  t.insert(t.end(), tail_len, tail);
  return t;
}

TEST(KvManagerScheduler, AWaiterHeldForItsLeadersPrefixAdoptsIt) {
  Serving s(32, {.max_batch_tokens = kB, .max_running = 8});
  Req* leader = s.Submit(1, Prompt(100, 4));
  Req* waiter = s.Submit(2, Prompt(200, 2));
  AdmitResult a = s.scheduler.Admit();
  EXPECT_EQ(a.held, 1u);
  EXPECT_EQ(a.newly_held, 1u);
  ASSERT_NE(leader->kv, nullptr);
  // The leader's prefill runs a block a step and publishes each: the waiter
  // is held until the third, the last it can adopt, is published.
  for (int step = 0; step < 3; ++step) {
    s.Step();
    a = s.scheduler.Admit();
    if (step < 2) {
      EXPECT_EQ(a.held, 1u) << step;
      EXPECT_EQ(a.newly_held, 0u);
      EXPECT_EQ(waiter->kv, nullptr) << step;
    }
  }
  ASSERT_NE(waiter->kv, nullptr);
  EXPECT_EQ(waiter->kv->cached_tokens(), 12u);
  s.ReleaseAll();
  ExpectBaseline(*s.manager);
}

TEST(KvManagerScheduler, APreemptedLeaderThatStandsStillHoldsNobodyForEver) {
  Serving s(32, {.max_batch_tokens = kB, .max_running = 8, .max_stalled_holds = 2});
  Req* leader = s.Submit(1, Prompt(100, 4));
  Req* waiter = s.Submit(2, Prompt(200, 2));
  s.scheduler.Admit();
  s.Step();  // the leader publishes its first block
  ASSERT_EQ(s.scheduler.PreemptYoungest(), leader);
  EXPECT_EQ(leader->kv, nullptr);
  // Back first in the queue, it comes back adopting the block it published,
  // and the waiter is held for it again.
  AdmitResult a = s.scheduler.Admit();
  ASSERT_NE(leader->kv, nullptr);
  EXPECT_EQ(leader->kv->cached_tokens(), kB);
  EXPECT_EQ(a.held, 1u);
  // Now it stands still (no step runs): the waiter is held at most
  // max_stalled_holds more admissions, then admitted with what was published.
  int admissions = 0;
  while (waiter->kv == nullptr && admissions < 10) {
    s.scheduler.Admit();
    ++admissions;
  }
  ASSERT_NE(waiter->kv, nullptr);
  EXPECT_LE(admissions, 2);
  EXPECT_EQ(waiter->kv->cached_tokens(), kB);
  s.ReleaseAll();
  ExpectBaseline(*s.manager);
}

// A model with sliding-window layers: two groups, each its own pool. A
// sequence's window group holds at most its window's blocks however long it
// grows (the blocks that slide out go back), its full group every position;
// its attention equals a contiguous HybridKv's over the same K/V (f32:
// exact); both pools are back at their baseline when it is destroyed.
model::AttentionShape WindowShape() {
  model::AttentionShape shape = Shape(4, 256);
  shape.windows = {16, 16, 0, 16};
  return shape;
}

KvManagerOptions WindowOptions(uint32_t blocks) {
  KvManagerOptions o = Options(blocks);
  o.rows = true;
  o.prefix_cache = false;
  o.max_chunk_tokens = 8;
  o.window_slack_tokens = kB;
  return o;
}

// The reference: a contiguous HybridKv with the manager's window options.
Result<std::unique_ptr<model::HybridKv>> ContiguousReference(const model::AttentionShape& shape) {
  model::HybridKvOptions ho;
  ho.formats = {Format::kF32, Format::kF32};
  ho.block_size = kB;
  ho.max_chunk_tokens = 8;
  ho.window_slack_tokens = kB;
  return model::HybridKv::Create(shape, ho);
}

TEST(KvManager, SlidingWindowGroups) {
  const model::AttentionShape shape = WindowShape();
  Result<std::unique_ptr<KvManager>> made = KvManager::Create(shape, nullptr, WindowOptions(128));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvManager& m = **made;
  ASSERT_EQ(m.groups().size(), 2u);
  EXPECT_EQ(m.groups()[0], KvGroupKind::kFullAttention);
  EXPECT_EQ(m.groups()[1], KvGroupKind::kSlidingWindow);
  // The window group's demand stops at window + lookback + slack.
  const KvDemand demand = m.AdmissionDemand(200);
  ASSERT_EQ(demand.blocks.size(), 2u);
  EXPECT_EQ(demand.blocks[0], (200u + kB) / kB);
  EXPECT_EQ(demand.blocks[1], (16u + 7 + kB - 1 + kB - 1) / kB);

  Result<std::unique_ptr<model::HybridKv>> ref = ContiguousReference(shape);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  const std::vector<TokenId> prompt(5, 7);
  Result<std::unique_ptr<KvSequence>> seq = m.Admit(prompt, KvAdmitOptions{});
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const size_t kv_dim = shape.n_kv_heads * shape.head_dim;
  uint32_t n = 0;
  for (uint32_t chunk : {5u, 8u, 1u, 3u, 8u, 8u, 1u, 1u, 7u, 2u, 8u, 8u, 8u, 6u}) {
    for (model::KvBackend* kv : {static_cast<model::KvBackend*>(seq->get()), static_cast<model::KvBackend*>(ref->get())}) {
      ASSERT_TRUE(kv->Extend(chunk).ok());
    }
    for (uint32_t l = 0; l < shape.n_layers; ++l) {
      std::vector<float> k(chunk * kv_dim), v(chunk * kv_dim), q(chunk * shape.n_heads * shape.head_dim);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      for (float& x : q) x = normal(rng);
      std::vector<float> out(q.size()), want(q.size());
      ASSERT_TRUE((*seq)->Store(l, k, v).ok());
      ASSERT_TRUE((*ref)->Store(l, k, v).ok());
      ASSERT_TRUE((*seq)->Attend(l, q, out).ok());
      ASSERT_TRUE((*ref)->Attend(l, q, want).ok());
      ASSERT_EQ(out, want) << "layer " << l << " at " << n;
    }
    n += chunk;
    const std::vector<KvGroupMetrics> g = m.GroupMetrics();
    // Used blocks: what the sequence holds; the rest of its reservation is
    // reserved (a pass's extra rows were reserved for the pass alone), and
    // between passes the window group never holds more than its demand.
    EXPECT_EQ(g[0].blocks_used, (n + kB - 1) / kB) << n;
    EXPECT_LE(g[1].blocks_used + g[1].blocks_reserved, demand.blocks[1]) << n;
    EXPECT_TRUE(m.CheckInvariants().ok());
  }
  EXPECT_GT(n, 64u);
  seq->reset();
  for (const KvGroupMetrics& g : m.GroupMetrics()) {
    EXPECT_EQ(g.blocks_used, 0u);
    EXPECT_EQ(g.blocks_reserved, 0u);
    EXPECT_EQ(g.blocks_free, g.blocks_total);
  }
}

// K/V of position p as a function of the tokens up to it (what a model's
// would be), for layer l.
std::vector<float> KvOf(std::span<const TokenId> tokens, uint32_t p, uint32_t l, uint32_t dim, int side) {
  uint64_t seed = 0x9E3779B97F4A7C15ull * (l + 1) + side;
  for (uint32_t i = 0; i <= p; ++i) seed = seed * 1000003u + tokens[i];
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(dim);
  for (float& v : x) v = normal(rng);
  return x;
}

// Runs tokens [from, to) through kv in chunks of at most 8, storing KvOf
// rows, and returns every layer's attention output of each chunk.
std::vector<float> RunTokens(model::KvBackend& kv, const model::AttentionShape& shape,
                             std::span<const TokenId> tokens, uint32_t from, uint32_t to) {
  std::vector<float> outs;
  const uint32_t dim = shape.n_kv_heads * shape.head_dim;
  for (uint32_t at = from; at < to;) {
    const uint32_t n = std::min(8u, to - at);
    EXPECT_TRUE(kv.Extend(n).ok());
    for (uint32_t l = 0; l < shape.n_layers; ++l) {
      std::vector<float> k, v;
      for (uint32_t p = at; p < at + n; ++p) {
        const std::vector<float> kp = KvOf(tokens, p, l, dim, 0), vp = KvOf(tokens, p, l, dim, 1);
        k.insert(k.end(), kp.begin(), kp.end());
        v.insert(v.end(), vp.begin(), vp.end());
      }
      std::vector<float> q = KvOf(tokens, at + n - 1, l + 100, n * shape.n_heads * shape.head_dim, 2);
      std::vector<float> out(q.size());
      EXPECT_TRUE(kv.Store(l, k, v).ok());
      const Status s = kv.Attend(l, q, out);
      EXPECT_TRUE(s.ok()) << s.ToString();
      outs.insert(outs.end(), out.begin(), out.end());
    }
    at += n;
  }
  return outs;
}

// Prefix reuse on a window model: a second request whose prompt extends the
// first's adopts both groups' blocks up to the last full block before its
// last token -- the full group's whole chain and the window group's last
// window, though the first request's window slid past the older window
// blocks long ago -- and attends exactly as a sequence that computed
// everything. A prompt that shares less gets the longest prefix whose
// window run is still cached; the pools end at their baseline.
TEST(KvManager, SlidingWindowPrefixReuse) {
  const model::AttentionShape shape = WindowShape();
  KvManagerOptions o = WindowOptions(128);
  o.prefix_cache = true;
  Result<std::unique_ptr<KvManager>> made = KvManager::Create(shape, nullptr, o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvManager& m = **made;
  ASSERT_TRUE(m.prefix_caching());
  std::vector<TokenId> first(90);
  for (uint32_t i = 0; i < first.size(); ++i) first[i] = 1 + (i * 7) % 50;
  {
    Result<std::unique_ptr<KvSequence>> a = m.Admit(first, KvAdmitOptions{});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ((*a)->cached_tokens(), 0u);
    std::vector<BlockHash> hashes;
    for (uint32_t at = 0; at < first.size(); at += 8) {
      RunTokens(**a, shape, first, at, std::min<uint32_t>(at + 8, first.size()));
      ASSERT_TRUE(m.Publish(**a, first, &hashes).ok());
    }
    EXPECT_TRUE(m.CheckInvariants().ok());
  }
  // The second prompt: the first plus 13 more tokens.
  std::vector<TokenId> second = first;
  for (uint32_t i = 0; i < 13; ++i) second.push_back(60 + i);
  Result<std::unique_ptr<KvSequence>> b = m.Admit(second, KvAdmitOptions{});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->cached_tokens(), (first.size() / kB) * kB);
  Result<std::unique_ptr<model::HybridKv>> ref = ContiguousReference(shape);
  ASSERT_TRUE(ref.ok());
  const uint32_t cached = (*b)->cached_tokens();
  RunTokens(**ref, shape, second, 0, cached);
  EXPECT_EQ(RunTokens(**b, shape, second, cached, second.size()),
            RunTokens(**ref, shape, second, cached, second.size()));
  b->reset();
  // A prompt sharing the first 41 tokens: its hit stops at block 10 (40
  // tokens) only if the window run ending there is still cached.
  std::vector<TokenId> third(first.begin(), first.begin() + 41);
  third.push_back(99);
  third.push_back(98);
  Result<std::unique_ptr<KvSequence>> c = m.Admit(third, KvAdmitOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->cached_tokens(), 40u);
  c->reset();
  for (const KvGroupMetrics& g : m.GroupMetrics()) {
    EXPECT_EQ(g.blocks_used, 0u);
    EXPECT_EQ(g.blocks_reserved, 0u);
    EXPECT_GT(g.blocks_cached, 0u);
  }
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// When the full pool evicts a chain's blocks, the window blocks of the same
// hashes can serve no hit: they are freed at once instead of waiting for
// the window pool's own eviction.
TEST(KvManager, WindowBlocksGoWithTheirFullChain) {
  model::AttentionShape shape = WindowShape();
  shape.max_seq_len = 128;
  KvManagerOptions o = WindowOptions(40);
  o.prefix_cache = true;
  Result<std::unique_ptr<KvManager>> made = KvManager::Create(shape, nullptr, o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvManager& m = **made;
  auto run = [&](const std::vector<TokenId>& prompt) {
    Result<std::unique_ptr<KvSequence>> seq = m.Admit(prompt, KvAdmitOptions{});
    EXPECT_TRUE(seq.ok()) << seq.status().ToString();
    if (!seq.ok()) return;
    std::vector<BlockHash> hashes;
    for (uint32_t at = (*seq)->cached_tokens(); at < prompt.size(); at += 8) {
      RunTokens(**seq, shape, prompt, at, std::min<uint32_t>(at + 8, prompt.size()));
      EXPECT_TRUE(m.Publish(**seq, prompt, &hashes).ok());
    }
  };
  std::vector<TokenId> a(90), b(90);
  for (uint32_t i = 0; i < 90; ++i) {
    a[i] = 1 + i % 50;
    b[i] = 51 + i % 40;
  }
  run(a);
  const std::vector<KvGroupMetrics> after_a = m.GroupMetrics();
  EXPECT_EQ(after_a[0].blocks_cached, 22u);  // 90 tokens: 22 full blocks named
  EXPECT_GT(after_a[1].blocks_cached, 0u);
  // b takes 23 full blocks of 40: the free ones, then a's chain from its
  // tail. The window blocks of the evicted hashes are freed with them.
  run(b);
  const std::vector<KvGroupMetrics> after_b = m.GroupMetrics();
  const uint64_t full_left = after_b[0].blocks_cached - 22;  // a's chain blocks still cached
  EXPECT_LT(full_left, 22u);
  // a's window blocks whose full block went were forgotten and freed.
  const KvMetrics metrics = m.Metrics();
  EXPECT_GT(metrics.window.unreachable, 0u);
  EXPECT_LE(metrics.window.unreachable, 22u - full_left);
  EXPECT_LE(after_b[1].blocks_cached, after_a[1].blocks_cached + full_left);
  Result<std::unique_ptr<KvSequence>> again = m.Admit(a, KvAdmitOptions{});
  ASSERT_TRUE(again.ok());
  EXPECT_LE((*again)->cached_tokens(), full_left * kB);
  again->reset();
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// A pass whose blocks the pools cannot give fails at Extend, before any
// layer stored: never part way, where the window layers that appended first
// would have dropped rows the rollback needs. The sequence is whole and goes
// on, exactly, once blocks come back (the engine preempts another).
TEST(KvManager, WindowSequenceOutOfBlocksFailsBeforeThePass) {
  model::AttentionShape shape = WindowShape();
  shape.max_seq_len = 128;
  Result<std::unique_ptr<KvManager>> made = KvManager::Create(shape, nullptr, WindowOptions(40));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  KvManager& m = **made;
  std::vector<TokenId> tokens(128);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 1 + i % 37;
  // a holds 25 of the 40 full blocks; b, admitted with 5 tokens, grows to 14.
  Result<std::unique_ptr<KvSequence>> a = m.Admit(std::span<const TokenId>(tokens).first(5), KvAdmitOptions{});
  ASSERT_TRUE(a.ok());
  RunTokens(**a, shape, tokens, 0, 100);
  Result<std::unique_ptr<KvSequence>> b = m.Admit(std::span<const TokenId>(tokens).first(5), KvAdmitOptions{});
  ASSERT_TRUE(b.ok());
  RunTokens(**b, shape, tokens, 0, 56);
  ASSERT_EQ(m.GroupMetrics()[0].blocks_free + m.GroupMetrics()[0].blocks_cached, 1u);
  // 8 more tokens need 2 more full blocks: Extend says so and opens nothing.
  const Status extended = (*b)->Extend(8);
  ASSERT_TRUE(extended.IsPoolExhausted()) << extended.ToString();
  const Status truncated = (*b)->Truncate(56);
  ASSERT_TRUE(truncated.ok()) << truncated.ToString();
  EXPECT_EQ((*b)->num_tokens(), 56u);
  EXPECT_TRUE(m.CheckInvariants().ok());
  // a goes (preempted); b goes on exactly as a fresh sequence would.
  a->reset();
  Result<std::unique_ptr<model::HybridKv>> ref = ContiguousReference(shape);
  ASSERT_TRUE(ref.ok());
  RunTokens(**ref, shape, tokens, 0, 56);
  EXPECT_EQ(RunTokens(**b, shape, tokens, 56, 90), RunTokens(**ref, shape, tokens, 56, 90));
  b->reset();
  for (const KvGroupMetrics& g : m.GroupMetrics()) {
    EXPECT_EQ(g.blocks_used, 0u);
    EXPECT_EQ(g.blocks_reserved, 0u);
  }
  EXPECT_TRUE(m.CheckInvariants().ok());
}

// A tier that keeps only full-attention objects (as one that lost the
// window group's would): Store drops every sliding-window group's object.
class FullOnlyTier final : public Tier {
 public:
  explicit FullOnlyTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "full-only"; }
  std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> keys) override {
    return inner_->Exists(keys);
  }
  std::vector<TierGet> Load(std::span<const std::string> keys) override { return inner_->Load(keys); }
  size_t Store(std::span<const TierPut> puts) override {
    std::vector<TierPut> kept;
    for (const TierPut& p : puts) {
      Result<BlockObjectInfo> info = ParseBlockObjectHeader(*p.bytes, p.bytes->size());
      if (info.ok() && info->group.has_value() && info->group->kind == LayerGroupKind::kSlidingWindow) continue;
      kept.push_back(p);
    }
    return inner_->Store(kept) + (puts.size() - kept.size());
  }
  void Erase(std::span<const std::string> keys) override { inner_->Erase(keys); }
  TierUsage usage() const override { return inner_->usage(); }

 private:
  std::shared_ptr<Tier> inner_;
};

// Offload tiers on a window model: a manager computes a prompt past the
// window and both groups' blocks reach a shared host tier; a second
// manager (its own pools, as another process would have) adopts both
// groups from the tier -- the full group's chain and only the window run
// its hit needs -- and attends exactly as a sequence that computed
// everything. A tier without the window group's objects gives no hit (the
// full chain alone cannot serve one), nor does a manager of another model:
// misses, never wrong K/V. Every pool ends at its baseline.
TEST(KvManager, SlidingWindowPrefixThroughATier) {
  const model::AttentionShape shape = WindowShape();
  std::shared_ptr<Tier> host = NewHostTier(HostTierOptions{});
  auto manager = [&](std::shared_ptr<Tier> tier, std::string model_id) {
    KvManagerOptions o = WindowOptions(128);
    o.prefix_cache = true;
    o.model_id = std::move(model_id);
    o.tier_objects = {std::move(tier)};
    Result<std::unique_ptr<KvManager>> made = KvManager::Create(shape, nullptr, o);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return made.ok() ? std::move(*made) : nullptr;
  };
  std::vector<TokenId> first(90);
  for (uint32_t i = 0; i < first.size(); ++i) first[i] = 1 + (i * 7) % 50;
  auto serve_first = [&](KvManager& m) {
    Result<std::unique_ptr<KvSequence>> a = m.Admit(first, KvAdmitOptions{});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    std::vector<BlockHash> hashes;
    for (uint32_t at = 0; at < first.size(); at += 8) {
      RunTokens(**a, shape, first, at, std::min<uint32_t>(at + 8, first.size()));
      ASSERT_TRUE(m.Publish(**a, first, &hashes).ok());
    }
    a->reset();
    m.FlushTiers();
  };
  std::vector<TokenId> second = first;
  for (uint32_t i = 0; i < 13; ++i) second.push_back(60 + i);
  const uint32_t hit = (first.size() / kB) * kB;
  {
    std::unique_ptr<KvManager> a = manager(host, "model-a");
    ASSERT_NE(a, nullptr);
    serve_first(*a);
    const OffloadStats stored = a->tier_stats();
    ASSERT_EQ(stored.tiers.size(), 1u);
    // Every full block of both groups: 22 each.
    EXPECT_EQ(stored.tiers[0].stored_blocks, 2u * (first.size() / kB));
  }
  {
    std::unique_ptr<KvManager> b = manager(host, "model-a");
    ASSERT_NE(b, nullptr);
    KvAdmission found;
    Result<std::unique_ptr<KvSequence>> seq = b->Admit(second, KvAdmitOptions{}, &found);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ((*seq)->cached_tokens(), hit);
    ASSERT_EQ(found.served.size(), 2u);
    EXPECT_EQ(found.served[0], 0u);
    EXPECT_EQ(found.served[1], hit);
    // The window group holds only the run the hit needs, not all 22 blocks.
    const std::vector<KvGroupMetrics> g = b->GroupMetrics();
    EXPECT_EQ(g[0].blocks_used, hit / kB);
    EXPECT_LT(g[1].blocks_used, hit / kB);
    Result<std::unique_ptr<model::HybridKv>> ref = ContiguousReference(shape);
    ASSERT_TRUE(ref.ok());
    RunTokens(**ref, shape, second, 0, hit);
    EXPECT_EQ(RunTokens(**seq, shape, second, hit, second.size()),
              RunTokens(**ref, shape, second, hit, second.size()));
    seq->reset();
    for (const KvGroupMetrics& group : b->GroupMetrics()) {
      EXPECT_EQ(group.blocks_used, 0u);
      EXPECT_EQ(group.blocks_reserved, 0u);
    }
    EXPECT_TRUE(b->CheckInvariants().ok());
  }
  {
    // Another model on the same tier: its keys are others; nothing adopted.
    std::unique_ptr<KvManager> c = manager(host, "model-c");
    ASSERT_NE(c, nullptr);
    Result<std::unique_ptr<KvSequence>> seq = c->Admit(second, KvAdmitOptions{});
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ((*seq)->cached_tokens(), 0u);
  }
  {
    // Full blocks alone in the tier: the chain is found, the window run is
    // not, and the request computes everything.
    auto full_only = std::make_shared<FullOnlyTier>(NewHostTier(HostTierOptions{}));
    std::unique_ptr<KvManager> a = manager(full_only, "model-a");
    ASSERT_NE(a, nullptr);
    serve_first(*a);
    std::unique_ptr<KvManager> b = manager(full_only, "model-a");
    ASSERT_NE(b, nullptr);
    Result<std::unique_ptr<KvSequence>> seq = b->Admit(second, KvAdmitOptions{});
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ((*seq)->cached_tokens(), 0u);
    const OffloadStats s = b->tier_stats();
    EXPECT_GT(s.tiers[0].misses[static_cast<size_t>(TierMiss::kAbsent)], 0u);
    seq->reset();
    for (const KvGroupMetrics& group : b->GroupMetrics()) EXPECT_EQ(group.blocks_used, 0u);
    EXPECT_TRUE(b->CheckInvariants().ok());
  }
}

// What the manager does not do for a window model is refused by name.
TEST(KvManager, SlidingWindowRefusals) {
  const model::AttentionShape shape = WindowShape();
  KvManagerOptions no_rows = WindowOptions(128);
  no_rows.rows = false;
  Result<std::unique_ptr<KvManager>> m = KvManager::Create(shape, nullptr, no_rows);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("without rows"), std::string::npos) << m.status().ToString();
  // A pool too small for one sequence names the group.
  KvManagerOptions small = WindowOptions(10);
  m = KvManager::Create(shape, nullptr, small);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("full-attention"), std::string::npos) << m.status().ToString();
  // Tiers where prefix reuse is off (a precision window on a window model).
  KvManagerOptions windowed = WindowOptions(128);
  windowed.prefix_cache = true;
  windowed.model_id = "m";
  windowed.window = PrecisionWindow{4, 8};
  windowed.tier_objects = {NewHostTier(HostTierOptions{})};
  m = KvManager::Create(shape, nullptr, windowed);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("precision window"), std::string::npos) << m.status().ToString();
  // Per-group formats on a model without window layers.
  KvManagerOptions local = Options(64);
  local.local_formats = FormatPair{Format::kF32, Format::kF32};
  m = KvManager::Create(Shape(2, 64), nullptr, local);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("sliding-window"), std::string::npos) << m.status().ToString();
}

}  // namespace
}  // namespace kvcache::engine
