// Checks shared by the weight-product and dequantization tests: every SIMD
// target in turn, and the bits a product keeps whatever the thread count
// and batch.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvcache/thread_pool.h"
#include "model/tensor/matmul.h"

namespace kvcache::model {

// Calls fn() once per SIMD target this CPU runs and this build compiled,
// with dispatch pinned to it (traced by name); restores runtime dispatch
// afterwards, even through a failed ASSERT.
template <class Fn>
void ForEachSimdTarget(Fn fn) {
  struct Restore {
    ~Restore() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// MatMul(w, x) with 1, 2 and 3 threads, and each of its n tokens alone,
// gives exactly `want` ([n][w.rows]).
inline void ExpectSameBitsPooledAndAlone(const WeightMatrix& w, const std::vector<float>& x, uint32_t n,
                                         const std::vector<float>& want) {
  for (uint32_t threads : {1u, 2u, 3u}) {
    ThreadPool pool(threads);
    std::vector<float> got(want.size());
    MatMul(w, x.data(), n, got.data(), &pool);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << threads << " threads";
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<float> one(w.rows);
      MatMul(w, x.data() + static_cast<size_t>(i) * w.cols, 1, one.data(), &pool);
      ASSERT_EQ(0, std::memcmp(one.data(), want.data() + static_cast<size_t>(i) * w.rows, w.rows * 4))
          << "token " << i << " alone, " << threads << " threads";
    }
  }
}

}  // namespace kvcache::model
