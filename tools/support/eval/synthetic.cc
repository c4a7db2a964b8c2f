// Synthetic eval data: see synthetic.h. A private splitmix64 + Box-Muller
// generator keeps the data identical across standard libraries.
#include "tools/support/eval/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvcache::eval {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed ^ 0x9E3779B97F4A7C15ull) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Uniform() * n); }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2 * M_PI * u2);
  }
  // Student-t with 3 degrees of freedom, scaled to unit variance.
  double StudentT3() {
    const double z = Normal();
    double chi2 = 0;
    for (int i = 0; i < 3; ++i) {
      const double x = Normal();
      chi2 += x * x;
    }
    return z / std::sqrt(chi2 / 3.0) / std::sqrt(3.0);
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

uint64_t Mix(uint64_t seed, uint64_t stream) { return seed * 0x2545F4914F6CDD1Dull + stream * 0x9E3779B97F4A7C15ull + 1; }

}  // namespace

Result<DataKind> ParseDataKind(std::string_view name) {
  if (name == "gaussian") return DataKind::kGaussian;
  if (name == "outlier") return DataKind::kOutlier;
  return Status::InvalidArgument(fmt::format("unknown data kind '{}' (gaussian or outlier)", name));
}

ChannelStats OutlierChannelStats(uint32_t head_dim, uint64_t seed, uint32_t kv_head) {
  Rng rng(Mix(seed, 1000 + kv_head));
  ChannelStats st;
  st.spread.resize(head_dim);
  st.mean.resize(head_dim);
  for (uint32_t c = 0; c < head_dim; ++c) st.spread[c] = static_cast<float>(std::exp(0.5 * rng.Normal()));
  for (uint32_t c = 0; c < head_dim; ++c) st.mean[c] = static_cast<float>(st.spread[c] * rng.Normal());
  std::vector<float> sorted = st.spread;
  std::nth_element(sorted.begin(), sorted.begin() + head_dim / 2, sorted.end());
  const double median_spread = sorted[head_dim / 2];
  // Distinct random channels: the first become outliers, the next heavy-tailed.
  std::vector<uint32_t> perm(head_dim);
  std::iota(perm.begin(), perm.end(), 0u);
  for (uint32_t i = head_dim; i > 1; --i) std::swap(perm[i - 1], perm[rng.Below(i)]);
  const uint32_t n_out = std::max(1u, head_dim / 32);
  const uint32_t n_heavy = std::min(head_dim - n_out, head_dim / 8);
  for (uint32_t i = 0; i < n_out; ++i) {
    const uint32_t c = perm[i];
    const double sign = rng.Uniform() < 0.5 ? -1.0 : 1.0;
    st.mean[c] = static_cast<float>(sign * (5.0 + 10.0 * rng.Uniform()) * median_spread);
    st.outliers.push_back(c);
  }
  for (uint32_t i = 0; i < n_heavy; ++i) st.heavy_tailed.push_back(perm[n_out + i]);
  std::sort(st.outliers.begin(), st.outliers.end());
  std::sort(st.heavy_tailed.begin(), st.heavy_tailed.end());
  return st;
}

