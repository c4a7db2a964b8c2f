// Attention kernels for the turbo formats (turbo8/4/3/2, turbo4i/3i/2i): the
// K and V pass instances over their decoders (format/turbo/decode-inl.h) and
// the integer-level formats' integer paths (format/turbo/kpass-inl.h,
// format/turbo/vpass-inl.h).
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_turbo.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/family-inl.h"
#include "format/turbo/kpass-inl.h"
#include "format/turbo/vpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::attention_internal::HWY_NAMESPACE {

using TurboFamily = FamilyKernels<Format::kTurbo8, Format::kTurbo4, Format::kTurbo3,
                                  Format::kTurbo2, Format::kTurbo4I, Format::kTurbo3I,
                                  Format::kTurbo2I>;

KFn TurboK(Format f, bool /*exact*/, int qb) { return TurboFamily::K(f, qb); }
VFn TurboV(Format f, bool /*exact*/, int qb) { return TurboFamily::V(f, qb); }
void TurboDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  TurboFamily::Decode(f, row, d, out);
}

}  // namespace kvcache::attention_internal::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
