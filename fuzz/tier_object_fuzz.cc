// Fuzz target `tier_object`: the offload tiers' block object (kvcache/serving/tier_object.h,
// layout in docs/tiers.md), through its public functions only.
//
// Input byte 0 picks the mode (2: disk file, 4: raw calibration object, 6:
// calibration round trip, else even: raw object, odd: round trip); the rest
// is:
//   raw object: arbitrary bytes given to
//       - VerifyBlockObject against a fixed expectation (geometry 2 x 1 x 32
//         x 4, the constant hashes and tokens below): an accepted object
//         carries exactly those, with the documented sizes;
//       - ParseBlockObjectHeader as a disk tier's index rebuild calls it
//         (only the header's bytes, the file's length as total): agrees with
//         a parse of the whole object; accepted headers have H = 128 + 4 nt +
//         32 L (+ 16 if the object names its calibration), nt = block_size,
//         length = H + payload;
//       - VerifyBlockObject against what the header itself claims: never
//         incompatible or token_mismatch then; if accepted and the geometry
//         is small, DecodeBlockObjectInto a pool of that geometry copies the
//         sections (or refuses with InvalidArgument), and re-encoding the
//         pool's block gives the input back outside the fields the reader
//         does not interpret (flags, padding, row bytes, checksums);
//       - DecodeBlockObjectInto on any parsed (unverified) header: memory
//         safe, a Status either way;
//       - the load path, VerifyAndDecodeBlockObject, against both
//         expectations, into a pool of the header's geometry and into one
//         of another (CheckLoadPath): the verdict of VerifyBlockObject (on
//         another pool an intact header is incompatible), and an accepted
//         object leaves the block holding what DecodeBlockObjectInto copies.
//   round trip: a geometry and formats from the first bytes, a pool block
//     filled from the input, EncodeBlockObject (naming a calibration digest
//     from the input, or not); the object verifies, its
//     header parses to what was encoded, the load path (and
//     DecodeBlockObjectInto) into another block copies it bit-exact, and wrong expectations (compat, chain, parent, a
//     token) give incompatible / corrupt / token_mismatch / token_mismatch.
//     Then one mutation from the input (flip a byte, overwrite 8 bytes,
//     truncate, extend): rejected unless the bytes are unchanged, by the
//     load path too.
//   disk file: the bytes written as one file of a DiskTier folder (named
//     after its header's key when it parses as a block or a calibration
//     object), then OpenDiskTier: the file is either indexed (and Load
//     returns it byte for byte) or discarded.
//   raw calibration object: DecodeCalibrationObject against what the header
//     claims: a miss is corrupt or incompatible; accepted, the calibration
//     passes CheckCalibration, has the claimed digest, its header parses as
//     the disk tier reads it, and re-encoding gives the input back byte for
//     byte; another compat or geometry is incompatible, another digest corrupt.
//   calibration round trip: a geometry and transforms from the input (each
//     mean / col_scale present or not, finite floats, positive scales),
//     EncodeCalibrationObject, decoded back equal; one mutation from the
//     input is rejected unless the bytes are unchanged.
// Thread safety: see fuzz_target.h.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"

namespace {
using namespace kvcache;

constexpr BlockHash kCompat{0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr BlockHash kChain{0x1111111111111111ull, 0x2222222222222222ull};
constexpr BlockHash kParent{0x3333333333333333ull, 0x4444444444444444ull};
constexpr TokenId kTokens[4] = {1, 2, 3, 4};

uint32_t U32(std::span<const uint8_t> b, size_t off) {
  uint32_t v = 0;
  if (off + 4 <= b.size()) std::memcpy(&v, b.data() + off, 4);
  return v;
}

// A pool of `blocks` blocks, or null if the format cannot take the geometry.
std::shared_ptr<BlockPool> MakePool(const GeometryOptions& go, FormatPair formats,
                                    uint32_t blocks) {
  auto g = Geometry::Create(go);
  if (!g.ok()) return nullptr;
  BlockPoolOptions po;
  po.num_blocks = blocks;
  po.huge_pages = false;
  auto pool = BlockPool::Create(*g, formats, po);
  if (!pool.ok()) {
    FUZZ_CHECK(pool.status().code() == StatusCode::kInvalidArgument);
    return nullptr;
  }
  return *pool;
}

bool SameBlock(const BlockPool& a, uint32_t ba, const BlockPool& b, uint32_t bb) {
  for (uint32_t l = 0; l < a.geometry().n_layers(); ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      if (std::memcmp(a.block_data(l, s, ba), b.block_data(l, s, bb), a.block_stride(s)) != 0) {
        return false;
      }
    }
  }
  return true;
}

// Every byte of block `b` (all layers, K then V).
std::vector<uint8_t> BlockBytes(const BlockPool& p, uint32_t b) {
  std::vector<uint8_t> out;
  for (uint32_t l = 0; l < p.geometry().n_layers(); ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      const uint8_t* d = p.block_data(l, s, b);
      out.insert(out.end(), d, d + p.block_stride(s));
    }
  }
  return out;
}

