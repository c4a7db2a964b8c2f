// The block object of tier_object.h: compatibility manifest and digest, keys, and
// the encoder / verifier / decoder of one block. Layout (little-endian; the
// same table is in docs/tiers.md):
//
//   off  size  field
//     0     4  magic "KVCB"
//     4     2  object version (kBlockObjectVersion)
//     6     2  flags: kBlockFlagCalibrated, kBlockFlagSinks, kBlockFlagLayerGroup (or 0)
//     8     4  header_bytes H = 128 + 4 * n_tokens + 32 * n_layers
//              (+ 16 with kBlockFlagCalibrated, + 16 with kBlockFlagSinks)
//    12     4  n_tokens (== block_size: only full blocks are stored)
//    16     8  payload_bytes
//    24    16  compat digest (lo, hi)
//    40    16  chain hash (lo, hi)
//    56    16  parent hash (lo, hi)
//    72    16  n_layers, n_kv_heads, head_dim, block_size (u32 each)
//    88     4  k format, v format (u8 each: Format's enum value), 2 zero bytes
//    92     4  library format version
//    96     8  k_row_bytes, v_row_bytes (u32 each)
//   104     8  XXH3-64 of the payload
//   112     8  XXH3-64 of bytes [0, H) with this field read as zero
//   120     8  zero; with flag kBlockFlagLayerGroup the layer group: kind
//              (u32, LayerGroupKind), window (u32)
//   128  4*nt  token ids (u32)
//     .  32*L  sections: per layer k_offset, k_bytes, v_offset, v_bytes (u64,
//              offsets from the payload's start)
//     .    16  only with flag kBlockFlagCalibrated: the calibration digest (lo, hi)
//     .    16  only with flag kBlockFlagSinks: sinks S (u32), zero (u32), XXH3-64
//              of the sink section (u64)
//     H     P  payload (P = payload_bytes): per layer K [n_kv_heads][block_size]
//              [k_row_bytes], V likewise
//   H+P     -  only with flag kBlockFlagSinks: the sink section, the bf16 rows
//              of a precision window's sinks (WindowSinks::rows: [n_layers][2]
//              [n_kv_heads][S][2 * head_dim]); the object is H + P + its size
//
// The calibration object (n = n_layers * 2 * n_kv_heads transforms):
//
//   off  size  field
//     0     4  magic "KVCL"
//     4     2  version (kCalibrationObjectVersion)
//     6     2  flags (0)
//     8     4  header_bytes H = 128 + 8 * n
//    12     4  n
//    16     8  payload_bytes (4 * the floats' count)
//    24    16  compat digest (lo, hi)
//    40    16  calibration digest (lo, hi)
//    56    12  n_layers, n_kv_heads, head_dim (u32 each)
//    68     4  library format version
//    72    40  zero
//   112     8  XXH3-64 of bytes [0, H) with this field read as zero
//   120     8  zero
//   128   8*n  per transform (layer, side, head order): mean length, col_scale length (u32)
//     H     -  per transform: mean then col_scale (f32)
//
// Stateless functions; thread-safe.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>
// libxxhash's runtime dispatch (AVX2 / SSE2 on x86-64): the same hash values,
// about twice the speed of the SSE2 build on an AVX2 machine.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define KVCACHE_XXH3_64 XXH3_64bits_dispatch
#define KVCACHE_XXH3_64_UPDATE XXH3_64bits_update_dispatch
#else
#define KVCACHE_XXH3_64 XXH3_64bits
#define KVCACHE_XXH3_64_UPDATE XXH3_64bits_update
#endif

#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"

