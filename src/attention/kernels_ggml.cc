// Attention kernels for the ggml block formats q8_0 and q4_0: the K and V
// pass instances over decode_ggml-inl.h (q8_0 keys: the integer K path).
//
// Compiled once per Highway target (foreach_target.h); kernels.cc calls
// these from the same target. Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels_ggml.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention/kernel_common-inl.h"
#include "attention/decode_ggml-inl.h"
#include "attention/kpass-inl.h"
#include "attention/vpass-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

KFn GgmlK(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kQ8_0: return KFor<Format::kQ8_0, false>(qb);
    case Format::kQ4_0: return KFor<Format::kQ4_0, false>(qb);
    default: return nullptr;
  }
}

VFn GgmlV(Format f, bool exact, int qb) {
  (void)exact;
  switch (f) {
    case Format::kQ8_0: return VFor<Format::kQ8_0, false>(qb);
    case Format::kQ4_0: return VFor<Format::kQ4_0, false>(qb);
    default: return nullptr;
  }
}

void GgmlDecode(Format f, const uint8_t* row, uint32_t d, float* out) {
  switch (f) {
    case Format::kQ8_0: return DecodeRow<Format::kQ8_0>(row, d, out);
    case Format::kQ4_0: return DecodeRow<Format::kQ4_0>(row, d, out);
    default: return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();
