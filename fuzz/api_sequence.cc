// The API-sequence fuzzer's decoder and checks (contract in api_sequence.h).
#include "fuzz/api_sequence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/eviction.h"
#include "kvcache/hybrid.h"
#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "tools/support/harness.h"

namespace kvcache::fuzz {
namespace {

constexpr int kSlots = 6;
constexpr int kHybridSlots = 3;
// Every kFullCheckEvery operations (and after the last) everything is
// checked; after the others, what the operation touched (see CheckAll).
constexpr size_t kFullCheckEvery = 16;
// (The operation and length limits are ApiSequenceOptions': the checks read
// every row back, so lengths bound an input's cost; paged sequences are
// bounded by their pool first.)

// Reads the input; past its end every read is 0 (and done() is true).
class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool done() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  // Uniform-ish in [0, n); 0 for n == 0.
  uint32_t below(uint32_t n) {
    if (n == 0) return 0;
    uint32_t x = u8();
    if (n > 256) x = (x << 8) | u8();
    return x % n;
  }
  bool flag() { return u8() & 1; }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

using harness::DraftOptions;
using harness::RowValue;

struct Config {
  GeometryOptions geo;
  FormatPair formats;
};

const Config kConfigs[] = {
    {{2, 2, 16, 4}, {Format::kF32, Format::kF32}},
    {{1, 1, 16, 2}, {Format::kF32, Format::kF32}},
    {{2, 2, 16, 4}, {Format::kQ8, Format::kF16}},
    {{1, 2, 16, 4}, {Format::kTurbo4, Format::kTurbo8}},
    {{2, 1, 32, 8}, {Format::kQ8_0, Format::kQ4_0}},
    {{1, 2, 16, 4}, {Format::kBF16, Format::kFp8E4M3}},
};

// What a sequence holds, as read back through the API.
struct Snapshot {
  uint32_t num_tokens = 0;
  std::vector<std::vector<uint32_t>> positions;  // [l*H+h]
  std::vector<std::vector<float>> k, v;          // [l*H+h][rows*D]
  bool operator==(const Snapshot&) const = default;
};

// Bitwise equality of n floats (memcmp must not see a null pointer, which
// an empty vector's data() may be).
bool SameFloats(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && SameFloats(a.data(), b.data(), a.size());
}

struct Seq {
  std::optional<SequenceCache> cache;
  std::vector<TokenId> tokens;  // token of every position [num_tokens]
  std::string salt;
  Snapshot snap;
};

struct Held {
  std::vector<uint32_t> blocks;
  std::shared_ptr<const Calibration> calibration;
  std::vector<TokenId> tokens;
  std::string salt;
};

// A published block: what its publisher held in it, per layer and head.
struct PublishedBlock {
  std::vector<std::vector<float>> k, v;  // [l*H+h][bs*D]
};

struct HybridSlot {
  std::optional<HybridSequence> seq;
  std::optional<HybridSequence> twin;  // contiguous, committed tokens only; null once diverged
  std::vector<TokenId> tokens;         // committed tokens (drafts excluded)
  uint32_t drafted = 0;
};

class World {
 public:
  World(Bytes& in, const ApiSequenceOptions& options)
      : in_(in),
        check_all_(options.check_all || std::getenv("KVCACHE_FUZZ_CHECK_ALL") != nullptr),
        max_ops_(options.max_ops),
        max_tokens_(options.max_tokens),
        max_hybrid_tokens_(options.max_hybrid_tokens) {}
  std::string Run();

 private:
  // --- setup and checks ---
  std::string Setup();
  std::string CheckAll(bool full);
  std::string CheckSeq(int i, bool compare) const;
  std::string CheckHybrid(int i) const;
  std::string CheckPoolAccounting();
  std::string CheckHybridAccounting();
  Snapshot Take(const SequenceCache& c) const;
  std::string CheckHybridTwin(const HybridSlot& s) const;

  // --- operations ---
  std::string OpCreate();
  std::string OpAppend();
  std::string OpAdvance();
  std::string OpTruncate();
  std::string OpFork(bool clone);
  std::string OpReserve();
  std::string OpRelease();
  std::string OpPublish();
  std::string OpAdopt();
  std::string OpAcquireHold();
  std::string OpUseHeld();
  std::string OpKeepRows();
  std::string OpImportance();
  std::string OpHog();
  std::string OpHybrid();

  // The sequence an operation works on; it is checked against its model
  // before the operation (the first failure waits in pre_error_), so that
  // nothing another operation did to it is absorbed or released unseen.
  Seq* PickSeq() {
    const int i = static_cast<int>(in_.below(kSlots));
    if (!seqs_[i].cache) return nullptr;
    if (trace_) std::fprintf(stderr, "  on seq %d\n", i);
    touched_ |= 1u << i;
    // Checked after the previous operation: nothing ran since.
    if (pre_error_.empty() && !(checked_ >> i & 1)) {
      const std::string e = CheckSeq(i, true);
      if (!e.empty()) pre_error_ = "before the operation: " + e;
    }
    return &seqs_[i];
  }
  Seq* FreeSlot() {
    for (int i = 0; i < kSlots; ++i) {
      if (seqs_[i].cache) continue;
      if (trace_) std::fprintf(stderr, "  into seq %d\n", i);
      touched_ |= 1u << i;
      return &seqs_[i];
    }
    return nullptr;
  }
  // s->snap was just read back from the cache (and checked by the operation).
  void Fresh(const Seq* s) { fresh_ |= 1u << (s - seqs_); }
  std::vector<float> Rows(const Seq& s, uint32_t first, std::span<const TokenId> toks, int side) const;
  std::vector<TokenId> RandomTokens(uint32_t n) {
    std::vector<TokenId> t(n);
    for (TokenId& x : t) x = in_.below(3);  // few distinct ids: prefixes collide
    return t;
  }

