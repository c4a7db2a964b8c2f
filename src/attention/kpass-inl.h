// The K pass: scores s[qi][r] = scale * <q_qi, k_r> + bias_qi for the
// visible rows of a job (-inf for the others) and the running max per query
// vector, for kQB query vectors per stored row (a row is decoded once per
// block of queries). The f32 exact instance adds rounded products in the
// reference order (reference.h); the others use FMAs. int8 keys (q8, q8_0)
// take the integer path: the query rounded to int16 once per call.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include <optional>

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#undef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// The kQB dot products of one stored row with queries q[0..kQB).
template <Format F, bool kExact, int kQB>
HWY_INLINE void RowDots(const Decoder<F>& dec, const uint8_t* p, uint32_t d,
                        const float* const* q, float* dots) {
  const uint32_t full_blocks = d / kDotLanes;
  const uint32_t n_blocks = full_blocks + ((d % kDotLanes) != 0 ? 1 : 0);
  const RowRef row = dec.Prepare(p, d);
  VF acc[kQB][kVecs];
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::Zero(DF());
  }
  // Full blocks, then the zero-padded tail block (no per-block test).
  auto accumulate = [&](uint32_t b, const VF* kv) HWY_ATTR {
    for (int j = 0; j < kQB; ++j) {
      for (size_t v = 0; v < kVecs; ++v) {
        const VF qq = hn::LoadU(DF(), q[j] + b * kDotLanes + v * kN);
        acc[j][v] = MulAcc<kExact>(qq, kv[v], acc[j][v]);
      }
    }
  };
  for (uint32_t b = 0; b < full_blocks; ++b) {
    VF kv[kVecs];
    dec.Block(row, b, kv);
    accumulate(b, kv);
  }
  if constexpr (Decoder<F>::kTail) {
    if (n_blocks != full_blocks) {
      VF kv[kVecs];
      TailBlock(dec, row, full_blocks, d, kv);
      accumulate(full_blocks, kv);
    }
  }
  if constexpr (!kExact && kQB == 4) {
    for (int j = 0; j < kQB; ++j) {
      for (size_t v = 1; v < kVecs; ++v) acc[j][0] = hn::Add(acc[j][0], acc[j][v]);
    }
    Reduce4(acc[0][0], acc[1][0], acc[2][0], acc[3][0], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = Reduce16(acc[j]);
  }
}

// ---------------------------------------------------------------------------
// Integer K path for int8 keys (q8, q8_0): each query vector is quantized
// once per K pass to int16 (q ~= qscale * q16, |q16| <= 32767, round to
// nearest), and a row's dot product is int8 x int16 multiply-adds into int32
// lanes (ReorderWidenMulAccumulate: vpmaddwd on x86, 2x the multiply-adds
// of an f32 FMA and no float conversion of the codes). The query's rounding
// moves a score by at most scale * qscale / 2 * sum_i |k_i| (documented in
// docs/attention.md). Used when head_dim is a multiple of 32 and at most
// kIntMaxDim, so that no int32 lane can overflow (a lane adds at most d / 8
// pairs, on SSE4, of at most 2 * 128 * 32767 each: < 2^30 for d = 1024).

constexpr uint32_t kIntMaxDim = 1024;

// (Not on the scalar target, whose 1-lane vectors have no int16 pairs.)
template <Format F>
constexpr bool kIntKeys = HWY_TARGET != HWY_SCALAR && (F == Format::kQ8 || F == Format::kQ8_0);

HWY_INLINE bool IntPathFits(uint32_t d) { return d % 32 == 0 && d <= kIntMaxDim; }

// q16[d] and its scale from q[d] (d a multiple of 32).
HWY_INLINE float QuantizeQuery(const float* q, uint32_t d, int16_t* q16) {
#if HWY_TARGET == HWY_SCALAR
  (void)q;
  (void)d;
  (void)q16;
  return 0.0f;  // the integer path is off on this target
#else
  const DF df;
  VF vmax = hn::Zero(df);
  VF vbad = hn::Zero(df);  // x * 0 is NaN exactly for x inf or NaN
  for (uint32_t i = 0; i < d; i += kN) {
    const VF x = hn::LoadU(df, q + i);
    vmax = hn::Max(vmax, hn::Abs(x));
    vbad = hn::Add(vbad, hn::Mul(x, hn::Zero(df)));
  }
  const float amax = std::isnan(hn::GetLane(hn::SumOfLanes(df, vbad)))
                         ? std::numeric_limits<float>::infinity()
                         : hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    // Zero: every dot is 0. inf or NaN (the calls reject a non-finite
    // query, but a finite one can still overflow in the column scales or the
    // rotation): the scale is NaN, so every dot is NaN, as in the float path.
    std::fill(q16, q16 + d, int16_t{0});
    return amax == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  // Round to nearest; |q * inv| <= 32767 up to rounding, and the demotion
  // saturates.
  const VF inv = hn::Set(df, 32767.0f / amax);
  const hn::Rebind<int16_t, DI> d16;
  for (uint32_t i = 0; i < d; i += kN) {
    hn::StoreU(hn::DemoteTo(d16, hn::NearestInt(hn::Mul(hn::LoadU(df, q + i), inv))), d16, q16 + i);
  }
  return amax / 32767.0f;
#endif
}

