// Private facts about stored rows, for code that reads them directly (the
// fused attention kernels) and for the codecs themselves: everything of the
// format families (format/<family>/<family>.h) and the whole-row kernels.
//
// The families, each with its row layout, scalar reference, SIMD encoder and
// Decoder<F> (format/decoders-inl.h):
//   format/plain/    f32, f16, bf16
//   format/fp8_q8/   fp8_e4m3, q8 (and the E4M3 conversions)
//   format/turbo/    turbo8, turbo4, turbo3, turbo2 (and the rotation)
//   format/ggml/     q8_0, q4_0
// RowLayout (format/row_layout.h) says where each part of a row sits.
//
// Thread safety: everything here is a pure function or constant data.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/fp8_q8/fp8_q8.h"
#include "format/ggml/ggml.h"
#include "format/plain/plain.h"
#include "format/row_layout.h"
#include "format/turbo/turbo.h"
#include "kvcache/codec.h"
#include "kvcache/format.h"

namespace kvcache {
namespace format_internal {

// ---------------------------------------------------------------------------
// Whole-row kernels on prepared rows: x[n][d] is already in storage space (mean
// subtracted, column scales divided out, rotated for turbo) and finite.
// out/in are [n][RowBytes(format, d)]. The dispatched versions are SIMD and
// produce bytes (and floats) identical to the scalar references.
void EncodeRows(Format format, uint32_t d, size_t n, const float* x, uint8_t* out);
void DecodeRows(Format format, uint32_t d, size_t n, const uint8_t* in, float* x);
// Index of the first NaN/Inf in x[0, n), or n. SIMD.
size_t FirstNonFinite(const float* x, size_t n);
void EncodeRowsScalar(Format format, uint32_t d, size_t n, const float* x, uint8_t* out);
// EncodeRows of row i of x[n][d] into dst[i] (RowBytes(format, d) bytes each),
// one dispatch for all n rows: the append path's rows go to n different heads.
void EncodeRowsScattered(Format format, uint32_t d, size_t n, const float* x,
                         uint8_t* const* dst);

// The append path's encode: row i of x[n][head_dim] (finite: the caller has
// checked) with transform tf[i] (tf == nullptr, or tf[i] nullptr or empty:
// none) into dst[i]. Writes the bytes codec.Encode writes for each row, with
// one dispatch for all rows and no allocation once this thread's scratch has
// grown. InvalidArgument (Encode's messages, row = the index i) for a
// transform Encode would refuse or a value that overflows after its
// transform; rows may have been written by then.
Status EncodeHeadRows(const RowCodec& codec, size_t n, const float* x, uint8_t* const* dst,
                      const RowTransform* const* tf);
void DecodeRowsScalar(Format format, uint32_t d, size_t n, const uint8_t* in, float* x);

// For tests: the non-negative level the turbo4/3/2 scale search (dispatched,
// SIMD) takes for |x| = a[i] under scale s[i] (an E4M3 value in [2^-9, 448]);
// it must equal the level of NearestCode(a[i] / s[i]) in turbo/scalar.cc.
void TurboSearchLevels(Format format, size_t n, const float* a, const float* s, float* level);

}  // namespace format_internal
}  // namespace kvcache
