// `kvcache bench tiers`: store and load bandwidth and latency of each offload
// tier for real block sizes (default: a bf16 block of Llama-3-8B's geometry,
// 32 layers x 8 kv heads x 128 x 16 tokens = 2 MiB), through the same path
// OffloadCache uses: encode the pool block into an object, Store a batch;
// Load a batch, verify every object (checksums, tokens), decode it into a
// pool block.
//
// Load = the tier's Load + VerifyAndDecodeBlockObject into a fresh pool
// block (OffloadCache's path: header checks, then each section copied and
// checksummed from its copy).
//
//   store_gbps / load_gbps  object bytes per second of wall time, median of
//                           --repeats batches of --batch blocks
//   store_us / load_us      per block, same medians; load_us splits into
//                           load_fetch_us (the tier's Load; load_fetch_gbps
//                           the same as a rate) and load_verify_decode_us
//   floor                   what bounds the tier, measured in the same run
//                           over the same batch: host = memcpy into the pool
//                           blocks (a load's one unavoidable pass; "floors"
//                           also has XXH3-64 and the two as separate passes,
//                           1/(1/a + 1/b)); disk = a raw read() of
//                           page-cached files of the object's size into a
//                           prefaulted buffer; redis = raw pipelined GETs
//                           on one socket read into a prefaulted buffer.
//                           The bare floors are in "floors".
//   recompute_us            the time to recompute one block instead
//                           ("recompute": 2 * params * block_size FLOPs at
//                           the f16 MatMul throughput of model/tensor/matmul.h
//                           measured now on this machine's threads;
//                           --recompute-params, default Llama-3-8B's).
// The disk tier runs on --disk-path with the page cache warm (the batch was
// just written); --redis URL adds a Redis tier (loopback: pipelined GETs).
#include <fmt/format.h>

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "kvcache/pool.h"
#include "kvcache/thread_pool.h"
#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"
#include "model/tensor/matmul.h"
#include "tools/bench_util.h"
#include "tools/command.h"
#include "tools/json_result.h"

namespace kvcache::tools {
namespace {

struct BenchTiersOptions : BenchCacheOptions {
  BenchTiersOptions() { kv_format = "bf16"; }
  uint32_t batch = 16;
  int repeats = 5;
  std::string disk_path;
  std::string redis;
  bool no_fsync = false;
  double recompute_params = 8'030'261'248.0;  // Llama-3-8B
};

using BenchClock = std::chrono::steady_clock;

double Seconds(BenchClock::time_point a, BenchClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median GB/s of fn() moving `bytes` per call.
template <typename Fn>
Result<double> Gbps(int repeats, double bytes, Fn fn) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = BenchClock::now();
    KV_RETURN_IF_ERROR(fn());
    t.push_back(Seconds(t0, BenchClock::now()));
  }
  return bytes / UpperMedian(t) / 1e9;
}

// Raw pipelined GETs of `keys` on one socket, every reply read with large
// read()s into one prefaulted buffer; returns the bytes of the values.
Result<double> RawRedisGets(const RedisEndpoint& ep, const std::vector<std::string>& keys,
                            size_t value_bytes, int repeats) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (::getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &ai) != 0 || ai == nullptr) {
    return Status::IoError("bench tiers: cannot resolve the redis host");
  }
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  const bool connected = fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  ::freeaddrinfo(ai);
  if (!connected) {
    if (fd >= 0) ::close(fd);
    return Status::IoError("bench tiers: cannot connect to redis for the raw GET floor");
  }
  std::string cmds;
  if (!ep.password.empty()) cmds += fmt::format("*2\r\n$4\r\nAUTH\r\n${}\r\n{}\r\n", ep.password.size(), ep.password);
  if (ep.db != 0) cmds += fmt::format("*2\r\n$6\r\nSELECT\r\n${}\r\n{}\r\n", std::to_string(ep.db).size(), ep.db);
  const size_t setup_reply = (ep.password.empty() ? 0 : 5) + (ep.db != 0 ? 5 : 0);  // "+OK\r\n"
  std::string gets;
  for (const std::string& k : keys) gets += fmt::format("*2\r\n$3\r\nGET\r\n${}\r\n{}\r\n", k.size(), k);
  const size_t reply_bytes = keys.size() * (fmt::format("${}\r\n", value_bytes).size() + value_bytes + 2);
  std::vector<uint8_t> buf(reply_bytes + setup_reply);  // zero-filled: prefaulted
  auto exchange = [&](const std::string& out, size_t expect) -> Status {
    for (size_t off = 0; off < out.size();) {
      const ssize_t w = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (w <= 0) return Status::IoError("bench tiers: raw redis send failed");
      off += static_cast<size_t>(w);
    }
    for (size_t got = 0; got < expect;) {
      const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
      if (r <= 0) return Status::IoError("bench tiers: raw redis read failed");
      got += static_cast<size_t>(r);
    }
    return Status::Ok();
  };
  Status st = Status::Ok();
  if (!cmds.empty()) st = exchange(cmds, setup_reply);
  Result<double> gbps = Status::Ok();
  if (st.ok()) {
    gbps = Gbps(repeats, double(value_bytes) * keys.size(), [&] { return exchange(gets, reply_bytes); });
    if (gbps.ok() && buf[0] != '$') gbps = Status::IoError("bench tiers: raw GET got no bulk reply");
  }
  ::close(fd);
  if (!st.ok()) return st;
  return gbps;
}

