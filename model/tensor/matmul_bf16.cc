// The bf16 weight product (matmul_bf16.h): AMX tiles where the CPU has
// them, vdpbf16ps where it has AVX512_BF16 without AMX, MatMul's f32 kernel
// over the same rounded values elsewhere.
//
// The tiles kernel, per part of rows [r0, r1): 16 weight rows at a time are
// decoded (DequantizeRow's exact values) and rounded to bf16 into a row-major
// buffer [16][kpad] (kpad = cols rounded up to 32, zero-padded; missing rows
// zero), which is the A operand as it lies (16 rows x 32 values per step,
// stride kpad * 2 bytes). The inputs were packed once per product as B
// operands: per 16 tokens and 32 values, row k of the tile holds the 16
// tokens' value pairs (2k, 2k + 1). C = 16 rows x 16 tokens in f32. Up to
// 4 accumulators per pass: 4 row groups x 1 token tile, or 2 x 2 (each A
// and each B load feeds two products). Tiles: 0-3 C, 4-7 A and B.
#include "model/tensor/matmul_bf16.h"

// The decode multiplies and adds round on their own, as DequantizeRow's do.
#pragma GCC optimize("fp-contract=off")
// GCC 12's AVX-512 headers start masked shifts, narrowing moves and
// _mm512_reduce_add_ps from _mm512_undefined_*(), which its own
// -W(maybe-)uninitialized then reports.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "kvcache/float16.h"
#include "model/tensor/ggml_blocks.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define KVCACHE_AMX_TILES 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define KVCACHE_AMX_TILES 0
#endif

namespace kvcache::model {
namespace dequant_internal {
void MatMulRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const float* x, uint32_t n,
                float* out, float* buf, bool bf16);
void RoundToBf16Rows(float* p, size_t n);
}  // namespace dequant_internal

namespace {

constexpr uint32_t kTile = 16;  // rows of A and C, tokens of B and C
constexpr uint32_t kStep = 32;  // bf16 values per row of A per step

uint32_t Steps(uint32_t cols) { return (cols + kStep - 1) / kStep; }
uint32_t TokenTiles(uint32_t n) { return (n + kTile - 1) / kTile; }

#if KVCACHE_AMX_TILES

#define KVCACHE_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

#define KVCACHE_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// AVX-512 F/BW/VL and AVX512_BF16 (vdpbf16ps), with the OS saving the
// AVX-512 state: the dot kernel, and the tiles kernel's decode and packing.
bool DetectDot() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((b & (1u << 16)) == 0 || (b & (1u << 30)) == 0 || (b & (1u << 31)) == 0) return false;  // F, BW, VL
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || (a & (1u << 5)) == 0) return false;  // AVX512_BF16
  return (Xcr0() & 0xE6) == 0xE6;  // SSE/AVX and the AVX-512 opmask and registers
}

// DetectDot's features, AMX-BF16 and AMX-TILE, and the tile state granted.
bool DetectTiles() {
  const char* off = std::getenv("KVCACHE_NO_AMX");
  if (off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0) return false;
  if (!DetectDot()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return false;  // AMX-BF16, AMX-TILE
  const uint64_t tiles = uint64_t{3} << 17;                            // tile config and data
  if ((Xcr0() & tiles) != tiles) return false;
  // Linux hands out the tile data state only on request (ARCH_REQ_XCOMP_PERM
  // for XFEATURE_XTILEDATA); without it the first tile instruction faults.
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 32 floats (lo, hi) rounded to bf16, ties to even (vcvtne2ps2bf16: as
// FloatToBF16 for every finite value of at least 2^-126 in magnitude; smaller
// ones become zero, which a model's weights and activations never need).
KVCACHE_DOT_TARGET inline __m512i ToBf16x32(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// A Q4_1 or Q8_0 block (src: its first byte) as 32 bf16 values:
// DequantizeRow's exact values (the code times d, plus m for Q4_1, each
// rounded on its own), then rounded to bf16.
template <GgmlType kT>
KVCACHE_DOT_TARGET inline __m512i BlockBf16(const uint8_t* src) {
  if constexpr (kT == GgmlType::kQ4_1) {
    // The block's 16 levels q * d + m (q = 0..15) rounded to bf16 once, then
    // looked up by the 32 codes (vpermw): the same bits as rounding each
    // value, for fewer instructions.
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(src))));
    const __m512 q16 = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 levels = _mm512_add_ps(_mm512_mul_ps(q16, _mm512_broadcastss_ps(dm)),
                                        _mm512_broadcastss_ps(_mm_shuffle_ps(dm, dm, 1)));
    const __m256i table = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(levels));
    const __m128i low = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4));
    const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
    return _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(codes), _mm512_castsi256_si512(table));
  } else {
    const __m512 d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(src[0] | (src[1] << 8))));
    const __m512 lo =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 18))));
    return ToBf16x32(_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d));
  }
}