// The load path, VerifyAndDecodeBlockObject into block `block` of `pool`
// (two blocks), against the separate VerifyBlockObject + DecodeBlockObjectInto
// with the same expectation. `info`: the object's parsed header, null if it
// does not parse. The same verdict where the pool fits the object (or the
// header does not parse); on another pool an intact header is kIncompatible
// (a corrupt payload may be either), never accepted; accepted: the block
// holds what DecodeBlockObjectInto copies; the other block is never written.
void CheckLoadPath(std::span<const uint8_t> bytes, const BlockHash& compat, const BlockHash& chain,
                   const BlockHash& parent, std::span<const TokenId> tokens,
                   const BlockObjectInfo* info, BlockPool& pool, uint32_t block) {
  const std::optional<TierMiss> want = VerifyBlockObject(bytes, compat, chain, parent, tokens);
  const uint32_t other = block ^ 1;
  for (uint32_t l = 0; l < pool.geometry().n_layers(); ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      std::memset(pool.block_data(l, s, block), 0x5a, pool.block_stride(s));
    }
  }
  const std::vector<uint8_t> other_before = BlockBytes(pool, other);
  const std::optional<TierMiss> got =
      VerifyAndDecodeBlockObject(bytes, compat, chain, parent, tokens, pool, block);
  FUZZ_CHECK(BlockBytes(pool, other) == other_before);
  const GeometryOptions* go = info ? &info->geometry : nullptr;
  const Geometry& pg = pool.geometry();
  const bool fits = go && go->n_layers == pg.n_layers() && go->n_kv_heads == pg.n_kv_heads() &&
                    go->head_dim == pg.head_dim() && go->block_size == pg.block_size() &&
                    info->formats == pool.formats();
  auto name = [](const std::optional<TierMiss>& m) {
    return m ? std::string(TierMissName(*m)) : std::string("accepted");
  };
  if (fits || !info) {
    FUZZ_CHECK_MSG(got == want, "load path %s, verify %s", name(got).c_str(), name(want).c_str());
  } else if (!want) {
    FUZZ_CHECK_MSG(got == TierMiss::kIncompatible, "load path into another pool: %s",
                   name(got).c_str());
  } else if (*want == TierMiss::kCorrupt) {
    FUZZ_CHECK(got == TierMiss::kCorrupt || got == TierMiss::kIncompatible);
  } else {
    FUZZ_CHECK_MSG(got == want, "load path %s, verify %s", name(got).c_str(), name(want).c_str());
  }
  if (got) return;
  const std::vector<uint8_t> loaded = BlockBytes(pool, block);
  FUZZ_CHECK(DecodeBlockObjectInto(bytes, pool, block).ok());
  FUZZ_CHECK(BlockBytes(pool, block) == loaded);
}

// A pool no parsed header of the corpus has (the fixed geometry, f32): the
// load path's pool for objects that do not parse or are too large to decode.
BlockPool& FixedPool() {
  static const std::shared_ptr<BlockPool> pool =
      MakePool({2, 1, 32, 4}, {Format::kF32, Format::kF32}, 2);
  return *pool;
}

// The header as a disk tier's rebuild reads it: its first H bytes (H from
// the fixed header, bounded by the length), the whole length as total.
Result<BlockObjectInfo> ParseAsRebuild(std::span<const uint8_t> bytes) {
  const size_t h = std::min<size_t>(bytes.size(), std::max<uint32_t>(U32(bytes, 8), 128));
  return ParseBlockObjectHeader(bytes.first(h), bytes.size());
}

