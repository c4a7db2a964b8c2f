// Attention kernels for fp8_e4m3 and q8: the K and V pass instances over
// decode_fp8_q8-inl.h (q8 keys: the integer K path).
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_fp8_q8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/kernel_common-inl.h"
#include "attention/decode_fp8_q8-inl.h"
#include "attention/kpass-inl.h"
#include "attention/vpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

KFn Fp8Q8K(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kFp8E4M3: return KFor<Format::kFp8E4M3, false>(qb);
    case Format::kQ8: return KFor<Format::kQ8, false>(qb);
    default: return nullptr;
  }
}

VFn Fp8Q8V(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kFp8E4M3: return VFor<Format::kFp8E4M3, false>(qb);
    case Format::kQ8: return VFor<Format::kQ8, false>(qb);
    default: return nullptr;
  }
}

void Fp8Q8Decode(Format f, const uint8_t* row, uint32_t d, float* out) {
  switch (f) {
    case Format::kFp8E4M3: return DecodeRow<Format::kFp8E4M3>(row, d, out);
    case Format::kQ8: return DecodeRow<Format::kQ8>(row, d, out);
    default: return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();