// Bytes of a Q4_1 or Q8_0 block.
constexpr size_t BlockBytes(GgmlType t) {
  return t == GgmlType::kQ4_1 ? ggml_blocks::kQ41Bytes : ggml_blocks::kQ80Bytes;
}

// Block j (values 32 j .. 32 j + 31) of row r of a Q4_1 or Q8_0 matrix as
// bf16 into dst[32] (BlockBf16).
KVCACHE_AMX_TARGET inline void BlockToBf16(const WeightMatrix& w, uint32_t r, uint32_t j, uint16_t* dst) {
  const uint8_t* src = w.data + static_cast<size_t>(r) * w.row_bytes;
  if (w.type == GgmlType::kQ4_1) {
    _mm512_storeu_si512(dst, BlockBf16<GgmlType::kQ4_1>(src + static_cast<size_t>(j) * BlockBytes(GgmlType::kQ4_1)));
  } else {
    _mm512_storeu_si512(dst, BlockBf16<GgmlType::kQ8_0>(src + static_cast<size_t>(j) * BlockBytes(GgmlType::kQ8_0)));
  }
}

bool DecodesByBlock(GgmlType t) { return t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0; }

// 32 integer codes (two vectors of 16 int32) times a scale, rounded to bf16:
// float(code) * d, each product rounded on its own, as DequantizeRow does.
KVCACHE_DOT_TARGET inline __m512i CodesTimes(__m512i lo, __m512i hi, __m512 d) {
  return ToBf16x32(_mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
}

// Values 32 s .. 32 s + 31 of a row (its first byte at row) of type kT as
// bf16: DequantizeRow's exact values (ggml_blocks.h's layouts, the scalar
// decoder's operations), rounded to bf16. For the K types kJ is s % 8, the
// step's place in its super-block (known when the caller's loop is unrolled).
template <GgmlType kT, uint32_t kJ = 0>
KVCACHE_DOT_TARGET inline __m512i StepBf16(const uint8_t* row, uint32_t s) {
  namespace gb = ggml_blocks;
  if constexpr (kT == GgmlType::kQ4_1 || kT == GgmlType::kQ8_0) {
    return BlockBf16<kT>(row + static_cast<size_t>(s) * BlockBytes(kT));
  } else if constexpr (kT == GgmlType::kQ5_0) {
    // float(code - 16) * d: a value whose fifth bit (bit j of qh) is clear
    // is its nibble - 16, one whose bit is set its nibble.
    const uint8_t* blk = row + static_cast<size_t>(s) * gb::kQ50Bytes;
    const __m512 d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(blk[0] | (blk[1] << 8))));
    const uint32_t qh = LoadU32(blk + 2);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
    const __m128i low = _mm_set1_epi8(0x0f), sixteen = _mm_set1_epi8(16);
    const __m128i lo = _mm_and_si128(q, low), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
    return CodesTimes(_mm512_cvtepi8_epi32(_mm_mask_sub_epi8(lo, static_cast<__mmask16>(~qh), lo, sixteen)),
                      _mm512_cvtepi8_epi32(_mm_mask_sub_epi8(hi, static_cast<__mmask16>(~qh >> 16), hi, sixteen)),
                      d);
  } else if constexpr (kT == GgmlType::kQ4_K) {
    // float(q) * (d * sc) - dmin * m for sub-block j of its super-block.
    const uint8_t* sb = row + static_cast<size_t>(s / 8) * gb::kQ4KBytes;
    constexpr uint32_t j = kJ;
    uint8_t sc, mn;
    gb::Q4KScaleMin(j, sb + gb::kQ4KScales, &sc, &mn);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(sb))));
    const float d1 = _mm_cvtss_f32(dd) * static_cast<float>(sc);
    const float m1 = _mm_cvtss_f32(_mm_shuffle_ps(dd, dd, 1)) * static_cast<float>(mn);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + gb::kQ4KQs + 32 * (j / 2)));
    const __m256i codes = _mm256_and_si256(j % 2 != 0 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    const __m512 d = _mm512_set1_ps(d1), m = _mm512_set1_ps(m1);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1)));
    return ToBf16x32(_mm512_sub_ps(_mm512_mul_ps(lo, d), m), _mm512_sub_ps(_mm512_mul_ps(hi, d), m));
  } else {
    // Q6_K: (d * sc) * float(code - 32), group k of half h, the first 16
    // values with scale 8 h + 2 k, the next 16 with the one after.
    const uint8_t* sb = row + static_cast<size_t>(s / 8) * gb::kQ6KBytes;
    constexpr uint32_t h = kJ / 4, k = kJ % 4;
    const float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(sb[gb::kQ6KD] | (sb[gb::kQ6KD + 1] << 8))));
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + gb::kQ6KScales + 8 * h + 2 * k);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 64 * h + 32 * (k % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + gb::kQ6KQh + 32 * h));
    const __m256i lowbits = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0f));
    const __m256i highbits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(static_cast<int>(2 * k))),
                                              _mm256_set1_epi8(3));
    const __m256i codes = _mm256_sub_epi8(_mm256_or_si256(lowbits, _mm256_slli_epi16(highbits, 4)),
                                          _mm256_set1_epi8(32));
    const __m512 s0 = _mm512_set1_ps(d * static_cast<float>(sc[0]));
    const __m512 s1 = _mm512_set1_ps(d * static_cast<float>(sc[1]));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(codes)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(codes, 1)));
    return ToBf16x32(_mm512_mul_ps(s0, lo), _mm512_mul_ps(s1, hi));
  }
}