namespace kvcache {
namespace {

constexpr uint8_t kMagic[4] = {'K', 'V', 'C', 'B'};
constexpr uint8_t kCalibrationMagic[4] = {'K', 'V', 'C', 'L'};
constexpr uint32_t kMaxTransforms = 1u << 20;

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
void PutHash(uint8_t* p, const BlockHash& h) {
  Put(p, h.lo);
  Put(p + 8, h.hi);
}
BlockHash GetHash(const uint8_t* p) { return {Get<uint64_t>(p), Get<uint64_t>(p + 8)}; }

uint64_t HeaderChecksum(std::span<const uint8_t> header) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header.data(), 112);
  const uint8_t zero[8] = {};
  XXH3_64bits_update(st, zero, 8);
  XXH3_64bits_update(st, header.data() + 120, header.size() - 120);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

size_t HeaderBytes(uint32_t n_tokens, uint32_t n_layers, bool calibrated, bool sinks) {
  return kBlockObjectFixedHeader + 4 * size_t{n_tokens} + 32 * size_t{n_layers} +
         (calibrated ? 16 : 0) + (sinks ? 16 : 0);
}

// Where the optional header fields start: the calibration digest, then the
// sink fields.
size_t OptionalFields(uint32_t n_tokens, uint32_t n_layers) {
  return kBlockObjectFixedHeader + 4 * size_t{n_tokens} + 32 * size_t{n_layers};
}

constexpr uint16_t kKnownFlags = kBlockFlagCalibrated | kBlockFlagSinks | kBlockFlagLayerGroup;


// The sink section of `info`'s object (REQUIRES info.sinks > 0, so parsed).
std::span<const uint8_t> SinkSection(std::span<const uint8_t> bytes, const BlockObjectInfo& info) {
  return bytes.subspan(info.header_bytes + info.payload_bytes, info.sinks_bytes);
}

// The per-layer section table (K offset, K bytes, V offset, V bytes: u64
// each), after the fixed header and the token ids.
const uint8_t* Sections(std::span<const uint8_t> bytes, size_t n_tokens) {
  return bytes.data() + kBlockObjectFixedHeader + n_tokens * 4;
}

// The object's geometry and formats are the pool's, and `block` is one of its blocks.
bool FitsPool(const BlockObjectInfo& info, const BlockPool& pool, uint32_t block) {
  const Geometry& g = pool.geometry();
  return info.geometry.n_layers == g.n_layers() && info.geometry.n_kv_heads == g.n_kv_heads() &&
         info.geometry.head_dim == g.head_dim() && info.geometry.block_size == g.block_size() &&
         info.formats == pool.formats() && block < pool.num_blocks();
}

// Everything VerifyBlockObject checks before the payload checksum.
std::optional<TierMiss> VerifyHeader(std::span<const uint8_t> bytes, const BlockHash& compat,
                                     const BlockHash& chain, const BlockHash& parent,
                                     std::span<const TokenId> tokens, const std::optional<LayerGroupTag>& group,
                                     BlockObjectInfo* out) {
  Result<BlockObjectInfo> info = ParseBlockObjectHeader(bytes, bytes.size());
  if (!info.ok()) {
    return info.status().code() == StatusCode::kFailedPrecondition ? TierMiss::kIncompatible
                                                                   : TierMiss::kCorrupt;
  }
  if (!(info->compat == compat) || info->group != group) return TierMiss::kIncompatible;
  if (!(info->chain == chain)) return TierMiss::kCorrupt;  // stored under another block's key
  if (!(info->parent == parent) || info->tokens.size() != tokens.size() ||
      std::memcmp(info->tokens.data(), tokens.data(), tokens.size() * 4) != 0) {
    return TierMiss::kTokenMismatch;
  }
  // The sections must tile the payload exactly in the documented order.
  // Each section holds [n_kv_heads][block_size] rows of the header's row size.
  const uint8_t* sec = Sections(bytes, tokens.size());
  const uint64_t rows = uint64_t{info->geometry.n_kv_heads} * info->geometry.block_size;
  const uint64_t want[2] = {rows * Get<uint32_t>(bytes.data() + 96),
                            rows * Get<uint32_t>(bytes.data() + 100)};
  uint64_t off = 0;
  for (uint32_t l = 0; l < info->geometry.n_layers; ++l) {
    for (int s = 0; s < 2; ++s) {
      if (Get<uint64_t>(sec + 32 * l + 16 * s) != off) return TierMiss::kCorrupt;
      const uint64_t n = Get<uint64_t>(sec + 32 * l + 16 * s + 8);
      if (n > info->payload_bytes - off || n != want[s]) return TierMiss::kCorrupt;
      off += n;
    }
  }
  if (off != info->payload_bytes) return TierMiss::kCorrupt;
  *out = std::move(*info);
  return std::nullopt;
}

}  // namespace

uint64_t BlockChecksum(std::span<const uint8_t> bytes) {
  return KVCACHE_XXH3_64(bytes.data(), bytes.size());
}

std::string_view TierMissName(TierMiss miss) {
  static constexpr std::string_view kNames[kNumTierMisses] = {
      "absent", "evicted", "corrupt", "incompatible", "token_mismatch", "timeout", "unavailable"};
  return kNames[static_cast<size_t>(miss)];
}

std::string LayerGroupName(const LayerGroupTag& group) {
  if (group.kind == LayerGroupKind::kFullAttention) return "full";
  return fmt::format("window:{}", group.window);
}

