// RedisTier against a real redis-server this binary starts (loopback, a
// free port, a temporary folder, no persistence) and against a fake RESP
// server that stalls, disconnects mid-value, answers $-1 or -ERR; calibrated
// formats' blocks and calibration shared by two processes through it.
//
// The server is started by a GoogleTest environment only when a Redis* test
// is selected, and killed at the end. If it cannot start, every Redis test
// FAILS (CI must run them; they are not skipped).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"
#include "serving/calibrated_test_util.h"
#include "serving/redis_process.h"
#include "serving/sinks_test_util.h"
#include "serving/tier_test_util.h"

namespace kvcache {
namespace {

using namespace tiertest;
using Clock = std::chrono::steady_clock;

// The suite's redis-server (tests/serving/redis_process.h), started once if
// any Redis* test is selected; tests may Stop() and Start() it again on the
// same port.
class RedisServer : public ::testing::Environment {
 public:
  static RedisServer* Get() { return instance_; }
  RedisServer() { instance_ = this; }

  void SetUp() override {
    bool wanted = false;
    const ::testing::UnitTest* u = ::testing::UnitTest::GetInstance();
    for (int i = 0; i < u->total_test_suite_count(); ++i) {
      const ::testing::TestSuite* s = u->GetTestSuite(i);
      if (std::string_view(s->name()).starts_with("Redis") && s->test_to_run_count() > 0) wanted = true;
    }
    if (wanted) Start();
  }
  void TearDown() override { Stop(); }

  bool Start() { return process_.Start(); }
  void Stop() { process_.Stop(); }
  // A blocking command for tests (SETRANGE, CONFIG SET, FLUSHALL, ...).
  redisReply* Command(const std::vector<std::string>& args) {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", process_.port(), {1, 0});
    if (c == nullptr || c->err) return nullptr;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    redisFree(c);
    return r;
  }
  bool running() const { return process_.running(); }
  std::string url() const { return process_.url(); }

 private:
  static inline RedisServer* instance_ = nullptr;
  testing::RedisProcess process_;
};

[[maybe_unused]] ::testing::Environment* const kRedisEnv =
    ::testing::AddGlobalTestEnvironment(new RedisServer);

void Free(redisReply* r) {
  if (r) freeReplyObject(r);
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = RedisServer::Get();
    ASSERT_TRUE(server_ != nullptr && server_->running())
        << "redis-server could not be started on 127.0.0.1 (apt-get install redis-server)";
    Free(server_->Command({"FLUSHALL"}));
    pool_ = NewPool({2, 2, 32, 16}, {Format::kBF16, Format::kBF16}, 8);
    tokens_ = Tokens(64);
    hashes_ = HashFullBlocks(tokens_, 16, "");
    for (uint32_t b = 0; b < 4; ++b) FillBlock(*pool_, b, 40 + b);
    tier_ = std::move(NewRedisTier({.url = server_->url()})).value();
  }
  TierPut Put(size_t i) {
    return {Key(i), i ? Key(i - 1) : "", Object(*pool_, static_cast<uint32_t>(i), compat_, tokens_, i)};
  }
  std::string Key(size_t i) { return BlockKey(compat_, hashes_[i]); }
  std::optional<TierMiss> Verify(const TierGet& g, size_t i) {
    if (g.bytes == nullptr) return g.miss;
    return VerifyBlockObject(*g.bytes, compat_, hashes_[i], i ? hashes_[i - 1] : ChainRoot(""),
                             std::span(tokens_).subspan(i * 16, 16));
  }

  RedisServer* server_ = nullptr;
  std::shared_ptr<BlockPool> pool_;
  std::vector<TokenId> tokens_;
  std::vector<BlockHash> hashes_;
  BlockHash compat_{21, 22};
  std::unique_ptr<Tier> tier_;
};

TEST(RedisUrl, Parses) {
  RedisEndpoint e = ParseRedisUrl("redis://:s3cret@10.0.0.1:7000/3").value();
  EXPECT_EQ(e.host, "10.0.0.1");
  EXPECT_EQ(e.port, 7000);
  EXPECT_EQ(e.password, "s3cret");
  EXPECT_EQ(e.db, 3);
  e = ParseRedisUrl("redis://localhost").value();
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h:1/x",
                          "redis://user:pw@h:1"}) {
    EXPECT_FALSE(ParseRedisUrl(bad).ok()) << bad;
  }
}