// Whether DotRows decodes rows of t step by step in registers (StepBf16)
// for few inputs.
bool DecodesBySteps(GgmlType t) {
  return DecodesByBlock(t) || t == GgmlType::kQ5_0 || t == GgmlType::kQ4_K || t == GgmlType::kQ6_K;
}

// The bytes a row of t spends on 32 values (the K types: rounded down; for
// prefetching only).
constexpr size_t StepBytes(GgmlType t) {
  switch (t) {
    case GgmlType::kQ5_0: return ggml_blocks::kQ50Bytes;
    case GgmlType::kQ4_K: return ggml_blocks::kQ4KBytes / 8;
    case GgmlType::kQ6_K: return ggml_blocks::kQ6KBytes / 8;
    default: return BlockBytes(t);  // Q4_1, Q8_0
  }
}

// Row r of w as bf16 into dst[cols] (other types than Q4_1 and Q8_0 through
// DequantizeRow into `decoded`).
KVCACHE_AMX_TARGET void RowToBf16(const WeightMatrix& w, uint32_t r, float* decoded, uint16_t* dst) {
  if (DecodesByBlock(w.type)) {
    for (uint32_t j = 0; j < w.cols / 32; ++j) BlockToBf16(w, r, j, dst + static_cast<size_t>(j) * 32);
    return;
  }
  w.DecodeRows(r, 1, decoded);
  uint32_t i = 0;
  for (; i + 32 <= w.cols; i += 32) {
    _mm512_storeu_si512(dst + i, ToBf16x32(_mm512_loadu_ps(decoded + i), _mm512_loadu_ps(decoded + i + 16)));
  }
  for (; i < w.cols; ++i) dst[i] = FloatToBF16(decoded[i]);
}

// The A operand of step s: rows decoded whole beforehand ([rows][kpad]).
struct DecodedRows {
  const uint16_t* a;
  const uint16_t* operator()(uint32_t s) const { return a + static_cast<size_t>(s) * kStep; }
};

// Steps StreamedRows decodes at once.
constexpr uint32_t kChunk = 6;
constexpr size_t kChunkValues = 4 * kTile * kChunk * kStep;  // its buffer: [64][kChunk * 32]

