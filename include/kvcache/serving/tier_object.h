// The block object the offload tiers store (tier_store.h), one per block,
// and the calibration object (docs/tiers.md has the byte layouts).
//
// A block object: magic "KVCB", version, a compatibility digest (model
// fingerprint, geometry, block size, K/V formats, rotation seed, calibration,
// library format version), the chain hash and its parent's hash, the block's
// token ids, a section table (per layer: K, then V), XXH3-64 checksums of
// header and payload, then the payload: per layer the pool's bytes of the
// block, K [n_kv_heads][block_size][k_row_bytes]
// then V likewise. One object per block; key "kvc1:<compat>:<chain>", each
// 32 lower-case hex digits of the 128-bit value (hi then lo). A block whose
// sequence was calibrated otherwise than the compatibility digest says sets
// flag bit 0 and names its calibration's digest (16 more header bytes); the
// calibration itself is a separate object, "kvcal1:<compat>:<digest>", stored
// before the blocks that name it and verified (digest recomputed) on load.
// The block that completes a precision window's sinks sets flag bit 1 and
// carries their bf16 rows (WindowSinks) in a section after the payload,
// checksummed, so that an adopter in any process reads the same sinks.
// A block of one layer group of a model whose layers keep their positions
// differently (a sliding-window model's full and window groups) sets flag
// bit 2 and names the group's layer kind and window in the header; the
// compatibility digest names the group too, so a process whose model,
// groups or formats differ misses rather than reading another group's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/tier_store.h"
#include "kvcache/status.h"

namespace kvcache {

class BlockPool;
struct WindowSinks;
struct Calibration;

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
// Flag bit 2: the block holds one layer group of a model with several
// (HybridModel, hybrid.h): header bytes 120-127 name the group's layer kind
// (u32, LayerGroupKind) and window (u32 positions, 0 for full attention).
// A sliding-window group's block is useful without its chain parent (a hit
// needs only the last window's run of blocks), so the tiers index it
// without a parent link (StoredObjectHeader::parent_key is empty).
inline constexpr uint16_t kBlockFlagLayerGroup = 4;
inline constexpr uint16_t kCalibrationObjectVersion = 1;

enum class LayerGroupKind : uint32_t { kFullAttention = 0, kSlidingWindow = 1 };
// The layer group a pool's blocks hold (BlockCompat::group).
struct LayerGroupTag {
  LayerGroupKind kind = LayerGroupKind::kFullAttention;
  uint32_t window = 0;  // positions; 0 for full attention, > 0 for a window
  bool operator==(const LayerGroupTag&) const = default;
  // A known kind, and a window > 0 exactly for a sliding window.
  bool whole() const {
    return kind == LayerGroupKind::kFullAttention ? window == 0
                                                  : kind == LayerGroupKind::kSlidingWindow && window > 0;
  }
};
// "full" or "window:W".
std::string LayerGroupName(const LayerGroupTag& group);
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
  // The layer group of a model with several (none: a model whose layers all
  // keep every position, and the manifest has no layer_group line).
  std::optional<LayerGroupTag> group;
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
  // kBlockFlagLayerGroup: the layer group the block holds (else none).
  std::optional<LayerGroupTag> group;
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
// WindowSinks::CheckFits); `group`, if given, sets kBlockFlagLayerGroup and
// names it (InvalidArgument for a window of 0 on a sliding-window group or
// one on a full group); without any the object is the unflagged layout.
Result<std::vector<uint8_t>> EncodeBlockObject(const BlockPool& pool, uint32_t block,
                                               const BlockHash& compat, const BlockHash& chain,
                                               const BlockHash& parent,
                                               std::span<const TokenId> tokens,
                                               std::optional<BlockHash> calibration = std::nullopt,
                                               const WindowSinks* sinks = nullptr,
                                               std::optional<LayerGroupTag> group = std::nullopt);
// Parses a header and checks magic, version, header checksum and that the
// object's size is what the header says (`total_bytes`: the whole object's
// size; `bytes` may be just its start). The payload is not checked.
Result<BlockObjectInfo> ParseBlockObjectHeader(std::span<const uint8_t> bytes,
                                               uint64_t total_bytes);
// Full verification against what the caller asked for: nullopt if the
// object is exactly the block (compat, chain, parent, tokens, layer group:
// none unless `group`) with an intact payload (and sink section, if
// flagged); else the miss reason (kIncompatible for another layer group).
std::optional<TierMiss> VerifyBlockObject(std::span<const uint8_t> bytes, const BlockHash& compat,
                                          const BlockHash& chain, const BlockHash& parent,
                                          std::span<const TokenId> tokens,
                                          std::optional<LayerGroupTag> group = std::nullopt);
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
                                                   std::shared_ptr<const WindowSinks>* sinks = nullptr,
                                                   std::optional<LayerGroupTag> group = std::nullopt);
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
  // A block's parent key; "" for a calibration and for a sliding-window
  // group's block (kBlockFlagLayerGroup), which needs no parent.
  std::string parent_key;
  std::string calibration_key;  // the calibration a block names; ""
};
Result<StoredObjectHeader> ParseStoredObjectHeader(std::span<const uint8_t> bytes,
                                                   uint64_t total_bytes);

}  // namespace kvcache