#if HWY_TARGET != HWY_SCALAR
using DI32 = hn::ScalableTag<int32_t>;
using DI16 = hn::Repartition<int16_t, DI32>;
constexpr size_t kN16 = hn::MaxLanes(DI16());
static_assert(32 % kN16 == 0, "int16 lanes must divide a q8_0 block");

// The int16 x int8 products of values [i, i + kN16) of q16 and codes, added
// into (s0, s1).
HWY_INLINE void MulAddCodes(const int8_t* codes, const int16_t* q16, hn::Vec<DI32>& s0,
                            hn::Vec<DI32>& s1) {
  const DI16 d16;
  const hn::Rebind<int8_t, DI16> d8;
  const auto c = hn::PromoteTo(d16, hn::LoadU(d8, codes));
  s0 = hn::ReorderWidenMulAccumulate(DI32(), c, hn::LoadU(d16, q16), s0, s1);
}

// dots[j] ~= <q_j, k> for the int8 row at p (scales applied), kQB queries.
template <Format F, int kQB>
HWY_INLINE void RowDotsInt(const uint8_t* p, uint32_t d, const int16_t* const* q16,
                           const float* qscale, float* dots) {
  const DI32 di;
  VF tot[kQB];
  if constexpr (F == Format::kQ8) {
    hn::Vec<DI32> s0[kQB], s1[kQB];
    for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
    const int8_t* c = reinterpret_cast<const int8_t*>(p);
    for (uint32_t i = 0; i < d; i += kN16) {
      for (int j = 0; j < kQB; ++j) MulAddCodes(c + i, q16[j] + i, s0[j], s1[j]);
    }
    for (int j = 0; j < kQB; ++j) tot[j] = hn::ConvertTo(DF(), hn::Add(s0[j], s1[j]));
  } else {
    for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(DF());
    for (uint32_t blk = 0; blk < d / 32; ++blk) {
      const uint8_t* b = p + 34 * blk;
      const VF scale = BroadcastF16(b);
      const int8_t* c = reinterpret_cast<const int8_t*>(b + 2);
      hn::Vec<DI32> s0[kQB], s1[kQB];
      for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
      for (uint32_t i = 0; i < 32; i += kN16) {
        for (int j = 0; j < kQB; ++j) MulAddCodes(c + i, q16[j] + 32 * blk + i, s0[j], s1[j]);
      }
      for (int j = 0; j < kQB; ++j) {
        tot[j] = hn::MulAdd(hn::ConvertTo(DF(), hn::Add(s0[j], s1[j])), scale, tot[j]);
      }
    }
  }
  const float row_scale = F == Format::kQ8 ? fi::Q8RowScale(p, d) : 1.0f;
  if constexpr (kQB == 4) {
    Reduce4(tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(DF(), tot[j]));
  }
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * (qscale[j] * row_scale);
}
#else
template <Format F, int kQB>
void RowDotsInt(const uint8_t* p, uint32_t d, const int16_t* const* q16, const float* qscale,
                float* dots);  // never instantiated on this target
#endif