  Bytes& in_;
  Geometry geo_ = *Geometry::Create({1, 1, 16, 4});
  FormatPair formats_;
  std::shared_ptr<BlockPool> pool_;
  std::unique_ptr<PrefixCache> prefix_;
  Seq seqs_[kSlots];
  std::vector<Held> held_;
  std::vector<uint32_t> hog_;
  std::map<std::pair<uint64_t, uint64_t>, PublishedBlock> published_;
  // Hybrid world.
  std::shared_ptr<const HybridModel> hmodel_;
  std::vector<std::shared_ptr<BlockPool>> hpools_;
  HybridSlot hybrids_[kHybridSlots];
  uint32_t touched_ = 0, fresh_ = 0, htouched_ = 0;  // bit i: slot i, this operation
  uint32_t checked_ = 0, hchecked_ = 0;  // bit i: slot i checked after the previous operation
  std::string pre_error_;
  // KVCACHE_FUZZ_TRACE=1 prints every operation (to follow a finding).
  const bool trace_ = std::getenv("KVCACHE_FUZZ_TRACE") != nullptr;
  // Everything checked after every operation (ApiSequenceOptions).
  const bool check_all_;
  const size_t max_ops_;
  const uint32_t max_tokens_, max_hybrid_tokens_;
};

std::string World::Setup() {
  const Config& c = kConfigs[in_.below(std::size(kConfigs))];
  auto g = Geometry::Create(c.geo);
  if (!g.ok()) return "geometry: " + g.status().ToString();
  geo_ = *g;
  formats_ = c.formats;
  if (trace_) std::fprintf(stderr, "setup %s %s\n", geo_.ToString().c_str(), FormatPairName(formats_).c_str());
  BlockPoolOptions po;
  po.num_blocks = 3 + in_.below(14);
  po.huge_pages = false;
  auto pool = BlockPool::Create(geo_, formats_, po);
  if (!pool.ok()) return "pool: " + pool.status().ToString();
  pool_ = *pool;
  auto pc = PrefixCache::Create(pool_, {.evicted_history = 64});
  if (!pc.ok()) return "prefix cache: " + pc.status().ToString();
  prefix_ = std::move(*pc);

  auto hg = Geometry::Create({3, 2, 16, 4});
  std::vector<LayerSpec> specs;
  specs.push_back(LayerSpec::FullWithPolicies(
      {EvictionPolicy::KeepAll(), EvictionPolicy::HeavyHitter(2, 2, 1)}));
  specs.push_back(LayerSpec::Window(1, 3));
  specs.push_back(LayerSpec::Linear(in_.flag() ? LinearRule::kPlain : LinearRule::kDecay));
  auto model = HybridModel::Create(*hg, in_.flag() ? FormatPair{} : FormatPair{Format::kQ8, Format::kF16},
                                   std::move(specs), DraftOptions());
  if (!model.ok()) return "hybrid model: " + model.status().ToString();
  hmodel_ = *model;
  const uint32_t blocks[2] = {4 + in_.below(8), 3 + in_.below(6)};
  BlockPoolOptions hpo;
  hpo.huge_pages = false;
  auto pools = hmodel_->CreatePools(blocks, hpo);
  if (!pools.ok()) return "hybrid pools: " + pools.status().ToString();
  hpools_ = *pools;
  return "";
}

Snapshot World::Take(const SequenceCache& c) const {
  Snapshot s;
  s.num_tokens = c.num_tokens();
  const uint32_t L = c.n_layers(), H = c.n_kv_heads();
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t h = 0; h < H; ++h) {
      s.positions.push_back(c.HeadPositions(l, h));
      auto k = c.HeadKeys(l, h);
      auto v = c.HeadValues(l, h);
      s.k.push_back(k.ok() ? *k : std::vector<float>{-12345.0f});
      s.v.push_back(v.ok() ? *v : std::vector<float>{-12345.0f});
    }
  }
  return s;
}

std::vector<float> World::Rows(const Seq& s, uint32_t first, std::span<const TokenId> toks,
                               int side) const {
  (void)s;
  return harness::TokenRows(toks, first, side, geo_.n_layers(), geo_.n_kv_heads(), geo_.head_dim());
}

std::string World::CheckPoolAccounting() {
  const uint32_t n = pool_->num_blocks();
  std::vector<uint32_t> want(n, 0);
  uint64_t reserved = 0;
  for (const Seq& s : seqs_) {
    if (!s.cache || s.cache->layout() != CacheLayout::kPaged) continue;
    for (uint32_t b : s.cache->block_table()) {
      if (b >= n) return fmt::format("block id {} out of range", b);
      ++want[b];
    }
    reserved += s.cache->reserved_blocks();
  }
  for (const Held& h : held_)
    for (uint32_t b : h.blocks) ++want[b];
  for (uint32_t b : hog_) ++want[b];
  const PoolStats st = pool_->stats();
  uint32_t used = 0, cached = 0;
  for (uint32_t b = 0; b < n; ++b) {
    if (pool_->refcount(b) != want[b]) {
      return fmt::format("block {} refcount {} but the holders hold {}", b, pool_->refcount(b),
                         want[b]);
    }
    if (want[b] > 0) {
      ++used;
      if (pool_->state(b) != BlockState::kInUse) return fmt::format("held block {} not in use", b);
    } else if (pool_->block_hash(b).has_value()) {
      ++cached;
      if (pool_->state(b) != BlockState::kCached) return fmt::format("block {} not cached", b);
    } else if (pool_->state(b) != BlockState::kFree) {
      return fmt::format("block {} should be free", b);
    }
  }
  if (st.used_blocks != used || st.cached_blocks != cached || st.free_blocks != n - used - cached) {
    return fmt::format("pool counters used={} cached={} free={}, model {} {} {}", st.used_blocks,
                       st.cached_blocks, st.free_blocks, used, cached, n - used - cached);
  }
  if (st.reserved_blocks != reserved) {
    return fmt::format("pool reserves {} blocks, the caches {}", st.reserved_blocks, reserved);
  }
  if (st.available_blocks != st.free_blocks + st.cached_blocks - st.reserved_blocks) {
    return "available != free + cached - reserved";
  }
  return "";
}

std::string World::CheckHybridAccounting() {
  for (int g = 0; g < 2; ++g) {
    const auto& pool = hpools_[g];
    if (!pool) continue;
    std::vector<uint32_t> want(pool->num_blocks(), 0);
    uint64_t reserved = 0;
    for (const HybridSlot& s : hybrids_) {
      for (const std::optional<HybridSequence>* x : {&s.seq, &s.twin}) {
        if (!*x) continue;
        const SequenceCache* c = (*x)->group_cache(g);
        if (!c || c->layout() != CacheLayout::kPaged) continue;
        for (uint32_t b : c->block_table()) ++want[b];
        reserved += c->reserved_blocks();
      }
    }
    for (uint32_t b = 0; b < pool->num_blocks(); ++b) {
      if (pool->refcount(b) != want[b]) {
        return fmt::format("hybrid pool {} block {} refcount {}, holders {}", g, b,
                           pool->refcount(b), want[b]);
      }
    }
    if (pool->num_reserved_blocks() != reserved) return "hybrid pool reservation mismatch";
    Status st = pool->CheckInvariants();
    if (!st.ok()) return "hybrid pool: " + st.ToString();
  }
  return "";
}