// The A operand decoded kChunk steps at a time into a [64][kChunk * 32]
// buffer (24 KiB, in L1): for few tokens, where the decode is most of the
// work and a whole-row buffer would not stay in L1. A tile load waits for
// the stores before it, so decoding a chunk and then running its steps
// pays that wait once per chunk, not once per step. Each chunk also
// prefetches its share of the next row block: the walk reads 64 rows at a
// time, a few blocks of each, which the hardware prefetchers do not follow.
// Rows of a step are kChunk * 64 bytes apart, row groups 16 rows.
struct StreamedRows {
  const WeightMatrix* w;
  uint32_t r, m, steps;
  uint16_t* buf;
  static constexpr uint32_t kStride = kChunk * kStep * 2;
  static constexpr size_t kGroup = size_t{kTile} * kChunk * kStep;
  KVCACHE_AMX_TARGET const uint16_t* operator()(uint32_t s) const {
    const uint32_t j = s % kChunk;
    if (j == 0) {
      const uint32_t n = std::min(kChunk, steps - s);
      for (uint32_t k = 0; k < m; ++k) {
        uint16_t* row = buf + static_cast<size_t>(k) * kChunk * kStep;
        for (uint32_t i = 0; i < n; ++i) BlockToBf16(*w, r + k, s + i, row + i * kStep);
      }
      const uint32_t next_rows = std::min<uint32_t>(4 * kTile, w->rows - std::min(w->rows, r + m));
      const size_t lines = (static_cast<size_t>(next_rows) * w->row_bytes + 63) / 64;
      const uint8_t* next = w->data + static_cast<size_t>(r + m) * w->row_bytes;
      for (size_t l = lines * s / steps; l < lines * (s + n) / steps; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(next + l * 64), _MM_HINT_T1);
      }
    }
    return buf + static_cast<size_t>(j) * kStep;
  }
};

// Values 32 s .. 32 s + 31 of a row of `cols`: in place, or copied into
// row[32] with zeros beyond cols when the step is the partial last one.
inline const float* StepValues(const float* x, uint32_t cols, uint32_t s, float* row) {
  const uint32_t c0 = s * kStep, m = std::min(kStep, cols - c0);
  if (m == kStep) return x + c0;
  std::fill(row, row + kStep, 0.0f);
  std::memcpy(row, x + c0, m * sizeof(float));
  return row;
}

// x [n][cols] into B tiles: tile (t, s) at ((t * steps + s) * 16 + k) * 32 +
// 2 * token + e holds x[16 t + token][32 s + 2 k + e], zero outside.
KVCACHE_AMX_TARGET void PackTiles(const float* x, uint32_t n, uint32_t cols, uint16_t* packed) {
  const uint32_t steps = Steps(cols);
  alignas(64) float row[kStep];
  const __m512i offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(kTile * 4));
  for (uint32_t t = 0; t < n; ++t) {
    const float* xt = x + static_cast<size_t>(t) * cols;
    for (uint32_t s = 0; s < steps; ++s) {
      const float* src = StepValues(xt, cols, s, row);
      // 16 value pairs (one 32-bit lane each) to rows 0..15 of the tile.
      const __m512i pairs = ToBf16x32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16));
      uint16_t* tile = packed + (static_cast<size_t>(t / kTile) * steps + s) * kTile * kStep;
      _mm512_i32scatter_epi32(tile + 2 * (t % kTile), offsets, pairs, 1);
    }
  }
}

