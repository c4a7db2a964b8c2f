// Attention kernels for fp8_e4m3 and q8: the K and V pass instances over their
// decoders (format/fp8_q8/decode-inl.h) and q8's integer K path
// (format/fp8_q8/kpass-inl.h).
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_fp8_q8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/family-inl.h"
#include "format/fp8_q8/kpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::attention_internal::HWY_NAMESPACE {

using Fp8Q8Family = FamilyKernels<Format::kFp8E4M3, Format::kQ8>;

KFn Fp8Q8K(Format f, bool /*exact*/, int qb) { return Fp8Q8Family::K(f, qb); }
VFn Fp8Q8V(Format f, bool /*exact*/, int qb) { return Fp8Q8Family::V(f, qb); }
void Fp8Q8Decode(Format f, const uint8_t* row, uint32_t d, float* out) {
  Fp8Q8Family::Decode(f, row, d, out);
}

}  // namespace kvcache::attention_internal::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
