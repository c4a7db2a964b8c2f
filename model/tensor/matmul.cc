// Weight products: row ranges split over the caller's ThreadPool; the SIMD
// row loop lives in gguf_dequant.cc (dispatch once per part).
#include "model/tensor/matmul.h"

#include "model/tensor/matmul_bf16.h"
#include "model/tensor/matmul_int8.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <vector>

namespace kvcache::model {
namespace dequant_internal {
void MatMulRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const float* x, uint32_t n,
                float* out, float* buf, bool bf16);
}  // namespace dequant_internal

WeightMatrix WeightMatrix::F32(std::span<const float> w, uint32_t rows, uint32_t cols) {
  assert(w.size() == static_cast<size_t>(rows) * cols);
  return {GgmlType::kF32, reinterpret_cast<const uint8_t*>(w.data()), rows, cols, size_t{cols} * 4};
}

void WeightMatrix::DecodeRows(uint32_t r, uint32_t n, float* out) const {
  // The view was validated when it was made (whole blocks, known type).
  const Status s = DequantizeRow(type, data + static_cast<size_t>(r) * row_bytes,
                                 static_cast<size_t>(n) * cols, out);
  assert(s.ok());
  (void)s;
}

namespace {

struct MatMulJob {
  const WeightMatrix* w;
  const float* x;
  uint32_t n;
  float* out;
  const QuantizedInputs* xq;  // the integer path's inputs, or null
  const Bf16Inputs* xb;       // the bf16 path's inputs, or null
};

// Rows [rows * part / num_parts, rows * (part + 1) / num_parts) of the job.
void RunPart(const MatMulJob& j, uint32_t part, uint32_t num_parts) {
  const uint32_t rows = j.w->rows;
  const uint32_t r0 = static_cast<uint32_t>(uint64_t{rows} * part / num_parts);
  const uint32_t r1 = static_cast<uint32_t>(uint64_t{rows} * (part + 1) / num_parts);
  if (j.xq != nullptr) {
    MatMulRowsInt8(*j.w, r0, r1, *j.xq, j.out);
    return;
  }
  if (j.xb != nullptr) {
    MatMulRowsBf16(*j.w, r0, r1, *j.xb, j.out);
    return;
  }
  thread_local std::vector<float> buf;
  if (buf.size() < 4 * size_t{j.w->cols}) buf.resize(4 * size_t{j.w->cols});
  dequant_internal::MatMulRows(*j.w, r0, r1, j.x, j.n, j.out, buf.data(), false);
}

}  // namespace

void MatMul(const WeightMatrix& w, const float* x, uint32_t n, float* out, ThreadPool* pool) {
  // The caller's rounded inputs, reused from call to call (no allocation
  // once the largest product has been seen).
  thread_local QuantizedInputs xq;
  thread_local Bf16Inputs xb;
  const bool int8 = UsesInt8(w);
  const bool bf16 = w.inputs == MatMulInputs::kBf16;
  if (int8) QuantizeInputs(x, n, w.cols, &xq);
  if (bf16) PrepareBf16Inputs(x, n, w.cols, PreferredBf16Kernel(), &xb);
  const MatMulJob job{&w, x, n, out, int8 ? &xq : nullptr, bf16 ? &xb : nullptr};
  if (pool == nullptr) {
    RunPart(job, 0, 1);
    return;
  }
  const uint32_t parts = pool->num_threads();
  pool->ParallelFor(parts, [&](uint32_t part, uint32_t) { RunPart(job, part, parts); });
}

MatMulChoice AutoMatMulInputs() {
  if (Bf16KernelAvailable(Bf16Kernel::kTiles)) return {MatMulInputs::kBf16, "AMX bf16 tiles"};
  if (Bf16KernelAvailable(Bf16Kernel::kDot)) return {MatMulInputs::kBf16, "AVX512_BF16 dot products"};
  if (Int8LanesAvailable()) return {MatMulInputs::kInt8, "no AMX or AVX512_BF16, integer lanes"};
  return {MatMulInputs::kF32, "no bf16 or integer-lane kernel on this CPU"};
}

Result<MatMulInputs> ParseMatMulInputs(std::string_view name) {
  if (name == "f32") return MatMulInputs::kF32;
  if (name == "int8") return MatMulInputs::kInt8;
  if (name == "bf16") return MatMulInputs::kBf16;
  if (name == "auto") return AutoMatMulInputs().inputs;
  return Status::InvalidArgument("unknown matmul inputs '" + std::string(name) +
                                 "' (want f32, int8, bf16 or auto)");
}

std::string_view MatMulInputsName(MatMulInputs inputs) {
  switch (inputs) {
    case MatMulInputs::kInt8: return "int8";
    case MatMulInputs::kBf16: return "bf16";
    default: return "f32";
  }
}

void MatMulScalar(const WeightMatrix& w, const float* x, uint32_t n, float* out) {
  std::vector<float> row(w.cols);
  for (uint32_t r = 0; r < w.rows; ++r) {
    const Status s = DequantizeRowScalar(w.type, w.data + static_cast<size_t>(r) * w.row_bytes, w.cols,
                                         row.data());
    assert(s.ok());
    (void)s;
    for (uint32_t t = 0; t < n; ++t) {
      float acc = 0;
      for (uint32_t c = 0; c < w.cols; ++c) acc += row[c] * x[static_cast<size_t>(t) * w.cols + c];
      out[static_cast<size_t>(t) * w.rows + r] = acc;
    }
  }
}

}  // namespace kvcache::model