// RG row groups (16 rows each, a_group values apart in a(s), the A operand
// of step s, rows a_stride bytes apart) times TG token
// tiles (b: the first one's tile for step 0; a token tile's tiles are
// `steps` apart), RG * TG <= 4 and TG <= 2, into c[RG * TG][16][16] (index
// rg * TG + tg).
// Several accumulators per step keep tdpbf16ps's latency off the critical
// path; each one still sums its steps in order, so grouping changes no bit.
template <int RG, int TG, class A>
KVCACHE_AMX_TARGET void TileProducts(const A& a, uint32_t a_stride, size_t a_group, const uint16_t* b,
                                     uint32_t steps, float* c) {
  static_assert(RG * TG <= 4 && TG <= 2);
  constexpr int kAcc = RG * TG;
  constexpr size_t kTileValues = kTile * kStep;
  const size_t bt = static_cast<size_t>(steps) * kTileValues;  // between token tiles
  _tile_zero(0);
  if constexpr (kAcc > 1) _tile_zero(1);
  if constexpr (kAcc > 2) _tile_zero(2);
  if constexpr (kAcc > 3) _tile_zero(3);
  for (uint32_t s = 0; s < steps; ++s) {
    const uint16_t* as = a(s);
    const uint16_t* bs = b + s * kTileValues;
    if constexpr (RG == 1) {
      _tile_loadd(4, as, a_stride);
      _tile_loadd(5, bs, 64);
      _tile_dpbf16ps(0, 4, 5);
      if constexpr (TG > 1) {
        _tile_loadd(6, bs + bt, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
    } else if constexpr (RG == 2) {
      _tile_loadd(4, as, a_stride);
      _tile_loadd(5, as + a_group, a_stride);
      _tile_loadd(6, bs, 64);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (TG == 1) {
        _tile_dpbf16ps(1, 5, 6);
      } else {
        _tile_dpbf16ps(2, 5, 6);
      }
      if constexpr (TG > 1) {
        _tile_loadd(7, bs + bt, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    } else {
      _tile_loadd(7, bs, 64);
      _tile_loadd(4, as, a_stride);
      _tile_dpbf16ps(0, 4, 7);
      _tile_loadd(5, as + a_group, a_stride);
      _tile_dpbf16ps(1, 5, 7);
      if constexpr (RG > 2) {
        _tile_loadd(6, as + 2 * a_group, a_stride);
        _tile_dpbf16ps(2, 6, 7);
      }
      if constexpr (RG > 3) {
        _tile_loadd(4, as + 3 * a_group, a_stride);
        _tile_dpbf16ps(3, 4, 7);
      }
    }
  }
  _tile_stored(0, c, 64);
  if constexpr (kAcc > 1) _tile_stored(1, c + 256, 64);
  if constexpr (kAcc > 2) _tile_stored(2, c + 512, 64);
  if constexpr (kAcc > 3) _tile_stored(3, c + 768, 64);
}

// TileProducts for rg row groups and tg token tiles (rg * tg <= 4, tg <= 2).
template <class A>
KVCACHE_AMX_TARGET void Products(uint32_t rg, uint32_t tg, const A& a, uint32_t a_stride, size_t a_group,
                                 const uint16_t* b, uint32_t steps, float* c) {
  switch (rg * 8 + tg) {
    case 8 + 1: TileProducts<1, 1>(a, a_stride, a_group, b, steps, c); break;
    case 8 + 2: TileProducts<1, 2>(a, a_stride, a_group, b, steps, c); break;
    case 16 + 1: TileProducts<2, 1>(a, a_stride, a_group, b, steps, c); break;
    case 16 + 2: TileProducts<2, 2>(a, a_stride, a_group, b, steps, c); break;
    case 24 + 1: TileProducts<3, 1>(a, a_stride, a_group, b, steps, c); break;
    default: TileProducts<4, 1>(a, a_stride, a_group, b, steps, c); break;
  }
}

KVCACHE_AMX_TARGET void TileRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x,
                                 float* out) {
  const uint32_t steps = Steps(w.cols), kpad = steps * kStep, tiles = TokenTiles(x.n);
  // Row groups per pass: enough accumulators for one, two or four token
  // tiles per step.
  // One token tile: 4 row groups (64 rows) a pass. More: 2 row groups
  // times 2 token tiles, the blocking whose 4 operand tiles (2 A, 2 B) all
  // stay loaded through a step's 4 products (a fifth operand would reload a
  // tile that a product of the same step still reads, and wait for it).
  const uint32_t groups = tiles >= 2 ? 2 : 4;
  // Up to 2 token tiles every row block is one pass: its A operand is
  // decoded step by step as the pass needs it. More tokens: the rows are
  // decoded whole once and read by several passes.
  const bool streamed = DecodesByBlock(w.type) && tiles <= 2;
  const size_t group = static_cast<size_t>(kTile) * kpad;
  thread_local std::vector<float> decoded;
  thread_local std::vector<uint16_t> a;
  alignas(64) uint16_t sbuf[kChunkValues] = {};
  if (!streamed) {
    decoded.resize(w.cols);
    // Columns past cols stay zero in every row (written once here).
    a.assign(groups * group, 0);
  }
  alignas(64) float c[4 * kTile * kTile];
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = kTile;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
  for (uint32_t r = r0; r < r1; r += groups * kTile) {
    const uint32_t m = std::min(groups * kTile, r1 - r);
    if (!streamed) {
      for (uint32_t k = 0; k < m; ++k) {
        RowToBf16(w, r + k, decoded.data(), a.data() + static_cast<size_t>(k) * kpad);
      }
      if (m < groups * kTile) std::fill(a.begin() + static_cast<size_t>(m) * kpad, a.end(), uint16_t{0});
    }
    // Rows past m (a last, partial block) are zeros or stale rows: their
    // results are not stored, and no row's result depends on another's.
    const uint32_t rg = groups == 1 ? 1 : (m + kTile - 1) / kTile;
    for (uint32_t t = 0; t < tiles;) {
      const uint16_t* b = x.packed.data() + static_cast<size_t>(t) * steps * kTile * kStep;
      const uint32_t tg = groups == 2 ? std::min(2u, tiles - t) : 1;
      if (streamed) {
        Products(rg, tg, StreamedRows{&w, r, m, steps, sbuf}, StreamedRows::kStride, StreamedRows::kGroup, b, steps,
                 c);
      } else {
        Products(rg, tg, DecodedRows{a.data()}, kpad * 2, group, b, steps, c);
      }
      for (uint32_t g = 0; g < rg; ++g) {
        const uint32_t rows = std::min(kTile, m - g * kTile);
        for (uint32_t j = 0; j < tg; ++j) {
          const float* cij = c + static_cast<size_t>(g * tg + j) * kTile * kTile;
          const uint32_t t0 = (t + j) * kTile, tn = std::min(kTile, x.n - t0);
          for (uint32_t row = 0; row < rows; ++row) {
            const float* cr = cij + static_cast<size_t>(row) * kTile;
            float* o = out + static_cast<size_t>(t0) * w.rows + r + g * kTile + row;
            for (uint32_t tok = 0; tok < tn; ++tok) o[static_cast<size_t>(tok) * w.rows] = cr[tok];
          }
        }
      }
      t += tg;
    }
  }
  _tile_release();
}

// x [n][cols] as bf16 rows of kpad values (zero beyond cols), for the dot
// kernel.
KVCACHE_DOT_TARGET void PackRows(const float* x, uint32_t n, uint32_t cols, uint16_t* packed) {
  const uint32_t kpad = Steps(cols) * kStep;
  alignas(64) float row[kStep];
  for (uint32_t t = 0; t < n; ++t) {
    const float* xt = x + static_cast<size_t>(t) * cols;
    uint16_t* dst = packed + static_cast<size_t>(t) * kpad;
    for (uint32_t s = 0; s < Steps(cols); ++s) {
      const float* src = StepValues(xt, cols, s, row);
      _mm512_storeu_si512(dst + s * kStep, ToBf16x32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16)));
    }
  }
}

// R weight rows (a, kpad values apart) times T inputs (xs), `steps` x 32
// values: one accumulator per (row, input), fed by vdpbf16ps in step order,
// then one lane sum, so a pair's result depends on its row and input only.
template <int R, int T>
KVCACHE_DOT_TARGET void DotBlockBf16(const uint16_t* a, size_t kpad, const uint16_t* const* xs, uint32_t steps,
                                     float* out, size_t out_stride) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (uint32_t s = 0; s < steps; ++s) {
    __m512bh x[T];
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xs[t] + s * kStep));
    for (int r = 0; r < R; ++r) {
      const __m512bh w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(a + r * kpad + s * kStep));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) out[t * out_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

template <int R>
KVCACHE_DOT_TARGET void DotRowsTimesInputs(const uint16_t* a, size_t kpad, const Bf16Inputs& x, uint32_t steps,
                                           float* out, size_t out_stride) {
  const uint16_t* base = x.packed.data();
  uint32_t t = 0;
  for (; t + 4 <= x.n; t += 4) {
    const uint16_t* xs[4] = {base + t * kpad, base + (t + 1) * kpad, base + (t + 2) * kpad, base + (t + 3) * kpad};
    DotBlockBf16<R, 4>(a, kpad, xs, steps, out + t * out_stride, out_stride);
  }
  for (; t < x.n; ++t) {
    const uint16_t* xs[1] = {base + t * kpad};
    DotBlockBf16<R, 1>(a, kpad, xs, steps, out + t * out_stride, out_stride);
  }
}

// Step s of DotDecodedBf16 (kJ = s % 8 for the K types).
template <GgmlType kT, int R, int T, uint32_t kJ>
KVCACHE_DOT_TARGET __attribute__((always_inline)) inline void DecodedStepBf16(const uint8_t* const* rows,
                                                                              const uint16_t* const* xs, uint32_t s,
                                                                              __m512 (&acc)[R][T]) {
  __m512bh x[T];
  for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xs[t] + s * kStep));
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + s * StepBytes(kT)) + 2048, _MM_HINT_T0);
    const __m512bh wv = reinterpret_cast<__m512bh>(StepBf16<kT, kJ>(rows[r], s));
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, x[t]);
  }
}