std::string CompatManifest(const BlockCompat& c) {
  std::string m = fmt::format(
      "kvcache-block-compat\nobject_version={}\nlibrary_format_version={}\nmodel={}\n"
      "n_layers={}\nn_kv_heads={}\nhead_dim={}\nblock_size={}\nk_format={}\nv_format={}\n"
      "rotation={:016x}\ncalibration={}\n",
      kBlockObjectVersion, kLibraryFormatVersion, c.model, c.geometry.n_layers,
      c.geometry.n_kv_heads, c.geometry.head_dim, c.geometry.block_size, FormatName(c.formats.k),
      FormatName(c.formats.v), c.rotation, HashHex(c.calibration));
  // Only a model with several layer groups names one: the digests of every
  // other model's blocks are what they were before groups existed.
  if (c.group.has_value()) m += "layer_group=" + LayerGroupName(*c.group) + "\n";
  return m;
}

BlockHash CompatDigest(const BlockCompat& compat) {
  const std::string m = CompatManifest(compat);
  const XXH128_hash_t h = XXH3_128bits(m.data(), m.size());
  return {h.low64, h.high64};
}

uint64_t RotationDigest(const BlockPool& pool) {
  const std::vector<float>& k = pool.codec(Side::kKey).rotation_signs();
  const std::vector<float>& v = pool.codec(Side::kValue).rotation_signs();
  if (k.empty() && v.empty()) return 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const uint64_t sizes[2] = {k.size(), v.size()};
  XXH3_64bits_update(st, sizes, sizeof(sizes));
  XXH3_64bits_update(st, k.data(), k.size() * sizeof(float));
  XXH3_64bits_update(st, v.data(), v.size() * sizeof(float));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

BlockHash CalibrationDigest(const Calibration& calibration) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  const uint64_t n = calibration.transforms.size();
  XXH3_128bits_update(st, &n, sizeof(n));
  for (const RowTransform& t : calibration.transforms) {
    const uint64_t sizes[2] = {t.mean.size(), t.col_scale.size()};
    XXH3_128bits_update(st, sizes, sizeof(sizes));
    XXH3_128bits_update(st, t.mean.data(), t.mean.size() * sizeof(float));
    XXH3_128bits_update(st, t.col_scale.data(), t.col_scale.size() * sizeof(float));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return {h.low64, h.high64};
}

std::string HashHex(const BlockHash& h) { return fmt::format("{:016x}{:016x}", h.hi, h.lo); }

std::string BlockKey(const BlockHash& compat, const BlockHash& chain) {
  return "kvc1:" + HashHex(compat) + ":" + HashHex(chain);
}

std::string CalibrationKey(const BlockHash& compat, const BlockHash& calibration) {
  return "kvcal1:" + HashHex(compat) + ":" + HashHex(calibration);
}

Result<std::vector<uint8_t>> EncodeBlockObject(const BlockPool& pool, uint32_t block,
                                               const BlockHash& compat, const BlockHash& chain,
                                               const BlockHash& parent,
                                               std::span<const TokenId> tokens,
                                               std::optional<BlockHash> calibration,
                                               const WindowSinks* sinks,
                                               std::optional<LayerGroupTag> group) {
  const Geometry& g = pool.geometry();
  if (block >= pool.num_blocks()) return Status::InvalidArgument("block object: block out of range");
  if (sinks != nullptr) KV_RETURN_IF_ERROR(sinks->CheckFits(g));
  if (group.has_value() && !group->whole()) {
    return Status::InvalidArgument("block object: a layer group's window must be > 0 exactly for a sliding window");
  }
  if (tokens.size() != g.block_size()) {
    return Status::InvalidArgument(fmt::format("block object: {} tokens for a block of {}",
                                               tokens.size(), g.block_size()));
  }
  const uint32_t L = g.n_layers();
  const size_t k_bytes = pool.block_stride(Side::kKey);
  const size_t v_bytes = pool.block_stride(Side::kValue);
  const uint32_t nt = static_cast<uint32_t>(tokens.size());
  const size_t H = HeaderBytes(nt, L, calibration.has_value(), sinks != nullptr);
  const uint64_t payload = uint64_t{L} * (k_bytes + v_bytes);
  const size_t sink_bytes = sinks != nullptr ? sinks->rows.size() : 0;
  std::vector<uint8_t> out(H + payload + sink_bytes);
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 4);
  Put<uint16_t>(p + 4, kBlockObjectVersion);
  uint16_t flags = 0;
  size_t field = OptionalFields(nt, L);
  if (calibration.has_value()) {
    flags |= kBlockFlagCalibrated;
    PutHash(p + field, *calibration);
    field += 16;
  }
  if (sinks != nullptr) {
    flags |= kBlockFlagSinks;
    uint8_t* section = p + H + payload;
    std::memcpy(section, sinks->rows.data(), sink_bytes);
    Put<uint32_t>(p + field, sinks->sinks);
    Put<uint32_t>(p + field + 4, 0);
    Put<uint64_t>(p + field + 8, BlockChecksum(std::span<const uint8_t>(section, sink_bytes)));
  }
  if (group.has_value()) {
    flags |= kBlockFlagLayerGroup;
    Put<uint32_t>(p + 120, static_cast<uint32_t>(group->kind));
    Put<uint32_t>(p + 124, group->window);
  }
  Put<uint16_t>(p + 6, flags);
  Put<uint32_t>(p + 8, static_cast<uint32_t>(H));
  Put<uint32_t>(p + 12, static_cast<uint32_t>(tokens.size()));
  Put<uint64_t>(p + 16, payload);
  PutHash(p + 24, compat);
  PutHash(p + 40, chain);
  PutHash(p + 56, parent);
  Put<uint32_t>(p + 72, L);
  Put<uint32_t>(p + 76, g.n_kv_heads());
  Put<uint32_t>(p + 80, g.head_dim());
  Put<uint32_t>(p + 84, g.block_size());
  p[88] = static_cast<uint8_t>(pool.formats().k);
  p[89] = static_cast<uint8_t>(pool.formats().v);
  Put<uint32_t>(p + 92, kLibraryFormatVersion);
  Put<uint32_t>(p + 96, static_cast<uint32_t>(pool.row_bytes(Side::kKey)));
  Put<uint32_t>(p + 100, static_cast<uint32_t>(pool.row_bytes(Side::kValue)));
  std::memcpy(p + kBlockObjectFixedHeader, tokens.data(), tokens.size() * 4);
  uint8_t* sec = p + kBlockObjectFixedHeader + tokens.size() * 4;
  uint8_t* body = p + H;
  uint64_t off = 0;
  for (uint32_t l = 0; l < L; ++l) {
    Put<uint64_t>(sec + 32 * l, off);
    Put<uint64_t>(sec + 32 * l + 8, k_bytes);
    std::memcpy(body + off, pool.block_data(l, Side::kKey, block), k_bytes);
    off += k_bytes;
    Put<uint64_t>(sec + 32 * l + 16, off);
    Put<uint64_t>(sec + 32 * l + 24, v_bytes);
    std::memcpy(body + off, pool.block_data(l, Side::kValue, block), v_bytes);
    off += v_bytes;
  }
  Put<uint64_t>(p + 104, BlockChecksum(std::span<const uint8_t>(body, payload)));
  Put<uint64_t>(p + 112, HeaderChecksum(std::span<const uint8_t>(p, H)));
  return out;
}

