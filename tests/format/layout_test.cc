// Byte-exact layouts: llama.cpp's block_q8_0 / block_q4_0 against blocks
// computed by hand, and hand-built turbo / q8 rows decoded at the documented
// bit positions (format_internal.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "format/format_internal.h"
#include "kvcache/codec.h"

namespace kvcache {
namespace {

namespace fi = format_internal;

std::vector<uint8_t> EncodeOne(Format f, const std::vector<float>& x) {
  const RowCodec c = RowCodec::Create(f, static_cast<uint32_t>(x.size()), Side::kKey).value();
  std::vector<uint8_t> out(c.row_bytes());
  EXPECT_TRUE(c.Encode(x, out).ok());
  return out;
}

TEST(LlamaBlocks, Q8_0ByHand) {
  // amax 127 -> d = 1 (f16 0x3C00); q = roundf(x / d), halves away from zero.
  std::vector<float> x(32);
  x[0] = 127; x[1] = -127; x[2] = 3.5f; x[3] = -3.5f; x[4] = 2.5f; x[5] = 0.49f; x[6] = -0.51f;
  for (int j = 7; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  std::vector<uint8_t> want = {0x00, 0x3C, 0x7F, 0x81, 0x04, 0xFC, 0x03, 0x00, 0xFF};
  for (int j = 7; j < 32; ++j) want.push_back(static_cast<uint8_t>(j - 16));
  EXPECT_EQ(EncodeOne(Format::kQ8_0, x), want);

  // d = 1/127 is not an f16: stored as 0x2008; codes come from the f32 d.
  std::vector<float> y(64, 0.0f);
  y[0] = 1.0f;
  y[32 + 31] = -2.0f;  // second block: d = 2/127 -> 0x2408, q = -127
  const std::vector<uint8_t> got = EncodeOne(Format::kQ8_0, y);
  ASSERT_EQ(got.size(), 68u);
  EXPECT_EQ(got[0], 0x08);
  EXPECT_EQ(got[1], 0x20);
  EXPECT_EQ(got[2], 127);
  for (int j = 1; j < 32; ++j) EXPECT_EQ(got[2 + j], 0) << j;
  EXPECT_EQ(got[34], 0x08);
  EXPECT_EQ(got[35], 0x24);
  EXPECT_EQ(got[34 + 2 + 31], 0x81);
  float back[32];
  fi::DecodeQ8_0Block(got.data(), back);
  EXPECT_EQ(back[0], 127.0f * fi::F16ToFloat(0x2008));
}

TEST(LlamaBlocks, Q4_0ByHand) {
  // max = -8 (first value of largest magnitude) -> d = 1, id = 1;
  // q = min(15, (int)(x + 8.5)); byte j = q[j] | q[j + 16] << 4.
  std::vector<float> x(32, 0.0f);
  x[0] = 7; x[1] = 7.6f; x[2] = 0; x[3] = 0.5f; x[4] = -0.5f; x[5] = -8; x[6] = -0.6f;
  x[7] = 3.2f; x[16] = 1; x[17] = -1; x[18] = 6.49f; x[19] = -7.9f; x[20] = 8;
  const std::vector<uint8_t> want = {0x00, 0x3C, 0x9F, 0x7F, 0xE8, 0x09, 0xF8, 0x80, 0x87, 0x8B,
                                     0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
  EXPECT_EQ(EncodeOne(Format::kQ4_0, x), want);

  // Positive max 4 -> d = -0.5 (0xB800), id = -2.
  std::vector<float> y(32, 0.0f);
  y[0] = 4; y[1] = -4; y[2] = 1; y[4] = -1; y[16] = 2;
  const std::vector<uint8_t> want2 = {0x00, 0xB8, 0x40, 0x8F, 0x86, 0x88, 0x8A, 0x88, 0x88, 0x88,
                                      0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
  const std::vector<uint8_t> got2 = EncodeOne(Format::kQ4_0, y);
  EXPECT_EQ(got2, want2);
  float back[32];
  fi::DecodeQ4_0Block(got2.data(), back);
  EXPECT_EQ(back[0], 4.0f);
  EXPECT_EQ(back[1], -3.5f);  // clipped: q = 15 -> -0.5 * 7
  EXPECT_EQ(back[2], 1.0f);
  EXPECT_EQ(back[16], 2.0f);
}

TEST(RowLayouts, TurboBitPositions) {
  const uint32_t d = 32;
  std::vector<float> out(d);
  // turbo4: byte j of group g holds value 2j (low nibble) and 2j+1 (high).
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo4, d));
    const fi::RowLayout l = fi::LayoutOf(Format::kTurbo4, d);
    ASSERT_EQ(l.scales_offset, 16u);
    for (int g = 0; g < 2; ++g) {
      for (int j = 0; j < 8; ++j) {
        const int c0 = (2 * j + g) & 15, c1 = (2 * j + 1 + g) & 15;
        row[8 * g + j] = static_cast<uint8_t>(c0 | (c1 << 4));
      }
    }
    row[16] = 0x38;  // 1.0
    row[17] = 0x40;  // 2.0
    fi::DecodeRowsScalar(Format::kTurbo4, d, 1, row.data(), out.data());
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], fi::kTurbo4Levels[i]);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[16 + i], 2.0f * fi::kTurbo4Levels[(i + 1) & 15]);
  }
  // turbo3: 6 bytes per group = one LE 48-bit word, code i at bits 3i..3i+2.
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo3, d));
    ASSERT_EQ(row.size(), 14u);
    for (int g = 0; g < 2; ++g) {
      uint64_t w = 0;
      for (int i = 0; i < 16; ++i) w |= static_cast<uint64_t>((i + 3 * g) & 7) << (3 * i);
      for (int b = 0; b < 6; ++b) row[6 * g + b] = static_cast<uint8_t>(w >> (8 * b));
    }
    row[12] = 0x38;
    row[13] = 0x30;  // 0.5
    fi::DecodeRowsScalar(Format::kTurbo3, d, 1, row.data(), out.data());
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], fi::kTurbo3Levels[i & 7]);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[16 + i], 0.5f * fi::kTurbo3Levels[(i + 3) & 7]);
  }
  // turbo2: code i at bits 2(i%4) of byte i/4.
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo2, d));
    ASSERT_EQ(row.size(), 10u);
    const uint8_t b = 0 | (1 << 2) | (2 << 4) | (3 << 6);  // codes 0,1,2,3
    for (int k = 0; k < 8; ++k) row[k] = b;
    row[8] = 0x38;
    row[9] = 0x38;
    fi::DecodeRowsScalar(Format::kTurbo2, d, 1, row.data(), out.data());
    for (uint32_t i = 0; i < d; ++i) EXPECT_EQ(out[i], fi::kTurbo2Levels[i % 4]);
  }
  // turbo2i: turbo2's bits, integer levels.
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo2I, d));
    ASSERT_EQ(row.size(), 10u);
    const uint8_t b = 0 | (1 << 2) | (2 << 4) | (3 << 6);  // codes 0,1,2,3
    for (int k = 0; k < 8; ++k) row[k] = b;
    row[8] = 0x38;
    row[9] = 0x40;  // 2.0
    fi::DecodeRowsScalar(Format::kTurbo2I, d, 1, row.data(), out.data());
    for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(out[i], fi::kTurbo2IInt[i % 4] / 128.0f);
    for (uint32_t i = 16; i < d; ++i) EXPECT_EQ(out[i], fi::kTurbo2IInt[i % 4] / 64.0f);
  }
  // turbo3i: the low 2 bits of code i at bits 2(i%4) of byte 4g + i/4 in
  // [0, d/4), bit 2 at bit i of the LE 16-bit word at d/4 + 2g, scales at 3d/8.
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo3I, d));
    ASSERT_EQ(row.size(), 14u);
    for (int g = 0; g < 2; ++g) {
      uint16_t high = 0;
      for (int i = 0; i < 16; ++i) {
        const int c = (i + 3 * g) & 7;
        row[4 * g + i / 4] |= static_cast<uint8_t>((c & 3) << (2 * (i % 4)));
        high |= static_cast<uint16_t>((c >> 2) << i);
      }
      row[8 + 2 * g] = static_cast<uint8_t>(high);
      row[9 + 2 * g] = static_cast<uint8_t>(high >> 8);
    }
    row[12] = 0x38;
    row[13] = 0x30;  // 0.5
    fi::DecodeRowsScalar(Format::kTurbo3I, d, 1, row.data(), out.data());
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], fi::kTurbo3ILevels[i & 7]);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(out[16 + i], 0.5f * fi::kTurbo3ILevels[(i + 3) & 7]);
    // The encoder writes the same planes: a row of exact levels comes back.
    std::vector<uint8_t> again(row.size());
    fi::EncodeRowsScalar(Format::kTurbo3I, d, 1, out.data(), again.data());
    std::vector<float> out2(d);
    fi::DecodeRowsScalar(Format::kTurbo3I, d, 1, again.data(), out2.data());
    EXPECT_EQ(out, out2);
  }
  // turbo8: 16 E4M3 codes per group, then bf16 scales.
  {
    std::vector<uint8_t> row(RowBytes(Format::kTurbo8, d));
    ASSERT_EQ(row.size(), 36u);
    for (uint32_t i = 0; i < d; ++i) row[i] = static_cast<uint8_t>(0x30 + i);  // 0.5 ...
    row[32] = 0x00;
    row[33] = 0x40;  // bf16 2.0
    row[34] = 0x80;
    row[35] = 0xBF;  // bf16 -1.0
    fi::DecodeRowsScalar(Format::kTurbo8, d, 1, row.data(), out.data());
    for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(out[i], 2.0f * fi::E4M3ToFloat(static_cast<uint8_t>(0x30 + i)));
    for (uint32_t i = 16; i < 32; ++i) EXPECT_EQ(out[i], -fi::E4M3ToFloat(static_cast<uint8_t>(0x30 + i)));
  }
}