std::string World::CheckHybridTwin(const HybridSlot& s) const {
  if (!s.seq || !s.twin || s.seq->in_draft()) return "";
  const HybridSequence& a = *s.seq;
  const HybridSequence& b = *s.twin;
  const HybridModel& m = *hmodel_;
  for (uint32_t l = 0; l < m.n_layers(); ++l) {
    if (a.num_tokens(l) != b.num_tokens(l)) {
      return fmt::format("hybrid layer {} has {} tokens, its twin {}", l, a.num_tokens(l),
                         b.num_tokens(l));
    }
    if (m.kind(l) == LayerKind::kLinear) {
      auto x = a.Linear(l);
      auto y = b.Linear(l);
      if (!x.ok() || !y.ok()) return "hybrid linear state unreadable";
      auto xs = (*x)->state();
      auto ys = (*y)->state();
      if (xs.size() != ys.size() || !std::equal(xs.begin(), xs.end(), ys.begin())) {
        return fmt::format("hybrid linear layer {} differs from its twin", l);
      }
      continue;
    }
    for (uint32_t h = 0; h < m.geometry().n_kv_heads(); ++h) {
      if (a.HeadPositions(l, h) != b.HeadPositions(l, h)) {
        return fmt::format("hybrid layer {} head {} positions differ from the twin", l, h);
      }
      auto ka = a.HeadKeys(l, h), kb = b.HeadKeys(l, h);
      auto va = a.HeadValues(l, h), vb = b.HeadValues(l, h);
      if (!ka.ok() || !kb.ok() || !va.ok() || !vb.ok()) return "hybrid rows unreadable";
      if (!SameBits(*ka, *kb) || !SameBits(*va, *vb)) {
        return fmt::format("hybrid layer {} head {} rows differ from the twin", l, h);
      }
      if (a.HeadImportance(l, h) != b.HeadImportance(l, h)) {
        return fmt::format("hybrid layer {} head {} importance differs from the twin", l, h);
      }
    }
  }
  return "";
}

std::string World::CheckSeq(int i, bool compare) const {
  const Seq& s = seqs_[i];
  if (!s.cache) return "";
  Status st = s.cache->CheckInvariants();
  if (!st.ok()) return fmt::format("seq {}: {}", i, st.ToString());
  if (s.cache->num_tokens() != s.tokens.size()) {
    return fmt::format("seq {} holds {} tokens, the model {}", i, s.cache->num_tokens(),
                       s.tokens.size());
  }
  if (compare && !(Take(*s.cache) == s.snap)) return fmt::format("seq {} changed behind its back", i);
  return "";
}

std::string World::CheckHybrid(int i) const {
  const HybridSlot& s = hybrids_[i];
  for (const std::optional<HybridSequence>* x : {&s.seq, &s.twin}) {
    if (!*x) continue;
    Status st = (*x)->CheckInvariants();
    if (!st.ok()) return fmt::format("hybrid {}: {}", i, st.ToString());
  }
  return CheckHybridTwin(s);
}

// Full: every sequence read back and compared with its model, every hybrid
// with its twin. Otherwise only the slots the operation touched (picked
// ones were also compared before it, in PickSeq, unless this check had
// just compared them after the previous operation; a sequence whose
// snapshot the operation just took and checked is not read again). The
// pools, the prefix cache and the exact accounting are checked every time.
std::string World::CheckAll(bool full) {
  checked_ = hchecked_ = 0;
  for (int i = 0; i < kSlots; ++i) {
    if (!full && !(touched_ >> i & 1)) continue;
    std::string e = CheckSeq(i, !(fresh_ >> i & 1));
    if (!e.empty()) return e;
    checked_ |= 1u << i;
  }
  Status pst = pool_->CheckInvariants();
  if (!pst.ok()) return "pool: " + pst.ToString();
  const std::string pc = prefix_->CheckInvariants();
  if (!pc.empty()) return "prefix cache: " + pc;
  std::string e = CheckPoolAccounting();
  if (!e.empty()) return e;
  for (int i = 0; i < kHybridSlots; ++i) {
    if (!full && !(htouched_ >> i & 1)) continue;
    e = CheckHybrid(i);
    if (!e.empty()) return e;
    hchecked_ |= 1u << i;
  }
  return CheckHybridAccounting();
}

// --- operations on sequence caches ------------------------------------------------

std::string World::OpCreate() {
  Seq* s = FreeSlot();
  if (!s) return "";
  const uint32_t kind = in_.below(3);
  if (kind == 0) {
    ContiguousOptions o;
    o.capacity_tokens = in_.below(12);
    o.policy = in_.flag() ? CapacityPolicy::kFixed : CapacityPolicy::kGrow;
    auto c = SequenceCache::CreateContiguous(geo_, formats_, o);
    if (!c.ok()) {
      // A fixed capacity of 0 is refused; anything else is a finding.
      if (o.capacity_tokens == 0 && c.status().code() == StatusCode::kInvalidArgument) return "";
      return "contiguous create: " + c.status().ToString();
    }
    s->cache.emplace(std::move(*c));
  } else {
    const uint32_t reserve = kind == 2 ? in_.below(20) : 0;
    const PoolStats before = pool_->stats();
    auto c = SequenceCache::CreatePaged(pool_, {.reserve_tokens = reserve});
    if (!c.ok()) {
      if (c.status().code() != StatusCode::kPoolExhausted) return c.status().ToString();
      if (pool_->stats().reserved_blocks != before.reserved_blocks) return "failed create reserved";
      return "";
    }
    s->cache.emplace(std::move(*c));
  }
  s->tokens.clear();
  s->salt = in_.flag() ? "" : "tenant";
  s->snap = Take(*s->cache);
  Fresh(s);
  return "";
}

