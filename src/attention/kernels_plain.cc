// Attention kernels for the plain float formats (f32, f16, bf16): the K and V
// pass instances over their decoders (format/plain/decode-inl.h), and the exact
// f32 path.
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_plain.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/family-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::attention_internal::HWY_NAMESPACE {

using PlainFamily = FamilyKernels<Format::kF32, Format::kF16, Format::kBF16>;

KFn PlainK(Format f, bool exact, int qb) {
  return exact ? KFor<Format::kF32, true>(qb) : PlainFamily::K(f, qb);
}
VFn PlainV(Format f, bool exact, int qb) {
  return exact ? VFor<Format::kF32, true>(qb) : PlainFamily::V(f, qb);
}
void PlainDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  PlainFamily::Decode(f, row, d, out);
}

}  // namespace kvcache::attention_internal::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