TEST_F(RedisTierTest, RoundTripPipelined) {
  std::vector<TierPut> puts = {Put(0), Put(1), Put(2), Put(3)};
  ASSERT_EQ(tier_->Store(puts), 4u);
  const std::vector<std::string> keys = {Key(0), Key(1), Key(2), Key(3), "kvc1:nope"};
  const auto ex = tier_->Exists(keys);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ex[i], std::nullopt);
  EXPECT_EQ(ex[4], TierMiss::kAbsent);
  const auto got = tier_->Load(keys);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_NE(got[i].bytes, nullptr);
    EXPECT_EQ(*got[i].bytes, *puts[i].bytes);
    EXPECT_EQ(Verify(got[i], i), std::nullopt);
  }
  EXPECT_EQ(got[4].miss, TierMiss::kAbsent);
  tier_->Erase(std::vector<std::string>{Key(0)});
  EXPECT_EQ(tier_->Exists(std::vector<std::string>{Key(0)})[0], TierMiss::kAbsent);
}

TEST_F(RedisTierTest, CorruptedValuesAreRejected) {
  std::vector<TierPut> puts = {Put(0), Put(1), Put(2), Put(3)};
  ASSERT_EQ(tier_->Store(puts), 4u);
  Free(server_->Command({"SETRANGE", Key(0), "3000", "\x55\x66"}));      // flip payload bytes
  Free(server_->Command({"SET", Key(1), std::string(puts[1].bytes->begin(), puts[1].bytes->end() - 9)}));
  Free(server_->Command({"APPEND", Key(2), "extra"}));                   // resize
  // A right key holding block 0's (well-formed) object: another chain hash.
  Free(server_->Command({"SET", Key(3), std::string(puts[0].bytes->begin(), puts[0].bytes->end())}));
  const auto got = tier_->Load(std::vector<std::string>{Key(0), Key(1), Key(2), Key(3)});
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(Verify(got[i], i), TierMiss::kCorrupt) << i;
}

TEST_F(RedisTierTest, ServerStoppedMidRunDegradesToMissesAndRecovers) {
  tier_ = std::move(NewRedisTier({.url = server_->url(),
                                  .deadline = std::chrono::milliseconds(300),
                                  .backoff = std::chrono::milliseconds(50),
                                  .max_backoff = std::chrono::milliseconds(100)}))
              .value();
  std::vector<TierPut> puts = {Put(0)};
  ASSERT_EQ(tier_->Store(puts), 1u);
  server_->Stop();
  const auto t0 = Clock::now();
  const auto got = tier_->Load(std::vector<std::string>{Key(0), Key(1)});
  EXPECT_EQ(got[0].miss, TierMiss::kUnavailable);
  EXPECT_EQ(got[1].miss, TierMiss::kUnavailable);
  EXPECT_EQ(tier_->Store(puts), 0u);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));  // bounded: no hang
  EXPECT_GE(tier_->usage().store_failures, 1u);
  ASSERT_TRUE(server_->Start());
  // Retried after the backoff (bounded wait: the max backoff is 100 ms).
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    back = tier_->Store(puts) == 1;
    if (!back) ::usleep(20000);
  }
  EXPECT_TRUE(back);
  EXPECT_EQ(Verify(tier_->Load(std::vector<std::string>{Key(0)})[0], 0), std::nullopt);
}