std::string World::OpAppend() {
  Seq* s = PickSeq();
  if (!s) return "";
  SequenceCache& c = *s->cache;
  const uint32_t T = 1 + in_.below(2 * geo_.block_size());
  const std::vector<TokenId> toks = RandomTokens(T);
  const uint32_t first = c.num_tokens();
  if (first + T > max_tokens_) return "";
  const std::vector<float> k = Rows(*s, first, toks, 0), v = Rows(*s, first, toks, 1);
  std::vector<uint8_t> alive;
  if (in_.below(4) == 0) {
    alive.resize(geo_.n_kv_heads());
    for (uint8_t& a : alive) a = in_.flag();
  }
  const bool promised = c.layout() == CacheLayout::kPaged && c.reservation_target_tokens() > 0 &&
                        c.is_fully_reserved() && first + T <= c.reservation_target_tokens();
  const PoolStats before = pool_->stats();
  Status st = c.Append(k, v, {alive});
  if (!st.ok()) {
    if (promised && st.code() == StatusCode::kPoolExhausted) {
      return "append within a fully reserved target failed: " + st.ToString();
    }
    if (st.code() != StatusCode::kPoolExhausted && st.code() != StatusCode::kCapacityExceeded) {
      return "append: " + st.ToString();
    }
    const PoolStats after = pool_->stats();
    if (after.used_blocks != before.used_blocks || after.reserved_blocks != before.reserved_blocks) {
      return "a failed append changed the pool";
    }
    return "";  // CheckAll verifies nothing else changed
  }
  s->tokens.insert(s->tokens.end(), toks.begin(), toks.end());
  Snapshot now = Take(c);
  // Rows stored before must read back unchanged; f32 new rows exactly.
  const uint32_t H = geo_.n_kv_heads(), D = geo_.head_dim();
  for (size_t i = 0; i < now.k.size(); ++i) {
    const size_t old_rows = s->snap.positions[i].size();
    if (now.positions[i].size() < old_rows ||
        !std::equal(s->snap.positions[i].begin(), s->snap.positions[i].end(),
                    now.positions[i].begin()) ||
        !SameFloats(now.k[i].data(), s->snap.k[i].data(), old_rows * D) ||
        !SameFloats(now.v[i].data(), s->snap.v[i].data(), old_rows * D)) {
      return fmt::format("append changed stored rows of head {}", i);
    }
    if (formats_ == FormatPair{}) {
      const uint32_t l = static_cast<uint32_t>(i / H), h = static_cast<uint32_t>(i % H);
      for (size_t r = old_rows; r < now.positions[i].size(); ++r) {
        const uint32_t p = now.positions[i][r];
        for (uint32_t e = 0; e < D; ++e) {
          if (now.k[i][r * D + e] != RowValue(s->tokens[p], p, l, h, 0, e) ||
              now.v[i][r * D + e] != RowValue(s->tokens[p], p, l, h, 1, e)) {
            return fmt::format("f32 row of position {} layer {} head {} reads back wrong", p, l, h);
          }
        }
      }
    }
  }
  s->snap = std::move(now);
  Fresh(s);
  return "";
}

std::string World::OpAdvance() {
  Seq* s = PickSeq();
  if (!s) return "";
  const uint32_t n = in_.below(6);
  if (s->cache->num_tokens() + n > max_tokens_) return "";
  Status st = s->cache->AdvanceLen(n);
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted && st.code() != StatusCode::kCapacityExceeded &&
        st.code() != StatusCode::kInvalidArgument) {
      return "advance: " + st.ToString();
    }
    return "";
  }
  s->tokens.resize(s->tokens.size() + n, 0);
  s->snap = Take(*s->cache);
  Fresh(s);
  return "";
}

std::string World::OpTruncate() {
  Seq* s = PickSeq();
  if (!s) return "";
  const uint32_t len = static_cast<uint32_t>(s->tokens.size());
  const uint32_t n = in_.below(len + 2);
  const PoolStats before = pool_->stats();
  Status st = s->cache->Truncate(n);
  if (n > len) {
    if (st.code() != StatusCode::kOutOfRange) return "truncate past the end: " + st.ToString();
    return "";
  }
  if (!st.ok()) return "truncate: " + st.ToString();
  (void)before;
  s->tokens.resize(n);
  Snapshot now = Take(*s->cache);
  const uint32_t D = geo_.head_dim();
  for (size_t i = 0; i < now.k.size(); ++i) {
    const std::vector<uint32_t>& p = s->snap.positions[i];
    const size_t keep = std::lower_bound(p.begin(), p.end(), n) - p.begin();
    if (now.positions[i] != std::vector<uint32_t>(p.begin(), p.begin() + keep) ||
        !SameBits(now.k[i], std::vector<float>(s->snap.k[i].begin(), s->snap.k[i].begin() + keep * D)) ||
        !SameBits(now.v[i], std::vector<float>(s->snap.v[i].begin(), s->snap.v[i].begin() + keep * D))) {
      return fmt::format("truncate to {} did not keep the rows before it (head {})", n, i);
    }
  }
  s->snap = std::move(now);
  Fresh(s);
  return "";
}

std::string World::OpFork(bool clone) {
  Seq* s = PickSeq();
  Seq* d = FreeSlot();
  if (!s || !d) return "";
  Result<SequenceCache> c = clone ? s->cache->Clone({in_.flag() ? CloneLayout::kSame
                                                              : CloneLayout::kContiguous})
                                  : s->cache->Fork();
  if (!c.ok()) {
    if (c.status().code() != StatusCode::kPoolExhausted) return "fork/clone: " + c.status().ToString();
    return "";
  }
  d->cache.emplace(std::move(*c));
  d->tokens = s->tokens;
  d->salt = s->salt;
  d->snap = Take(*d->cache);
  Fresh(d);
  if (!(d->snap == s->snap)) return clone ? "clone differs from its source" : "fork differs from its parent";
  if (clone && d->cache->layout() == CacheLayout::kPaged) {
    for (uint32_t b : d->cache->block_table()) {
      for (uint32_t x : s->cache->block_table())
        if (x == b) return "a paged clone shares a block";
    }
  }
  return "";
}

std::string World::OpReserve() {
  Seq* s = PickSeq();
  if (!s) return "";
  const uint32_t target = in_.below(24);
  const uint32_t before = s->cache->reserved_blocks();
  const uint32_t pool_before = pool_->num_reserved_blocks();
  Status st = s->cache->Reserve(target);
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return "reserve: " + st.ToString();
    if (s->cache->reserved_blocks() != before || pool_->num_reserved_blocks() != pool_before) {
      return "a failed Reserve changed the reservation";
    }
    return "";
  }
  if (s->cache->layout() == CacheLayout::kPaged && !s->cache->is_fully_reserved()) {
    return "Reserve succeeded but is not fully reserved";
  }
  return "";
}