// The K pass proper; kInt: int8 keys through RowDotsInt with the queries
// already quantized (q16, qscale).
template <Format F, bool kExact, int kQB, bool kInt>
void KPassRows(const KArgs& a, const int16_t* const* q16, const float* qscale) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const Visibility vis = MakeVisibility(plan, job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* q[kQB];
  float* s[kQB];
  float m[kQB];
  float bias[kQB];
  for (int j = 0; j < kQB; ++j) {
    q[j] = qv[j].q;
    s[j] = a.scores + static_cast<size_t>(a.qi0 + j) * job.rows;
    m[j] = a.maxes[a.qi0 + j];
    bias[j] = qv[j].bias;
  }
  const float scale = plan.scale * ValueMul(F);
  const bool has_bias = job.has_bias;
  const bool all_visible = AllVisible(vis, qv, kQB, a.r1);
  const HeadRows rows(view, view.k, job.head);
  auto row_dots = [&](const uint8_t* p, float* dots) HWY_ATTR {
    if constexpr (kInt) {
      RowDotsInt<F, kQB>(p, d, q16, qscale, dots);
    } else {
      (void)q16;
      (void)qscale;
      RowDots<F, kExact, kQB>(dec, p, d, q, dots);
    }
  };
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&rows, &a.r1, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  for (uint32_t r = a.r0; r < a.r1;) {
    uint32_t n;
    const uint8_t* p = rows.Run(r, a.r1, &n);
    const uint32_t run_end = r + n;
    if (all_visible) {
#if HWY_TARGET <= HWY_AVX2
      if constexpr (kQB == 4) {
        // The 4 scores of a row as one 128-bit vector: the same multiply,
        // add and max as the scalar loop below (bit for bit), in 3 vector
        // ops. Kept scalar, GCC held m[] packed in two 64-bit stack words
        // and spent ~10 ops per query per row on it. AVX2 and AVX-512 only:
        // SSE4's 16 registers are already short of its 16 accumulators
        // (turbo2 measured ~5% slower there with the vector form).
        const hn::FixedTag<float, 4> d4;
        const auto scale4 = hn::Set(d4, scale);
        const auto bias4 = hn::LoadU(d4, bias);
        auto m4 = hn::LoadU(d4, m);
        for (; r < run_end; ++r, p += rows.row_bytes) {
          pf.Step();
          alignas(16) float dots[4];
          row_dots(p, dots);
          auto x4 = hn::Mul(hn::Load(d4, dots), scale4);
          if (has_bias) x4 = hn::Add(x4, bias4);
          m4 = hn::IfThenElse(m4 < x4, x4, m4);  // std::max(m, x), NaN x included
          s[0][r] = hn::GetLane(x4);
          s[1][r] = hn::ExtractLane(x4, 1);
          s[2][r] = hn::ExtractLane(x4, 2);
          s[3][r] = hn::ExtractLane(x4, 3);
        }
        hn::StoreU(m4, d4, m);
        continue;
      }
#endif
      for (; r < run_end; ++r, p += rows.row_bytes) {
        pf.Step();
        float dots[4];
        row_dots(p, dots);
        for (int j = 0; j < kQB; ++j) {
          float x = dots[j] * scale;
          if (has_bias) x = x + bias[j];
          s[j][r] = x;
          m[j] = std::max(m[j], x);
        }
      }
      continue;
    }
    for (; r < run_end; ++r, p += rows.row_bytes) {
      pf.Step();
      const uint32_t pos = vis.Pos(r);
      uint32_t mask = 0;
      for (int j = 0; j < kQB; ++j) mask |= vis.Visible(pos, qv[j].qpos) ? (1u << j) : 0u;
      if (mask == 0) {
        for (int j = 0; j < kQB; ++j) s[j][r] = kNegInf;
        continue;
      }
      float dots[4];
      row_dots(p, dots);
      for (int j = 0; j < kQB; ++j) {
        if (!(mask & (1u << j))) {
          s[j][r] = kNegInf;
          continue;
        }
        float x = dots[j] * scale;
        if (has_bias) x = x + bias[j];
        s[j][r] = x;
        m[j] = std::max(m[j], x);
      }
    }
  }
  for (int j = 0; j < kQB; ++j) a.maxes[a.qi0 + j] = m[j];
}

template <Format F, bool kExact, int kQB>
void KPass(const KArgs& a) {
  if constexpr (kIntKeys<F> && !kExact) {
    const uint32_t d = a.plan->head_dim;
    if (IntPathFits(d)) {
      // int8 keys: the integer path, the queries quantized once per call.
      alignas(64) int16_t q16_buf[kQB * kIntMaxDim];
      const int16_t* q16[kQB];
      float qscale[kQB];
      const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
      for (int j = 0; j < kQB; ++j) {
        qscale[j] = QuantizeQuery(qv[j].q, d, q16_buf + j * kIntMaxDim);
        q16[j] = q16_buf + j * kIntMaxDim;
      }
      return KPassRows<F, kExact, kQB, true>(a, q16, qscale);
    }
  }
  KPassRows<F, kExact, kQB, false>(a, nullptr, nullptr);
}

template <Format F, bool kExact>
KFn KFor(int qb) {
  return qb == 4 ? &KPass<F, kExact, 4> : qb == 2 ? &KPass<F, kExact, 2> : &KPass<F, kExact, 1>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_KPASS_INL_H_
