// Linear-attention state: SIMD kernels vs the scalar reference on every
// target, the update rules' math, the speculative scratch lane vs replaying
// only the accepted tokens, and bad input leaving everything unchanged.
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/linear_state.h"
#include "linear/linear_kernels.h"
#include "hwy_targets.h"

namespace kvcache {
namespace {

using testing::ForEachHwyTarget;

constexpr LinearRule kRules[] = {LinearRule::kPlain, LinearRule::kDecay, LinearRule::kDelta};

std::vector<float> Random(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& f : x) f = u(rng);
  return x;
}

// Gates valid for the rule ([0,1] decay, [0,2] delta, none for plain).
std::vector<float> Gates(std::mt19937& rng, LinearRule rule, size_t n) {
  if (rule == LinearRule::kPlain) return {};
  return Random(rng, n, rule == LinearRule::kDecay ? 0.5f : 0.0f,
                rule == LinearRule::kDecay ? 1.0f : 1.5f);
}

bool BitEqual(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
bool BitEqual(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LinearKernels, SimdEqualsReferenceOnEveryTarget) {
  struct Case { uint32_t heads, d_k, d_v; };
  const Case cases[] = {{1, 1, 1}, {2, 3, 5}, {1, 7, 17}, {3, 16, 16}, {2, 33, 12}, {1, 64, 64}};
  ForEachHwyTarget([&] {
    std::mt19937 rng(7);
    for (LinearRule rule : kRules) {
      for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message() << LinearRuleName(rule) << " H=" << c.heads
                                        << " dk=" << c.d_k << " dv=" << c.d_v);
        const linear::Shape s{c.heads, c.d_k, c.d_v};
        const size_t T = 9;
        const auto k = Random(rng, T * c.heads * c.d_k);
        const auto v = Random(rng, T * c.heads * c.d_v);
        const auto q = Random(rng, T * c.heads * c.d_k);
        auto gate = Gates(rng, rule, T * c.heads);
        auto state0 = std::vector<double>(size_t{c.heads} * c.d_k * c.d_v);
        for (double& x : state0) x = std::uniform_real_distribution<double>(-1, 1)(rng);
        auto ref = state0, simd = state0;
        std::vector<float> out_ref(T * c.heads * c.d_v), out_simd(out_ref.size());
        linear::ApplyTokensReference(rule, s, T, k.data(), v.data(), gate.data(), q.data(),
                                     out_ref.data(), ref.data());
        linear::ApplyTokens(rule, s, T, k.data(), v.data(), gate.data(), q.data(),
                            out_simd.data(), simd.data());
        EXPECT_TRUE(BitEqual(ref, simd));
        EXPECT_TRUE(BitEqual(out_ref, out_simd));
        // Without outputs: same state.
        auto simd2 = state0;
        linear::ApplyTokens(rule, s, T, k.data(), v.data(), gate.data(), nullptr, nullptr,
                            simd2.data());
        EXPECT_TRUE(BitEqual(ref, simd2));
        // Read.
        std::vector<float> r_ref(c.heads * c.d_v), r_simd(r_ref.size());
        linear::ReadReference(s, ref.data(), q.data(), r_ref.data());
        linear::Read(s, ref.data(), q.data(), r_simd.data());
        EXPECT_TRUE(BitEqual(r_ref, r_simd));
      }
    }
  });
}