std::string World::OpRelease() {
  Seq* s = PickSeq();
  if (!s) return "";
  if (in_.flag()) {
    s->cache->Release();
    if (!s->cache->released() || s->cache->reserved_blocks() != 0 || !s->cache->block_table().empty()) {
      return "Release left something held";
    }
    Status st = s->cache->Append(Rows(*s, 0, std::vector<TokenId>{1}, 0),
                                 Rows(*s, 0, std::vector<TokenId>{1}, 1));
    if (st.code() != StatusCode::kFailedPrecondition) return "append after Release: " + st.ToString();
  }
  s->cache.reset();
  s->tokens.clear();
  return "";
}

std::string World::OpPublish() {
  Seq* s = PickSeq();
  if (!s || s->cache->layout() != CacheLayout::kPaged) return "";
  SequenceCache& c = *s->cache;
  if (trace_) {
    std::string t;
    for (TokenId x : s->tokens) t += fmt::format("{} ", x);
    for (uint32_t b : c.block_table()) {
      auto h = pool_->block_hash(b);
      t += fmt::format("[{} {:x}] ", b, h ? *h : 0);
    }
    std::fprintf(stderr, "  tokens/table %s salt '%s'\n", t.c_str(), s->salt.c_str());
  }
  // Blocks that carry a hash already (published before, by this sequence or
  // one it shares them with) were checked and recorded then; this sequence
  // may no longer fill them (KeepRows keeping a prefix of a head's rows, a
  // truncation) without anything being wrong: the block's bytes are intact
  // (a hashed block is never written in place) and adopters check them.
  std::vector<bool> hashed_before;
  for (uint32_t b : c.block_table()) hashed_before.push_back(pool_->block_hash(b).has_value());
  auto r = prefix_->PublishSequence(&c, s->tokens, s->salt);
  if (trace_) std::fprintf(stderr, "  publish: %s\n", r.ok() ? "ok" : r.status().ToString().c_str());
  // Refusals: a block not full in every head (dead heads, evicted rows)
  // is FailedPrecondition. A sequence whose heads do not all hold positions
  // 0..F*bs-1 in order (F = its tokens' full blocks) may also get
  // InvalidArgument: its table is short (positions where every head was
  // dead hold no block), or a block it shares still carries the hash of the
  // tokens it was published with. A sequence that does hold them must not.
  const size_t full_rows = s->tokens.size() / geo_.block_size() * geo_.block_size();
  bool whole = true;
  for (const auto& pos : s->snap.positions) {
    whole &= pos.size() >= full_rows && (full_rows == 0 || pos[full_rows - 1] == full_rows - 1);
  }
  if (!r.ok() && r.status().code() != StatusCode::kFailedPrecondition &&
      !(!whole && r.status().code() == StatusCode::kInvalidArgument)) {
    return "publish: " + r.status().ToString();
  }
  // Every block of c that this publish hashed holds exactly those
  // positions in every head; remember what it holds.
  const uint32_t bs = geo_.block_size(), H = geo_.n_kv_heads(), D = geo_.head_dim();
  const std::vector<BlockHash> hashes = HashFullBlocks(s->tokens, bs, s->salt);
  auto table = c.block_table();
  for (size_t i = 0; i < hashes.size() && i < table.size(); ++i) {
    if (pool_->block_hash(table[i]) != hashes[i].lo) continue;
    if (i < hashed_before.size() && hashed_before[i]) continue;
    PublishedBlock pb;
    for (uint32_t l = 0; l < geo_.n_layers(); ++l) {
      for (uint32_t h = 0; h < H; ++h) {
        const size_t j = size_t{l} * H + h;
        const auto& pos = s->snap.positions[j];
        if (pos.size() < (i + 1) * bs) return fmt::format("published block {} is not full", i);
        for (uint32_t r2 = 0; r2 < bs; ++r2) {
          if (pos[i * bs + r2] != i * bs + r2) {
            return fmt::format("published block {} of layer {} head {} holds position {} in slot {}",
                               i, l, h, pos[i * bs + r2], r2);
          }
        }
        pb.k.emplace_back(s->snap.k[j].begin() + i * bs * D, s->snap.k[j].begin() + (i + 1) * bs * D);
        pb.v.emplace_back(s->snap.v[j].begin() + i * bs * D, s->snap.v[j].begin() + (i + 1) * bs * D);
      }
    }
    published_[{hashes[i].lo, hashes[i].hi}] = std::move(pb);
  }
  return "";
}

// Checks that the first n_blocks blocks of seq decode to what their
// publishers stored.
static std::string CheckAdopted(const World* w, const Snapshot& snap, const std::vector<BlockHash>& hashes,
                                size_t n_blocks, uint32_t bs, uint32_t D,
                                const std::map<std::pair<uint64_t, uint64_t>, PublishedBlock>& published) {
  (void)w;
  for (size_t i = 0; i < n_blocks; ++i) {
    auto it = published.find({hashes[i].lo, hashes[i].hi});
    if (it == published.end()) return fmt::format("adopted block {} was never published", i);
    for (size_t j = 0; j < snap.k.size(); ++j) {
      std::vector<float> k(snap.k[j].begin() + i * bs * D, snap.k[j].begin() + (i + 1) * bs * D);
      std::vector<float> v(snap.v[j].begin() + i * bs * D, snap.v[j].begin() + (i + 1) * bs * D);
      if (!SameBits(k, it->second.k[j]) || !SameBits(v, it->second.v[j])) {
        return fmt::format("adopted block {} head {} differs from what was published", i, j);
      }
    }
  }
  return "";
}

std::string World::OpAdopt() {
  Seq* d = FreeSlot();
  if (!d) return "";
  // Half the time the prompt repeats a live sequence's tokens (a hit).
  std::vector<TokenId> toks;
  std::string salt = in_.flag() ? "" : "tenant";
  Seq* src = PickSeq();
  if (src && in_.below(4) != 0) {
    toks = src->tokens;
    salt = src->salt;
    toks.resize(std::min<size_t>(toks.size(), in_.below(static_cast<uint32_t>(toks.size()) + 3)));
  }
  if (toks.empty()) toks = RandomTokens(1 + in_.below(3 * geo_.block_size()));
  auto c = SequenceCache::CreatePaged(pool_);
  if (!c.ok()) return "create for adopt: " + c.status().ToString();
  auto r = prefix_->AdoptInto(&*c, toks, salt);
  if (!r.ok()) return "adopt: " + r.status().ToString();
  const uint32_t bs = geo_.block_size();
  if (*r % bs != 0 || *r > toks.size() || c->num_tokens() != *r) return "adopt returned a bad length";
  d->cache.emplace(std::move(*c));
  d->tokens.assign(toks.begin(), toks.begin() + *r);
  d->salt = salt;
  d->snap = Take(*d->cache);
  Fresh(d);
  const std::vector<BlockHash> hashes = HashFullBlocks(d->tokens, bs, salt);
  return CheckAdopted(this, d->snap, hashes, *r / bs, bs, geo_.head_dim(), published_);
}