// A tiny maxmemory with allkeys-lru and concurrent writers: every value read
// back is either absent or a whole, verified object.
TEST_F(RedisTierTest, TinyMaxmemoryConcurrentWritersNeverTearObjects) {
  Free(server_->Command({"CONFIG", "SET", "maxmemory", "8mb"}));
  Free(server_->Command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}));
  auto big = NewPool({4, 4, 128, 16}, {Format::kF32, Format::kF32}, 4);  // 256 KiB objects
  const std::vector<TokenId> t = Tokens(16 * 40);
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  std::vector<TierBytes> objs;
  for (size_t i = 0; i < h.size(); ++i) {
    FillBlock(*big, 0, i);
    objs.push_back(Object(*big, 0, compat_, t, i));
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      auto tier = std::move(NewRedisTier({.url = server_->url(), .deadline = std::chrono::milliseconds(2000)})).value();
      for (size_t i = w; i < h.size(); i += 3) {
        tier->Store(std::vector<TierPut>{{BlockKey(compat_, h[i]), "", objs[i]}});
        const auto got = tier->Load(std::vector<std::string>{BlockKey(compat_, h[i / 2])});
        if (got[0].bytes != nullptr &&
            VerifyBlockObject(*got[0].bytes, compat_, h[i / 2], i / 2 ? h[i / 2 - 1] : ChainRoot(""),
                              std::span(t).subspan(i / 2 * 16, 16))
                .has_value()) {
          ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  Free(server_->Command({"CONFIG", "SET", "maxmemory", "0"}));
}

// Two processes (the CLI run twice) share a tier: the second loads what the
// first stored; another format or geometry in the same store never hits. The
// pool is large enough that no run evicts its own blocks, so every tier hit
// comes from an earlier process.
nlohmann::json SimulateTiers(const std::string& tiers, const std::string& extra) {
  const std::string cmd = std::string(KVCACHE_CLI_PATH) +
                          " simulate --json --workload shared-prefix --requests 6 --seed 5"
                          " --pool-gib 0.25 --tiers " + tiers + " " + extra +
                          " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? pclose(p) : -1;
  EXPECT_EQ(status, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j.is_discarded() ? nlohmann::json() : j["results"][0];
}

TEST_F(RedisTierTest, TwoProcessesShareBlocksThroughRedisAndDisk) {
  const std::string dir = "/tmp/kvc_cli_disk_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  for (const std::string& tiers : {server_->url(), "disk:" + dir + ":1GiB"}) {
    const nlohmann::json a = SimulateTiers(tiers, "--kv-format bf16 --model-geometry 2,2,64");
    EXPECT_EQ(a["tier_hit_tokens"], 0) << tiers;
    EXPECT_GT(a["tiers"][0]["bytes_stored"].get<uint64_t>(), 0u) << tiers;
    const nlohmann::json b = SimulateTiers(tiers, "--kv-format bf16 --model-geometry 2,2,64");
    EXPECT_GT(b["tier_hit_tokens"].get<uint64_t>(), 0u) << tiers;
    EXPECT_EQ(b["tiers"][0]["hit_tokens"], b["tier_hit_tokens"]);
    EXPECT_EQ(b["tiers"][0]["misses"]["corrupt"], 0);
    const nlohmann::json c = SimulateTiers(tiers, "--kv-format f16 --model-geometry 2,2,64");
    EXPECT_EQ(c["tier_hit_tokens"], 0) << tiers;
    const nlohmann::json d = SimulateTiers(tiers, "--kv-format bf16 --model-geometry 2,4,64");
    EXPECT_EQ(d["tier_hit_tokens"], 0) << tiers;
  }
  std::filesystem::remove_all(dir);
}

// Each calibrated format: a sequence published by one process (its own
// RedisTier) is adopted by another (another connection), bit-identically and
// with the same calibration: 4 blocks and 1 calibration object on the server.
TEST_F(RedisTierTest, CalibratedFormatsRoundTripBetweenTwoProcesses) {
  for (const FormatPair f : caltest::CalibratedFormats()) {
    Free(server_->Command({"FLUSHALL"}));
    caltest::ExpectRoundTrip(f, [&](int) {
      return std::vector<std::shared_ptr<Tier>>{std::move(NewRedisTier({.url = server_->url()})).value()};
    });
    redisReply* r = server_->Command({"DBSIZE"});
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->integer, 5) << FormatName(f.k);
    Free(r);
  }
}

// A precision window's sinks travel with the block that completes them
// through Redis too: a second connection (process) adopts them.
TEST_F(RedisTierTest, WindowSinksRoundTripBetweenTwoProcesses) {
  sinkstest::ExpectSinksRoundTrip([&](int) {
    return std::vector<std::shared_ptr<Tier>>{std::move(NewRedisTier({.url = server_->url()})).value()};
  });
}

TEST_F(RedisTierTest, BenchTiersJsonShape) {
  const std::string cmd = std::string(KVCACHE_CLI_PATH) +
                          " bench tiers --json --layers 2 --kv-heads 2 --head-dim 64 --batch 3"
                          " --repeats 1 --no-fsync --redis " + server_->url() + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(p ? pclose(p) : -1, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["block_bytes"], 2 * 2 * 2 * 16 * 64 * 2);  // L * K,V * KVH * B * D * bf16
  ASSERT_EQ(j["tiers"].size(), 3u);
  const char* names[] = {"host", "disk", "redis"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["tiers"][i]["tier"], names[i]);
    EXPECT_GT(j["tiers"][i]["load_gbps"].get<double>(), 0);
    EXPECT_GT(j["tiers"][i]["store_gbps"].get<double>(), 0);
    EXPECT_GT(j["tiers"][i]["object_bytes"].get<uint64_t>(), j["block_bytes"].get<uint64_t>());
  }
}

