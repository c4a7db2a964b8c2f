// Offload tiers: stores that keep prefix blocks after the pool lets them go
// (the object each block is stored as: tier_object.h).
//
// A Tier maps keys to immutable byte strings, with batched Exists / Load /
// Store. Three implementations:
//   HostTier   process RAM, a byte budget, LRU.
//   DiskTier   a folder and a byte budget, LRU by bytes. Each object is
//              written to a temporary file, fsync'd and renamed into place,
//              so a name only ever refers to a whole object; on open the
//              index is rebuilt from the files' headers (torn or foreign
//              files are deleted).
//   RedisTier  a Redis (or Valkey: RESP2 only) server, hiredis, pipelined
//              GET/SET/EXISTS, an absolute deadline on every call.
// Host and disk evict a chain's tail before its prefix: among the least
// recently used objects the first one no stored object names as its parent
// goes first (a child is useless without its parent). Redis evicts by its
// own policy (maxmemory-policy allkeys-lru is what docs/tiers.md suggests).
//
// Faults never become errors on the caller's path: a tier that cannot answer
// reports misses (kTimeout, kUnavailable) and, for Redis, stays down for a
// backoff before it is tried again. A Load returns bytes unverified; the
// caller (OffloadCache, offload.h) checks them with VerifyAndDecodeBlockObject
// as it copies them into a staging block nobody else can read.
//
// Thread safety: every Tier method may be called from any thread at once.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"

namespace kvcache {

// Why a tier did not supply a usable block.
enum class TierMiss : uint8_t {
  kAbsent,         // the tier never had it (or forgot that it had)
  kEvicted,        // it had it and evicted it since
  kCorrupt,        // bytes that fail magic, size, checksum or chain checks
  kIncompatible,   // another object version or compatibility digest
  kTokenMismatch,  // the right key, but other token ids or another parent
  kTimeout,        // the call ran past its deadline
  kUnavailable,    // the tier is down, failed, or answered an error
};
inline constexpr size_t kNumTierMisses = 7;
// "absent", "evicted", "corrupt", "incompatible", "token_mismatch", "timeout",
// "unavailable".
std::string_view TierMissName(TierMiss miss);

using TierBytes = std::shared_ptr<const std::vector<uint8_t>>;

// A loaded value: immutable bytes shared by their holders. Either a stored
// vector shared as is (the host tier: zero-copy) or a buffer the tier
// allocated uninitialized and filled (disk: read(); Redis: the socket's bulk
// payload read straight into it), so a load never zero-fills or copies a
// value it is about to overwrite.
class TierBlob {
 public:
  // `size` uninitialized bytes; the creator fills mutable_data() before
  // sharing the blob.
  explicit TierBlob(size_t size) : own_(new uint8_t[size]), data_(own_.get()), size_(size) {}
  explicit TierBlob(TierBytes shared)
      : shared_(std::move(shared)), data_(shared_ ? shared_->data() : nullptr),
        size_(shared_ ? shared_->size() : 0) {}
  TierBlob(const TierBlob&) = delete;
  TierBlob& operator=(const TierBlob&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const uint8_t* begin() const { return data_; }
  const uint8_t* end() const { return data_ + size_; }
  // Only for the blob's creator, before it is shared; null for a shared vector.
  uint8_t* mutable_data() { return own_.get(); }

 private:
  std::unique_ptr<uint8_t[]> own_;
  TierBytes shared_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};
using TierBlobPtr = std::shared_ptr<const TierBlob>;
inline bool operator==(const TierBlob& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

struct TierPut {
  std::string key;
  std::string parent_key;  // the chain parent's key; "" for a chain's first block
  TierBytes bytes;
  // The calibration object the block names ("" if none). Host and disk keep
  // a named object like a parent: not evicted while a stored block names it.
  std::string calibration_key = {};
};
// One key's answer: bytes, or (bytes null) why not.
struct TierGet {
  TierBlobPtr bytes;
  TierMiss miss = TierMiss::kAbsent;
};

// What a tier holds and what it had to give up (its own view; the cache's
// per-tier hit/miss counters are in offload.h).
struct TierUsage {
  uint64_t objects = 0;
  uint64_t bytes = 0;           // stored value bytes (0 if the tier cannot tell: Redis)
  uint64_t capacity_bytes = 0;  // 0 = not bounded by us
  uint64_t evictions = 0;
  uint64_t store_failures = 0;  // puts refused (too large, I/O error, server down)
  uint64_t recovered_objects = 0;  // DiskTier: objects indexed on open
  uint64_t discarded_files = 0;    // DiskTier: torn or foreign files deleted on open
};

class Tier {
 public:
  virtual ~Tier() = default;
  virtual std::string name() const = 0;
  // For each key: nullopt if the tier holds it now (a later Load may still
  // miss), else why not. No side effects (no LRU touch).
  virtual std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> keys) = 0;
  // For each key its bytes, or a miss. Touches what it returns (LRU).
  virtual std::vector<TierGet> Load(std::span<const std::string> keys) = 0;
  // Stores each put (an existing key is replaced). Returns how many were
  // stored; the others are counted in usage().store_failures.
  virtual size_t Store(std::span<const TierPut> puts) = 0;
  // Forgets keys (e.g. objects that failed verification). Best effort.
  virtual void Erase(std::span<const std::string> keys) = 0;
  virtual TierUsage usage() const = 0;
};

struct HostTierOptions {
  uint64_t capacity_bytes = uint64_t{1} << 30;
  size_t evicted_history = 1 << 16;  // evicted keys remembered (kEvicted vs kAbsent)
};
std::unique_ptr<Tier> NewHostTier(const HostTierOptions& options);

struct DiskTierOptions {
  std::string path;  // created if missing
  uint64_t capacity_bytes = uint64_t{16} << 30;
  bool fsync = true;  // fsync each object before its rename (crash consistency)
  size_t evicted_history = 1 << 16;
};
// Opens (creating) the folder and rebuilds the index from its files.
Result<std::unique_ptr<Tier>> OpenDiskTier(const DiskTierOptions& options);

struct RedisTierOptions {
  // redis://[:password@]host[:port][/db]; port 6379, db 0 by default.
  std::string url;
  std::chrono::milliseconds deadline{500};   // per call (connect, a batch)
  std::chrono::milliseconds backoff{100};    // first retry delay after a failure
  std::chrono::milliseconds max_backoff{5000};
  uint64_t ttl_ms = 0;                       // 0: no expiry; else SET ... PX ttl_ms
  size_t max_batch = 64;                     // keys per pipelined round trip
};
struct RedisEndpoint {
  std::string host;
  int port = 6379;
  std::string password;
  int db = 0;
};
Result<RedisEndpoint> ParseRedisUrl(std::string_view url);
// Does not connect: the first call does (and a failure is a miss).
Result<std::unique_ptr<Tier>> NewRedisTier(const RedisTierOptions& options);

}  // namespace kvcache