std::string World::OpAcquireHold() {
  if (held_.size() >= 4) return "";
  std::vector<TokenId> toks;
  Seq* src = PickSeq();
  Held h;
  h.salt = in_.flag() ? "" : "tenant";
  if (src && in_.flag()) {
    toks = src->tokens;
    h.salt = src->salt;
  } else {
    toks = RandomTokens(1 + in_.below(3 * geo_.block_size()));
  }
  if (in_.below(4) == 0) {  // Peek: takes no references, counts nothing
    const PrefixCacheStats before = prefix_->stats();
    PrefixMatch m = prefix_->Peek(toks, h.salt);
    if (m.num_tokens != m.blocks.size() * geo_.block_size()) return "peek length";
    if (prefix_->stats().lookups != before.lookups) return "Peek counted a lookup";
    return "";  // CheckAll verifies that no reference was taken
  }
  PrefixMatch m = prefix_->Acquire(toks, h.salt);
  if (m.num_tokens != m.blocks.size() * geo_.block_size()) return "prefix match length";
  if (m.blocks.empty()) return "";
  h.blocks = m.blocks;
  h.calibration = m.calibration;
  h.tokens.assign(toks.begin(), toks.begin() + m.num_tokens);
  held_.push_back(std::move(h));
  return "";
}

std::string World::OpUseHeld() {
  if (held_.empty()) return "";
  const size_t i = in_.below(static_cast<uint32_t>(held_.size()));
  Held h = std::move(held_[i]);
  held_.erase(held_.begin() + i);
  Seq* d = FreeSlot();
  if (!d || in_.flag()) {
    Status st = pool_->Release(h.blocks);
    if (!st.ok()) return "release held: " + st.ToString();
    return "";
  }
  auto c = SequenceCache::CreatePaged(pool_);
  if (!c.ok()) return c.status().ToString();
  Status st = c->AdoptPrefix(h.blocks, h.calibration);
  if (!st.ok()) return "adopt held: " + st.ToString();
  d->cache.emplace(std::move(*c));
  d->tokens = h.tokens;
  d->salt = h.salt;
  d->snap = Take(*d->cache);
  Fresh(d);
  const uint32_t bs = geo_.block_size();
  return CheckAdopted(this, d->snap, HashFullBlocks(d->tokens, bs, d->salt), h.blocks.size(), bs,
                      geo_.head_dim(), published_);
}

std::string World::OpKeepRows() {
  Seq* s = PickSeq();
  if (!s) return "";
  const uint32_t l = in_.below(geo_.n_layers()), h = in_.below(geo_.n_kv_heads());
  const uint32_t n = s->cache->head_len(l, h);
  std::vector<uint32_t> rows;
  const bool bad = in_.below(8) == 0;
  for (uint32_t r = 0; r < n; ++r)
    if (in_.below(3) != 0) rows.push_back(r);
  if (bad) rows.push_back(n);  // out of range: refused
  Status st = s->cache->KeepRows(l, h, rows);
  if (bad) {
    if (st.code() != StatusCode::kInvalidArgument) return "KeepRows of a bad row: " + st.ToString();
    return "";
  }
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return "KeepRows: " + st.ToString();
    return "";
  }
  const size_t j = size_t{l} * geo_.n_kv_heads() + h;
  const uint32_t D = geo_.head_dim();
  Snapshot want = s->snap;
  want.positions[j].clear();
  want.k[j].clear();
  want.v[j].clear();
  for (uint32_t r : rows) {
    want.positions[j].push_back(s->snap.positions[j][r]);
    want.k[j].insert(want.k[j].end(), s->snap.k[j].begin() + r * D, s->snap.k[j].begin() + (r + 1) * D);
    want.v[j].insert(want.v[j].end(), s->snap.v[j].begin() + r * D, s->snap.v[j].begin() + (r + 1) * D);
  }
  Snapshot now = Take(*s->cache);
  if (!(now == want)) return fmt::format("KeepRows on layer {} head {} kept the wrong rows", l, h);
  s->snap = std::move(now);
  Fresh(s);
  return "";
}

std::string World::OpImportance() {
  Seq* s = PickSeq();
  if (!s) return "";
  const uint32_t l = in_.below(geo_.n_layers()), h = in_.below(geo_.n_kv_heads());
  const uint32_t n = s->cache->head_len(l, h);
  std::vector<float> probs(n + (in_.below(8) == 0 ? 1 : 0));
  bool finite = true;
  for (float& p : probs) {
    const uint32_t x = in_.below(16);
    if (x == 0) {
      p = std::numeric_limits<float>::quiet_NaN();
      finite = false;
    } else if (x == 1) {
      p = -std::numeric_limits<float>::infinity();
      finite = false;
    } else {
      p = static_cast<float>(x) / 16.0f;
    }
  }
  const std::vector<float> head_before = s->cache->HeadImportance(l, h);
  const std::vector<float> pos_before = s->cache->Importance(l);
  Status st = s->cache->AccumulateImportance(l, h, probs);
  const bool valid = finite && probs.size() == n;
  if (!valid) {
    if (st.code() != StatusCode::kInvalidArgument) return "bad importance accepted: " + st.ToString();
    if (s->cache->HeadImportance(l, h) != head_before || s->cache->Importance(l) != pos_before) {
      return "refused importance changed the sums";
    }
    return "";
  }
  if (!st.ok()) return "importance: " + st.ToString();
  std::vector<float> want = head_before;
  for (size_t r = 0; r < n; ++r) want[r] += probs[r];
  if (s->cache->HeadImportance(l, h) != want) return "head importance is not the sum";
  std::vector<float> pos = pos_before;
  const std::vector<uint32_t> p = s->cache->HeadPositions(l, h);
  for (size_t r = 0; r < n; ++r) pos[p[r]] += probs[r];
  if (s->cache->Importance(l) != pos) return "position importance is not the sum";
  return "";
}

