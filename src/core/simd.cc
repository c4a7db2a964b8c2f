// Reports the dispatched Highway target by asking a dispatched function.
#include "kvcache/simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace HWY_NAMESPACE {
const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }
}  // namespace HWY_NAMESPACE
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
HWY_EXPORT(TargetNameHere);

std::string SimdTarget() { return HWY_DYNAMIC_DISPATCH(TargetNameHere)(); }

std::vector<std::string> SupportedSimdTargets() {
  std::vector<std::string> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(hwy::TargetName(t));
  return out;
}
}  // namespace kvcache
#endif