Result<BlockObjectInfo> ParseBlockObjectHeader(std::span<const uint8_t> bytes,
                                               uint64_t total_bytes) {
  if (bytes.size() < kBlockObjectFixedHeader) return Status::Corruption("object: too short");
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) return Status::Corruption("object: bad magic");
  if (Get<uint16_t>(p + 4) != kBlockObjectVersion) {
    return Status::FailedPrecondition(
        fmt::format("object: version {} (this library reads {})", Get<uint16_t>(p + 4),
                    kBlockObjectVersion));
  }
  BlockObjectInfo info;
  info.header_bytes = Get<uint32_t>(p + 8);
  const uint32_t n_tokens = Get<uint32_t>(p + 12);
  info.payload_bytes = Get<uint64_t>(p + 16);
  info.geometry = {Get<uint32_t>(p + 72), Get<uint32_t>(p + 76), Get<uint32_t>(p + 80),
                   Get<uint32_t>(p + 84)};
  const uint16_t flags = Get<uint16_t>(p + 6);
  const bool calibrated = (flags & kBlockFlagCalibrated) != 0;
  const bool has_sinks = (flags & kBlockFlagSinks) != 0;
  if (info.geometry.n_layers > Geometry::kMaxLayers || n_tokens != info.geometry.block_size ||
      n_tokens > (1u << 20) ||
      info.header_bytes != HeaderBytes(n_tokens, info.geometry.n_layers, calibrated, has_sinks) ||
      bytes.size() < info.header_bytes || info.payload_bytes > total_bytes) {
    return Status::Corruption("object: sizes disagree");
  }
  const size_t sink_fields = OptionalFields(n_tokens, info.geometry.n_layers) + (calibrated ? 16 : 0);
  if (has_sinks) {
    // The section's size follows from S and the geometry (WindowSinks).
    WindowSinks shape;
    shape.sinks = Get<uint32_t>(p + sink_fields);
    shape.n_layers = info.geometry.n_layers;
    shape.n_kv_heads = info.geometry.n_kv_heads;
    shape.head_dim = info.geometry.head_dim;
    info.sinks_bytes = shape.sinks == 0 ? 0 : shape.expected_bytes();
    if (info.sinks_bytes == 0) return Status::Corruption("object: sink section sizes disagree");
    info.sinks = shape.sinks;
    info.sinks_checksum = Get<uint64_t>(p + sink_fields + 8);
  }
  if (total_bytes - info.payload_bytes < info.sinks_bytes ||
      total_bytes != info.header_bytes + info.payload_bytes + info.sinks_bytes) {
    return Status::Corruption("object: sizes disagree");
  }
  if (Get<uint64_t>(p + 112) != HeaderChecksum(bytes.first(info.header_bytes))) {
    return Status::Corruption("object: header checksum");
  }
  if (p[88] >= kAllFormats.size() || p[89] >= kAllFormats.size()) {
    return Status::Corruption("object: unknown format");
  }
  if (Get<uint32_t>(p + 92) != kLibraryFormatVersion) {
    return Status::FailedPrecondition("object: library format version");
  }
  // Flags: only kBlockFlagCalibrated and kBlockFlagSinks are defined (a
  // writer that sets another writes something this reader does not know).
  // Reserved bytes are zero, and the row sizes are the formats' own: the
  // layout is exact, nothing is ignored.
  if ((flags & ~kKnownFlags) != 0) {
    return Status::FailedPrecondition("object: unknown flags");
  }
  const bool grouped = (flags & kBlockFlagLayerGroup) != 0;
  if (Get<uint16_t>(p + 90) != 0 || (!grouped && Get<uint64_t>(p + 120) != 0) ||
      (has_sinks && Get<uint32_t>(p + sink_fields + 4) != 0)) {
    return Status::Corruption("object: reserved bytes not zero");
  }
  if (grouped) {
    const LayerGroupTag group{static_cast<LayerGroupKind>(Get<uint32_t>(p + 120)), Get<uint32_t>(p + 124)};
    if (!group.whole()) return Status::Corruption("object: unknown layer group");
    info.group = group;
  }
  info.formats = {static_cast<Format>(p[88]), static_cast<Format>(p[89])};
  const uint32_t head_dim = info.geometry.head_dim;
  if (Get<uint32_t>(p + 96) != RowBytes(info.formats.k, head_dim) ||
      Get<uint32_t>(p + 100) != RowBytes(info.formats.v, head_dim)) {
    return Status::Corruption("object: row bytes disagree with the formats");
  }
  info.compat = GetHash(p + 24);
  info.chain = GetHash(p + 40);
  info.parent = GetHash(p + 56);
  info.tokens.resize(n_tokens);
  std::memcpy(info.tokens.data(), p + kBlockObjectFixedHeader, size_t{n_tokens} * 4);
  info.calibrated = calibrated;
  if (info.calibrated) info.calibration = GetHash(p + OptionalFields(n_tokens, info.geometry.n_layers));
  return info;
}