// The eight steps of a K type's super-block from step s, in order.
template <GgmlType kT, int R, int T, uint32_t... kJ>
KVCACHE_DOT_TARGET __attribute__((always_inline)) inline void SuperBlockStepsBf16(
    const uint8_t* const* rows, const uint16_t* const* xs, uint32_t s, __m512 (&acc)[R][T],
    std::integer_sequence<uint32_t, kJ...>) {
  (DecodedStepBf16<kT, R, T, kJ>(rows, xs, s + kJ, acc), ...);
}

// R rows of a matrix of a DecodesBySteps type (rows ids[0..R) of w) times
// T inputs (xs): DotBlockBf16's steps with each step's 32 values decoded to
// bf16 in registers (StepBf16) as it is multiplied (the same operands in
// the same order: the same bits), for few inputs, where writing the decoded rows out and reading them back
// would cost more than the products.
template <GgmlType kT, int R, int T>
KVCACHE_DOT_TARGET void DotDecodedBf16(const WeightMatrix& w, const uint32_t* ids, const uint16_t* const* xs,
                                       uint32_t steps, float* out, size_t out_stride) {
  const uint8_t* rows[R];
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    rows[r] = w.data + static_cast<size_t>(ids[r]) * w.row_bytes;
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  if constexpr (kT == GgmlType::kQ4_K || kT == GgmlType::kQ6_K) {
    for (uint32_t s = 0; s < steps; s += 8) {
      SuperBlockStepsBf16<kT, R, T>(rows, xs, s, acc, std::make_integer_sequence<uint32_t, 8>());
    }
  } else {
    for (uint32_t s = 0; s < steps; ++s) DecodedStepBf16<kT, R, T, 0>(rows, xs, s, acc);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) out[t * out_stride + ids[r]] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

// Rows [r0, r1) of a DecodesBySteps type's matrix times 1 to 3 inputs by
// DotDecodedBf16: groups of 4 rows a quarter of the range apart, so that
// each row stream runs through a quarter of the range in address order (the
// hardware prefetcher follows it; which rows share a group changes no bit).
template <GgmlType kT>
KVCACHE_DOT_TARGET void DotDecodedRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x,
                                       float* out) {
  const uint32_t steps = Steps(w.cols);
  const size_t kpad = size_t{steps} * kStep;
  const uint16_t* base = x.packed.data();
  const uint32_t q = (r1 - r0) / 4;
  auto rows_times_inputs = [&]<int R>(const uint32_t* ids) {
    uint32_t t = 0;
    for (; t + 2 <= x.n; t += 2) {
      const uint16_t* xs[2] = {base + t * kpad, base + (t + 1) * kpad};
      DotDecodedBf16<kT, R, 2>(w, ids, xs, steps, out + static_cast<size_t>(t) * w.rows, w.rows);
    }
    if (t < x.n) {
      const uint16_t* xs[1] = {base + t * kpad};
      DotDecodedBf16<kT, R, 1>(w, ids, xs, steps, out + static_cast<size_t>(t) * w.rows, w.rows);
    }
  };
  for (uint32_t i = 0; i < q; ++i) {
    const uint32_t ids[4] = {r0 + i, r0 + q + i, r0 + 2 * q + i, r0 + 3 * q + i};
    rows_times_inputs.template operator()<4>(ids);
  }
  for (uint32_t r = r0 + 4 * q; r < r1; ++r) rows_times_inputs.template operator()<1>(&r);
}

