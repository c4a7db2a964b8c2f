// The block layouts of the quantized ggml types the weight products decode,
// as byte offsets and small unpacking helpers shared by the dequantizer
// (gguf_dequant.cc) and the integer-lane product (matmul_int8.cc).
//
// Q4_1 (32 values, 20 bytes): f16 d, f16 m, 16 bytes of nibbles; value j
//   = (low nibble of byte j) * d + m, value 16 + j = (high nibble) * d + m.
// Q5_0 (32 values, 22 bytes): f16 d, a little-endian u32 qh, 16 bytes of
//   nibbles; the 5-bit code of value j is its nibble (low of byte j for j <
//   16, high of byte j - 16 above) plus 16 * bit j of qh; value = (code -
//   16) * d.
// Q8_0 (32 values, 34 bytes): f16 d, 32 int8; value = q * d.
// Q4_K (256 values, 144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales
//   and mins for eight sub-blocks of 32 (Q4KScaleMin), 128 bytes of
//   nibbles: sub-block j takes bytes 32 (j / 2) .. 32 (j / 2) + 31, their
//   low nibbles for even j, high for odd; value = (d * sc_j) * q - dmin * m_j.
// Q6_K (256 values, 210 bytes): 128 bytes ql (low 4 bits), 64 bytes qh (high
//   2 bits), 16 int8 scales (one per 16 values), f16 d at byte 208. Two
//   halves of 128 values; in half h, value 32 k + l (k < 4, l < 32) has the
//   low bits of ql[64 h + l + 32 (k % 2)] (low nibble for k < 2, high
//   above), the high bits (qh[32 h + l] >> 2 k) & 3, and the scale
//   scales[8 h + 2 k + l / 16]; value = (d * scale) * (code - 32).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvcache::model::ggml_blocks {

inline constexpr uint32_t kQ41Bytes = 20, kQ50Bytes = 22, kQ80Bytes = 34;
inline constexpr uint32_t kQ4KBytes = 144, kQ6KBytes = 210;
// Byte offsets inside a Q4_K and a Q6_K super-block.
inline constexpr uint32_t kQ4KScales = 4, kQ4KQs = 16;
inline constexpr uint32_t kQ6KQh = 128, kQ6KScales = 192, kQ6KD = 208;

inline uint32_t LoadU32Le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// The 6-bit scale and min of sub-block j (0..7) from a Q4_K block's 12
// scale bytes: bytes 0..3 hold the scales of sub-blocks 0..3 in their low 6
// bits, bytes 4..7 their mins; sub-blocks 4..7 take the low (scale) or high
// (min) nibble of byte j + 4 and, as bits 4..5, the top two bits of byte
// j - 4 (scale) or byte j (min).
inline void Q4KScaleMin(uint32_t j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The 6-bit code (0..63) of value l + 32 k of half h of a Q6_K block at b.
inline int Q6KCode(const uint8_t* b, uint32_t h, uint32_t k, uint32_t l) {
  const uint8_t lo = b[64 * h + l + 32 * (k % 2)];
  const int low = k < 2 ? (lo & 0xF) : (lo >> 4);
  return low | (((b[kQ6KQh + 32 * h + l] >> (2 * k)) & 3) << 4);
}

}  // namespace kvcache::model::ggml_blocks