// --- a fake RESP server ------------------------------------------------------

enum class FakeMode { kStall, kCutMidBulk, kNil, kError };

class FakeResp {
 public:
  explicit FakeResp(FakeMode mode) : mode_(mode) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listen_, 8);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeResp() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  // Counts complete RESP commands at the start of buf; consumes them.
  static int TakeCommands(std::string& buf) {
    int n = 0;
    size_t at = 0;
    for (;;) {
      size_t p = at;
      if (p >= buf.size() || buf[p] != '*') break;
      size_t eol = buf.find("\r\n", p);
      if (eol == std::string::npos) break;
      const int args = std::atoi(buf.c_str() + p + 1);
      p = eol + 2;
      bool whole = true;
      for (int i = 0; i < args && whole; ++i) {
        eol = buf.find("\r\n", p);
        if (eol == std::string::npos || buf[p] != '$') {
          whole = false;
          break;
        }
        const size_t len = std::strtoul(buf.c_str() + p + 1, nullptr, 10);
        p = eol + 2 + len + 2;
        if (p > buf.size()) whole = false;
      }
      if (!whole) break;
      at = p;
      ++n;
    }
    buf.erase(0, at);
    return n;
  }

  void Serve() {
    std::vector<int> clients;
    std::vector<std::string> bufs;
    while (!stop_) {
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (int c : clients) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        clients.push_back(::accept(listen_, nullptr, nullptr));
        bufs.emplace_back();
        ++connections_;
      }
      for (size_t i = 0; i + 1 < fds.size(); ++i) {  // clients polled this round
        if (!(fds[i + 1].revents & (POLLIN | POLLHUP))) continue;
        char tmp[65536];
        const ssize_t r = ::read(clients[i], tmp, sizeof(tmp));
        if (r <= 0) {
          ::close(clients[i]);
          clients[i] = -1;
          continue;
        }
        bufs[i].append(tmp, static_cast<size_t>(r));
        const int n = TakeCommands(bufs[i]);
        std::string out;
        for (int k = 0; k < n; ++k) {
          switch (mode_) {
            case FakeMode::kStall: break;  // never answers
            case FakeMode::kNil: out += "$-1\r\n"; break;
            case FakeMode::kError: out += "-ERR fake failure\r\n"; break;
            case FakeMode::kCutMidBulk: out += "$100000\r\nonly-a-few-bytes"; break;
          }
        }
        if (!out.empty()) (void)!::write(clients[i], out.data(), out.size());
        if (mode_ == FakeMode::kCutMidBulk && n > 0) {
          ::close(clients[i]);
          clients[i] = -1;
        }
      }
      for (size_t i = clients.size(); i-- > 0;) {
        if (clients[i] < 0) {
          clients.erase(clients.begin() + static_cast<ptrdiff_t>(i));
          bufs.erase(bufs.begin() + static_cast<ptrdiff_t>(i));
        }
      }
    }
    for (int c : clients) ::close(c);
  }

  FakeMode mode_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// The deadline is generous where the fake answers (sanitizer builds are slow)
