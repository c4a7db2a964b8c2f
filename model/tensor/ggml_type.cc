// The ggml type table: names and block sizes.
#include "model/tensor/ggml_type.h"

namespace kvcache::model {

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ5_1: return "Q5_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ8_1: return "Q8_1";
    case GgmlType::kQ2_K: return "Q2_K";
    case GgmlType::kQ3_K: return "Q3_K";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kQ8_K: return "Q8_K";
    case GgmlType::kI8: return "I8";
    case GgmlType::kI16: return "I16";
    case GgmlType::kI32: return "I32";
    case GgmlType::kI64: return "I64";
    case GgmlType::kF64: return "F64";
    case GgmlType::kBF16: return "BF16";
  }
  return "type " + std::to_string(static_cast<uint32_t>(type));
}

GgmlTypeSize GgmlTypeSizeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return {1, 4};
    case GgmlType::kF16: return {1, 2};
    case GgmlType::kQ4_0: return {32, 18};
    case GgmlType::kQ4_1: return {32, 20};
    case GgmlType::kQ5_0: return {32, 22};
    case GgmlType::kQ5_1: return {32, 24};
    case GgmlType::kQ8_0: return {32, 34};
    case GgmlType::kQ8_1: return {32, 36};
    case GgmlType::kQ2_K: return {256, 84};
    case GgmlType::kQ3_K: return {256, 110};
    case GgmlType::kQ4_K: return {256, 144};
    case GgmlType::kQ5_K: return {256, 176};
    case GgmlType::kQ6_K: return {256, 210};
    case GgmlType::kQ8_K: return {256, 292};
    case GgmlType::kI8: return {1, 1};
    case GgmlType::kI16: return {1, 2};
    case GgmlType::kI32: return {1, 4};
    case GgmlType::kI64: return {1, 8};
    case GgmlType::kF64: return {1, 8};
    case GgmlType::kBF16: return {1, 2};
  }
  return {0, 0};
}

namespace {
// The types DequantizeRow decodes, in the order messages list them.
constexpr GgmlType kDequantizable[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_1, GgmlType::kQ5_0,
                                       GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K};
}  // namespace

bool CanDequantize(GgmlType type) {
  for (GgmlType t : kDequantizable) {
    if (t == type) return true;
  }
  return false;
}

std::string DequantizableTypeNames() {
  std::string names;
  for (GgmlType t : kDequantizable) names += (names.empty() ? "" : ", ") + GgmlTypeName(t);
  return names;
}

}  // namespace kvcache::model