TEST(RowLayouts, Q8RowAndSizes) {
  const uint32_t d = 16;
  std::vector<uint8_t> row(RowBytes(Format::kQ8, d));
  ASSERT_EQ(row.size(), 20u);
  for (uint32_t i = 0; i < d; ++i) row[i] = static_cast<uint8_t>(static_cast<int8_t>(i) - 8);
  const float s = 0.25f;
  std::memcpy(row.data() + d, &s, 4);
  std::vector<float> out(d);
  fi::DecodeRowsScalar(Format::kQ8, d, 1, row.data(), out.data());
  for (uint32_t i = 0; i < d; ++i) EXPECT_EQ(out[i], 0.25f * (static_cast<int>(i) - 8));
  // Layout offsets agree with RowBytes for every format.
  for (Format f : kAllFormats) {
    const fi::RowLayout l = fi::LayoutOf(f, 128);
    EXPECT_EQ(l.scales_offset + (l.scale_bytes ? l.scale_bytes * (128 / l.group_size) : 0),
              RowBytes(f, 128))
        << FormatName(f);
  }
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo4, 128), 4.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo3, 128), 3.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo2, 128), 2.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo3I, 128), 3.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo2I, 128), 2.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kTurbo8, 128), 9.0);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kQ8_0, 128), 8.5);
  EXPECT_DOUBLE_EQ(BitsPerValue(Format::kQ4_0, 128), 4.5);
}

}  // namespace
}  // namespace kvcache