// f16 MatMul throughput (FLOP/s) of a 4096 x 4096 weight matrix (Llama-3-8B's
// attention projection shape) over a 16-token chunk, every hardware thread.
double MatMulFlops(uint32_t tokens, uint32_t* threads_out) {
  constexpr uint32_t kDim = 4096;
  std::vector<uint16_t> w(size_t{kDim} * kDim);
  std::mt19937 rng(7);
  for (uint16_t& v : w) v = static_cast<uint16_t>(0x3000 | (rng() & 0x83FF));  // |x| in [2^-3, 2^-2)
  std::vector<float> x(size_t{tokens} * kDim), out(size_t{tokens} * kDim);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  model::WeightMatrix m;
  m.type = model::GgmlType::kF16;
  m.data = reinterpret_cast<const uint8_t*>(w.data());
  m.rows = kDim;
  m.cols = kDim;
  m.row_bytes = size_t{kDim} * 2;
  const uint32_t threads = std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  *threads_out = threads;
  model::MatMul(m, x.data(), tokens, out.data(), &pool);  // warm up
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = BenchClock::now();
    model::MatMul(m, x.data(), tokens, out.data(), &pool);
    t.push_back(Seconds(t0, BenchClock::now()));
  }
  return 2.0 * kDim * kDim * tokens / UpperMedian(t);
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

  // --- floors, over the same batch of objects ---
  std::vector<std::vector<uint8_t>> objs;
  {
    const std::vector<TokenId> tokens(size_t{o.batch} * o.block_size, 1);
    const std::vector<BlockHash> h = HashFullBlocks(tokens, o.block_size, "");
    for (uint32_t b = 0; b < o.batch; ++b) {
      KV_ASSIGN_OR_RETURN(std::vector<uint8_t> obj,
                          EncodeBlockObject(*pool, b, compat, h[b], b ? h[b - 1] : ChainRoot(""),
                                            std::span(tokens).subspan(size_t{b} * o.block_size, o.block_size)));
      objs.push_back(std::move(obj));
    }
  }
  const size_t object_size = objs[0].size();
  const double batch_bytes = double(object_size) * o.batch;
  nlohmann::json floors;
  // memcpy into the pool blocks a load fills, section by section.
  KV_ASSIGN_OR_RETURN(const double memcpy_gbps, Gbps(o.repeats, batch_bytes, [&] {
    for (uint32_t b = 0; b < o.batch; ++b) {
      const uint8_t* src = objs[b].data() + (object_size - pool->block_bytes());
      for (uint32_t l = 0; l < geo.n_layers(); ++l) {
        for (Side side : {Side::kKey, Side::kValue}) {
          std::memcpy(pool->block_data(l, side, o.batch + b), src, pool->block_stride(side));
          src += pool->block_stride(side);
        }
      }
    }
    return Status::Ok();
  }));
  uint64_t sink = 0;
  KV_ASSIGN_OR_RETURN(const double xxh3_gbps, Gbps(o.repeats, batch_bytes, [&] {
    for (uint32_t b = 0; b < o.batch; ++b) sink += BlockChecksum(objs[b]);
    return Status::Ok();
  }));
  floors["memcpy_gbps"] = memcpy_gbps;
  floors["xxh3_gbps"] = xxh3_gbps;
  floors["xxh3_sink"] = sink & 1;  // keeps the hashes from being optimized away
  const double host_floor = 1.0 / (1.0 / memcpy_gbps + 1.0 / xxh3_gbps);
  floors["memcpy_plus_xxh3_gbps"] = host_floor;
  {
    const std::string dir = disk + "/floor";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    for (uint32_t b = 0; b < o.batch; ++b) {
      const std::string f = fmt::format("{}/{}.bin", dir, b);
      const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      const bool ok = fd >= 0 && ::write(fd, objs[b].data(), object_size) == static_cast<ssize_t>(object_size);
      if (fd >= 0) ::close(fd);
      if (!ok) return Status::IoError("bench tiers: cannot write the read() floor's files");
    }
    std::vector<uint8_t> buf(object_size);  // zero-filled: prefaulted
    KV_ASSIGN_OR_RETURN(const double read_gbps, Gbps(o.repeats, batch_bytes, [&]() -> Status {
      for (uint32_t b = 0; b < o.batch; ++b) {
        const int fd = ::open(fmt::format("{}/{}.bin", dir, b).c_str(), O_RDONLY | O_CLOEXEC);
        const bool ok = fd >= 0 && ::read(fd, buf.data(), buf.size()) == static_cast<ssize_t>(buf.size());
        if (fd >= 0) ::close(fd);
        if (!ok) return Status::IoError("bench tiers: read() floor failed");
      }
      return Status::Ok();
    }));
    floors["read_gbps"] = read_gbps;
    std::filesystem::remove_all(dir, ec);
  }
  if (!o.redis.empty()) {
    KV_ASSIGN_OR_RETURN(RedisEndpoint ep, ParseRedisUrl(o.redis));
    std::vector<TierPut> puts;
    std::vector<std::string> keys;
    for (uint32_t b = 0; b < o.batch; ++b) {
      keys.push_back(fmt::format("kvc-bench-floor:{}:{}", ::getpid(), b));
      puts.push_back({keys.back(), "", std::make_shared<const std::vector<uint8_t>>(objs[b])});
    }
    Tier& redis = *tiers.back();
    if (redis.Store(puts) != puts.size()) return Status::IoError("bench tiers: redis refused a store");
    KV_ASSIGN_OR_RETURN(const double get_gbps, RawRedisGets(ep, keys, object_size, o.repeats));
    redis.Erase(keys);
    floors["redis_get_raw_gbps"] = get_gbps;
  }
  objs.clear();

  // --- recompute: 2 * params * block_size FLOPs at the measured MatMul rate ---
  uint32_t threads = 0;
  const double flops = MatMulFlops(o.block_size, &threads);
  const double recompute_us = 2.0 * o.recompute_params * o.block_size / flops * 1e6;
  out["recompute"] = {{"method", "2 * params * block_size FLOPs at the measured f16 MatMul rate "
                                 "(4096x4096 weights, a block_size-token chunk; attention not counted)"},
                      {"params", o.recompute_params},
                      {"matmul_gflops", flops / 1e9},
                      {"threads", threads},
                      {"recompute_us_per_block", recompute_us}};

  nlohmann::json results = nlohmann::json::array();
  uint64_t round = 0;
  for (const auto& tier : tiers) {
    std::vector<double> store_s, load_s, fetch_s, vd_s;
    uint64_t object_bytes = 0;
    for (int rep = 0; rep < o.repeats; ++rep, ++round) {
      // A fresh chain each repeat (its own tokens), so nothing is already stored.
      std::vector<TokenId> tokens(size_t{o.batch} * o.block_size);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i + round * 1'000'003);
      const std::vector<BlockHash> h = HashFullBlocks(tokens, o.block_size, "");
      const BlockHash root = ChainRoot("");
      auto t0 = BenchClock::now();
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
      auto t1 = BenchClock::now();
      puts.clear();
      std::vector<TierGet> got = tier->Load(keys);
      auto tf = BenchClock::now();
      for (uint32_t b = 0; b < o.batch; ++b) {
        if (got[b].bytes == nullptr ||
            VerifyAndDecodeBlockObject(*got[b].bytes, compat, h[b], b ? h[b - 1] : root,
                                       std::span(tokens).subspan(size_t{b} * o.block_size, o.block_size),
                                       *pool, o.batch + b)
                .has_value()) {
          return Status::Internal(fmt::format("bench tiers: {} returned a bad object", tier->name()));
        }
      }
      auto t2 = BenchClock::now();
      fetch_s.push_back(Seconds(t1, tf));
      vd_s.push_back(Seconds(tf, t2));
      got.clear();
      tier->Erase(keys);
      store_s.push_back(Seconds(t0, t1));
      load_s.push_back(Seconds(t1, t2));
    }
    const double bytes = double(object_bytes) * o.batch;
    const double st = UpperMedian(store_s), ld = UpperMedian(load_s);
    const std::string name = tier->name();
    nlohmann::json floor;
    if (name == "host") floor = {{"name", "memcpy"}, {"gbps", memcpy_gbps}};
    if (name == "disk") floor = {{"name", "read"}, {"gbps", floors["read_gbps"]}};
    if (name == "redis") floor = {{"name", "redis_get_raw"}, {"gbps", floors["redis_get_raw_gbps"]}};
    results.push_back({{"tier", name},
                       {"object_bytes", object_bytes},
                       {"store_gbps", bytes / st / 1e9},
                       {"load_gbps", bytes / ld / 1e9},
                       {"floor", floor},
                       {"store_us", st / o.batch * 1e6},
                       {"load_us", ld / o.batch * 1e6},
                       {"load_fetch_us", UpperMedian(fetch_s) / o.batch * 1e6},
                       {"load_fetch_gbps", bytes / std::max(UpperMedian(fetch_s), 1e-9) / 1e9},
                       {"load_verify_decode_us", UpperMedian(vd_s) / o.batch * 1e6},
                       {"recompute_us", recompute_us},
                       {"recompute_over_load", recompute_us / (ld / o.batch * 1e6)}});
  }
  out["floors"] = std::move(floors);
  tiers.clear();
  if (o.disk_path.empty()) std::filesystem::remove_all(disk);
  out["tiers"] = std::move(results);
  return out;
}