std::optional<TierMiss> VerifyBlockObject(std::span<const uint8_t> bytes, const BlockHash& compat,
                                          const BlockHash& chain, const BlockHash& parent,
                                          std::span<const TokenId> tokens, std::optional<LayerGroupTag> group) {
  BlockObjectInfo info;
  if (std::optional<TierMiss> why = VerifyHeader(bytes, compat, chain, parent, tokens, group, &info)) {
    return why;
  }
  if (BlockChecksum(bytes.subspan(info.header_bytes, info.payload_bytes)) !=
      Get<uint64_t>(bytes.data() + 104)) {
    return TierMiss::kCorrupt;
  }
  if (info.sinks > 0 && BlockChecksum(SinkSection(bytes, info)) != info.sinks_checksum) {
    return TierMiss::kCorrupt;
  }
  return std::nullopt;
}

std::optional<TierMiss> VerifyAndDecodeBlockObject(std::span<const uint8_t> bytes,
                                                   const BlockHash& compat, const BlockHash& chain,
                                                   const BlockHash& parent,
                                                   std::span<const TokenId> tokens,
                                                   BlockPool& pool, uint32_t block,
                                                   std::shared_ptr<const WindowSinks>* sinks,
                                                   std::optional<LayerGroupTag> group) {
  if (sinks != nullptr) sinks->reset();
  BlockObjectInfo info;
  if (std::optional<TierMiss> why = VerifyHeader(bytes, compat, chain, parent, tokens, group, &info)) {
    return why;
  }
  if (!FitsPool(info, pool, block)) return TierMiss::kIncompatible;
  // With the pool's geometry and formats, VerifyHeader's checks (sections
  // tile the payload, each n_kv_heads x block_size rows of RowBytes(format,
  // head_dim)) make every section exactly the pool's block stride.
  const Geometry& g = pool.geometry();
  const size_t k_bytes = pool.block_stride(Side::kKey);
  const size_t v_bytes = pool.block_stride(Side::kValue);
  const uint8_t* sec = Sections(bytes, tokens.size());
  // Copy a section, then hash the copy while it is in cache: one pass over
  // the object instead of a checksum pass and a copy pass.
  const uint8_t* body = bytes.data() + info.header_bytes;
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) return TierMiss::kUnavailable;
  XXH3_64bits_reset(st);
  // Pieces of kCopyChunk bytes: the copy is still in L1 when it is hashed.
  constexpr size_t kCopyChunk = 8192;
  auto copy_and_hash = [&](uint8_t* dst, const uint8_t* src, size_t n) {
    for (size_t off = 0; off < n; off += kCopyChunk) {
      const size_t c = std::min(kCopyChunk, n - off);
      std::memcpy(dst + off, src + off, c);
      KVCACHE_XXH3_64_UPDATE(st, dst + off, c);
    }
  };
  for (uint32_t l = 0; l < g.n_layers(); ++l) {
    copy_and_hash(pool.block_data(l, Side::kKey, block), body + Get<uint64_t>(sec + 32 * l), k_bytes);
    copy_and_hash(pool.block_data(l, Side::kValue, block), body + Get<uint64_t>(sec + 32 * l + 16),
                  v_bytes);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (h != Get<uint64_t>(bytes.data() + 104)) return TierMiss::kCorrupt;
  if (info.sinks > 0) {
    const std::span<const uint8_t> section = SinkSection(bytes, info);
    if (BlockChecksum(section) != info.sinks_checksum) return TierMiss::kCorrupt;
    if (sinks != nullptr) {
      auto out = std::make_shared<WindowSinks>();
      out->sinks = info.sinks;
      out->n_layers = g.n_layers();
      out->n_kv_heads = g.n_kv_heads();
      out->head_dim = g.head_dim();
      out->formats = info.formats;
      out->rows.assign(section.begin(), section.end());
      *sinks = std::move(out);
    }
  }
  return std::nullopt;
}