std::string World::OpHog() {
  if (!hog_.empty() && in_.flag()) {
    const uint32_t n = 1 + in_.below(static_cast<uint32_t>(hog_.size()));
    std::vector<uint32_t> back(hog_.end() - n, hog_.end());
    hog_.resize(hog_.size() - n);
    Status st = pool_->Release(back);
    if (!st.ok()) return "unhog: " + st.ToString();
    return "";
  }
  std::vector<uint32_t> take(1 + in_.below(3));
  const PoolStats before = pool_->stats();
  Status st = pool_->Allocate(take);
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return "hog: " + st.ToString();
    if (take.size() <= before.available_blocks) return "Allocate refused available blocks";
    return "";
  }
  hog_.insert(hog_.end(), take.begin(), take.end());
  return "";
}

// --- hybrid sequences ------------------------------------------------------------

std::string World::OpHybrid() {
  const int slot = static_cast<int>(in_.below(kHybridSlots));
  HybridSlot& s = hybrids_[slot];
  htouched_ |= 1u << slot;
  // As PickSeq: checked against its twin before anything changes it.
  if (!(hchecked_ >> slot & 1)) {
    if (std::string e = CheckHybrid(slot); !e.empty()) return "before the operation: " + e;
  }
  const HybridModel& m = *hmodel_;
  const uint32_t L = m.n_layers(), H = m.geometry().n_kv_heads(), D = m.geometry().head_dim();
  auto tokens_rows = [&](uint32_t first, std::span<const TokenId> toks, int side) {
    return harness::TokenRows(toks, first, side, L, H, D);
  };
  if (!s.seq) {
    auto seq = in_.flag() ? HybridSequence::CreatePaged(hmodel_, hpools_, {})
                          : HybridSequence::CreateContiguous(hmodel_);
    if (!seq.ok()) return "hybrid create: " + seq.status().ToString();
    auto twin = HybridSequence::CreateContiguous(hmodel_);
    if (!twin.ok()) return "hybrid twin: " + twin.status().ToString();
    s.seq.emplace(std::move(*seq));
    s.twin.emplace(std::move(*twin));
    s.tokens.clear();
    s.drafted = 0;
    return "";
  }
  HybridSequence& q = *s.seq;
  const uint32_t op = in_.below(9);
  auto note = [&](const char* what, const Status& st) {
    if (trace_) std::fprintf(stderr, "    %s: %s\n", what, st.ToString().c_str());
  };
  if (trace_) {
    static const char* const kSub[] = {"append", "append", "begin-draft", "commit/abort",
                                       "importance", "evict", "fork", "truncate", "release"};
    std::fprintf(stderr, "  hybrid %d %s (length %u%s, %s)\n", slot, kSub[op], q.num_tokens(),
                 q.in_draft() ? ", in draft" : "", q.layout() == CacheLayout::kPaged ? "paged" : "contiguous");
  }
  switch (op) {
    case 0:
    case 1: {  // append tokens (drafts while a draft is open)
      const uint32_t n = 1 + in_.below(3);
      const std::vector<TokenId> toks = RandomTokens(n);
      const uint32_t first = q.num_tokens();
      if (first + n > max_hybrid_tokens_) return "";
      Status st = q.Append(tokens_rows(first, toks, 0), tokens_rows(first, toks, 1));
      note("append", st);
      if (!st.ok()) {
        if (st.code() != StatusCode::kPoolExhausted && st.code() != StatusCode::kCapacityExceeded &&
            st.code() != StatusCode::kInvalidArgument) {
          return "hybrid append: " + st.ToString();
        }
        s.twin.reset();  // a partial multi-layer append is documented; stop comparing
        return "";
      }
      if (!q.in_draft() && q.window_compaction_pending()) {
        return "hybrid append succeeded with a window compaction pending";
      }
      if (q.in_draft()) {
        s.drafted += n;
        s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());  // provisional
        return "";
      }
      s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());
      if (s.twin) {
        for (uint32_t t = 0; t < n; ++t) {
          std::span<const TokenId> one(&toks[t], 1);
          Status tw = s.twin->Append(tokens_rows(first + t, one, 0), tokens_rows(first + t, one, 1));
          if (!tw.ok()) return "hybrid twin append: " + tw.ToString();
        }
      }
      return "";
    }
    case 2: {  // begin a draft
      Status st = q.BeginDraft();
      if (q.num_tokens() == 0) {
        if (st.ok()) return "BeginDraft on an empty sequence succeeded";
        return "";
      }
      if (!st.ok() && st.code() != StatusCode::kFailedPrecondition) return "BeginDraft: " + st.ToString();
      if (st.ok()) s.drafted = 0;
      return "";
    }
    case 3: {  // commit or abort
      if (!q.in_draft()) {
        if (q.Commit(0).code() != StatusCode::kFailedPrecondition) return "Commit without a draft";
        return "";
      }
      const uint32_t base = q.draft_base();
      const bool abort = in_.flag();
      const uint32_t a = abort ? 0 : in_.below(s.drafted + 2);
      Status st = abort ? q.Abort() : q.Commit(a);
      if (trace_) note(abort ? "abort" : fmt::format("commit {}", a).c_str(), st);
      if (!abort && a > s.drafted) {
        if (st.code() != StatusCode::kOutOfRange) return "Commit past the draft: " + st.ToString();
        return "";
      }
      if (!st.ok()) {
        if (st.code() != StatusCode::kPoolExhausted) return "commit/abort: " + st.ToString();
        s.twin.reset();
        s.tokens.resize(std::min<size_t>(s.tokens.size(), q.num_tokens()));
        return "";
      }
      if (q.window_compaction_pending()) return "commit/abort succeeded with a window compaction pending";
      const std::vector<TokenId> kept(s.tokens.begin() + base, s.tokens.begin() + base + a);
      s.tokens.resize(base + a);
      s.drafted = 0;
      if (s.twin) {
        for (uint32_t t = 0; t < a; ++t) {
          std::span<const TokenId> one(&kept[t], 1);
          Status tw = s.twin->Append(tokens_rows(base + t, one, 0), tokens_rows(base + t, one, 1));
          if (!tw.ok()) return "hybrid twin append: " + tw.ToString();
        }
      }
      return "";
    }
    case 4: {  // importance on the heavy-hitter head of layer 0
      const uint32_t h = in_.below(H);
      const uint32_t n = q.head_len(0, h);
      std::vector<float> probs(n);
      bool finite = true;
      for (float& p : probs) {
        const uint32_t x = in_.below(12);
        p = x == 0 ? std::numeric_limits<float>::infinity() : static_cast<float>(x) / 8.0f;
        finite &= x != 0;
      }
      const std::vector<float> before = q.HeadImportance(0, h);
      Status st = q.AccumulateImportance(0, h, probs);
      if (q.in_draft()) {
        if (st.code() != StatusCode::kFailedPrecondition) return "importance in a draft: " + st.ToString();
        return "";
      }
      if (!finite) {
        if (st.code() != StatusCode::kInvalidArgument) return "hybrid non-finite importance accepted";
        if (q.HeadImportance(0, h) != before) return "refused hybrid importance changed the sums";
        return "";
      }
      if (!st.ok()) return "hybrid importance: " + st.ToString();
      if (s.twin && !s.twin->AccumulateImportance(0, h, probs).ok()) return "twin importance";
      return "";
    }
    case 5: {  // evict heavy hitters
      Status st = q.Evict();
      note("evict", st);
      if (q.in_draft()) {
        if (st.code() != StatusCode::kFailedPrecondition) return "Evict in a draft: " + st.ToString();
        return "";
      }
      if (!st.ok()) {
        if (st.code() != StatusCode::kPoolExhausted) return "Evict: " + st.ToString();
        s.twin.reset();
        return "";
      }
      if (s.twin && !s.twin->Evict().ok()) return "twin Evict";
      for (uint32_t h = 0; h < H; ++h) {
        const EvictionPolicy& p = m.head_policies(0)[h];
        if (p.kind == EvictionKind::kHeavyHitter &&
            q.head_len(0, h) > p.heavy_tokens + p.window_tokens + p.sink_tokens) {
          return fmt::format("heavy-hitter head {} holds {} rows after Evict", h, q.head_len(0, h));
        }
      }
      return "";
    }
    case 6: {  // fork into a free slot
      HybridSlot* d = nullptr;
      for (HybridSlot& x : hybrids_)
        if (!x.seq) d = &x;
      if (!d) return "";
      htouched_ |= 1u << (d - hybrids_);
      auto f = q.Fork();
      if (!f.ok()) {
        if (q.in_draft() && f.status().code() == StatusCode::kFailedPrecondition) return "";
        if (f.status().code() != StatusCode::kPoolExhausted) return "hybrid fork: " + f.status().ToString();
        return "";
      }
      d->seq.emplace(std::move(*f));
      d->tokens = s.tokens;
      d->drafted = 0;
      if (s.twin) {
        auto tf = s.twin->Fork();
        if (!tf.ok()) return "twin fork: " + tf.status().ToString();
        d->twin.emplace(std::move(*tf));
      }
      return "";
    }
    case 7: {  // truncate (a linear layer refuses unless n == length)
      const uint32_t n = in_.below(q.num_tokens() + 1);
      Status st = q.Truncate(n);
      if (trace_) note(fmt::format("truncate {}", n).c_str(), st);
      if (st.ok() && n != q.num_tokens()) return "truncate did not reach its length";
      if (st.ok() && s.twin) {
        if (!s.twin->Truncate(n).ok()) return "twin truncate";
        s.tokens.resize(n);
      }
      return "";
    }
    default: {  // release
      q.Release();
      s.seq.reset();
      s.twin.reset();
      s.tokens.clear();
      return "";
    }
  }
}