// Rows [r0, r1) by the dot kernel: 4 rows decoded to bf16 at a time (zero
// beyond cols), times every input; DecodesBySteps types' rows times 1 to 3
// inputs by DotDecodedRows.
KVCACHE_DOT_TARGET void DotRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x, float* out) {
  if (DecodesBySteps(w.type) && x.n < 4) {
    using Kernel = void (*)(const WeightMatrix&, uint32_t, uint32_t, const Bf16Inputs&, float*);
    const GgmlType t = w.type;
    const Kernel kernel = t == GgmlType::kQ4_1   ? DotDecodedRows<GgmlType::kQ4_1>
                          : t == GgmlType::kQ5_0 ? DotDecodedRows<GgmlType::kQ5_0>
                          : t == GgmlType::kQ4_K ? DotDecodedRows<GgmlType::kQ4_K>
                          : t == GgmlType::kQ6_K ? DotDecodedRows<GgmlType::kQ6_K>
                                                 : DotDecodedRows<GgmlType::kQ8_0>;
    kernel(w, r0, r1, x, out);
    return;
  }
  const uint32_t steps = Steps(w.cols);
  const size_t kpad = size_t{steps} * kStep;
  thread_local std::vector<uint16_t> a;
  thread_local std::vector<float> decoded;
  if (a.size() < 4 * kpad) a.resize(4 * kpad);
  if (decoded.size() < w.cols) decoded.resize(w.cols);
  for (uint32_t r = r0; r < r1; r += 4) {
    const uint32_t m = std::min<uint32_t>(4, r1 - r);
    if (r + 4 < r1) {  // the next rows, from memory while these are decoded and multiplied
      const uint8_t* next = w.data + static_cast<size_t>(r + 4) * w.row_bytes;
      const size_t bytes = std::min<size_t>(r1 - r - 4, 4) * w.row_bytes;
      for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
    }
    for (uint32_t k = 0; k < m; ++k) {
      uint16_t* row = a.data() + k * kpad;
      RowToBf16(w, r + k, decoded.data(), row);
      std::fill(row + w.cols, row + kpad, uint16_t{0});
    }
    float* o = out + r;
    switch (m) {
      case 4: DotRowsTimesInputs<4>(a.data(), kpad, x, steps, o, w.rows); break;
      case 3: DotRowsTimesInputs<3>(a.data(), kpad, x, steps, o, w.rows); break;
      case 2: DotRowsTimesInputs<2>(a.data(), kpad, x, steps, o, w.rows); break;
      default: DotRowsTimesInputs<1>(a.data(), kpad, x, steps, o, w.rows); break;
    }
  }
}