void RawObject(std::span<const uint8_t> bytes) {
  // Against the fixed expectation.
  const std::optional<TierMiss> fixed = VerifyBlockObject(bytes, kCompat, kChain, kParent, kTokens);
  if (!fixed) {
    auto info = ParseBlockObjectHeader(bytes, bytes.size());
    FUZZ_CHECK(info.ok());
    FUZZ_CHECK(info->compat == kCompat && info->chain == kChain && info->parent == kParent);
    FUZZ_CHECK(info->tokens == std::vector<TokenId>(std::begin(kTokens), std::end(kTokens)));
    FUZZ_CHECK(info->header_bytes + info->payload_bytes + info->sinks_bytes == bytes.size());
  } else {
    FUZZ_CHECK(*fixed == TierMiss::kCorrupt || *fixed == TierMiss::kIncompatible ||
               *fixed == TierMiss::kTokenMismatch);
  }

  // The header alone (the disk tier's rebuild) and the whole object agree.
  auto whole = ParseBlockObjectHeader(bytes, bytes.size());
  auto head = ParseAsRebuild(bytes);
  FUZZ_CHECK(whole.ok() == head.ok());
  if (!whole.ok()) {
    FUZZ_CHECK(whole.status().code() == StatusCode::kCorruption ||
               whole.status().code() == StatusCode::kFailedPrecondition);
    FUZZ_CHECK(whole.status().code() == head.status().code());
    CheckLoadPath(bytes, kCompat, kChain, kParent, kTokens, nullptr, FixedPool(), 0);
    return;
  }
  const BlockObjectInfo& info = *whole;
  FUZZ_CHECK(head->key() == info.key() && head->tokens == info.tokens);
  FUZZ_CHECK(info.tokens.size() == info.geometry.block_size);
  FUZZ_CHECK(info.header_bytes == 128 + 4 * info.tokens.size() + 32 * size_t{info.geometry.n_layers} +
                                      (info.calibrated ? 16 : 0) + (info.sinks > 0 ? 16 : 0));
  FUZZ_CHECK(info.header_bytes + info.payload_bytes + info.sinks_bytes == bytes.size());
  // A header shorter than H, or another total, is refused.
  FUZZ_CHECK(!ParseBlockObjectHeader(bytes.first(info.header_bytes - 1), bytes.size()).ok());
  FUZZ_CHECK(!ParseBlockObjectHeader(bytes, bytes.size() + 1).ok());

  // Against what the header claims: only the sections and payload remain.
  const std::optional<TierMiss> self =
      VerifyBlockObject(bytes, info.compat, info.chain, info.parent, info.tokens);
  FUZZ_CHECK(!self || *self == TierMiss::kCorrupt);
  // The load path into a pool of another geometry (or this one's, by chance).
  CheckLoadPath(bytes, info.compat, info.chain, info.parent, info.tokens, &info, FixedPool(), 0);

  // Decoding into a pool of that geometry (small ones only).
  const GeometryOptions& go = info.geometry;
  const uint64_t rows = uint64_t{go.n_layers} * go.n_kv_heads * go.block_size;
  if (rows == 0 || rows > 4096 || go.head_dim == 0 || go.head_dim > 1024) return;
  auto pool = MakePool(go, info.formats, 2);
  if (!pool) return;
  // The load path into a pool that fits, against both expectations.
  CheckLoadPath(bytes, info.compat, info.chain, info.parent, info.tokens, &info, *pool, 0);
  CheckLoadPath(bytes, kCompat, kChain, kParent, kTokens, &info, *pool, 0);
  const Status st = DecodeBlockObjectInto(bytes, *pool, 1);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == StatusCode::kInvalidArgument);
    return;
  }
  if (self) return;  // decoded unverified bytes: memory safety was the point
  // A verified, decoded object re-encodes to itself outside the fields the
  // reader does not interpret.
  auto again = EncodeBlockObject(*pool, 1, info.compat, info.chain, info.parent, info.tokens,
                                 info.calibrated ? std::optional(info.calibration) : std::nullopt);
  FUZZ_CHECK_MSG(again.ok(), "%s", again.status().ToString().c_str());
  FUZZ_CHECK(again->size() == bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    const bool ignored = (i >= 6 && i < 8) || (i >= 90 && i < 92) || (i >= 96 && i < 104) ||
                         (i >= 112 && i < 128);
    FUZZ_CHECK_MSG(ignored || (*again)[i] == bytes[i], "byte %zu differs after re-encoding", i);
  }
}