Status DecodeBlockObjectInto(std::span<const uint8_t> bytes, BlockPool& pool, uint32_t block) {
  KV_ASSIGN_OR_RETURN(BlockObjectInfo info, ParseBlockObjectHeader(bytes, bytes.size()));
  if (!FitsPool(info, pool, block)) {
    return Status::InvalidArgument("block object: not this pool's geometry or formats");
  }
  const Geometry& g = pool.geometry();
  const size_t k_bytes = pool.block_stride(Side::kKey);
  const size_t v_bytes = pool.block_stride(Side::kValue);
  const uint8_t* sec = Sections(bytes, info.tokens.size());
  for (uint32_t l = 0; l < g.n_layers(); ++l) {
    if (Get<uint64_t>(sec + 32 * l + 8) != k_bytes || Get<uint64_t>(sec + 32 * l + 24) != v_bytes ||
        Get<uint64_t>(sec + 32 * l) > info.payload_bytes - k_bytes ||
        Get<uint64_t>(sec + 32 * l + 16) > info.payload_bytes - v_bytes ||
        info.payload_bytes < k_bytes || info.payload_bytes < v_bytes) {
      return Status::InvalidArgument("block object: sections are not the pool's");
    }
  }
  const uint8_t* body = bytes.data() + info.header_bytes;
  for (uint32_t l = 0; l < g.n_layers(); ++l) {
    std::memcpy(pool.block_data(l, Side::kKey, block), body + Get<uint64_t>(sec + 32 * l), k_bytes);
    std::memcpy(pool.block_data(l, Side::kValue, block), body + Get<uint64_t>(sec + 32 * l + 16),
                v_bytes);
  }
  return Status::Ok();
}

// --- the calibration object ----------------------------------------------------

