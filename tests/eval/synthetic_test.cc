// Synthetic eval data has the statistics synthetic.h promises.
#include "tools/support/eval/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvcache::eval {
namespace {

struct Moments {
  double mean = 0, sd = 0, kurtosis = 0;
};

// Channel c of kv head h over tokens [first, tokens).
Moments Channel(const std::vector<float>& x, const SyntheticShape& s, uint32_t h, uint32_t c, uint32_t first = 0) {
  Moments m;
  const double n = s.tokens - first;
  for (uint32_t t = first; t < s.tokens; ++t) m.mean += x[(static_cast<size_t>(t) * s.kv_heads + h) * s.head_dim + c];
  m.mean /= n;
  double m2 = 0, m4 = 0;
  for (uint32_t t = first; t < s.tokens; ++t) {
    const double d = x[(static_cast<size_t>(t) * s.kv_heads + h) * s.head_dim + c] - m.mean;
    m2 += d * d;
    m4 += d * d * d * d;
  }
  m2 /= n;
  m4 /= n;
  m.sd = std::sqrt(m2);
  m.kurtosis = m4 / (m2 * m2);
  return m;
}

TEST(Synthetic, ParseDataKind) {
  EXPECT_EQ(*ParseDataKind("gaussian"), DataKind::kGaussian);
  EXPECT_EQ(*ParseDataKind("outlier"), DataKind::kOutlier);
  EXPECT_FALSE(ParseDataKind("uniform").ok());
}

TEST(Synthetic, DeterministicPerSeed) {
  const SyntheticShape s{64, 2, 32};
  EXPECT_EQ(MakeKeys(DataKind::kOutlier, s, 3), MakeKeys(DataKind::kOutlier, s, 3));
  EXPECT_NE(MakeKeys(DataKind::kOutlier, s, 3), MakeKeys(DataKind::kOutlier, s, 4));
  EXPECT_EQ(MakeValues(DataKind::kGaussian, s, 3), MakeValues(DataKind::kGaussian, s, 3));
}

TEST(Synthetic, GaussianIsStandardNormal) {
  const SyntheticShape s{4096, 1, 64};
  const auto k = MakeKeys(DataKind::kGaussian, s, 1);
  for (uint32_t c = 0; c < s.head_dim; ++c) {
    const Moments m = Channel(k, s, 0, c);
    EXPECT_NEAR(m.mean, 0.0, 0.08) << c;
    EXPECT_NEAR(m.sd, 1.0, 0.06) << c;
    EXPECT_NEAR(m.kurtosis, 3.0, 0.5) << c;
  }
}

TEST(Synthetic, OutlierKeysHaveTheRealKeyFeatures) {
  const SyntheticShape s{4096, 2, 128};
  const auto k = MakeKeys(DataKind::kOutlier, s, 1);
  for (uint32_t h = 0; h < s.kv_heads; ++h) {
    const ChannelStats st = OutlierChannelStats(s.head_dim, 1, h);
    ASSERT_EQ(st.outliers.size(), 4u);
    ASSERT_EQ(st.heavy_tailed.size(), 16u);
    std::vector<double> sds, means;
    for (uint32_t c = 0; c < s.head_dim; ++c) {
      const Moments m = Channel(k, s, h, c, /*first=*/1);  // the sink aside
      sds.push_back(m.sd);
      means.push_back(m.mean);
    }
    std::vector<double> sorted = sds;
    std::sort(sorted.begin(), sorted.end());
    const double median_sd = sorted[sorted.size() / 2];
    // Lognormal spreads: a wide range around a median near 1.
    EXPECT_NEAR(median_sd, 1.0, 0.25);
    EXPECT_GT(sorted.back() / sorted.front(), 3.0);
    // Outlier channels: offset 5-15x the median spread.
    std::vector<bool> is_out(s.head_dim, false);
    for (uint32_t c : st.outliers) {
      is_out[c] = true;
      const double ratio = std::abs(means[c]) / median_sd;
      EXPECT_GE(ratio, 4.5) << c;
      EXPECT_LE(ratio, 16.5) << c;
    }
    // Other channels: mean offset about as large as the spread (RMS ratio near 1).
    double ratio2 = 0;
    int n = 0;
    for (uint32_t c = 0; c < s.head_dim; ++c) {
      if (is_out[c]) continue;
      ratio2 += (means[c] / sds[c]) * (means[c] / sds[c]);
      ++n;
    }
    EXPECT_NEAR(std::sqrt(ratio2 / n), 1.0, 0.3);
    // Heavy-tailed channels: excess kurtosis (Student-t 3 has infinite kurtosis;
    // a sample of 4096 shows well above the normal's 3).
    double heavy_kurt = 0;
    for (uint32_t c : st.heavy_tailed) heavy_kurt += Channel(k, s, h, c, 1).kurtosis;
    EXPECT_GT(heavy_kurt / st.heavy_tailed.size(), 5.0);
    // The sink: token 0 has a key norm far above the median token's.
    std::vector<double> norms;
    for (uint32_t t = 0; t < s.tokens; ++t) {
      double a = 0;
      for (uint32_t c = 0; c < s.head_dim; ++c) {
        const double x = k[(static_cast<size_t>(t) * s.kv_heads + h) * s.head_dim + c];
        a += x * x;
      }
      norms.push_back(std::sqrt(a));
    }
    const double sink = norms[0];
    std::nth_element(norms.begin(), norms.begin() + norms.size() / 2, norms.end());
    EXPECT_GT(sink, 3.5 * norms[norms.size() / 2]);
  }
}

TEST(Synthetic, OutlierValuesAreNearIsotropic) {
  const SyntheticShape s{4096, 1, 64};
  const auto v = MakeValues(DataKind::kOutlier, s, 1);
  for (uint32_t c = 0; c < s.head_dim; ++c) {
    const Moments m = Channel(v, s, 0, c);
    EXPECT_NEAR(m.mean, 0.0, 0.1) << c;
    EXPECT_GT(m.sd, 0.6) << c;
    EXPECT_LT(m.sd, 1.6) << c;
  }
}

TEST(Synthetic, QueriesShareTheKeysOutlierChannels) {
  const SyntheticShape s{1024, 2, 128};
  const auto k = MakeKeys(DataKind::kOutlier, s, 1);
  QueryOptions qo;
  qo.num_queries = 256;
  qo.q_heads = 4;
  const auto q = MakeQueries(k, s, qo);
  ASSERT_EQ(q.size(), size_t{256} * 4 * 128);
  for (uint32_t qh = 0; qh < qo.q_heads; ++qh) {
    const uint32_t h = qh / 2;
    const ChannelStats st = OutlierChannelStats(s.head_dim, 1, h);
    // On the key outlier channels the queries carry the keys' offset, far
    // above a typical channel's.
    std::vector<double> q_mean(s.head_dim);
    for (uint32_t c = 0; c < s.head_dim; ++c) {
      for (uint32_t n = 0; n < qo.num_queries; ++n) {
        q_mean[c] += q[(static_cast<size_t>(n) * qo.q_heads + qh) * s.head_dim + c] / qo.num_queries;
      }
    }
    std::vector<double> abs_sorted(s.head_dim);
    for (uint32_t c = 0; c < s.head_dim; ++c) abs_sorted[c] = std::abs(q_mean[c]);
    std::sort(abs_sorted.begin(), abs_sorted.end());
    const double median_abs = abs_sorted[s.head_dim / 2];
    for (uint32_t c : st.outliers) {
      EXPECT_NEAR(q_mean[c], st.mean[c], 0.2 * std::abs(st.mean[c])) << "query head " << qh << " channel " << c;
      EXPECT_GT(std::abs(q_mean[c]), 4 * median_abs) << "query head " << qh << " channel " << c;
    }
  }
}

}  // namespace
}  // namespace kvcache::eval
