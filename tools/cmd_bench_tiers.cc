// `kvcache bench tiers`: store and load bandwidth and latency of each offload
// tier for real block sizes (default: a bf16 block of Llama-3-8B's geometry,
// 32 layers x 8 kv heads x 128 x 16 tokens = 2 MiB), through the same path
// OffloadCache uses: encode the pool block into an object, Store a batch;
// Load a batch, verify every object (checksums, tokens), decode it into a
// pool block.
//
//   store_gbps / load_gbps  object bytes per second of wall time, median of
//                           --repeats batches of --batch blocks
//   store_us / load_us      per block, same medians; load_us splits into
//                           load_fetch_us (the tier's Load), load_verify_us
//                           (VerifyBlockObject) and load_decode_us (the copy
//                           into a pool block)
// The disk tier runs on --disk-path with the page cache warm (the batch was
// just written); --redis URL adds a Redis tier (loopback: pipelined GETs).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kvcache/pool.h"
#include "kvcache/tier.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

struct BenchTiersOptions {
  bool json = false;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  std::string kv_format = "bf16";
  uint32_t batch = 16;
  int repeats = 5;
  std::string disk_path;
  std::string redis;
  bool no_fsync = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<nlohmann::json> RunBench(const BenchTiersOptions& o) {
  KV_ASSIGN_OR_RETURN(Geometry geo, Geometry::Create({o.layers, o.kv_heads, o.head_dim, o.block_size}));
  KV_ASSIGN_OR_RETURN(FormatPair formats, ParseFormatPair(o.kv_format));
  if (o.repeats < 1 || o.batch < 1) return Status::InvalidArgument("bench tiers: --repeats, --batch >= 1");
  KV_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool,
                      BlockPool::Create(geo, formats, {.num_blocks = 2 * o.batch}));
  // Distinct, non-zero contents per block.
  for (uint32_t b = 0; b < o.batch; ++b) {
    for (uint32_t l = 0; l < geo.n_layers(); ++l) {
      for (Side s : {Side::kKey, Side::kValue}) {
        uint8_t* p = pool->block_data(l, s, b);
        for (size_t i = 0; i < pool->block_stride(s); ++i) p[i] = static_cast<uint8_t>(i * 131 + b * 7 + l);
      }
    }
  }
  const std::string disk = o.disk_path.empty()
                               ? (std::filesystem::temp_directory_path() /
                                  ("kvcache_bench_tiers_" + std::to_string(::getpid()))).string()
                               : o.disk_path;
  std::vector<std::shared_ptr<Tier>> tiers;
  tiers.push_back(NewHostTier({.capacity_bytes = uint64_t{64} << 30}));
  DiskTierOptions d;
  d.path = disk;
  d.capacity_bytes = uint64_t{64} << 30;
  d.fsync = !o.no_fsync;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> disk_tier, OpenDiskTier(d));
  tiers.push_back(std::move(disk_tier));
  if (!o.redis.empty()) {
    RedisTierOptions r;
    r.url = o.redis;
    r.deadline = std::chrono::milliseconds(5000);
    r.max_batch = o.batch;
    KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> redis, NewRedisTier(r));
    tiers.push_back(std::move(redis));
  }
  const BlockHash compat{1, 2};
  nlohmann::json out;
  out["block_bytes"] = pool->block_bytes();
  out["batch"] = o.batch;
  out["kv_format"] = FormatPairName(formats);
  out["geometry"] = {{"n_layers", o.layers}, {"n_kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                     {"block_size", o.block_size}};
  nlohmann::json results = nlohmann::json::array();
  uint64_t round = 0;
  for (const auto& tier : tiers) {
    std::vector<double> store_s, load_s, fetch_s, verify_s, decode_s;
    uint64_t object_bytes = 0;
    for (int rep = 0; rep < o.repeats; ++rep, ++round) {
      // A fresh chain each repeat (its own tokens), so nothing is already stored.
      std::vector<TokenId> tokens(size_t{o.batch} * o.block_size);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i + round * 1'000'003);
      const std::vector<BlockHash> h = HashFullBlocks(tokens, o.block_size, "");
      const BlockHash root = ChainRoot("");
      auto t0 = std::chrono::steady_clock::now();
      std::vector<TierPut> puts;
      std::vector<std::string> keys;
      for (uint32_t b = 0; b < o.batch; ++b) {
        KV_ASSIGN_OR_RETURN(std::vector<uint8_t> obj,
                            EncodeBlockObject(*pool, b, compat, h[b], b ? h[b - 1] : root,
                                              std::span(tokens).subspan(size_t{b} * o.block_size, o.block_size)));
        object_bytes = obj.size();
        keys.push_back(BlockKey(compat, h[b]));
        puts.push_back({keys.back(), b ? keys[b - 1] : "", std::make_shared<const std::vector<uint8_t>>(std::move(obj))});
      }
      if (tier->Store(puts) != puts.size()) {
        return Status::IoError(fmt::format("bench tiers: {} refused a store", tier->name()));
      }
      auto t1 = std::chrono::steady_clock::now();
      puts.clear();
      std::vector<TierGet> got = tier->Load(keys);
      auto tf = std::chrono::steady_clock::now();
      for (uint32_t b = 0; b < o.batch; ++b) {
        if (got[b].bytes == nullptr ||
            VerifyBlockObject(*got[b].bytes, compat, h[b], b ? h[b - 1] : root,
                              std::span(tokens).subspan(size_t{b} * o.block_size, o.block_size))
                .has_value()) {
          return Status::Internal(fmt::format("bench tiers: {} returned a bad object", tier->name()));
        }
      }
      auto tv = std::chrono::steady_clock::now();
      for (uint32_t b = 0; b < o.batch; ++b) {
        KV_RETURN_IF_ERROR(DecodeBlockObjectInto(*got[b].bytes, *pool, o.batch + b));
      }
      auto t2 = std::chrono::steady_clock::now();
      fetch_s.push_back(std::chrono::duration<double>(tf - t1).count());
      verify_s.push_back(std::chrono::duration<double>(tv - tf).count());
      decode_s.push_back(std::chrono::duration<double>(t2 - tv).count());
      got.clear();
      tier->Erase(keys);
      store_s.push_back(std::chrono::duration<double>(t1 - t0).count());
      load_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    const double bytes = double(object_bytes) * o.batch;
    const double st = Median(store_s), ld = Median(load_s);
    results.push_back({{"tier", tier->name()},
                       {"object_bytes", object_bytes},
                       {"store_gbps", bytes / st / 1e9},
                       {"load_gbps", bytes / ld / 1e9},
                       {"store_us", st / o.batch * 1e6},
                       {"load_us", ld / o.batch * 1e6},
                       {"load_fetch_us", Median(fetch_s) / o.batch * 1e6},
                       {"load_verify_us", Median(verify_s) / o.batch * 1e6},
                       {"load_decode_us", Median(decode_s) / o.batch * 1e6}});
  }
  tiers.clear();
  if (o.disk_path.empty()) std::filesystem::remove_all(disk);
  out["tiers"] = std::move(results);
  return out;
}

const bool kRegistered = RegisterCommand(
    "bench tiers", "Offload tier store/load bandwidth and latency per block (docs/tiers.md)",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<BenchTiersOptions>();
      app->add_flag("--json", o->json, "Print JSON");
      app->add_option("--layers", o->layers)->capture_default_str();
      app->add_option("--kv-heads", o->kv_heads)->capture_default_str();
      app->add_option("--head-dim", o->head_dim)->capture_default_str();
      app->add_option("--block-size", o->block_size)->capture_default_str();
      app->add_option("--kv-format", o->kv_format)->capture_default_str();
      app->add_option("--batch", o->batch, "Blocks per Store/Load call")->capture_default_str();
      app->add_option("--repeats", o->repeats)->capture_default_str();
      app->add_option("--disk-path", o->disk_path, "Disk tier folder (default: a temporary one)");
      app->add_option("--redis", o->redis, "redis://host:port of a server to measure too");
      app->add_flag("--no-fsync", o->no_fsync, "Disk tier without fsync before rename");
      return [o] {
        Result<nlohmann::json> r = RunBench(*o);
        if (!r.ok()) {
          fmt::print(stderr, "kvcache bench tiers: {}\n", r.status().ToString());
          return 2;
        }
        if (o->json) {
          fmt::print("{}\n", r->dump(2));
          return 0;
        }
        fmt::print("block {} bytes ({}), batch {}\n", (*r)["block_bytes"].get<uint64_t>(),
                   (*r)["kv_format"].get<std::string>(), o->batch);
        fmt::print("{:<6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}\n", "tier", "store GB/s",
                   "load GB/s", "store us", "load us", "fetch us", "verify us", "decode us");
        for (const auto& t : (*r)["tiers"]) {
          fmt::print("{:<6} {:>10.2f} {:>10.2f} {:>10.0f} {:>10.0f} {:>9.0f} {:>9.0f} {:>9.0f}\n",
                     t["tier"].get<std::string>(), t["store_gbps"].get<double>(),
                     t["load_gbps"].get<double>(), t["store_us"].get<double>(),
                     t["load_us"].get<double>(), t["load_fetch_us"].get<double>(),
                     t["load_verify_us"].get<double>(), t["load_decode_us"].get<double>());
        }
        return 0;
      };
    });

}  // namespace
}  // namespace kvcache::tools
