// Decoding rows of ggml tensor data into f32.
//
// Dequantization covers the types of SmolLM2's Q4_1 file and Gemma 3's
// Q4_K_M file plus F16: F32, F16, Q4_1, Q5_0, Q8_0 (blocks of 32 values)
// and Q4_K, Q6_K (super-blocks of 256); the block layouts are ggml's, spelled
// out in model/tensor/ggml_blocks.h. Other known types (Q5_K, BF16, ...) are
// sized (ggml_type.h) but decoding them is Unimplemented, naming the type
// and the types that are decoded.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/status.h"
#include "model/tensor/ggml_type.h"

namespace kvcache::model {

// Decodes n values of `type` from `src` into dst[n] (SIMD, runtime
// dispatch). n must be a whole number of blocks: InvalidArgument otherwise,
// Unimplemented for a type CanDequantize rejects. The result is bit-identical
// to DequantizeRowScalar on every SIMD target, except that where a block's
// scale is NaN the NaN payloads may differ (found by fuzz/gguf_fuzz.cc).
Status DequantizeRow(GgmlType type, const uint8_t* src, size_t n, float* dst);
// The scalar reference.
Status DequantizeRowScalar(GgmlType type, const uint8_t* src, size_t n, float* dst);

}  // namespace kvcache::model