std::vector<float> MakeKeys(DataKind kind, const SyntheticShape& shape, uint64_t seed) {
  const uint32_t T = shape.tokens, H = shape.kv_heads, D = shape.head_dim;
  std::vector<float> keys(static_cast<size_t>(T) * H * D);  // [T][H][D]
  for (uint32_t h = 0; h < H; ++h) {
    Rng rng(Mix(seed, h));
    if (kind == DataKind::kGaussian) {
      for (uint32_t t = 0; t < T; ++t) {
        for (uint32_t c = 0; c < D; ++c) keys[(static_cast<size_t>(t) * H + h) * D + c] = static_cast<float>(rng.Normal());
      }
      continue;
    }
    const ChannelStats st = OutlierChannelStats(D, seed, h);
    std::vector<bool> heavy(D, false);
    for (uint32_t c : st.heavy_tailed) heavy[c] = true;
    for (uint32_t t = 0; t < T; ++t) {
      float* row = &keys[(static_cast<size_t>(t) * H + h) * D];
      for (uint32_t c = 0; c < D; ++c) {
        const double z = heavy[c] ? rng.StudentT3() : rng.Normal();
        row[c] = static_cast<float>(st.mean[c] + st.spread[c] * z);
      }
    }
    if (T == 0) continue;
    // Token 0: the attention sink. Deviation from the mean 8x a typical
    // token's deviation norm, in a random direction, plus a component along the
    // mean so that queries (which carry the mean) score it about 3 higher.
    double typical2 = 0, mean2 = 0;
    for (uint32_t c = 0; c < D; ++c) {
      typical2 += static_cast<double>(st.spread[c]) * st.spread[c];
      mean2 += static_cast<double>(st.mean[c]) * st.mean[c];
    }
    std::vector<double> dir(D);
    double dot = 0;
    for (uint32_t c = 0; c < D; ++c) {
      dir[c] = st.spread[c] * rng.Normal();
      dot += dir[c] * st.mean[c];
    }
    double norm2 = 0;
    for (uint32_t c = 0; c < D; ++c) {
      if (mean2 > 0) dir[c] -= dot / mean2 * st.mean[c];
      norm2 += dir[c] * dir[c];
    }
    const double dev = 8.0 * std::sqrt(typical2) / std::sqrt(std::max(norm2, 1e-30));
    const double along = mean2 > 0 ? 3.0 * std::sqrt(static_cast<double>(D)) / mean2 : 0.0;
    float* row = &keys[static_cast<size_t>(h) * D];
    for (uint32_t c = 0; c < D; ++c) {
      row[c] = static_cast<float>(st.mean[c] + dev * dir[c] + along * st.mean[c]);
    }
  }
  return keys;
}

std::vector<float> MakeValues(DataKind kind, const SyntheticShape& shape, uint64_t seed) {
  const uint32_t T = shape.tokens, H = shape.kv_heads, D = shape.head_dim;
  std::vector<float> values(static_cast<size_t>(T) * H * D);  // [T][H][D]
  for (uint32_t h = 0; h < H; ++h) {
    Rng rng(Mix(seed, 500 + h));
    std::vector<double> spread(D, 1.0);
    if (kind == DataKind::kOutlier) {
      for (uint32_t c = 0; c < D; ++c) spread[c] = std::exp(0.1 * rng.Normal());
    }
    for (uint32_t t = 0; t < T; ++t) {
      for (uint32_t c = 0; c < D; ++c) {
        values[(static_cast<size_t>(t) * H + h) * D + c] = static_cast<float>(spread[c] * rng.Normal());
      }
    }
  }
  return values;
}

std::vector<float> MakeQueries(const std::vector<float>& keys, const SyntheticShape& shape,
                               const QueryOptions& options) {
  const uint32_t T = shape.tokens, H = shape.kv_heads, D = shape.head_dim;
  const uint32_t QH = options.q_heads, group = QH / H;
  std::vector<float> queries(static_cast<size_t>(options.num_queries) * QH * D);  // [N][QH][D]
  std::vector<std::vector<double>> mu(H, std::vector<double>(D, 0.0));            // [H][D]
  for (uint32_t t = 0; t < T; ++t) {
    for (uint32_t h = 0; h < H; ++h) {
      for (uint32_t c = 0; c < D; ++c) mu[h][c] += keys[(static_cast<size_t>(t) * H + h) * D + c];
    }
  }
  for (auto& m : mu) {
    for (double& x : m) x /= T;
  }
  Rng rng(Mix(options.seed, 777));
  auto position = [&] { return T > 1 ? 1 + rng.Below(T - 1) : 0u; };
  for (uint32_t n = 0; n < options.num_queries; ++n) {
    for (uint32_t qh = 0; qh < QH; ++qh) {
      const uint32_t h = qh / group;
      const float* kj = &keys[(static_cast<size_t>(position()) * H + h) * D];
      const float* ki = &keys[(static_cast<size_t>(position()) * H + h) * D];
      const float* kl = &keys[(static_cast<size_t>(position()) * H + h) * D];
      float* q = &queries[(static_cast<size_t>(n) * QH + qh) * D];
      for (uint32_t c = 0; c < D; ++c) {
        q[c] = static_cast<float>(mu[h][c] + 0.5 * (kj[c] - mu[h][c]) + 0.5 * (ki[c] - kl[c]) / std::sqrt(2.0));
      }
    }
  }
  return queries;
}

}  // namespace kvcache::eval