void RoundTrip(std::span<const uint8_t> in) {
  if (in.size() < 6) return;
  GeometryOptions go;
  go.n_layers = 1 + in[0] % 3;
  go.n_kv_heads = 1 + in[1] % 3;
  go.head_dim = 32u << (in[2] % 3);  // 32, 64, 128: every format takes them
  go.block_size = 1 + in[3] % 8;
  const FormatPair formats{kAllFormats[in[4] % kAllFormats.size()],
                           kAllFormats[in[5] % kAllFormats.size()]};
  in = in.subspan(6);
  auto pool = MakePool(go, formats, 2);
  if (!pool) return;
  // Block 0 from the input, cycled (zeros without input).
  if (!in.empty()) {
    for (uint32_t l = 0; l < go.n_layers; ++l) {
      for (Side s : {Side::kKey, Side::kValue}) {
        uint8_t* p = pool->block_data(l, s, 0);
        const size_t stride = pool->block_stride(s);
        for (size_t i = 0; i < stride; i += in.size()) {
          std::memcpy(p + i, in.data(), std::min(in.size(), stride - i));
        }
        p[0] ^= static_cast<uint8_t>(l * 2 + (s == Side::kValue));  // layers and sides differ
      }
    }
  }
  std::vector<TokenId> tokens(go.block_size);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(U32(in, 4 * i) >> 1);
  const BlockHash compat{U32(in, 0) * 0x9E3779B97F4A7C15ull, 7};
  const BlockHash chain{U32(in, 4) + 1ull, 11}, parent{U32(in, 8) + 2ull, 13};
  std::optional<BlockHash> cal;  // the calibration the object names, if any
  if (U32(in, 12) & 1) cal = BlockHash{U32(in, 16), U32(in, 20)};

  auto obj = EncodeBlockObject(*pool, 0, compat, chain, parent, tokens, cal);
  FUZZ_CHECK_MSG(obj.ok(), "%s", obj.status().ToString().c_str());
  const std::vector<uint8_t>& bytes = *obj;
  FUZZ_CHECK(!VerifyBlockObject(bytes, compat, chain, parent, tokens));
  auto info = ParseBlockObjectHeader(bytes, bytes.size());
  FUZZ_CHECK(info.ok());
  FUZZ_CHECK(info->compat == compat && info->chain == chain && info->parent == parent);
  FUZZ_CHECK(info->tokens == tokens && info->formats == formats);
  FUZZ_CHECK(info->calibrated == cal.has_value() && info->calibration == cal.value_or(BlockHash{}));
  FUZZ_CHECK(info->geometry.n_layers == go.n_layers && info->geometry.n_kv_heads == go.n_kv_heads &&
             info->geometry.head_dim == go.head_dim && info->geometry.block_size == go.block_size);
  FUZZ_CHECK(info->payload_bytes ==
             uint64_t{go.n_layers} * (pool->block_stride(Side::kKey) + pool->block_stride(Side::kValue)));
  FUZZ_CHECK(info->key() == BlockKey(compat, chain));
  FUZZ_CHECK(ParseAsRebuild(bytes).ok());
  // The load path into block 1 (block 0, the source, untouched), accepted.
  CheckLoadPath(bytes, compat, chain, parent, tokens, &*info, *pool, 1);
  FUZZ_CHECK(SameBlock(*pool, 0, *pool, 1));
  auto again = EncodeBlockObject(*pool, 1, compat, chain, parent, tokens, cal);
  FUZZ_CHECK(again.ok() && *again == bytes);

  // Wrong expectations.
  const BlockHash other{compat.lo ^ 1, compat.hi};
  FUZZ_CHECK(VerifyBlockObject(bytes, other, chain, parent, tokens) == TierMiss::kIncompatible);
  FUZZ_CHECK(VerifyBlockObject(bytes, compat, other, parent, tokens) == TierMiss::kCorrupt);
  FUZZ_CHECK(VerifyBlockObject(bytes, compat, chain, other, tokens) == TierMiss::kTokenMismatch);
  std::vector<TokenId> wrong = tokens;
  wrong[in.empty() ? 0 : in[0] % wrong.size()] ^= 1;
  FUZZ_CHECK(VerifyBlockObject(bytes, compat, chain, parent, wrong) == TierMiss::kTokenMismatch);
  // Another pool's geometry is refused on decode, nothing written.
  GeometryOptions og = go;
  og.block_size = go.block_size % 8 + 1;
  if (auto op = MakePool(og, formats, 1)) {
    FUZZ_CHECK(DecodeBlockObjectInto(bytes, *op, 0).code() == StatusCode::kInvalidArgument);
  }

  // One mutation, taken from the input's last bytes.
  if (in.size() < 12) return;
  const uint8_t* m = in.data() + in.size() - 12;
  const uint32_t at = (uint32_t{m[1]} | uint32_t{m[2]} << 8 | uint32_t{m[3]} << 16) % bytes.size();
  std::vector<uint8_t> mut = bytes;
  switch (m[0] % 4) {
    case 0:
      mut[at] ^= m[4];
      break;
    case 1:
      std::memcpy(mut.data() + std::min<size_t>(at, mut.size() - 8), m + 4, 8);
      break;
    case 2:
      mut.resize(at);
      break;
    default:
      mut.insert(mut.begin() + at, m + 4, m + 4 + 1 + m[4] % 8);
      break;
  }
  const std::optional<TierMiss> v = VerifyBlockObject(mut, compat, chain, parent, tokens);
  FUZZ_CHECK_MSG(v.has_value() == (mut != bytes), "mutation %d at %u of %zu: %s", m[0] % 4, at,
                 bytes.size(), v ? std::string(TierMissName(*v)).c_str() : "accepted");
  // The load path agrees on the mutated object (block 0 untouched).
  auto mut_info = ParseBlockObjectHeader(mut, mut.size());
  CheckLoadPath(mut, compat, chain, parent, tokens, mut_info.ok() ? &*mut_info : nullptr, *pool, 1);
}

