// Bindings of the layers above the cache: eviction policies, hybrid
// sequences (speculative draft / commit / abort), the prefix cache, the
// serving simulator and the format evaluator. Same conventions as
// bindings.cc (see its header comment).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "kvcache/eviction.h"
#include "kvcache/hybrid.h"
#include "engine/sim/simulator.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/workload.h"
#include "kvcache/serving/tier_store.h"
#include "kvcache/serving/offload.h"
#include "tools/support/eval/eval.h"  // private: the evaluator has no public header yet
#include <chrono>

using namespace nb::literals;

namespace kvcache::py {
namespace {

using PyHybrid = Guarded<HybridSequence>;

// An OffloadCache with what it needs kept alive (its prefix cache and tiers).
struct PyOffload {
  std::shared_ptr<PrefixCache> prefix;
  std::vector<std::shared_ptr<Tier>> tiers;
  std::unique_ptr<OffloadCache> cache;
};

nb::dict TierStatsDict(const TierStats& t) {
  nb::dict d;
  d["name"] = t.name;
  d["lookups"] = t.lookups;
  d["hit_blocks"] = t.hit_blocks;
  d["hit_tokens"] = t.hit_tokens;
  nb::dict misses;
  for (size_t r = 0; r < kNumTierMisses; ++r) {
    misses[std::string(TierMissName(static_cast<TierMiss>(r))).c_str()] = t.misses[r];
  }
  d["misses"] = misses;
  d["bytes_loaded"] = t.bytes_loaded;
  d["bytes_stored"] = t.bytes_stored;
  d["stored_blocks"] = t.stored_blocks;
  d["dropped_stores"] = t.dropped_stores;
  d["load_p50_us"] = t.load_p50_us;
  d["load_p99_us"] = t.load_p99_us;
  d["objects"] = t.usage.objects;
  d["bytes"] = t.usage.bytes;
  return d;
}

std::vector<TokenId> Tokens(const InU32& a) {
  if (a.ndim() != 1) ThrowInvalid("tokens must be 1-D uint32; got " + ShapeString(a));
  return std::vector<TokenId>(a.data(), a.data() + a.size());
}

void CheckHybridLayer(const HybridSequence& s, uint32_t layer) {
  if (layer >= s.model().n_layers()) {
    Throw(Status::OutOfRange("layer " + std::to_string(layer) + " out of range: the model has " +
                             std::to_string(s.model().n_layers()) + " layers"));
  }
}

nb::dict StatsDict(const PrefixCacheStats& s) {
  nb::dict d;
  d["lookups"] = s.lookups;
  d["lookup_tokens"] = s.lookup_tokens;
  d["hit_tokens"] = s.hit_tokens;
  d["hit_rate"] = s.hit_rate();
  d["published_blocks"] = s.published_blocks;
  d["evictions"] = s.evictions;
  d["orphans_dropped"] = s.orphans_dropped;
  nb::dict lookups, tokens;
  for (size_t r = 0; r < kNumMissReasons; ++r) {
    const std::string name(MissReasonName(static_cast<MissReason>(r)));
    lookups[name.c_str()] = s.miss_lookups[r];
    tokens[name.c_str()] = s.miss_tokens[r];
  }
  d["miss_lookups"] = lookups;
  d["miss_tokens"] = tokens;
  return d;
}

nb::dict ReportDict(const SimulateReport& r) {
  nb::dict d;
  d["kv_format"] = r.formats;
  d["num_blocks"] = r.num_blocks;
  d["block_bytes"] = r.block_bytes;
  d["bytes_per_token"] = r.bytes_per_token;
  d["capacity_tokens"] = r.capacity_tokens;
  d["requests"] = r.requests;
  d["rejected"] = r.rejected;
  d["sequences"] = r.sequences;
  d["steps"] = r.steps;
  d["peak_concurrent"] = r.peak_concurrent;
  d["mean_concurrent"] = r.mean_concurrent;
  d["prefix_hit_rate"] = r.prefix_hit_rate;
  d["prefix"] = StatsDict(r.prefix);
  d["preemptions"] = r.preemptions;
  d["evicted_blocks"] = r.evicted_blocks;
  d["pool_utilization"] = r.pool_utilization;
  d["peak_pool_utilization"] = r.peak_pool_utilization;
  d["tokens_appended"] = r.tokens_appended;
  d["prefill_tokens"] = r.prefill_tokens;
  d["generated_tokens"] = r.generated_tokens;
  d["draft_tokens"] = r.draft_tokens;
  d["draft_accepted"] = r.draft_accepted;
  d["mean_queue_steps"] = r.mean_queue_steps;
  d["wall_seconds"] = r.wall_seconds;
  return d;
}

// Rows [tokens, kv_heads, head_dim] as an EvalData field.
std::vector<float> EvalRows(const InF32& a, const char* name, uint32_t* tokens, uint32_t* heads,
                            uint32_t* dim) {
  if (a.ndim() != 3 || a.size() == 0) {
    ThrowInvalid(std::string(name) + " must have shape [tokens, heads, head_dim]; got " +
                 ShapeString(a));
  }
  *tokens = static_cast<uint32_t>(a.shape(0));
  *heads = static_cast<uint32_t>(a.shape(1));
  *dim = static_cast<uint32_t>(a.shape(2));
  return std::vector<float>(a.data(), a.data() + a.size());
}

}  // namespace

void BindServing(nb::module_& m) {
  // --- eviction policies ---------------------------------------------------------
  nb::class_<EvictionPolicy>(m, "EvictionPolicy",
                             "Which rows of one kv head to keep (StreamingLLM window, H2O "
                             "heavy hitters, a dead head, or everything).")
      .def_static("keep_all", &EvictionPolicy::KeepAll)
      .def_static("window", &EvictionPolicy::Window, "sink"_a, "window"_a,
                  "StreamingLLM: the first `sink` positions and the last `window`.")
      .def_static("heavy_hitter", &EvictionPolicy::HeavyHitter, "heavy"_a, "window"_a,
                  "sink"_a = 0,
                  "H2O: the `heavy` rows of most accumulated importance, plus a recent window.")
      .def_static("dead_head", &EvictionPolicy::DeadHead, "The head stores nothing.")
      .def_prop_ro("kind",
                   [](const EvictionPolicy& p) {
                     switch (p.kind) {
                       case EvictionKind::kKeepAll: return "keep_all";
                       case EvictionKind::kWindow: return "window";
                       case EvictionKind::kHeavyHitter: return "heavy_hitter";
                       case EvictionKind::kDeadHead: return "dead_head";
                     }
                     return "?";
                   })
      .def_ro("sink_tokens", &EvictionPolicy::sink_tokens)
      .def_ro("window_tokens", &EvictionPolicy::window_tokens)
      .def_ro("heavy_tokens", &EvictionPolicy::heavy_tokens)
      .def("validate", [](const EvictionPolicy& p) { Check(p.Validate()); })
      .def("__eq__", [](const EvictionPolicy& a, const EvictionPolicy& b) { return a == b; })
      .def("__repr__", [](const EvictionPolicy& p) { return "EvictionPolicy." + p.ToString(); });
  m.def(
      "select_rows",
      [](const EvictionPolicy& policy, uint32_t num_rows, std::optional<InF32> importance) {
        std::span<const float> imp;
        if (importance) imp = Span(*importance);
        return ToArray1D(Unwrap(SelectRows(policy, num_rows, imp)));
      },
      "policy"_a, "num_rows"_a, "importance"_a.none() = nb::none(),
      "Rows (ascending uint32) a policy keeps out of num_rows; importance [num_rows] for H2O.");

  // --- hybrid models and sequences -----------------------------------------------------
  nb::class_<LayerSpec>(m, "LayerSpec", "What kind of layer: full attention, window or linear.")
      .def_static(
          "full",
          [](std::optional<std::vector<EvictionPolicy>> policies) {
            return policies ? LayerSpec::FullWithPolicies(*policies) : LayerSpec::Full();
          },
          "head_policies"_a.none() = nb::none(),
          "Full attention; optional [n_kv_heads] eviction policies (DuoAttention, H2O).")
      .def_static("window", &LayerSpec::Window, "sink"_a, "window"_a,
                  "Sliding-window attention with sinks.")
      .def_static(
          "linear",
          [](const std::string& rule, std::vector<float> head_gate) {
            return LayerSpec::Linear(Unwrap(ParseLinearRule(rule)), std::move(head_gate));
          },
          "rule"_a = "plain", "head_gate"_a = std::vector<float>{},
          "A linear-recurrent layer ('plain', 'decay' or 'delta'): a state per head, no K/V.")
      .def_prop_ro("kind", [](const LayerSpec& s) { return std::string(LayerKindName(s.kind)); });

  nb::class_<HybridModel>(m, "HybridModel", "Layer kinds and storage groups of a hybrid model.")
      .def(nb::new_([](const Geometry& geometry, const std::string& formats,
                       std::vector<LayerSpec> layers, uint32_t window_slack_tokens,
                       uint32_t window_lookback_tokens, uint32_t max_draft_tokens) {
             HybridModelOptions o;
             o.window_slack_tokens = window_slack_tokens;
             o.window_lookback_tokens = window_lookback_tokens;
             o.max_draft_tokens = max_draft_tokens;
             // HybridModel is immutable; nanobind holds it by shared_ptr<const>.
             return std::const_pointer_cast<HybridModel>(
                 Unwrap(HybridModel::Create(geometry, ParsePair(formats), std::move(layers), o)));
           }),
           "geometry"_a, "formats"_a, "layers"_a, nb::kw_only(), "window_slack_tokens"_a = 0,
           "window_lookback_tokens"_a = 0, "max_draft_tokens"_a = 256)
      .def_prop_ro("geometry", &HybridModel::geometry)
      .def_prop_ro("n_layers", &HybridModel::n_layers)
      .def(
          "create_pools",
          [](const HybridModel& model, std::vector<uint32_t> blocks_per_group) {
            if (blocks_per_group.size() != 2) ThrowInvalid("blocks_per_group must have 2 entries");
            return Unwrap(model.CreatePools(blocks_per_group));
          },
          "blocks_per_group"_a,
          "One pool per non-empty storage group [full, bounded] (None for an empty group).");

  auto hybrid_class = nb::class_<PyHybrid>(m, "HybridSequence",
                                           "One sequence of a hybrid model, with speculative drafts as a "
                                           "transaction: begin_draft, then commit(n_accepted) or abort().")
      .def_static(
          "contiguous",
          [](std::shared_ptr<HybridModel> model, uint32_t sinks, uint32_t recent, uint32_t slack) {
            ContiguousOptions o;
            o.window = {.sinks = sinks, .recent = recent, .slack = slack};
            return std::make_unique<PyHybrid>(Unwrap(HybridSequence::CreateContiguous(model, o)));
          },
          "model"_a, nb::kw_only(), "sinks"_a = 0, "recent"_a = 0, "slack"_a = 0,
          "sinks / recent > 0: a precision window on the full layers (their first sinks and "
          "last recent positions also kept as bf16 rows; SequenceCache.contiguous). Every head of "
          "the full layers must keep every row.")
      .def_static(
          "paged",
          [](std::shared_ptr<HybridModel> model, std::vector<std::shared_ptr<BlockPool>> pools,
             uint32_t reserve_tokens, uint32_t sinks, uint32_t recent, uint32_t slack) {
            if (pools.size() != 2) ThrowInvalid("pools must have 2 entries (create_pools)");
            PagedOptions o;
            o.reserve_tokens = reserve_tokens;
            o.window = {.sinks = sinks, .recent = recent, .slack = slack};
            return std::make_unique<PyHybrid>(Unwrap(HybridSequence::CreatePaged(model, pools, o)));
          },
          "model"_a, "pools"_a, nb::kw_only(), "reserve_tokens"_a = 0, "sinks"_a = 0, "recent"_a = 0,
          "slack"_a = 0, "sinks / recent: a precision window on the full layers, as for contiguous().")
      .def_prop_ro("num_tokens", [](const PyHybrid& s) { return s.obj.num_tokens(); })
      .def("__len__", [](const PyHybrid& s) { return s.obj.num_tokens(); })
      .def(
          "append",
          [](PyHybrid& s, const InF32& k, const InF32& v) {
            HybridSequence& h = s.Mut();
            const Geometry& g = h.model().geometry();
            const size_t per_token = size_t{g.n_layers()} * g.kv_dim();
            if (k.ndim() != 4 || k.shape(0) != g.n_layers() || k.shape(2) != g.n_kv_heads() ||
                k.shape(3) != g.head_dim() || k.size() != v.size() || k.size() % per_token) {
              ThrowInvalid("k, v must have shape [layers, tokens, kv_heads, head_dim] = [" +
                           std::to_string(g.n_layers()) + ", n, " + std::to_string(g.n_kv_heads()) +
                           ", " + std::to_string(g.head_dim()) + "]; got " + ShapeString(k) +
                           " and " + ShapeString(v));
            }
            Check(h.Append(Span(k), Span(v)));
          },
          "k"_a, "v"_a, "Appends tokens to every layer: k, v [layers, tokens, kv_heads, head_dim].")
      .def("begin_draft", [](PyHybrid& s) { Check(s.Mut().BeginDraft()); })
      .def(
          "commit", [](PyHybrid& s, uint32_t n) { Check(s.Mut().Commit(n)); }, "num_accepted"_a,
          "Keeps the first num_accepted drafted tokens and ends the draft.")
      .def("abort", [](PyHybrid& s) { Check(s.Mut().Abort()); }, "Drops every drafted token.")
      .def_prop_ro("in_draft", [](const PyHybrid& s) { return s.obj.in_draft(); })
      .def_prop_ro("draft_base", [](const PyHybrid& s) { return s.obj.draft_base(); })
      .def(
          "truncate", [](PyHybrid& s, uint32_t n) { Check(s.Mut().Truncate(n)); }, "num_tokens"_a)
      .def("evict", [](PyHybrid& s) { Check(s.Mut().Evict()); },
           "Applies every heavy-hitter head policy of the model.")
      .def(
          "evict_layer",
          [](PyHybrid& s, uint32_t layer, std::vector<EvictionPolicy> policies) {
            CheckHybridLayer(s.obj, layer);
            Check(s.Mut().EvictLayer(layer, Unwrap(PolicyTable::PerHead(std::move(policies)))));
          },
          "layer"_a, "policies"_a, "Applies [n_kv_heads] policies to one attention layer once.")
      .def(
          "head_keys",
          [](const PyHybrid& s, uint32_t layer, uint32_t head) {
            CheckHybridLayer(s.obj, layer);
            return HeadRowsArray(Unwrap(s.obj.HeadKeys(layer, head)), s.obj.model().geometry().head_dim());
          },
          "layer"_a, "head"_a)
      .def(
          "head_values",
          [](const PyHybrid& s, uint32_t layer, uint32_t head) {
            CheckHybridLayer(s.obj, layer);
            return HeadRowsArray(Unwrap(s.obj.HeadValues(layer, head)), s.obj.model().geometry().head_dim());
          },
          "layer"_a, "head"_a)
      .def(
          "head_positions",
          [](const PyHybrid& s, uint32_t layer, uint32_t head) {
            CheckHybridLayer(s.obj, layer);
            return ToArray1D(s.obj.HeadPositions(layer, head));
          },
          "layer"_a, "head"_a)
      .def(
          "accumulate_importance",
          [](PyHybrid& s, uint32_t layer, uint32_t head, const InF32& probs) {
            CheckHybridLayer(s.obj, layer);
            Check(s.Mut().AccumulateImportance(layer, head, Span(probs)));
          },
          "layer"_a, "head"_a, "probs"_a)
      .def(
          "attend",
          [](PyHybrid& s, uint32_t layer, const InF32& q, bool return_lse) {
            CheckHybridLayer(s.obj, layer);
            const size_t d = s.obj.model().geometry().head_dim();
            if ((q.ndim() != 2 && q.ndim() != 3) || q.shape(q.ndim() - 1) != d ||
                q.shape(q.ndim() - 2) == 0 || q.shape(0) == 0) {
              ThrowInvalid("q must have shape [n_q_heads, head_dim] or [n_queries, n_q_heads, "
                           "head_dim] with head_dim=" + std::to_string(d) + "; got " +
                           ShapeString(q));
            }
            const uint32_t n_queries = q.ndim() == 3 ? static_cast<uint32_t>(q.shape(0)) : 1;
            const uint32_t n_q_heads = static_cast<uint32_t>(q.shape(q.ndim() - 2));
            std::vector<float> out(q.size());
            std::vector<float> lse(return_lse ? size_t{n_queries} * n_q_heads : 0);
            AttentionOptions o;
            o.n_q_heads = n_q_heads;
            Status status;
            {
              ReadGuard guard(std::vector<PyHybrid*>{&s});
              nb::gil_scoped_release release;
              status = s.obj.Attend(layer, n_queries, Span(q), o, {out, lse, {}, {}});
            }
            Check(status);
            std::vector<size_t> shape(q.shape_ptr(), q.shape_ptr() + q.ndim());
            nb::object o_arr = nb::cast(ToArray(std::move(out), shape));
            if (!return_lse) return o_arr;
            shape.pop_back();
            return nb::object(nb::make_tuple(o_arr, nb::cast(ToArray(std::move(lse), shape))));
          },
          "layer"_a, "q"_a, nb::kw_only(), "return_lse"_a = false,
          "Attention of the last n_queries positions of one attention layer with each head's "
          "window and policies applied. Releases the GIL.")
      .def(
          "fork", [](PyHybrid& s) { return std::make_unique<PyHybrid>(Unwrap(s.Mut().Fork())); })
      .def("clone",
           [](const PyHybrid& s) { return std::make_unique<PyHybrid>(Unwrap(s.obj.Clone())); })
      .def("release", [](PyHybrid& s) { s.Mut().Release(); })
      .def_prop_ro("released", [](const PyHybrid& s) { return s.obj.released(); })
      .def_prop_ro("allocated_bytes", [](const PyHybrid& s) { return s.obj.allocated_bytes(); })
      .def_prop_ro("used_bytes", [](const PyHybrid& s) { return s.obj.used_bytes(); })
;
  DefInvariantsAndWith(hybrid_class);

  // --- prefix cache ------------------------------------------------------------------------
  nb::class_<PrefixCache>(m, "PrefixCache",
                          "Full blocks named by a hash chain over their token ids, reused "
                          "across sequences of one pool (LRU of unreferenced blocks).")
      .def(nb::new_([](std::shared_ptr<BlockPool> pool, size_t evicted_history) {
             if (!pool) ThrowInvalid("PrefixCache: pool is None");
             PrefixCacheOptions o;
             o.evicted_history = evicted_history;
             return std::shared_ptr<PrefixCache>(Unwrap(PrefixCache::Create(std::move(pool), o)));
           }),
           "pool"_a, nb::kw_only(), "evicted_history"_a = size_t{1} << 16)
      .def_prop_ro("block_size", &PrefixCache::block_size)
      .def(
          "adopt_into",
          [](PrefixCache& pc, PyCache& seq, const InU32& tokens, const std::string& salt) {
            return Unwrap(pc.AdoptInto(&seq.Mut(), Tokens(tokens), salt));
          },
          "seq"_a, "tokens"_a, "salt"_a = "",
          "Starts an empty paged seq with the longest cached prefix of tokens; returns the "
          "tokens adopted (a multiple of the block size).")
      .def(
          "publish_sequence",
          [](PrefixCache& pc, PyCache& seq, const InU32& tokens, const std::string& salt) {
            return Unwrap(pc.PublishSequence(&seq.Mut(), Tokens(tokens), salt));
          },
          "seq"_a, "tokens"_a, "salt"_a = "",
          "Publishes seq's full blocks (tokens = its committed tokens); returns blocks newly "
          "published.")
      .def(
          "peek",
          [](const PrefixCache& pc, const InU32& tokens, const std::string& salt) {
            return pc.Peek(Tokens(tokens), salt).num_tokens;
          },
          "tokens"_a, "salt"_a = "", "Tokens of the longest cached prefix; takes nothing.")
      .def_prop_ro("num_cached_blocks", &PrefixCache::num_cached_blocks)
      .def("stats", [](const PrefixCache& pc) { return StatsDict(pc.stats()); })
      .def("reset_stats", &PrefixCache::ResetStats)
      .def("check_invariants", [](const PrefixCache& pc) {
        const std::string problem = pc.CheckInvariants();
        if (!problem.empty()) Throw(Status::Internal(problem));
      });

  // --- offload tiers -----------------------------------------------------------------------
  nb::class_<Tier>(m, "Tier", "A block store (host RAM, a disk folder or Redis); thread-safe.")
      .def_prop_ro("name", &Tier::name)
      .def(
          "keys_present",
          [](Tier& t, std::vector<std::string> keys) {
            std::vector<bool> out;
            for (const auto& miss : t.Exists(keys)) out.push_back(!miss.has_value());
            return out;
          },
          "keys"_a, "For each key, whether the tier holds it now.")
      .def(
          "usage",
          [](const Tier& t) {
            const TierUsage u = t.usage();
            nb::dict d;
            d["objects"] = u.objects;
            d["bytes"] = u.bytes;
            d["capacity_bytes"] = u.capacity_bytes;
            d["evictions"] = u.evictions;
            d["store_failures"] = u.store_failures;
            d["recovered_objects"] = u.recovered_objects;
            d["discarded_files"] = u.discarded_files;
            return d;
          });
  m.def(
      "host_tier",
      [](uint64_t capacity_bytes) {
        HostTierOptions o;
        o.capacity_bytes = capacity_bytes;
        return std::shared_ptr<Tier>(NewHostTier(o));
      },
      "capacity_bytes"_a = uint64_t{1} << 30, "Host RAM, LRU by bytes (chain tails first).");
  m.def(
      "disk_tier",
      [](const std::string& path, uint64_t capacity_bytes, bool fsync) {
        DiskTierOptions o;
        o.path = path;
        o.capacity_bytes = capacity_bytes;
        o.fsync = fsync;
        return std::shared_ptr<Tier>(Unwrap(OpenDiskTier(o)));
      },
      "path"_a, "capacity_bytes"_a = uint64_t{16} << 30, "fsync"_a = true,
      "A folder of objects (temp file, fsync, rename); the index is rebuilt on open.");
  m.def(
      "redis_tier",
      [](const std::string& url, double deadline_ms) {
        RedisTierOptions o;
        o.url = url;
        o.deadline = std::chrono::milliseconds(static_cast<int64_t>(deadline_ms));
        return std::shared_ptr<Tier>(Unwrap(NewRedisTier(o)));
      },
      "url"_a, "deadline_ms"_a = 500.0,
      "redis://[:password@]host[:port][/db]; connects on first use, faults become misses.");

  nb::class_<PyOffload>(m, "OffloadCache",
                        "A prefix cache whose published blocks are written through to tiers "
                        "and loaded back, verified, when the pool misses.")
      .def(nb::new_([](std::shared_ptr<BlockPool> pool, std::vector<std::shared_ptr<Tier>> tiers,
                       const std::string& model, size_t queue_blocks) {
             if (!pool) ThrowInvalid("OffloadCache: pool is None");
             auto out = std::make_shared<PyOffload>();
             out->prefix = std::shared_ptr<PrefixCache>(Unwrap(PrefixCache::Create(pool)));
             out->tiers = tiers;
             OffloadOptions o;
             o.model = model;
             o.queue_blocks = queue_blocks;
             out->cache = Unwrap(OffloadCache::Create(pool, out->prefix.get(), tiers, o));
             return out;
           }),
           "pool"_a, "tiers"_a, nb::kw_only(), "model"_a = "", "queue_blocks"_a = 256,
           "model: the model fingerprint that goes into every object's compatibility digest.")
      .def(
          "publish_sequence",
          [](PyOffload& oc, PyCache& seq, const InU32& tokens, const std::string& salt) {
            return Unwrap(oc.cache->PublishSequence(&seq.Mut(), Tokens(tokens), salt));
          },
          "seq"_a, "tokens"_a, "salt"_a = "",
          "Publishes seq's full blocks and queues them for the tiers; returns blocks published.")
      .def(
          "adopt_into",
          [](PyOffload& oc, PyCache& seq, const InU32& tokens, const std::string& salt) {
            std::vector<uint64_t> served;
            const size_t adopted = Unwrap(oc.cache->AdoptInto(&seq.Mut(), Tokens(tokens), salt, &served));
            nb::dict by;
            by["pool"] = served.empty() ? 0 : served[0];
            for (size_t t = 0; t + 1 < served.size(); ++t) by[oc.tiers[t]->name().c_str()] = served[t + 1];
            return nb::make_tuple(adopted, by);
          },
          "seq"_a, "tokens"_a, "salt"_a = "",
          "Starts an empty paged seq with the longest prefix the pool or the tiers hold; "
          "returns (tokens adopted, {'pool': n, tier name: n, ...}).")
      .def("flush", [](PyOffload& oc) {
        nb::gil_scoped_release release;
        oc.cache->Flush();
      }, "Waits until every queued store is written.")
      .def("stats", [](const PyOffload& oc) {
        const OffloadStats s = oc.cache->stats();
        nb::dict d;
        nb::list tiers;
        for (const TierStats& t : s.tiers) tiers.append(TierStatsDict(t));
        d["tiers"] = tiers;
        d["queued_blocks"] = s.queued_blocks;
        d["dropped_queue_full"] = s.dropped_queue_full;
        d["load_alloc_failures"] = s.load_alloc_failures;
        return d;
      });

  // --- simulate --------------------------------------------------------------------------------
  m.def(
      "simulate",
      [](const std::string& formats, const std::string& workload, const std::string& model,
         uint64_t pool_bytes, uint32_t num_requests, uint64_t seed, const std::string& admission,
         bool prefix_caching, uint32_t draft_tokens, double draft_accept, uint32_t max_running,
         double mean_interarrival_steps) {
        SimulateOptions o;
        o.geometry = Unwrap(ParseModelGeometry(model));
        o.formats = ParsePair(formats);
        o.pool_bytes = pool_bytes;
        o.admission = Unwrap(ParseAdmissionPolicy(admission));
        o.prefix_caching = prefix_caching;
        o.draft_tokens = draft_tokens;
        o.draft_accept = draft_accept;
        o.max_running = max_running;
        o.seed = seed;
        std::vector<Request> requests;
        auto kind = ParseWorkloadKind(workload);
        if (kind.ok()) {
          WorkloadOptions w;
          w.kind = *kind;
          w.num_requests = num_requests;
          w.seed = seed;
          w.mean_interarrival_steps = mean_interarrival_steps;
          requests = GenerateWorkload(w);
        } else {
          requests = Unwrap(LoadWorkloadFile(workload));
        }
        Result<SimulateReport> report = [&] {
          nb::gil_scoped_release release;
          return Simulate(o, requests);
        }();
        return ReportDict(Unwrap(std::move(report)));
      },
      "formats"_a = "bf16", nb::kw_only(), "workload"_a = "chat", "model"_a = "llama3-8b",
      "pool_bytes"_a = uint64_t{1} << 30, "num_requests"_a = 300, "seed"_a = 1,
      "admission"_a = "prompt", "prefix_caching"_a = true, "draft_tokens"_a = 0,
      "draft_accept"_a = 0.7, "max_running"_a = 256, "mean_interarrival_steps"_a = 1.0,
      "Replays a workload ('chat', 'shared-prefix', 'parallel-sampling' or a JSONL file) on a\n"
      "pool of pool_bytes for a model geometry ('llama3-8b' or 'L,KVH,D'); returns the\n"
      "SimulateReport's fields as a dict (prefix-cache counters under 'prefix'). Releases the GIL.");

  // --- eval ----------------------------------------------------------------------------------------
  m.def(
      "eval",
      [](const InF32& keys, const InF32& values, const InF32& queries,
         std::vector<std::string> formats, uint32_t calibration_tokens) {
        eval::EvalData data;
        uint32_t t2, h2, d2, qh, qd;
        data.keys = EvalRows(keys, "keys", &data.tokens, &data.kv_heads, &data.head_dim);
        data.values = EvalRows(values, "values", &t2, &h2, &d2);
        data.queries = EvalRows(queries, "queries", &data.num_queries, &qh, &qd);
        data.q_heads = qh;
        if (t2 != data.tokens || h2 != data.kv_heads || d2 != data.head_dim ||
            qd != data.head_dim) {
          ThrowInvalid("eval: keys " + ShapeString(keys) + ", values " + ShapeString(values) +
                       " and queries " + ShapeString(queries) + " do not agree");
        }
        Check(data.Validate());
        std::vector<FormatPair> pairs;
        for (const std::string& f : formats) pairs.push_back(ParsePair(f));
        eval::EvalOptions options;
        options.calibration_tokens = calibration_tokens;
        std::vector<Result<eval::PairResult>> results;
        {
          nb::gil_scoped_release release;
          eval::Evaluator evaluator(data, options);
          for (FormatPair p : pairs) results.push_back(evaluator.Evaluate(p));
        }
        nb::list out;
        for (auto& r : results) {
          const eval::PairResult pr = Unwrap(std::move(r));
          nb::dict d;
          d["kv_format"] = FormatPairName(pr.pair);
          d["k_bits"] = pr.k_bits;
          d["v_bits"] = pr.v_bits;
          d["k_nmse"] = pr.k_nmse;
          d["v_nmse"] = pr.v_nmse;
          d["attn_rel_err"] = pr.attention.rel_err;
          d["attn_cosine"] = pr.attention.cosine;
          d["attn_kl"] = pr.attention.kl;
          d["attn_top1_agree"] = pr.attention.top1_agree;
          out.append(d);
        }
        return out;
      },
      "keys"_a, "values"_a, "queries"_a, "formats"_a, nb::kw_only(),
      "calibration_tokens"_a = 256,
      "Measures K:V format pairs on your rows: keys, values [tokens, kv_heads, head_dim],\n"
      "queries [num_queries, q_heads, head_dim]. Returns one dict per pair: bits, NMSE of K\n"
      "and V, attention output error, cosine, KL and top-1 agreement vs f32. Releases the GIL.");
}

}  // namespace kvcache::py