namespace {

size_t CalibrationHeaderBytes(uint32_t n) { return kBlockObjectFixedHeader + 8 * size_t{n}; }

bool AllFinite(const std::vector<float>& v, bool positive) {
  for (float x : v) {
    if (!std::isfinite(x) || (positive && !(x > 0))) return false;
  }
  return true;
}

// What a calibration object's header says, checked: magic, version, sizes,
// header checksum, flags and reserved bytes.
struct CalibrationHeader {
  uint32_t n = 0, header_bytes = 0;
  uint64_t payload_bytes = 0;
  BlockHash compat, digest;
  GeometryOptions geometry;
};

Result<CalibrationHeader> ParseCalibrationHeader(std::span<const uint8_t> bytes, uint64_t total_bytes) {
  if (bytes.size() < kBlockObjectFixedHeader) return Status::Corruption("calibration: too short");
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kCalibrationMagic, 4) != 0) return Status::Corruption("calibration: bad magic");
  if (Get<uint16_t>(p + 4) != kCalibrationObjectVersion) {
    return Status::FailedPrecondition(fmt::format("calibration: version {} (this library reads {})",
                                                  Get<uint16_t>(p + 4), kCalibrationObjectVersion));
  }
  CalibrationHeader h;
  h.header_bytes = Get<uint32_t>(p + 8);
  h.n = Get<uint32_t>(p + 12);
  h.payload_bytes = Get<uint64_t>(p + 16);
  if (h.n > kMaxTransforms || h.header_bytes != CalibrationHeaderBytes(h.n) ||
      bytes.size() < h.header_bytes || h.payload_bytes > total_bytes ||
      total_bytes != h.header_bytes + h.payload_bytes) {
    return Status::Corruption("calibration: sizes disagree");
  }
  if (Get<uint64_t>(p + 112) != HeaderChecksum(bytes.first(h.header_bytes))) {
    return Status::Corruption("calibration: header checksum");
  }
  if (Get<uint32_t>(p + 68) != kLibraryFormatVersion || Get<uint16_t>(p + 6) != 0) {
    return Status::FailedPrecondition("calibration: library format version or flags");
  }
  for (size_t off = 72; off < 112; off += 8) {
    if (Get<uint64_t>(p + off) != 0) return Status::Corruption("calibration: reserved bytes not zero");
  }
  if (Get<uint64_t>(p + 120) != 0) return Status::Corruption("calibration: reserved bytes not zero");
  h.compat = GetHash(p + 24);
  h.digest = GetHash(p + 40);
  h.geometry = {Get<uint32_t>(p + 56), Get<uint32_t>(p + 60), Get<uint32_t>(p + 64), 0};
  return h;
}

// The transforms of a calibration object whose header parsed; kCorrupt
// unless every length is 0 or head_dim and they add up to the payload.
std::optional<Calibration> ReadTransforms(std::span<const uint8_t> bytes, const CalibrationHeader& h) {
  const uint8_t* lengths = bytes.data() + kBlockObjectFixedHeader;
  const uint32_t D = h.geometry.head_dim;
  uint64_t floats = 0;
  for (uint32_t i = 0; i < 2 * h.n; ++i) {
    const uint32_t len = Get<uint32_t>(lengths + 4 * size_t{i});
    if (len != 0 && len != D) return std::nullopt;
    floats += len;
  }
  if (floats * 4 != h.payload_bytes) return std::nullopt;
  Calibration c;
  c.transforms.resize(h.n);
  const uint8_t* body = bytes.data() + h.header_bytes;
  for (uint32_t i = 0; i < h.n; ++i) {
    for (int part = 0; part < 2; ++part) {
      std::vector<float>& v = part == 0 ? c.transforms[i].mean : c.transforms[i].col_scale;
      v.resize(Get<uint32_t>(lengths + 8 * size_t{i} + 4 * part));
      if (!v.empty()) std::memcpy(v.data(), body, v.size() * 4);  // (an empty vector's data() may be null)
      body += v.size() * 4;
    }
  }
  return c;
}

}  // namespace

