// Attention kernels for the plain float formats (f32, f16, bf16): the K
// and V pass instances over decode_plain-inl.h, and the exact f32 path.
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_plain.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/kernel_common-inl.h"
#include "attention/decode_plain-inl.h"
#include "attention/kpass-inl.h"
#include "attention/vpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

KFn PlainK(Format f, bool exact, int qb) {
  if (exact) return KFor<Format::kF32, true>(qb);
  switch (f) {
    case Format::kF32: return KFor<Format::kF32, false>(qb);
    case Format::kF16: return KFor<Format::kF16, false>(qb);
    case Format::kBF16: return KFor<Format::kBF16, false>(qb);
    default: return nullptr;
  }
}

VFn PlainV(Format f, bool exact, int qb) {
  if (exact) return VFor<Format::kF32, true>(qb);
  switch (f) {
    case Format::kF32: return VFor<Format::kF32, false>(qb);
    case Format::kF16: return VFor<Format::kF16, false>(qb);
    case Format::kBF16: return VFor<Format::kBF16, false>(qb);
    default: return nullptr;
  }
}

void PlainDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  switch (f) {
    case Format::kF32: return DecodeRow<Format::kF32>(row, d, out);
    case Format::kF16: return DecodeRow<Format::kF16>(row, d, out);
    case Format::kBF16: return DecodeRow<Format::kBF16>(row, d, out);
    default: return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();
