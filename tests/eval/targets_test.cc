// The quality targets, measured the way `kvcache eval` measures them
// (smaller sizes so the test stays fast). Skipped for formats whose codec is
// not implemented in this build.
#include <gtest/gtest.h>

#include "tools/support/eval/eval.h"
#include "tools/support/eval/synthetic.h"

namespace kvcache::eval {
namespace {

EvalData Data(DataKind kind, uint32_t tokens, uint64_t seed) {
  EvalData d;
  const SyntheticShape s{tokens, 2, 128};
  d.tokens = s.tokens;
  d.kv_heads = s.kv_heads;
  d.head_dim = s.head_dim;
  d.keys = MakeKeys(kind, s, seed);
  d.values = MakeValues(kind, s, seed);
  QueryOptions qo;
  qo.num_queries = 32;
  qo.q_heads = 4;
  qo.seed = seed;
  d.num_queries = qo.num_queries;
  d.q_heads = qo.q_heads;
  d.queries = MakeQueries(d.keys, s, qo);
  return d;
}

TEST(Targets, GaussianKeyNmse) {
  const EvalData d = Data(DataKind::kGaussian, 512, 1);
  Evaluator ev(d);
  const std::pair<Format, double> targets[] = {
      {Format::kTurbo4, 0.012}, {Format::kTurbo3, 0.040}, {Format::kTurbo2, 0.13}};
  for (const auto& [format, bound] : targets) {
    auto r = ev.Evaluate({format, Format::kF32});
    if (!r.ok() && r.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << r.status().ToString();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_LE(r->k_nmse, bound) << FormatName(format);
  }
}

TEST(Targets, OutlierTurbo4KeysBeatQ4_0) {
  const EvalData d = Data(DataKind::kOutlier, 512, 1);
  Evaluator ev(d);
  for (Format v : {Format::kF32, Format::kTurbo4, Format::kQ4_0}) {
    auto turbo = ev.Evaluate({Format::kTurbo4, v});
    auto q4 = ev.Evaluate({Format::kQ4_0, v});
    if ((!turbo.ok() && turbo.status().code() == StatusCode::kUnimplemented) ||
        (!q4.ok() && q4.status().code() == StatusCode::kUnimplemented)) {
      GTEST_SKIP() << "turbo4 or q4_0 not implemented";
    }
    ASSERT_TRUE(turbo.ok() && q4.ok());
    EXPECT_LE(turbo->attention.rel_err, 0.6 * q4->attention.rel_err)
        << "V = " << FormatName(v) << ": turbo4 " << turbo->attention.rel_err << " q4_0 " << q4->attention.rel_err;
  }
}

}  // namespace
}  // namespace kvcache::eval