std::string World::Run() {
  std::string e = Setup();
  if (!e.empty()) return "setup: " + e;
  for (size_t n = 0; n < max_ops_ && !in_.done(); ++n) {
    const uint32_t op = in_.below(20);
    static const char* const kNames[] = {
        "create", "append", "append", "append", "advance", "truncate", "fork", "clone",
        "reserve", "release", "publish", "adopt", "acquire", "use-held", "keep-rows",
        "importance", "hog", "hybrid", "hybrid", "hybrid"};
    // (formatted only when needed: this loop is the fuzzer's hot path)
    auto op_name = [&] { return fmt::format("op {} ({})", n, kNames[op]); };
    if (trace_) std::fprintf(stderr, "%s\n", op_name().c_str());
    touched_ = fresh_ = htouched_ = 0;
    pre_error_.clear();
    switch (op) {
      case 0: e = OpCreate(); break;
      case 1: case 2: case 3: e = OpAppend(); break;
      case 4: e = OpAdvance(); break;
      case 5: e = OpTruncate(); break;
      case 6: e = OpFork(false); break;
      case 7: e = OpFork(true); break;
      case 8: e = OpReserve(); break;
      case 9: e = OpRelease(); break;
      case 10: e = OpPublish(); break;
      case 11: e = OpAdopt(); break;
      case 12: e = OpAcquireHold(); break;
      case 13: e = OpUseHeld(); break;
      case 14: e = OpKeepRows(); break;
      case 15: e = OpImportance(); break;
      case 16: e = OpHog(); break;
      default: e = OpHybrid(); break;
    }
    if (!pre_error_.empty()) e = pre_error_;  // it came first
    const bool full = check_all_ || (n + 1) % kFullCheckEvery == 0 || n + 1 == max_ops_ || in_.done();
    if (e.empty()) {
      e = CheckAll(full);
      if (!e.empty() && full && !check_all_) e += " (full check; KVCACHE_FUZZ_CHECK_ALL=1 finds the operation)";
    }
    if (!e.empty()) return op_name() + ": " + e;
  }
  // Everything released leaves every pool exactly full.
  for (Seq& s : seqs_) s.cache.reset();
  for (Held& h : held_) {
    Status st = pool_->Release(h.blocks);
    if (!st.ok()) return "final release of held blocks: " + st.ToString();
  }
  held_.clear();
  if (!hog_.empty() && !pool_->Release(hog_).ok()) return "final release of the hog";
  hog_.clear();
  for (HybridSlot& s : hybrids_) {
    s.seq.reset();
    s.twin.reset();
  }
  e = CheckAll(true);
  if (!e.empty()) return "final: " + e;
  const PoolStats st = pool_->stats();
  if (st.used_blocks != 0 || st.reserved_blocks != 0 || st.available_blocks != st.num_blocks) {
    return "final: pool not full: " + pool_->DebugString();
  }
  prefix_.reset();
  for (const auto& p : hpools_) {
    if (!p) continue;
    const PoolStats h = p->stats();
    if (h.used_blocks != 0 || h.reserved_blocks != 0 || h.available_blocks != h.num_blocks) {
      return "final: hybrid pool not full: " + p->DebugString();
    }
  }
  return "";
}

}  // namespace

std::string RunApiSequence(const uint8_t* data, size_t size, const ApiSequenceOptions& options) {
  Bytes in(data, size);
  World w(in, options);
  return w.Run();
}

}  // namespace kvcache::fuzz