// The rules' math, checked independently of the kernels' loop structure.
TEST(LinearKernels, RulesMatchTheirDefinitions) {
  std::mt19937 rng(11);
  const uint32_t dk = 6, dv = 5;
  const linear::Shape s{1, dk, dv};
  const auto k = Random(rng, dk), v = Random(rng, dv);
  // Plain from zero: S = k vᵀ exactly.
  std::vector<double> S(dk * dv, 0.0);
  linear::ApplyTokens(LinearRule::kPlain, s, 1, k.data(), v.data(), nullptr, nullptr, nullptr,
                      S.data());
  for (uint32_t i = 0; i < dk; ++i)
    for (uint32_t j = 0; j < dv; ++j) EXPECT_EQ(S[i * dv + j], double(k[i]) * double(v[j]));
  // Decay with g = 0 forgets everything before: S = k2 v2ᵀ.
  const auto k2 = Random(rng, dk), v2 = Random(rng, dv);
  const float g0 = 0.0f;
  linear::ApplyTokens(LinearRule::kDecay, s, 1, k2.data(), v2.data(), &g0, nullptr, nullptr,
                      S.data());
  for (uint32_t i = 0; i < dk; ++i)
    for (uint32_t j = 0; j < dv; ++j) EXPECT_EQ(S[i * dv + j], double(k2[i]) * double(v2[j]));
  // Decay with g = 0.5 halves the old state exactly.
  const auto k3 = Random(rng, dk), v3 = Random(rng, dv);
  const float half = 0.5f;
  auto before = S;
  linear::ApplyTokens(LinearRule::kDecay, s, 1, k3.data(), v3.data(), &half, nullptr, nullptr,
                      S.data());
  for (uint32_t i = 0; i < dk; ++i)
    for (uint32_t j = 0; j < dv; ++j)
      EXPECT_EQ(S[i * dv + j], 0.5 * before[i * dv + j] + double(k3[i]) * double(v3[j]));
  // Delta rule with β = 1 and a unit key: afterwards Sᵀk = v (the key's
  // association is overwritten), up to rounding.
  std::vector<float> unit(dk);
  double norm = 0;
  for (float x : k3) norm += double(x) * x;
  for (uint32_t i = 0; i < dk; ++i) unit[i] = static_cast<float>(k3[i] / std::sqrt(norm));
  const float beta = 1.0f;
  std::vector<float> out(dv);
  linear::ApplyTokens(LinearRule::kDelta, s, 1, unit.data(), v.data(), &beta, unit.data(),
                      out.data(), S.data());
  for (uint32_t j = 0; j < dv; ++j) EXPECT_NEAR(out[j], v[j], 1e-5);
}

// The per-head default gates `gates` for a gated rule; none for plain.
std::vector<float> HeadGates(LinearRule rule, std::vector<float> gates) {
  return rule == LinearRule::kPlain ? std::vector<float>{} : gates;
}

