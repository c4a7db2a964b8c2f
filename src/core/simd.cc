// Reports the dispatched Highway target by asking a dispatched function, and
// restricts dispatch for the process (UseSimdTarget).
//
// Restriction uses hwy::DisableTargets with every target better than the chosen
// one: Highway then re-chooses on the next HWY_DYNAMIC_DISPATCH of every
// exported function in every translation unit (the chosen-target mask is
// shared), so no call site needs to know. Nothing in the library caches a
// dispatched function pointer; each call goes through HWY_DYNAMIC_DISPATCH.
//
// Thread safety: see kvcache/simd.h. The supported list is a function-local
// static (thread-safe initialisation), computed before any restriction.
#include "kvcache/simd.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

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

namespace {

struct TargetEntry {
  int64_t bit;
  std::string name;
};

// Compiled targets this CPU supports, best (lowest bit) first, as detected
// before UseSimdTarget restricted anything.
const std::vector<TargetEntry>& Supported() {
  static const std::vector<TargetEntry> list = [] {
    std::vector<TargetEntry> out;
    for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back({t, hwy::TargetName(t)});
    return out;
  }();
  return list;
}

bool SameName(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(a[i])) !=
        std::toupper(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string SimdTarget() { return HWY_DYNAMIC_DISPATCH(TargetNameHere)(); }

std::vector<std::string> SupportedSimdTargets() {
  std::vector<std::string> out;
  for (const TargetEntry& e : Supported()) out.push_back(e.name);
  return out;
}

Status UseSimdTarget(std::string_view name) {
  const std::vector<TargetEntry>& list = Supported();
  for (const TargetEntry& e : list) {
    if (!SameName(e.name, name)) continue;
    // Targets are bits, better ones lower: disable every bit below this one.
    // The best target disables nothing, which is the default choice.
    hwy::DisableTargets(e.bit - 1);
    return Status::Ok();
  }
  std::string valid;
  for (const TargetEntry& e : list) valid += (valid.empty() ? "" : ", ") + e.name;
  return Status::InvalidArgument(fmt::format(
      "SIMD target '{}' is not compiled in or not supported by this CPU; choose one of: {}",
      name, valid));
}

}  // namespace kvcache
#endif
