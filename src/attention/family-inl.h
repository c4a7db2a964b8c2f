// What each kernels_<family>.cc instantiates for its formats: the K and V
// pass of every format of the family (the float-query instances; kernels_
// plain.cc adds the exact f32 one) and DecodeRow, picked by format.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include "attention/kernel_common-inl.h"
#include "attention/kpass-inl.h"
#include "attention/vpass-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_FAMILY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_FAMILY_INL_H_
#undef KVCACHE_SRC_ATTENTION_FAMILY_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_FAMILY_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// The kernels of formats Fs: K/V return the pass for format f with qb query
// vectors per block (1 to 4), or nullptr when f is not one of Fs; Decode
// is DecodeRow for f (nothing when f is not one of Fs).
template <Format... Fs>
struct FamilyKernels {
  static KFn K(Format f, int qb) {
    KFn k = nullptr;
    ((f == Fs ? (void)(k = KFor<Fs, false>(qb)) : (void)0), ...);
    return k;
  }
  static VFn V(Format f, int qb) {
    VFn v = nullptr;
    ((f == Fs ? (void)(v = VFor<Fs, false>(qb)) : (void)0), ...);
    return v;
  }
  static void Decode(Format f, const uint8_t* row, uint32_t d, float* out) {
    ((f == Fs ? DecodeRow<Fs>(row, d, out) : (void)0), ...);
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_FAMILY_INL_H_
