// Test helper: runs a body once per Highway target that was compiled in and
// that this CPU supports (through hwy::SetSupportedTargetsForTest, each under
// a SCOPED_TRACE naming the target), then restores normal dispatch.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>

namespace kvcache::testing {

template <class Fn>
void ForEachHwyTarget(const Fn& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace kvcache::testing
