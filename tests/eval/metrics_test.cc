// Metrics against hand-computed cases, and the evaluator on f32 (exact) and
// on the formats that exist.
#include "tools/support/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tools/support/eval/eval.h"
#include "tools/support/eval/synthetic.h"

namespace kvcache::eval {
namespace {

TEST(Metrics, NmseHandComputed) {
  const std::vector<float> ref = {3, 4};  // energy 25
  const std::vector<float> test = {3, 1};  // error 9
  EXPECT_DOUBLE_EQ(Nmse(ref, test), 9.0 / 25.0);
  EXPECT_EQ(Nmse(ref, ref), 0.0);
  const std::vector<float> zero = {0, 0};
  EXPECT_EQ(Nmse(zero, zero), 0.0);
  EXPECT_TRUE(std::isinf(Nmse(zero, ref)));
}

TEST(Metrics, HeadAttentionHandComputed) {
  // D = 4, scale 1/2. q = (2, 0, 0, 0): scores = k_t[0].
  const std::vector<float> q = {2, 0, 0, 0};
  // Two rows interleaved with another head's (row_stride 8): k0 = (ln 3, ...), k1 = (0, ...).
  const float ln3 = static_cast<float>(std::log(3.0));
  const std::vector<float> keys = {ln3, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0, 9, 9, 9, 9};
  const std::vector<float> values = {1, 0, 0, 0, 9, 9, 9, 9, 0, 1, 0, 0, 9, 9, 9, 9};
  std::vector<double> log_p(2), out(4);
  HeadAttention(q, keys.data(), values.data(), 2, 8, log_p, out);
  // p = (3/4, 1/4) within float rounding of ln 3.
  EXPECT_NEAR(std::exp(log_p[0]), 0.75, 1e-7);
  EXPECT_NEAR(std::exp(log_p[1]), 0.25, 1e-7);
  EXPECT_NEAR(out[0], 0.75, 1e-7);
  EXPECT_NEAR(out[1], 0.25, 1e-7);
  EXPECT_EQ(out[2], 0.0);
}

TEST(Metrics, AttentionStatsHandComputed) {
  AttentionStats stats;
  // Query 1: identical -> rel 0, cos 1, kl 0, top1 agree.
  const std::vector<double> lp_a = {std::log(0.75), std::log(0.25)};
  const std::vector<double> o_a = {3, 4};
  stats.Add(lp_a, o_a, lp_a, o_a);
  // Query 2: p = (.75, .25) vs (.25, .75): KL = .5 ln 3; argmax differs;
  // o = (3, 4) vs (4, 3): rel err sqrt(2)/5, cos 24/25.
  const std::vector<double> lp_b = {std::log(0.25), std::log(0.75)};
  const std::vector<double> o_b = {4, 3};
  stats.Add(lp_a, o_a, lp_b, o_b);
  const AttentionSummary s = stats.Summary();
  EXPECT_EQ(s.count, 2u);
  EXPECT_NEAR(s.rel_err, std::sqrt(2.0) / 5 / 2, 1e-12);
  EXPECT_NEAR(s.cosine, (1 + 24.0 / 25) / 2, 1e-12);
  EXPECT_NEAR(s.kl, 0.5 * std::log(3.0) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(s.top1_agree, 0.5);
}

EvalData SmallData(DataKind kind) {
  EvalData d;
  const SyntheticShape s{128, 2, 64};
  d.tokens = s.tokens;
  d.kv_heads = s.kv_heads;
  d.head_dim = s.head_dim;
  d.keys = MakeKeys(kind, s, 1);
  d.values = MakeValues(kind, s, 1);
  QueryOptions qo;
  qo.num_queries = 16;
  qo.q_heads = 4;
  d.num_queries = qo.num_queries;
  d.q_heads = qo.q_heads;
  d.queries = MakeQueries(d.keys, s, qo);
  return d;
}

TEST(Evaluator, F32IsExact) {
  for (DataKind kind : {DataKind::kGaussian, DataKind::kOutlier}) {
    const EvalData d = SmallData(kind);
    ASSERT_TRUE(d.Validate().ok());
    Evaluator ev(d);
    auto r = ev.Evaluate({Format::kF32, Format::kF32});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->k_bits, 32.0);
    EXPECT_EQ(r->k_nmse, 0.0);
    EXPECT_EQ(r->v_nmse, 0.0);
    EXPECT_EQ(r->attention.rel_err, 0.0);
    EXPECT_NEAR(r->attention.cosine, 1.0, 1e-12);
    EXPECT_EQ(r->attention.kl, 0.0);
    EXPECT_EQ(r->attention.top1_agree, 1.0);
    EXPECT_EQ(r->attention.count, 64u);
  }
}

TEST(Evaluator, ErrorsAreReportedAndLeaveItUsable) {
  EvalData d = SmallData(DataKind::kGaussian);
  Evaluator ev(d);
  // q4_0 needs a multiple of 32: fine at 64; build a 48-dim set for the error.
  EvalData odd = d;
  odd.head_dim = 48;
  odd.keys.resize(size_t{128} * 2 * 48);
  odd.values.resize(odd.keys.size());
  odd.queries.resize(size_t{16} * 4 * 48);
  ASSERT_TRUE(odd.Validate().ok());
  Evaluator ev_odd(odd);
  auto bad = ev_odd.Evaluate({Format::kF32, Format::kQ4_0});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ev_odd.Evaluate({Format::kF32, Format::kF32}).ok());
  // Every format either measures sanely or reports an error.
  for (Format f : kAllFormats) {
    auto r = ev.Evaluate({f, f});
    if (!r.ok()) continue;
    EXPECT_GE(r->k_nmse, 0.0);
    EXPECT_LT(r->k_nmse, 0.5) << FormatName(f);
    EXPECT_GT(r->attention.cosine, 0.5) << FormatName(f);
    EXPECT_GE(r->attention.kl, 0.0);
  }
}

TEST(Evaluator, ValidateRejectsInconsistentData) {
  EvalData d = SmallData(DataKind::kGaussian);
  d.q_heads = 3;
  EXPECT_FALSE(d.Validate().ok());
  d = SmallData(DataKind::kGaussian);
  d.values.pop_back();
  EXPECT_FALSE(d.Validate().ok());
  d = SmallData(DataKind::kGaussian);
  d.tokens = 0;
  EXPECT_FALSE(d.Validate().ok());
}

}  // namespace
}  // namespace kvcache::eval