// and short where it stalls.
std::unique_ptr<Tier> FakeTier(const FakeResp& f, int deadline_ms = 2000, int backoff_ms = 200) {
  return std::move(NewRedisTier({.url = f.url(),
                                 .deadline = std::chrono::milliseconds(deadline_ms),
                                 .backoff = std::chrono::milliseconds(backoff_ms),
                                 .max_backoff = std::chrono::milliseconds(2 * backoff_ms)}))
      .value();
}

TEST(FakeRedis, StallIsATimeoutWithinTheDeadlineThenBacksOff) {
  FakeResp fake(FakeMode::kStall);
  // The backoff is long beside the deadline, so that a loaded machine
  // pausing this thread between the calls below cannot outlast it.
  auto tier = FakeTier(fake, 150, 1000);
  const std::vector<std::string> keys = {"a", "b"};
  auto t0 = Clock::now();
  const auto got = tier->Load(keys);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(got[0].miss, TierMiss::kTimeout);
  EXPECT_EQ(got[1].miss, TierMiss::kTimeout);
  // Down: answered without a new connection, well within the backoff.
  const int conns = fake.connections();
  t0 = Clock::now();
  EXPECT_EQ(tier->Exists(keys)[0], TierMiss::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
  EXPECT_EQ(fake.connections(), conns);
  // After the backoff it is tried again (a new connection).
  ::usleep(1100000);
  EXPECT_EQ(tier->Exists(keys)[0], TierMiss::kTimeout);
  EXPECT_EQ(fake.connections(), conns + 1);
}

TEST(FakeRedis, DisconnectMidBulkIsUnavailable) {
  FakeResp fake(FakeMode::kCutMidBulk);
  auto tier = FakeTier(fake);
  const auto got = tier->Load(std::vector<std::string>{"a", "b", "c"});
  for (const TierGet& g : got) {
    EXPECT_EQ(g.bytes, nullptr);
    EXPECT_EQ(g.miss, TierMiss::kUnavailable);
  }
}

TEST(FakeRedis, NilIsAbsentAndErrorIsUnavailablePerKey) {
  {
    FakeResp fake(FakeMode::kNil);
    auto tier = FakeTier(fake);
    for (int round = 0; round < 2; ++round) {  // the stream stays in step
      const auto got = tier->Load(std::vector<std::string>{"a", "b"});
      EXPECT_EQ(got[0].miss, TierMiss::kAbsent);
      EXPECT_EQ(got[1].miss, TierMiss::kAbsent);
    }
    EXPECT_EQ(fake.connections(), 1);
  }
  {
    FakeResp fake(FakeMode::kError);
    auto tier = FakeTier(fake);
    for (int round = 0; round < 2; ++round) {
      const auto got = tier->Load(std::vector<std::string>{"a", "b"});
      EXPECT_EQ(got[0].miss, TierMiss::kUnavailable);
      EXPECT_EQ(got[1].miss, TierMiss::kUnavailable);
    }
    auto obj = std::make_shared<const std::vector<uint8_t>>(100, 1);
    EXPECT_EQ(tier->Store(std::vector<TierPut>{{"k", "", obj}}), 0u);
    EXPECT_EQ(fake.connections(), 1);  // errors are replies: no reconnect
  }
}

TEST(FakeRedis, NothingListeningIsUnavailableQuickly) {
  auto tier = std::move(NewRedisTier({.url = "redis://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort()),
                                      .deadline = std::chrono::milliseconds(200)}))
                  .value();
  const auto t0 = Clock::now();
  EXPECT_EQ(tier->Load(std::vector<std::string>{"a"})[0].miss, TierMiss::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1500));
}

}  // namespace
}  // namespace kvcache
