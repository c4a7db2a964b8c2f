// Scalar conversions between float and the two 16-bit float encodings the
// library reads and writes: IEEE binary16 ("f16": KV rows, .npy files, GGUF
// scales) and bfloat16 ("bf16": KV rows, turbo8 group scales).
//
// Decoding is exact for every bit pattern (NaN payloads kept as stored).
// Encoding rounds to nearest, ties to even; values too large for the format
// become infinity; NaN stays a quiet NaN with its sign and the payload's top
// bits. The SIMD kernels of the library reproduce these bit for bit.
//
// Thread safety: pure inline functions.
#pragma once

#include <bit>
#include <cstdint>

namespace kvcache {

// IEEE binary16 -> float, exact.
inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// float -> IEEE binary16, round to nearest even; overflow (>= 65520) -> inf;
// NaN -> quiet NaN (payload's top bits kept, quiet bit set).
inline uint16_t FloatToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // inf or NaN
    if (a == 0x7F800000u) return sign | 0x7C00u;
    return sign | 0x7E00u | static_cast<uint16_t>((a >> 13) & 0x3FFu);
  }
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                         // below 2^-14: subnormal or zero
    // value / 2^-24 rounded to nearest even, done in float (exact: the result
    // fits 11 bits; adding 2^23 then subtracting it rounds to an integer, RNE).
    const float v = std::bit_cast<float>(a) * 16777216.0f;  // * 2^24, exact
    const float r = (v + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint16_t>(static_cast<uint32_t>(r));
  }
  // Normal: rebias the exponent, RNE on the 13 dropped bits (a carry may bump
  // the exponent, which is correct, up to inf).
  const uint32_t rebased = a - (112u << 23);
  const uint32_t round = 0xFFFu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebased + round) >> 13);
}

// bfloat16 -> float, exact.
inline float BF16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// float -> bfloat16, round to nearest even; overflow rounds to inf; NaN ->
// quiet NaN with its sign and top payload bits.
inline uint16_t FloatToBF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t round = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + round) >> 16);
}

}  // namespace kvcache
