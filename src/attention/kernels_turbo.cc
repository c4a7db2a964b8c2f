// Attention kernels for the turbo formats (turbo8, turbo4, turbo3, turbo2):
// the K and V pass instances over decode_turbo-inl.h.
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_turbo.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/kernel_common-inl.h"
#include "attention/decode_turbo-inl.h"
#include "attention/kpass-inl.h"
#include "attention/vpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

KFn TurboK(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kTurbo8: return KFor<Format::kTurbo8, false>(qb);
    case Format::kTurbo4: return KFor<Format::kTurbo4, false>(qb);
    case Format::kTurbo3: return KFor<Format::kTurbo3, false>(qb);
    case Format::kTurbo2: return KFor<Format::kTurbo2, false>(qb);
    default: return nullptr;
  }
}

VFn TurboV(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kTurbo8: return VFor<Format::kTurbo8, false>(qb);
    case Format::kTurbo4: return VFor<Format::kTurbo4, false>(qb);
    case Format::kTurbo3: return VFor<Format::kTurbo3, false>(qb);
    case Format::kTurbo2: return VFor<Format::kTurbo2, false>(qb);
    default: return nullptr;
  }
}

void TurboDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  switch (f) {
    case Format::kTurbo8: return DecodeRow<Format::kTurbo8>(row, d, out);
    case Format::kTurbo4: return DecodeRow<Format::kTurbo4>(row, d, out);
    case Format::kTurbo3: return DecodeRow<Format::kTurbo3>(row, d, out);
    case Format::kTurbo2: return DecodeRow<Format::kTurbo2>(row, d, out);
    default: return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();
