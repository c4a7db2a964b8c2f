// Attention kernels for the ggml block formats q8_0 and q4_0: the K and V pass
// instances over their decoders (format/ggml/decode-inl.h) and their integer
// K paths (format/ggml/kpass-inl.h).
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_ggml.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/family-inl.h"
#include "format/ggml/kpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::attention_internal::HWY_NAMESPACE {

using GgmlFamily = FamilyKernels<Format::kQ8_0, Format::kQ4_0>;

KFn GgmlK(Format f, bool /*exact*/, int qb) { return GgmlFamily::K(f, qb); }
VFn GgmlV(Format f, bool /*exact*/, int qb) { return GgmlFamily::V(f, qb); }
void GgmlDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  GgmlFamily::Decode(f, row, d, out);
}

}  // namespace kvcache::attention_internal::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
