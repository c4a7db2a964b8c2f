// Offload tiers: stores that keep prefix blocks after the pool lets them go,
// and the self-describing object each block is stored as.
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
// The object (docs/tiers.md has the byte layout): magic "KVCB", version, a
// compatibility digest (model fingerprint, geometry, block size, K/V formats,
// rotation seed, calibration, library format version), the chain hash and
// its parent's hash, the block's token ids, a section table (per layer: K,
// then V), XXH3-64 checksums of header and payload, then the payload: per
// layer the pool's bytes of the block, K [n_kv_heads][block_size][k_row_bytes]
// then V likewise. One object per block; key "kvc1:<compat>:<chain>", each
// 32 lower-case hex digits of the 128-bit value (hi then lo). A block whose
// sequence was calibrated otherwise than the compatibility digest says sets
// flag bit 0 and names its calibration's digest (16 more header bytes); the
// calibration itself is a separate object, "kvcal1:<compat>:<digest>", stored
// before the blocks that name it and verified (digest recomputed) on load.
// The block that completes a precision window's sinks sets flag bit 1 and
// carries their bf16 rows (WindowSinks) in a section after the payload,
// checksummed, so that an adopter in any process reads the same sinks.
//
// Thread safety: every Tier method may be called from any thread at once.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"

namespace kvcache {

class BlockPool;
struct WindowSinks;
struct Calibration;

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

// --- the block object --------------------------------------------------

inline constexpr uint16_t kBlockObjectVersion = 1;
// Flag bit 0 of a block object: it names its calibration (the header has 16
// more bytes, the digest). Without it the block carries the calibration the
// compatibility digest names (BlockCompat::calibration; none if zero).
inline constexpr uint16_t kBlockFlagCalibrated = 1;
// Flag bit 1: the block completes a precision window's sinks and carries
// their bf16 rows (WindowSinks, cache.h) in a checksummed section after the
// payload; the header has 16 more bytes (S, zero, the section's XXH3-64)
// after the calibration digest, if any.
inline constexpr uint16_t kBlockFlagSinks = 2;
inline constexpr uint16_t kCalibrationObjectVersion = 1;
// Bumped whenever the stored bytes of any format change meaning (a codec's
// layout, the Format enum's numbering): part of every compatibility digest.
inline constexpr uint32_t kLibraryFormatVersion = 1;

// Everything a stored block's bytes depend on besides its tokens.
struct BlockCompat {
  std::string model;  // model fingerprint: a weights hash, or name@revision
  GeometryOptions geometry;
  FormatPair formats;
  // What rotated (turbo) formats' bytes depend on besides the format: a
  // digest of the rotation signs the pool's rotation_seed produced.
  // OffloadCache uses RotationDigest of its pool; it is 0 when neither side
  // rotates, so pools that differ only in rotation_seed are then compatible.
  uint64_t rotation = 0;
  BlockHash calibration{};  // CalibrationDigest, or zero for none
};
// XXH3-64 of the K then the V codec's rotation signs; 0 if neither rotates.
uint64_t RotationDigest(const BlockPool& pool);
// The canonical text the digest is taken of (docs/tiers.md).
std::string CompatManifest(const BlockCompat& compat);
BlockHash CompatDigest(const BlockCompat& compat);  // XXH3-128 of the manifest
// XXH3-128 over every transform's mean and col_scale (sizes included).
BlockHash CalibrationDigest(const Calibration& calibration);
// "kvc1:<32 hex>:<32 hex>".
std::string BlockKey(const BlockHash& compat, const BlockHash& chain);
// "kvcal1:<32 hex compat>:<32 hex CalibrationDigest>".
std::string CalibrationKey(const BlockHash& compat, const BlockHash& calibration);
std::string HashHex(const BlockHash& hash);  // 32 hex digits, hi then lo

// What a verified object header says.
struct BlockObjectInfo {
  BlockHash compat, chain, parent;
  GeometryOptions geometry;
  FormatPair formats;
  uint32_t header_bytes = 0;
  uint64_t payload_bytes = 0;
  std::vector<TokenId> tokens;
  // kBlockFlagCalibrated: the digest of the calibration the block was encoded
  // with (zero: none). Without the flag: calibrated = false, calibration zero,
  // and the block carries the compatibility digest's calibration.
  bool calibrated = false;
  BlockHash calibration{};
  // kBlockFlagSinks: the sinks S of the section after the payload, its size
  // and XXH3-64 (the object is header_bytes + payload_bytes + sinks_bytes).
  // Without the flag: all 0.
  uint32_t sinks = 0;
  uint64_t sinks_bytes = 0;
  uint64_t sinks_checksum = 0;
  std::string key() const { return BlockKey(compat, chain); }
  std::string parent_key(const BlockHash& root) const {
    return parent == root ? std::string() : BlockKey(compat, parent);
  }
};
inline constexpr size_t kBlockObjectFixedHeader = 128;

// Serializes block `block` of `pool` (all layers, K and V). REQUIRES: the
// caller holds a reference on the block and nobody writes it (a hashed block).
// `calibration`, if given, sets kBlockFlagCalibrated and names that digest
// (zero: explicitly none); `sinks`, if given, sets kBlockFlagSinks and
// carries them (InvalidArgument unless they fit the pool's geometry:
// WindowSinks::CheckFits); without either the object is the unflagged layout.
Result<std::vector<uint8_t>> EncodeBlockObject(const BlockPool& pool, uint32_t block,
                                               const BlockHash& compat, const BlockHash& chain,
                                               const BlockHash& parent,
                                               std::span<const TokenId> tokens,
                                               std::optional<BlockHash> calibration = std::nullopt,
                                               const WindowSinks* sinks = nullptr);
// Parses a header and checks magic, version, header checksum and that the
// object's size is what the header says (`total_bytes`: the whole object's
// size; `bytes` may be just its start). The payload is not checked.
Result<BlockObjectInfo> ParseBlockObjectHeader(std::span<const uint8_t> bytes,
                                               uint64_t total_bytes);
// Full verification against what the caller asked for: nullopt if the
// object is exactly the block (compat, chain, parent, tokens) with an intact
// payload (and sink section, if flagged); else the miss reason.
std::optional<TierMiss> VerifyBlockObject(std::span<const uint8_t> bytes, const BlockHash& compat,
                                          const BlockHash& chain, const BlockHash& parent,
                                          std::span<const TokenId> tokens);
// VerifyBlockObject and DecodeBlockObjectInto in one pass, the load path
// of OffloadCache: every check of VerifyBlockObject, in its order, except
// that the payload is copied into `block` a section at a time and each
// section is checksummed from its copy (still in cache) rather than in a
// separate pass over the object. nullopt: the block holds the object's
// payload. A miss: the reason, and the block's contents are unspecified
// (the caller gives it back; nobody else can read it). REQUIRES: the caller
// holds `block` exclusively (a staging block just allocated for this load).
// kIncompatible if the object, though intact, is not this pool's geometry
// or formats (another compat digest would have said so first). A sink
// section is checked too (kCorrupt if its checksum fails); `sinks`, if
// given, receives its rows (null when the object has none or fails).
std::optional<TierMiss> VerifyAndDecodeBlockObject(std::span<const uint8_t> bytes,
                                                   const BlockHash& compat, const BlockHash& chain,
                                                   const BlockHash& parent,
                                                   std::span<const TokenId> tokens,
                                                   BlockPool& pool, uint32_t block,
                                                   std::shared_ptr<const WindowSinks>* sinks = nullptr);
// XXH3-64 of `bytes` (the object's checksums): libxxhash's runtime-dispatched
// variant (AVX2 where the CPU has it), the same value as XXH3_64bits.
uint64_t BlockChecksum(std::span<const uint8_t> bytes);
// Copies a verified object's payload into block `block` of `pool` (tests and
// the fuzz target; the load path uses VerifyAndDecodeBlockObject).
// REQUIRES: the caller holds `block` exclusively; InvalidArgument (nothing
// written) if the object's geometry or formats are not the pool's.
Status DecodeBlockObjectInto(std::span<const uint8_t> bytes, BlockPool& pool, uint32_t block);

// --- the calibration object --------------------------------------------
// A sequence's Calibration, stored once per tier under CalibrationKey(compat,
// CalibrationDigest(calibration)) and named by the blocks encoded with it
// (docs/tiers.md has the layout): magic "KVCL", version, compat digest, the
// calibration digest, geometry, a header checksum, then per transform the
// mean and col_scale lengths and the floats. The digest, recomputed over the
// decoded floats, is the payload's check.

// OK if `calibration` can be stored for blocks of `geometry`: [n_layers][2]
// [n_kv_heads] transforms, each mean and col_scale empty or head_dim finite
// floats, col_scale > 0. InvalidArgument (saying what) otherwise.
Status CheckCalibration(const Calibration& calibration, const GeometryOptions& geometry);
// REQUIRES CheckCalibration(calibration, geometry).ok() (else InvalidArgument).
Result<std::vector<uint8_t>> EncodeCalibrationObject(const Calibration& calibration,
                                                     const GeometryOptions& geometry,
                                                     const BlockHash& compat);
// Verifies a loaded calibration object against what the block asked for:
// kCorrupt (magic, sizes, header checksum, reserved bytes, lengths, floats
// CheckCalibration refuses, the digest in the header or recomputed is not
// `digest`), kIncompatible (another version, compat digest or geometry).
// On success the calibration.
struct CalibrationLoad {
  std::shared_ptr<const Calibration> calibration;
  TierMiss miss = TierMiss::kCorrupt;  // when calibration is null
};
CalibrationLoad DecodeCalibrationObject(std::span<const uint8_t> bytes, const BlockHash& compat,
                                        const BlockHash& digest, const GeometryOptions& geometry);

// What a tier's index needs of any stored object (block or calibration),
// from its header only: its key, the keys it names, checked as
// ParseBlockObjectHeader checks a block's header (magic, version, sizes
// against `total_bytes`, header checksum). Both kinds keep header_bytes at
// offset 8, so reading 128 bytes, then header_bytes, is enough.
struct StoredObjectHeader {
  std::string key;
  std::string parent_key;       // a block's parent key; "" for a calibration
  std::string calibration_key;  // the calibration a block names; ""
};
Result<StoredObjectHeader> ParseStoredObjectHeader(std::span<const uint8_t> bytes,
                                                   uint64_t total_bytes);

}  // namespace kvcache