Status CheckCalibration(const Calibration& calibration, const GeometryOptions& g) {
  const size_t want = size_t{g.n_layers} * 2 * g.n_kv_heads;
  if (calibration.transforms.size() != want) {
    return Status::InvalidArgument(fmt::format(
        "calibration: {} transforms for {} layers x 2 sides x {} kv heads", calibration.transforms.size(),
        g.n_layers, g.n_kv_heads));
  }
  for (const RowTransform& t : calibration.transforms) {
    if ((!t.mean.empty() && t.mean.size() != g.head_dim) ||
        (!t.col_scale.empty() && t.col_scale.size() != g.head_dim)) {
      return Status::InvalidArgument(fmt::format("calibration: a transform is not {} wide", g.head_dim));
    }
    if (!AllFinite(t.mean, false) || !AllFinite(t.col_scale, true)) {
      return Status::InvalidArgument("calibration: a mean is not finite or a col_scale not > 0");
    }
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> EncodeCalibrationObject(const Calibration& calibration,
                                                     const GeometryOptions& g, const BlockHash& compat) {
  KV_RETURN_IF_ERROR(CheckCalibration(calibration, g));
  const uint32_t n = static_cast<uint32_t>(calibration.transforms.size());
  if (n > kMaxTransforms) return Status::InvalidArgument("calibration: too many transforms");
  uint64_t floats = 0;
  for (const RowTransform& t : calibration.transforms) floats += t.mean.size() + t.col_scale.size();
  const size_t H = CalibrationHeaderBytes(n);
  std::vector<uint8_t> out(H + floats * 4);
  uint8_t* p = out.data();
  std::memcpy(p, kCalibrationMagic, 4);
  Put<uint16_t>(p + 4, kCalibrationObjectVersion);
  Put<uint32_t>(p + 8, static_cast<uint32_t>(H));
  Put<uint32_t>(p + 12, n);
  Put<uint64_t>(p + 16, floats * 4);
  PutHash(p + 24, compat);
  PutHash(p + 40, CalibrationDigest(calibration));
  Put<uint32_t>(p + 56, g.n_layers);
  Put<uint32_t>(p + 60, g.n_kv_heads);
  Put<uint32_t>(p + 64, g.head_dim);
  Put<uint32_t>(p + 68, kLibraryFormatVersion);
  uint8_t* lengths = p + kBlockObjectFixedHeader;
  uint8_t* body = p + H;
  for (uint32_t i = 0; i < n; ++i) {
    const RowTransform& t = calibration.transforms[i];
    Put<uint32_t>(lengths + 8 * size_t{i}, static_cast<uint32_t>(t.mean.size()));
    Put<uint32_t>(lengths + 8 * size_t{i} + 4, static_cast<uint32_t>(t.col_scale.size()));
    // (an empty vector's data() may be null: memcpy must not see it)
    if (!t.mean.empty()) std::memcpy(body, t.mean.data(), t.mean.size() * 4);
    body += t.mean.size() * 4;
    if (!t.col_scale.empty()) std::memcpy(body, t.col_scale.data(), t.col_scale.size() * 4);
    body += t.col_scale.size() * 4;
  }
  Put<uint64_t>(p + 112, HeaderChecksum(std::span<const uint8_t>(p, H)));
  return out;
}

CalibrationLoad DecodeCalibrationObject(std::span<const uint8_t> bytes, const BlockHash& compat,
                                        const BlockHash& digest, const GeometryOptions& g) {
  CalibrationLoad out;
  Result<CalibrationHeader> h = ParseCalibrationHeader(bytes, bytes.size());
  if (!h.ok()) {
    out.miss = h.status().code() == StatusCode::kFailedPrecondition ? TierMiss::kIncompatible
                                                                   : TierMiss::kCorrupt;
    return out;
  }
  out.miss = TierMiss::kIncompatible;
  if (!(h->compat == compat)) return out;
  out.miss = TierMiss::kCorrupt;
  if (!(h->digest == digest)) return out;  // another calibration under this key
  out.miss = TierMiss::kIncompatible;
  if (h->geometry.n_layers != g.n_layers || h->geometry.n_kv_heads != g.n_kv_heads ||
      h->geometry.head_dim != g.head_dim) {
    return out;
  }
  out.miss = TierMiss::kCorrupt;
  std::optional<Calibration> c = ReadTransforms(bytes, *h);
  if (!c.has_value() || !CheckCalibration(*c, g).ok() || !(CalibrationDigest(*c) == digest)) return out;
  out.calibration = std::make_shared<const Calibration>(std::move(*c));
  return out;
}

Result<StoredObjectHeader> ParseStoredObjectHeader(std::span<const uint8_t> bytes,
                                                   uint64_t total_bytes) {
  StoredObjectHeader out;
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kCalibrationMagic, 4) == 0) {
    KV_ASSIGN_OR_RETURN(CalibrationHeader h, ParseCalibrationHeader(bytes, total_bytes));
    out.key = CalibrationKey(h.compat, h.digest);
    return out;
  }
  KV_ASSIGN_OR_RETURN(BlockObjectInfo info, ParseBlockObjectHeader(bytes, total_bytes));
  out.key = info.key();
  const bool needs_parent = !info.group.has_value() || info.group->kind != LayerGroupKind::kSlidingWindow;
  if (needs_parent) out.parent_key = BlockKey(info.compat, info.parent);
  if (info.calibrated && !(info.calibration == BlockHash{})) {
    out.calibration_key = CalibrationKey(info.compat, info.calibration);
  }
  return out;
}

}  // namespace kvcache