LinearState Make(LinearRule rule, uint32_t H, uint32_t dk, uint32_t dv,
                 std::vector<float> head_gate = {}) {
  auto s = LinearState::Create({.n_heads = H, .d_k = dk, .d_v = dv, .rule = rule,
                                .head_gate = std::move(head_gate)});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

TEST(LinearState, AppendMatchesReferenceAndDefaultGates) {
  std::mt19937 rng(3);
  for (LinearRule rule : kRules) {
    SCOPED_TRACE(LinearRuleName(rule));
    const uint32_t H = 2, dk = 8, dv = 6;
    const std::vector<float> head_gate =
        HeadGates(rule, {0.75f, rule == LinearRule::kDelta ? 1.25f : 1.0f});
    LinearState st = Make(rule, H, dk, dv, head_gate);
    std::vector<double> ref(H * dk * dv, 0.0);
    const linear::Shape shape{H, dk, dv};
    for (int step = 0; step < 5; ++step) {
      const size_t n = 1 + step % 3;
      const auto k = Random(rng, n * H * dk), v = Random(rng, n * H * dv),
                 q = Random(rng, n * H * dk);
      const bool explicit_gate = rule != LinearRule::kPlain && step % 2 == 1;
      const auto gate = explicit_gate ? Gates(rng, rule, n * H) : std::vector<float>{};
      std::vector<float> ref_gate = gate;
      if (rule != LinearRule::kPlain && !explicit_gate) {
        for (size_t t = 0; t < n; ++t) ref_gate.insert(ref_gate.end(), head_gate.begin(), head_gate.end());
      }
      std::vector<float> out(n * H * dv), out_ref(out.size());
      ASSERT_TRUE(st.Append({.k = k, .v = v, .gate = gate, .q = q}, out).ok());
      linear::ApplyTokensReference(rule, shape, n, k.data(), v.data(), ref_gate.data(), q.data(),
                                   out_ref.data(), ref.data());
      EXPECT_TRUE(BitEqual(st.state(), ref));
      EXPECT_TRUE(BitEqual(out, out_ref));
    }
    EXPECT_EQ(st.num_tokens(), 9u);
    // Read equals the reference read.
    const auto q = Random(rng, H * dk);
    std::vector<float> out(H * dv), out_ref(H * dv);
    ASSERT_TRUE(st.Read(q, out).ok());
    linear::ReadReference(shape, ref.data(), q.data(), out_ref.data());
    EXPECT_TRUE(BitEqual(out, out_ref));
  }
}

// Randomized drafts: after Commit(a) the state is bit for bit that of a twin
// that appended only the first a drafted tokens; after Abort it is unchanged;
// outputs during the draft equal a twin appending every drafted token.
TEST(LinearState, DraftCommitEqualsReplayingOnlyAcceptedTokens) {
  std::mt19937 rng(2024);
  for (LinearRule rule : kRules) {
    SCOPED_TRACE(LinearRuleName(rule));
    const uint32_t H = 3, dk = 12, dv = 7;
    const std::vector<float> head_gate = HeadGates(rule, {0.9f, 0.5f, 1.0f});
    LinearState st = Make(rule, H, dk, dv, head_gate);
    LinearState twin = Make(rule, H, dk, dv, head_gate);
    for (int round = 0; round < 30; ++round) {
      // Some plain tokens between drafts.
      const size_t n0 = rng() % 3;
      auto k0 = Random(rng, n0 * H * dk), v0 = Random(rng, n0 * H * dv);
      auto g0 = rng() % 2 ? Gates(rng, rule, n0 * H) : std::vector<float>{};
      ASSERT_TRUE(st.Append({.k = k0, .v = v0, .gate = g0}).ok());
      ASSERT_TRUE(twin.Append({.k = k0, .v = v0, .gate = g0}).ok());

      const auto committed = std::vector<double>(st.state().begin(), st.state().end());
      ASSERT_TRUE(st.BeginDraft().ok());
      LinearState all = twin.Copy();  // appends every drafted token, no draft
      std::vector<std::vector<float>> ks, vs, gs;
      const uint32_t T = 1 + rng() % 6;
      uint32_t drafted = 0;
      while (drafted < T) {  // drafted in chunks of 1..2 tokens
        const uint32_t n = std::min<uint32_t>(T - drafted, 1 + rng() % 2);
        auto k = Random(rng, n * H * dk), v = Random(rng, n * H * dv), q = Random(rng, n * H * dk);
        auto g = rng() % 2 ? Gates(rng, rule, n * H) : std::vector<float>{};
        std::vector<float> out(n * H * dv), out_all(out.size());
        ASSERT_TRUE(st.Append({.k = k, .v = v, .gate = g, .q = q}, out).ok());
        ASSERT_TRUE(all.Append({.k = k, .v = v, .gate = g, .q = q}, out_all).ok());
        EXPECT_TRUE(BitEqual(out, out_all));
        EXPECT_TRUE(BitEqual(st.state(), committed));  // committed lane untouched
        ks.push_back(k), vs.push_back(v), gs.push_back(g);
        drafted += n;
      }
      EXPECT_TRUE(BitEqual(st.scratch(), all.state()));
      const int choice = rng() % 4;
      if (choice == 0) {
        ASSERT_TRUE(st.Abort().ok());
        EXPECT_TRUE(BitEqual(st.state(), committed));
        EXPECT_EQ(st.num_tokens(), twin.num_tokens());
      } else {
        const uint32_t a = choice == 1 ? T : rng() % (T + 1);
        ASSERT_TRUE(st.Commit(a).ok());
        // The twin appends exactly the accepted tokens (chunks split as needed).
        uint32_t left = a;
        for (size_t c = 0; c < ks.size() && left > 0; ++c) {
          const uint32_t n = static_cast<uint32_t>(ks[c].size() / (H * dk));
          const uint32_t take = std::min(n, left);
          LinearInputs in{.k = std::span<const float>(ks[c]).first(take * H * dk),
                          .v = std::span<const float>(vs[c]).first(take * H * dv)};
          if (!gs[c].empty()) in.gate = std::span<const float>(gs[c]).first(take * H);
          ASSERT_TRUE(twin.Append(in).ok());
          left -= take;
        }
        EXPECT_TRUE(BitEqual(st.state(), twin.state())) << "a=" << a << " T=" << T;
      }
      EXPECT_EQ(st.num_tokens(), twin.num_tokens());
      EXPECT_FALSE(st.in_draft());
      EXPECT_TRUE(st.scratch().empty());
    }
  }
}

TEST(LinearState, CreateRejectsBadOptions) {
  EXPECT_FALSE(LinearState::Create({.n_heads = 0, .d_k = 4, .d_v = 4}).ok());
  EXPECT_FALSE(LinearState::Create({.n_heads = 1, .d_k = 0, .d_v = 4}).ok());
  EXPECT_FALSE(LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 5000}).ok());
  EXPECT_FALSE(LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 4, .head_gate = {0.5f}}).ok());
  EXPECT_FALSE(LinearState::Create(
                   {.n_heads = 2, .d_k = 4, .d_v = 4, .rule = LinearRule::kDecay, .head_gate = {0.5f}})
                   .ok());
  EXPECT_FALSE(LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 4, .rule = LinearRule::kDecay,
                                    .head_gate = {1.5f}})
                   .ok());
  EXPECT_FALSE(LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 4, .rule = LinearRule::kDelta,
                                    .head_gate = {NAN}})
                   .ok());
  EXPECT_FALSE(
      LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 4, .max_draft_tokens = 0}).ok());
  EXPECT_TRUE(LinearState::Create({.n_heads = 1, .d_k = 4, .d_v = 4, .rule = LinearRule::kDelta,
                                   .head_gate = {2.0f}})
                  .ok());
  EXPECT_EQ(*ParseLinearRule("delta"), LinearRule::kDelta);
  EXPECT_FALSE(ParseLinearRule("mamba").ok());
}