void DiskFile(std::span<const uint8_t> bytes) {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("kvcache-fuzz-tier-" + std::to_string(::getpid()))).string();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all((std::filesystem::temp_directory_path() /
                                   ("kvcache-fuzz-tier-" + std::to_string(::getpid()))),
                                  ec);
    });
    return d;
  }();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const size_t h = std::min<size_t>(bytes.size(), std::max<uint32_t>(U32(bytes, 8), 128));
  auto info = ParseStoredObjectHeader(bytes.first(h), bytes.size());
  std::string key = info.ok() ? info->key : "kvc1:junk:zz";
  std::string file = key;
  std::replace(file.begin(), file.end(), ':', '-');
  const std::string shard = key.substr(key.rfind(':') + 1, 2);
  std::filesystem::create_directories(dir + "/objects/" + shard, ec);
  FUZZ_CHECK(!ec);
  {
    std::ofstream f(dir + "/objects/" + shard + "/" + file + ".kvcb", std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    FUZZ_CHECK(f.good());
  }
  DiskTierOptions o;
  o.path = dir;
  o.fsync = false;
  auto tier = OpenDiskTier(o);
  FUZZ_CHECK_MSG(tier.ok(), "%s", tier.status().ToString().c_str());
  const TierUsage u = (*tier)->usage();
  FUZZ_CHECK(u.recovered_objects + u.discarded_files == 1);
  FUZZ_CHECK(u.recovered_objects == (info.ok() ? 1u : 0u));
  if (!info.ok()) return;
  FUZZ_CHECK(u.objects == 1 && u.bytes == bytes.size());
  const std::string keys[] = {key};
  const std::vector<TierGet> got = (*tier)->Load(keys);
  FUZZ_CHECK(got.size() == 1 && got[0].bytes != nullptr);
  FUZZ_CHECK(got[0].bytes->size() == bytes.size() &&
             std::equal(bytes.begin(), bytes.end(), got[0].bytes->begin()));
}

uint64_t U64(std::span<const uint8_t> b, size_t off) {
  uint64_t v = 0;
  if (off + 8 <= b.size()) std::memcpy(&v, b.data() + off, 8);
  return v;
}

