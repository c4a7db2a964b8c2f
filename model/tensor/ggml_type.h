// The ggml tensor types (GGUF's on-disk u32 codes): their names and block
// sizes. The tensor floor of model/: file readers (model/io/gguf.h) and the
// weight products (model/tensor/matmul.h) both speak of these types.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace kvcache::model {

// ggml tensor types (the on-disk u32 codes) that the reader can size.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};
// "F32", "Q4_1", ...; "type N" for a code the reader does not know.
std::string GgmlTypeName(GgmlType type);
// Values per block and bytes per block; {0, 0} for an unknown code.
struct GgmlTypeSize {
  uint32_t block_values = 0;
  uint32_t block_bytes = 0;
};
GgmlTypeSize GgmlTypeSizeOf(GgmlType type);
// True for the types DequantizeRow decodes (F32, F16, Q4_1, Q5_0, Q8_0,
// Q4_K, Q6_K).
bool CanDequantize(GgmlType type);
// Those types' names, for messages: "F32, F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K".
std::string DequantizableTypeNames();

}  // namespace kvcache::model