// The text of a result: one row per tier.
void PrintText(const BenchTiersOptions& o, const nlohmann::json& r) {
  fmt::print("block {} bytes ({}), batch {}\n", r["block_bytes"].get<uint64_t>(),
             r["kv_format"].get<std::string>(), o.batch);
  fmt::print("{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>12}\n", "tier",
             "store GB/s", "load GB/s", "floor GB/s", "store us", "load us", "fetch us",
             "verify+dec", "recompute us");
  for (const auto& t : r["tiers"]) {
    fmt::print("{:<6} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.0f} {:>10.0f} {:>9.0f} {:>10.0f} {:>12.0f}\n",
               t["tier"].get<std::string>(), t["store_gbps"].get<double>(),
               t["load_gbps"].get<double>(), t["floor"]["gbps"].get<double>(),
               t["store_us"].get<double>(), t["load_us"].get<double>(),
               t["load_fetch_us"].get<double>(), t["load_verify_decode_us"].get<double>(),
               t["recompute_us"].get<double>());
  }
  fmt::print("floors: {}\nrecompute: {}\n", r["floors"].dump(), r["recompute"].dump());
}

const bool kRegistered = RegisterOptionsCommand<BenchTiersOptions>(
    "bench tiers", "Offload tier store/load bandwidth and latency per block (docs/tiers.md)",
    [](CLI::App* app, BenchTiersOptions& o) {
      AddBenchCacheFlags(app, o);
      app->add_option("--batch", o.batch, "Blocks per Store/Load call")->capture_default_str();
      app->add_option("--repeats", o.repeats, "Runs per measurement (median)")->capture_default_str();
      app->add_option("--disk-path", o.disk_path, "Disk tier folder (default: a temporary one)");
      app->add_option("--redis", o.redis, "redis://host:port of a server to measure too");
      app->add_flag("--no-fsync", o.no_fsync, "Disk tier without fsync before rename");
      app->add_option("--recompute-params", o.recompute_params,
                      "Model parameters for the recompute estimate (default Llama-3-8B)")
          ->capture_default_str();
    },
    JsonResultRunner<BenchTiersOptions>("bench tiers", RunBench, PrintText));

}  // namespace
}  // namespace kvcache::tools