void CalibrationObject(std::span<const uint8_t> bytes) {
  // The expectation is what the (unchecked) header claims.
  const BlockHash compat{U64(bytes, 24), U64(bytes, 32)}, digest{U64(bytes, 40), U64(bytes, 48)};
  const GeometryOptions g{U32(bytes, 56), U32(bytes, 60), U32(bytes, 64), 16};
  const CalibrationLoad c = DecodeCalibrationObject(bytes, compat, digest, g);
  const size_t h = std::min<size_t>(bytes.size(), std::max<uint32_t>(U32(bytes, 8), 128));
  const auto head = ParseStoredObjectHeader(bytes.first(h), bytes.size());
  if (c.calibration == nullptr) {
    FUZZ_CHECK(c.miss == TierMiss::kCorrupt || c.miss == TierMiss::kIncompatible);
    return;
  }
  FUZZ_CHECK(head.ok() && head->key == CalibrationKey(compat, digest));
  FUZZ_CHECK(head->parent_key.empty() && head->calibration_key.empty());
  FUZZ_CHECK(CalibrationDigest(*c.calibration) == digest);
  FUZZ_CHECK(CheckCalibration(*c.calibration, g).ok());
  auto again = EncodeCalibrationObject(*c.calibration, g, compat);
  FUZZ_CHECK(again.ok() && again->size() == bytes.size() &&
             std::equal(bytes.begin(), bytes.end(), again->begin()));
  const BlockHash other{compat.lo ^ 1, compat.hi}, other_digest{digest.lo ^ 1, digest.hi};
  FUZZ_CHECK(DecodeCalibrationObject(bytes, other, digest, g).miss == TierMiss::kIncompatible);
  FUZZ_CHECK(DecodeCalibrationObject(bytes, compat, other_digest, g).miss == TierMiss::kCorrupt);
  GeometryOptions og = g;
  og.n_kv_heads += 1;
  FUZZ_CHECK(DecodeCalibrationObject(bytes, compat, digest, og).miss == TierMiss::kIncompatible);
}

void CalibrationRoundTrip(std::span<const uint8_t> in) {
  if (in.size() < 3) return;
  const GeometryOptions g{1u + in[0] % 3, 1u + in[1] % 3, 16u << (in[2] % 3), 16};
  in = in.subspan(3);
  size_t next = 0;
  auto byte = [&] { return in.empty() ? uint8_t{0} : in[next++ % in.size()]; };
  Calibration cal;
  cal.transforms.resize(size_t{g.n_layers} * 2 * g.n_kv_heads);
  for (RowTransform& t : cal.transforms) {
    const uint8_t present = byte();
    if (present & 1) {
      for (uint32_t d = 0; d < g.head_dim; ++d) t.mean.push_back((float(byte()) - 128.0f) / 16.0f);
    }
    if (present & 2) {
      for (uint32_t d = 0; d < g.head_dim; ++d) t.col_scale.push_back(0.25f + float(byte()) / 32.0f);
    }
  }
  const BlockHash compat{U32(in, 0) + 3ull, 17}, digest = CalibrationDigest(cal);
  auto obj = EncodeCalibrationObject(cal, g, compat);
  FUZZ_CHECK_MSG(obj.ok(), "%s", obj.status().ToString().c_str());
  const std::vector<uint8_t>& bytes = *obj;
  const CalibrationLoad c = DecodeCalibrationObject(bytes, compat, digest, g);
  FUZZ_CHECK(c.calibration != nullptr && c.calibration->transforms == cal.transforms);
  FUZZ_CHECK(ParseStoredObjectHeader(bytes, bytes.size()).ok());
  if (in.size() < 12) return;
  const uint8_t* m = in.data() + in.size() - 12;
  const uint32_t at = (uint32_t{m[1]} | uint32_t{m[2]} << 8) % bytes.size();
  std::vector<uint8_t> mut = bytes;
  switch (m[0] % 3) {
    case 0:
      mut[at] ^= m[4] | 1;
      break;
    case 1:
      mut.resize(at);
      break;
    default:
      mut.insert(mut.begin() + at, m + 4, m + 4 + 1 + m[4] % 8);
      break;
  }
  const CalibrationLoad v = DecodeCalibrationObject(mut, compat, digest, g);
  FUZZ_CHECK_MSG((v.calibration == nullptr) == (mut != bytes), "mutation %d at %u of %zu", m[0] % 3,
                 at, bytes.size());
}

}  // namespace

KVCACHE_FUZZ_TARGET(tier_object) {
  if (size < 1) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  // The disk mode costs file system calls (milliseconds): byte 0 == 2 only.
  if (data[0] == 2) {
    DiskFile(rest);
  } else if (data[0] == 4) {
    CalibrationObject(rest);
  } else if (data[0] == 6) {
    CalibrationRoundTrip(rest);
  } else if (data[0] % 2 == 0) {
    RawObject(rest);
  } else {
    RoundTrip(rest);
  }
  return 0;
}