TEST(LinearState, BadInputChangesNothing) {
  std::mt19937 rng(5);
  const uint32_t H = 2, dk = 4, dv = 3;
  auto created = LinearState::Create(
      {.n_heads = H, .d_k = dk, .d_v = dv, .rule = LinearRule::kDecay, .max_draft_tokens = 3});
  ASSERT_TRUE(created.ok());
  LinearState st = std::move(created).value();
  auto k = Random(rng, H * dk), v = Random(rng, H * dv), q = Random(rng, H * dk);
  ASSERT_TRUE(st.Append({.k = k, .v = v}).ok());
  const auto snapshot = std::vector<double>(st.state().begin(), st.state().end());
  auto unchanged = [&] {
    EXPECT_TRUE(BitEqual(st.state(), snapshot));
    EXPECT_EQ(st.num_tokens(), 1u);
  };
  std::vector<float> out(H * dv);
  // Sizes.
  EXPECT_EQ(st.Append({.k = std::span<const float>(k).first(3), .v = v}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Append({.k = k, .v = std::span<const float>(v).first(2)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Append({.k = k, .v = v, .gate = std::vector<float>{0.5f}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Append({.k = k, .v = v, .q = q}).code(), StatusCode::kInvalidArgument);  // no out
  EXPECT_EQ(st.Append({.k = k, .v = v}, out).code(), StatusCode::kInvalidArgument);  // out w/o q
  // Values.
  auto bad = k;
  bad[1] = INFINITY;
  EXPECT_EQ(st.Append({.k = bad, .v = v}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Append({.k = k, .v = v, .gate = std::vector<float>{0.5f, 1.5f}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(st.Read(std::span<const float>(q).first(2), out).code(), StatusCode::kInvalidArgument);
  unchanged();
  // Draft state machine.
  EXPECT_EQ(st.Commit(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.Abort().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(st.BeginDraft().ok());
  EXPECT_EQ(st.BeginDraft().code(), StatusCode::kFailedPrecondition);  // nested
  ASSERT_TRUE(st.Append({.k = k, .v = v}).ok());
  ASSERT_TRUE(st.Append({.k = k, .v = v}).ok());
  const auto scratch = std::vector<double>(st.scratch().begin(), st.scratch().end());
  EXPECT_EQ(st.Commit(3).code(), StatusCode::kOutOfRange);  // more than drafted
  std::vector<float> k2(2 * H * dk, 0.25f), v2(2 * H * dv, 0.5f);
  EXPECT_EQ(st.Append({.k = k2, .v = v2}).code(), StatusCode::kCapacityExceeded);  // 4 > 3
  EXPECT_TRUE(st.in_draft());
  EXPECT_EQ(st.draft_tokens(), 2u);
  EXPECT_TRUE(BitEqual(st.scratch(), scratch));
  unchanged();
  ASSERT_TRUE(st.Abort().ok());
  unchanged();
  // Clear.
  st.Clear();
  EXPECT_EQ(st.num_tokens(), 0u);
  for (double x : st.state()) EXPECT_EQ(x, 0.0);
}

}  // namespace
}  // namespace kvcache