#else
bool DetectTiles() { return false; }
bool DetectDot() { return false; }
#endif

}  // namespace

bool Bf16KernelAvailable(Bf16Kernel kernel) {
  static const bool tiles = DetectTiles();
  static const bool dot = DetectDot();
  switch (kernel) {
    case Bf16Kernel::kTiles: return tiles;
    case Bf16Kernel::kDot: return dot;
    default: return true;
  }
}

Bf16Kernel PreferredBf16Kernel() {
  for (Bf16Kernel k : {Bf16Kernel::kTiles, Bf16Kernel::kDot}) {
    if (Bf16KernelAvailable(k)) return k;
  }
  return Bf16Kernel::kFma;
}

const char* Bf16KernelName(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::kTiles: return "tiles";
    case Bf16Kernel::kDot: return "dot";
    default: return "fma";
  }
}

void PrepareBf16Inputs(const float* x, uint32_t n, uint32_t cols, Bf16Kernel kernel, Bf16Inputs* out) {
  out->n = n;
  out->cols = cols;
  if (!Bf16KernelAvailable(kernel)) kernel = Bf16Kernel::kFma;
#if KVCACHE_AMX_TILES
  if (kernel == Bf16Kernel::kTiles) {
    out->kernel = kernel;
    out->packed.assign(static_cast<size_t>(TokenTiles(n)) * Steps(cols) * kTile * kStep, 0);
    PackTiles(x, n, cols, out->packed.data());
    return;
  }
  if (kernel == Bf16Kernel::kDot) {
    out->kernel = kernel;
    out->packed.resize(static_cast<size_t>(n) * Steps(cols) * kStep);
    PackRows(x, n, cols, out->packed.data());
    return;
  }
#endif
  out->kernel = Bf16Kernel::kFma;
  out->rounded.assign(x, x + static_cast<size_t>(n) * cols);
  dequant_internal::RoundToBf16Rows(out->rounded.data(), out->rounded.size());
}

void MatMulRowsBf16(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x, float* out) {
  assert(x.cols == w.cols);
#if KVCACHE_AMX_TILES
  if (x.kernel == Bf16Kernel::kTiles) {
    TileRows(w, r0, r1, x, out);
    return;
  }
  if (x.kernel == Bf16Kernel::kDot) {
    DotRows(w, r0, r1, x, out);
    return;
  }
#endif
  thread_local std::vector<float> buf;
  if (buf.size() < 4 * size_t{w.cols}) buf.resize(4 * size_t{w.cols});
  dequant_internal::MatMulRows(w, r0, r1, x.rounded.data(), x.n, out, buf.data(), true);
}

void MatMulBf16Reference(const WeightMatrix& w, const float* x, uint32_t n, double* out) {
  std::vector<float> row(w.cols);
  for (uint32_t r = 0; r < w.rows; ++r) {
    w.DecodeRows(r, 1, row.data());
    for (uint32_t t = 0; t < n; ++t) {
      double acc = 0;
      for (uint32_t c = 0; c < w.cols; ++c) {
        acc += static_cast<double>(BF16ToFloat(FloatToBF16(row[c]))) *
               BF16ToFloat(FloatToBF16(x[static_cast<size_t>(t) * w.cols + c]));
      }
      out[static_cast<size_t>(t) * w.rows + r] = acc;
    }
  }
}

}  // namespace kvcache::model
